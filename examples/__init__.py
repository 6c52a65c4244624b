"""Example agents shipped with motus (``examples.serving.hitl_agent:agent``)."""
