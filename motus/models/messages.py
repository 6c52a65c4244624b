"""Chat messages: the unit of every agent turn.

A turn is ``(message, state) -> (response, new_state)`` where every item is a
:class:`ChatMessage`. The shape follows the OpenAI chat format (``tool_calls`` carry
``{"id", "type": "function", "function": {"name", "arguments"}}``) because most
providers and clients already speak it.

Guarantee: serialising a ``ChatMessage`` (``model_dump`` / ``model_dump_json``) omits
fields whose value is ``None``, so the wire stays small and matches the reference
product. Unknown fields in input are ignored, not rejected, so a newer client can talk
to an older server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

Role = Literal["system", "user", "assistant", "tool"]


class _OmitNone(BaseModel):
    """Base for wire models whose JSON leaves out null fields."""

    model_config = ConfigDict(extra="ignore")

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class FunctionCall(_OmitNone):
    """The function part of a tool call: its name and its JSON-encoded arguments."""

    name: str
    arguments: str = "{}"


class ToolCall(_OmitNone):
    """One tool call requested by the model."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_OmitNone):
    """One message of a conversation.

    ``user_params`` carries per-message parameters from the client (``--param`` in the
    CLI) that the agent may read; it is never sent to a model provider by motus itself.
    """

    role: Role = "user"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    base64_image: str | None = None
    user_params: dict[str, Any] | None = None

    @classmethod
    def user_message(cls, content: str | None = None, **fields: Any) -> ChatMessage:
        return cls(role="user", content=content, **fields)

    @classmethod
    def assistant_message(cls, content: str | None = None, **fields: Any) -> ChatMessage:
        return cls(role="assistant", content=content, **fields)

    @classmethod
    def system_message(cls, content: str, **fields: Any) -> ChatMessage:
        return cls(role="system", content=content, **fields)

    @classmethod
    def tool_message(cls, content: str, tool_call_id: str, name: str | None = None, **fields: Any) -> ChatMessage:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name, **fields)
