"""The model client interface that :class:`motus.agent.ReActAgent` drives.

A *chat client* is any object with::

    client.chat(*, model: str, messages: list[ChatMessage], tools: list[dict] | None = None,
                **options) -> ChatCompletion

``tools`` are provider-neutral definitions ``{"name", "description", "parameters"}``
(``parameters`` a JSON schema; :meth:`motus.tools.Tool.definition` produces them).
``chat`` may be a plain function (the HTTP clients are: ``requests`` is blocking, and
the agent runs them in a thread so its event loop stays free) or a coroutine function.
It returns a :class:`ChatCompletion` whose ``message`` is an assistant
:class:`~motus.models.ChatMessage` (``content`` and/or ``tool_calls``) and whose
``usage`` counts tokens. Failures raise :class:`ModelError`, whose message names the
provider and its own error text and never contains the API key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from motus.models.messages import ChatMessage

__all__ = ["Usage", "ChatCompletion", "ModelError", "ChatClient", "completion_record", "completion_from_record"]


@dataclass(frozen=True)
class Usage:
    """Tokens spent by one model call (0 when the provider did not say)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


@dataclass
class ChatCompletion:
    """One model reply: the assistant message, token usage, and what the provider said."""

    message: ChatMessage
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    finish_reason: str | None = None
    raw: dict[str, Any] | None = field(default=None, repr=False)


def completion_record(completion: ChatCompletion) -> dict[str, Any]:
    """A reply as a journal records it: plain JSON in the OpenAI chat-completions shape
    (``choices[0].message``), which the live view of a turn reads. Any object with a
    ``message`` (a ``ChatMessage`` or its dict) and a ``usage`` will do: a client of the
    user's own need not return this very class."""
    message = completion.message
    if not isinstance(message, ChatMessage):
        message = ChatMessage.model_validate(message)
    usage = getattr(completion, "usage", None) or Usage()
    if isinstance(usage, dict):  # a client of the user's own may give the provider's own dict
        usage = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    elif not isinstance(usage, Usage):
        usage = Usage(int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0))
    return {
        "choices": [{"message": message.model_dump(mode="json"), "finish_reason": getattr(completion, "finish_reason", None)}],
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
        "model": getattr(completion, "model", None),
    }


def completion_from_record(record: dict[str, Any]) -> ChatCompletion:
    """The reply ``completion_record`` recorded."""
    choice = record["choices"][0]
    usage = record.get("usage") or {}
    return ChatCompletion(
        message=ChatMessage.model_validate(choice["message"]),
        usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
        model=record.get("model"),
        finish_reason=choice.get("finish_reason"),
        raw=record,
    )


class ModelError(RuntimeError):
    """A model call failed: missing key, provider error, or the provider unreachable.

    ``status`` is the HTTP status when there was one; ``retryable`` tells whether the
    failure was of a kind that was retried (429, 5xx, connection) before giving up.
    """

    def __init__(self, message: str, *, provider: str = "", status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.retryable = retryable


@runtime_checkable
class ChatClient(Protocol):
    """What :class:`motus.agent.ReActAgent` needs from a model client."""

    def chat(
        self,
        *,
        model: str,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> ChatCompletion: ...
