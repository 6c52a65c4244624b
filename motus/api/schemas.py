"""The REST contract in one file: request and response bodies as pydantic models.

Part of the HTTP API's shared vocabulary (:mod:`motus.api`): the server's views validate
every body with these models and answer with them, and the client parses the server's answers
with the same models, so the contract that clients see and the OpenAPI document are derived
from one place. It imports neither the server (``motus.serve``) nor the client
(``motus.client``).

Unknown fields are ignored, never refused, so a client written for a newer or older server
keeps working. Field names, defaults and nullability follow ``serving-api.md`` exactly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from motus.api.titles import title_problem
from motus.api.webhook_urls import MAX_URL_LENGTH, check_token, check_url
from motus.models import ChatMessage

__all__ = [
    "AuditEntry",
    "CreateSessionRequest",
    "ErrorResponse",
    "Grant",
    "HealthResponse",
    "InboxContext",
    "InboxItem",
    "WhoAmI",
    "InterruptInfo",
    "MessageAccepted",
    "ResumeAccepted",
    "ResumeRequest",
    "RetitleRequest",
    "SendMessageRequest",
    "SessionResponse",
    "SessionSummary",
    "StatusName",
    "Webhook",
]

StatusName = Literal["idle", "running", "interrupted", "error"]


class Webhook(BaseModel):
    """Where to POST the outcome of the turn. The URL is checked here (``check_url``: http or
    https, a well-formed host, no whitespace or control characters, at most 2048 characters);
    where it may connect to is checked at delivery, on the addresses the host resolves to."""

    model_config = ConfigDict(extra="ignore")

    url: str = Field(min_length=1, json_schema_extra={"maxLength": MAX_URL_LENGTH, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"})
    token: str | None = None
    include_messages: bool = False
    events: list[Literal["interrupted", "idle", "error"]] | None = Field(
        default=None, description='When to deliver; default ["idle", "error"] (a turn that ended).'
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        check_url(value)  # ValueError naming the problem
        return value

    @field_validator("token")
    @classmethod
    def _header_safe_token(cls, value: str | None) -> str | None:
        check_token(value)
        return value


def _checked_title(value: str | None) -> str | None:
    problem = None if value is None else title_problem(value)
    if problem:
        raise ValueError(f"the title {problem}")
    return value


class CreateSessionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    state: list[ChatMessage] | None = None
    title: str | None = Field(
        default=None, description="What people see for the session (beyond the guide); by default its first user message, shortened."
    )

    _title = field_validator("title")(_checked_title)


class RetitleRequest(BaseModel):
    """``PATCH /sessions/{id}``: a new title for the session."""

    title: str

    _title = field_validator("title")(_checked_title)


class SendMessageRequest(ChatMessage):
    """A ``ChatMessage`` (role defaults to ``user``) plus an optional webhook."""

    webhook: Webhook | None = None

    def message(self) -> ChatMessage:
        return ChatMessage.model_validate(self.model_dump(exclude={"webhook"}))


class ResumeRequest(BaseModel):
    interrupt_id: str = Field(min_length=1)
    value: Any = None


class Approval(BaseModel):
    """One approval given towards an interrupt's quorum."""

    by: str
    at: str | None = None


class InterruptInfo(BaseModel):
    interrupt_id: str
    type: str
    payload: dict[str, Any]
    created_at: str | None = Field(default=None, description="When the server first saw it (ISO 8601, UTC).")
    expires_at: str | None = Field(default=None, description="When it resolves itself with its default, if it has a timeout.")
    approvals: list[Approval] | None = Field(
        default=None, description="With a quorum (payload.quorum): the approvals given so far, oldest first.")
    approvals_needed: int | None = Field(
        default=None, description="With a quorum: how many more approvals, from different keys, resolve it.")

    @model_serializer(mode="wrap")
    def _guide_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """In a session answer an interrupt keeps the guide's three fields unless it expires
        (a client comparing whole answers with the reference's keeps working); the inbox
        always shows both times."""
        data = handler(self)
        if data.get("expires_at") is None and not isinstance(self, InboxItem):
            data.pop("expires_at", None)
            data.pop("created_at", None)
        if data.get("approvals") is None:  # only an interrupt with a quorum has these
            data.pop("approvals", None)
            data.pop("approvals_needed", None)
        return data


class InboxContext(BaseModel):
    """Why an inbox item asks: enough to decide without opening the session."""

    session_title: str | None = Field(default=None, description="The session's title.")
    message: str | None = Field(default=None, description="The text of the user message that started the waiting turn.")
    sent_by: str | None = Field(default=None, description="The name of the API key that sent that message.")
    sent_at: str | None = Field(default=None, description="When that message started the turn (ISO 8601, UTC).")
    agent_text: str | None = Field(
        default=None, description="What the agent said in this turn before it asked (its model replies' text)."
    )


class InboxItem(InterruptInfo):
    """A pending interrupt in the inbox (``GET /interrupts``), with its session and the
    context of its turn; ``position`` and ``of`` number it among its session's items."""

    session_id: str
    context: InboxContext = Field(default_factory=InboxContext)
    position: int = 1
    of: int = 1


class Grant(BaseModel):
    """A remembered approval: calls of ``tool_name`` in this session pass the gate."""

    tool_name: str
    granted_by: str
    granted_at: str


class AuditEntry(BaseModel):
    """Who decided what. ``kind`` is ``resolved`` (an interrupt answered: ``by`` a key's
    name, or ``timeout``; with a quorum, ``approvals`` lists every approval), ``approval``
    (one approval towards a quorum, the interrupt still pending), ``grant`` or ``revoke``;
    the other fields depend on it."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["resolved", "approval", "grant", "revoke"]
    at: str
    by: str


class SessionResponse(BaseModel):
    session_id: str
    status: StatusName
    response: ChatMessage | None = None
    error: str | None = None
    interrupts: list[InterruptInfo] | None = None
    turn: dict[str, Any] | None = Field(
        default=None,
        description="While running or interrupted: the message that started the turn and what it did so far "
        "(model replies and tool calls, tool results, interrupts), from the turn journal.",
    )

    @model_serializer(mode="wrap")
    def _guide_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``turn`` only while a turn is live: otherwise the answer is the guide's exactly."""
        data = handler(self)
        if data.get("turn") is None:
            data.pop("turn", None)
        return data


class SessionSummary(BaseModel):
    session_id: str
    total_messages: int
    status: StatusName
    title: str | None = Field(default=None, description="Only with ?titles=true (beyond the guide).")


class MessageAccepted(BaseModel):
    session_id: str
    status: StatusName


class ResumeAccepted(BaseModel):
    session_id: str
    status: StatusName
    approvals_needed: int | None = Field(
        default=None, description="An approval towards a quorum that did not complete it: how many more it needs "
        "(the interrupt stays pending).")
    detail: str | None = Field(default=None, description="With approvals_needed: where the quorum stands, for people.")

    @model_serializer(mode="wrap")
    def _guide_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The guide's two fields unless the answer was one approval of several."""
        data = handler(self)
        if data.get("approvals_needed") is None:
            data.pop("approvals_needed", None)
            data.pop("detail", None)
        return data


class WhoAmI(BaseModel):
    """The key a request came with (``GET /whoami``): what a client needs to offer only the
    answers this key may give. Never the secret."""

    name: str = Field(description="The key's name; 'anonymous' on a server without API keys.")
    roles: list[str] = Field(default_factory=list, description="Its roles (NAME=SECRET:ROLE,ROLE), sorted.")
    read_only: bool = Field(default=False, description="Whether it may only list and watch.")


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    max_workers: int
    running_workers: int
    total_sessions: int
    store: str = "memory"
    live_turns: int = 0
    parked_turns: int = 0
    open_streams: int = 0


class ErrorResponse(BaseModel):
    detail: str
