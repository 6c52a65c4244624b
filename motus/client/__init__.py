"""The client side of motus: the Python client, the terminal chat and the client commands.

``from motus.client import Client`` is the library (:mod:`motus.client.library`; every public
name of it is importable from here). The rest of the package builds on it only:

- :mod:`motus.client.chat`: the interactive chat of ``motus serve chat`` (its terminal side in
  :mod:`motus.client.terminal` and :mod:`motus.client.prompts`);
- :mod:`motus.client.commands`: the ``motus serve`` client commands (``chat``, ``health``,
  ``create``, ``sessions``, ``get``, ``delete``, ``messages``, ``send``, ``inbox``).

Importing this package does not import those two (nor click): a script that only talks to a
server loads the library and its dependencies, nothing else.
"""

from motus.client.events import Event
from motus.client.library import (
    DEFAULT_POLL_SECONDS,
    SKIP,
    APIError,
    AuditEntry,
    Client,
    ClientError,
    Conflict,
    ConnectionFailed,
    Grant,
    HealthResponse,
    InboxItem,
    InterruptHandler,
    InterruptInfo,
    MessageAccepted,
    Forbidden,
    NotFound,
    ResumeAccepted,
    SessionResponse,
    SessionSummary,
    TurnFailed,
    TurnPaused,
    Unauthorized,
    Unavailable,
    Webhook,
    WhoAmI,
    normalize_url,
)

__all__ = [
    "APIError",
    "AuditEntry",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "DEFAULT_POLL_SECONDS",
    "Event",
    "Grant",
    "HealthResponse",
    "InboxItem",
    "InterruptHandler",
    "InterruptInfo",
    "MessageAccepted",
    "Forbidden",
    "NotFound",
    "ResumeAccepted",
    "SKIP",
    "SessionResponse",
    "SessionSummary",
    "TurnFailed",
    "TurnPaused",
    "Unauthorized",
    "Unavailable",
    "Webhook",
    "WhoAmI",
    "normalize_url",
]
