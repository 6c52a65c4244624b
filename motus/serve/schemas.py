"""The REST contract's pydantic models, under the server's old import path.

They live in :mod:`motus.api.schemas`, the HTTP API's shared vocabulary that the client
imports too; the server's modules import them from here.
"""

from __future__ import annotations

from motus.api.schemas import (
    AuditEntry,
    CreateSessionRequest,
    ErrorResponse,
    Grant,
    HealthResponse,
    InboxItem,
    InterruptInfo,
    MessageAccepted,
    ResumeAccepted,
    ResumeRequest,
    SendMessageRequest,
    SessionResponse,
    SessionSummary,
    StatusName,
    Webhook,
)

__all__ = [
    "AuditEntry",
    "CreateSessionRequest",
    "ErrorResponse",
    "Grant",
    "HealthResponse",
    "InboxItem",
    "InterruptInfo",
    "MessageAccepted",
    "ResumeAccepted",
    "ResumeRequest",
    "SendMessageRequest",
    "SessionResponse",
    "SessionSummary",
    "StatusName",
    "Webhook",
]
