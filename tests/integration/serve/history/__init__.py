"""A session's stored history: only what changed is sent and written, and it is always exactly what the agent returned."""
