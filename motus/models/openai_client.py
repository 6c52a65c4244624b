"""OpenAI chat-completions clients: :class:`OpenAIChatClient` and :class:`OpenRouterChatClient`.

Both speak ``POST {base_url}/chat/completions`` with ``Authorization: Bearer <key>`` and
implement the interface of :mod:`motus.models.base`. The key and base URL come from the
arguments or the environment (``OPENAI_API_KEY``/``OPENAI_BASE_URL``,
``OPENROUTER_API_KEY``/``OPENROUTER_BASE_URL``); a missing key is a
:class:`~motus.models.base.ModelError` at construction, so ``motus serve start`` fails at
start-up with a message that says which variable to set, not at the first turn.

OpenRouter sometimes answers HTTP 200 with an ``error`` object instead of choices; that
is a ``ModelError`` too, carrying the provider's message.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from motus.models._client_base import HttpChatClient, resolve_key  # noqa: F401  (resolve_key: kept importable here)
from motus.models.base import ChatCompletion, ModelError, Usage
from motus.models.http import provider_error_message
from motus.models.messages import ChatMessage, FunctionCall, ToolCall

__all__ = ["OpenAIChatClient", "OpenRouterChatClient", "to_openai_messages", "to_openai_tools"]


def _image_url(data: str) -> str:
    return data if data.startswith(("data:", "http://", "https://")) else f"data:image/png;base64,{data}"


def to_openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """ChatMessages as chat-completions messages (``user_params`` never leaves motus)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role}
        if message.base64_image:
            parts: list[dict[str, Any]] = []
            if message.content:
                parts.append({"type": "text", "text": message.content})
            parts.append({"type": "image_url", "image_url": {"url": _image_url(message.base64_image)}})
            item["content"] = parts
        else:
            item["content"] = message.content
        if message.tool_calls:
            item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.role == "tool":
            item["tool_call_id"] = message.tool_call_id
            if item["content"] is None:
                item["content"] = ""
        elif message.name:
            item["name"] = message.name
        if item["content"] is None and not message.tool_calls:
            item["content"] = ""
        out.append(item)
    return out


def to_openai_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Neutral tool definitions as ``{"type": "function", "function": {...}}`` entries."""
    if not tools:
        return None
    return [entry if "type" in entry and "function" in entry else {"type": "function", "function": entry} for entry in tools]


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    if not raw:
        return None
    calls = []
    for entry in raw:
        function = entry.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(
                id=entry.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                function=FunctionCall(name=function.get("name", ""), arguments=arguments or "{}"),
            )
        )
    return calls


class OpenAIChatClient(HttpChatClient):
    """A chat-completions client for OpenAI (or any server that speaks its protocol).

    Args:
        api_key: default ``$OPENAI_API_KEY``.
        base_url: default ``$OPENAI_BASE_URL`` or ``https://api.openai.com/v1``.
        connect_timeout, read_timeout: seconds, per HTTP attempt.
        max_retries, backoff, max_backoff, max_retry_after, sleep: retry policy (see
            :mod:`motus.models.http`); ``sleep`` is injectable for tests.
        headers: extra HTTP headers.
        **defaults: request fields sent with every call (``temperature``, ``max_tokens``...).
    """

    provider = "OpenAI"
    api_key_env = "OPENAI_API_KEY"
    base_url_env = "OPENAI_BASE_URL"
    default_base_url = "https://api.openai.com/v1"

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}", **self._extra_headers()}

    def _extra_headers(self) -> dict[str, str]:
        return {}

    def chat(
        self,
        *,
        model: str,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> ChatCompletion:
        """One chat-completions call; see :mod:`motus.models.base` for the contract."""
        body: dict[str, Any] = {"model": model, "messages": to_openai_messages(messages), **self.defaults, **options}
        openai_tools = to_openai_tools(tools)
        if openai_tools:
            body["tools"] = openai_tools
        reply = self.transport.post("/chat/completions", body)
        return self._parse(reply)

    def _parse(self, reply: dict[str, Any]) -> ChatCompletion:
        choices = reply.get("choices")
        if not choices:
            detail = provider_error_message(reply) or "the reply has no choices"
            raise ModelError(f"{self.provider} returned an error: {self.transport.scrub(detail)}", provider=self.provider)
        choice = choices[0]
        if isinstance(choice.get("error"), dict):
            detail = provider_error_message(choice) or "unknown error"
            raise ModelError(f"{self.provider} returned an error: {self.transport.scrub(detail)}", provider=self.provider)
        raw_message = choice.get("message") or {}
        content = raw_message.get("content")
        if isinstance(content, list):  # some compatible servers send content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        message = ChatMessage(role="assistant", content=content, tool_calls=_tool_calls(raw_message.get("tool_calls")))
        usage = reply.get("usage") or {}
        return ChatCompletion(
            message=message,
            usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            model=reply.get("model"),
            finish_reason=choice.get("finish_reason"),
            raw=reply,
        )


class OpenRouterChatClient(OpenAIChatClient):
    """OpenRouter's OpenAI-compatible API (``$OPENROUTER_API_KEY``, ``$OPENROUTER_BASE_URL``).

    ``app_name``/``app_url`` become OpenRouter's optional ``X-Title``/``HTTP-Referer``
    attribution headers.
    """

    provider = "OpenRouter"
    api_key_env = "OPENROUTER_API_KEY"
    base_url_env = "OPENROUTER_BASE_URL"
    default_base_url = "https://openrouter.ai/api/v1"

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *, app_name: str = "motus", app_url: str | None = None, **kwargs: Any) -> None:
        self._app_name = app_name
        self._app_url = app_url
        super().__init__(api_key, base_url, **kwargs)

    def _extra_headers(self) -> dict[str, str]:
        headers = {"X-Title": self._app_name} if self._app_name else {}
        if self._app_url:
            headers["HTTP-Referer"] = self._app_url
        return headers
