"""motus: serve AI agents over HTTP and let them pause mid-turn to ask a person.

The pieces most users touch:

- ``motus.models.ChatMessage``: the message type every agent turn consumes and returns.
- ``motus.serve.interrupt.interrupt``: pause the running turn until a client resumes it.
- ``motus.step``: run a block of the agent's own code once per turn, journaled, so a
  replayed turn (after parking or a restart) gets its recorded result instead of running it
  again.
- ``motus.serve.AgentServer``: the HTTP server (``motus serve start module:attr``).

``import motus`` loads none of the server: ``step`` and ``interrupt`` live in
``motus.durable`` (what runs inside a worker), which ``motus.serve.interrupt`` re-exports.
"""

from motus.durable.journal import step

__version__ = "0.1.0"

__all__ = ["step", "__version__"]
