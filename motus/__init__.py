"""motus: serve AI agents over HTTP and let them pause mid-turn to ask a person.

The pieces most users touch:

- ``motus.models.ChatMessage``: the message type every agent turn consumes and returns.
- ``motus.serve.interrupt.interrupt``: pause the running turn until a client resumes it.
- ``motus.serve.AgentServer``: the HTTP server (``motus serve start module:attr``).
"""

__version__ = "0.1.0"
