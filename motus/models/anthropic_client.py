"""Anthropic Messages API client with tool use: :class:`AnthropicChatClient`.

Implements the interface of :mod:`motus.models.base` over ``POST {base}/v1/messages``
(headers ``x-api-key`` and ``anthropic-version``). ChatMessage history is converted both
ways:

* ``system`` messages become the top-level ``system`` text;
* an assistant message's ``tool_calls`` become ``tool_use`` blocks, and ``tool``
  messages become ``tool_result`` blocks in a user turn (``is_error`` set when the
  result is a motus ``{"error": ...}`` object);
* consecutive messages of one role are merged, as the API requires alternation;
* the reply's ``text`` blocks become ``content`` and its ``tool_use`` blocks become
  ``tool_calls`` whose ``arguments`` are JSON strings, exactly like the OpenAI client.

The key comes from ``api_key`` or ``$ANTHROPIC_API_KEY`` (missing: ``ModelError`` at
construction), the base URL from ``base_url``, ``$ANTHROPIC_BASE_URL`` or
``https://api.anthropic.com``. ``max_tokens`` is required by the API: default 4096.
"""

from __future__ import annotations

import json
import re
from typing import Any

from motus.models._client_base import HttpChatClient
from motus.models.base import ChatCompletion, ModelError, Usage
from motus.models.http import provider_error_message
from motus.models.messages import ChatMessage, FunctionCall, ToolCall

__all__ = ["AnthropicChatClient", "to_anthropic_request"]

ANTHROPIC_VERSION = "2023-06-01"
_DATA_URL = re.compile(r"^data:(?P<type>[\w/+.-]+);base64,(?P<data>.*)$", re.DOTALL)


def _image_block(data: str) -> dict[str, Any]:
    if data.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": data}}
    match = _DATA_URL.match(data)
    media_type, payload = (match.group("type"), match.group("data")) if match else ("image/png", data)
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": payload}}


def _is_error_result(content: str) -> bool:
    try:
        value = json.loads(content)
    except (TypeError, ValueError):
        return False
    return isinstance(value, dict) and set(value) == {"error"}


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": message.content or ""}
        if _is_error_result(message.content or ""):
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.base64_image and message.role == "user":
        blocks.append(_image_block(message.base64_image))
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls or []:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": _tool_input(call.function.arguments)})
    return blocks


def to_anthropic_request(messages: list[ChatMessage], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The ``system``, ``messages`` and ``tools`` fields of a Messages API request."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    request: dict[str, Any] = {"messages": turns}
    if system:
        request["system"] = system
    if tools:
        request["tools"] = [
            {"name": t["name"], "description": t.get("description") or "", "input_schema": t.get("parameters") or {"type": "object", "properties": {}}}
            for t in (entry.get("function", entry) for entry in tools)
        ]
    return request


class AnthropicChatClient(HttpChatClient):
    """A client of Anthropic's Messages API; arguments as for :class:`~motus.models.OpenAIChatClient`, plus ``max_tokens``."""

    provider = "Anthropic"
    api_key_env = "ANTHROPIC_API_KEY"
    base_url_env = "ANTHROPIC_BASE_URL"
    default_base_url = "https://api.anthropic.com"

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *, max_tokens: int = 4096, **kwargs: Any) -> None:
        self.max_tokens = max_tokens
        super().__init__(api_key, base_url, **kwargs)

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}

    def chat(
        self,
        *,
        model: str,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> ChatCompletion:
        """One Messages API call; see :mod:`motus.models.base` for the contract."""
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, **to_anthropic_request(messages, tools), **self.defaults, **options}
        reply = self.transport.post("/v1/messages", body)
        if reply.get("type") == "error" or "content" not in reply:
            detail = provider_error_message(reply) or "the reply has no content"
            raise ModelError(f"{self.provider} returned an error: {self.transport.scrub(detail)}", provider=self.provider)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in reply.get("content") or []:
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
            elif block.get("type") == "tool_use":
                calls.append(ToolCall(id=block["id"], function=FunctionCall(name=block["name"], arguments=json.dumps(block.get("input") or {}))))
        usage = reply.get("usage") or {}
        prompt = int(usage.get("input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
        return ChatCompletion(
            message=ChatMessage(role="assistant", content="\n".join(t for t in texts if t) or None, tool_calls=calls or None),
            usage=Usage(prompt, int(usage.get("output_tokens") or 0)),
            model=reply.get("model"),
            finish_reason=reply.get("stop_reason"),
            raw=reply,
        )
