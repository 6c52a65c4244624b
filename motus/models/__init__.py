"""Messages and model clients.

``ChatMessage`` is defined in :mod:`motus.models.messages`. The model clients
(OpenAI, OpenRouter, Anthropic) live in :mod:`motus.models.clients` and are imported
lazily, so serving a plain function agent never imports HTTP client code it does not use.
"""

from __future__ import annotations

from typing import Any

from motus.models.messages import ChatMessage, FunctionCall, Role, ToolCall

__all__ = [
    "ChatMessage",
    "FunctionCall",
    "Role",
    "ToolCall",
    "OpenAIChatClient",
    "OpenRouterChatClient",
    "AnthropicChatClient",
    "ChatCompletion",
    "ChatClient",
    "ModelError",
    "ScriptedChatClient",
    "Usage",
    "tool_calls",
]

_CLIENTS = {
    "OpenAIChatClient",
    "OpenRouterChatClient",
    "AnthropicChatClient",
    "ChatCompletion",
    "ChatClient",
    "ModelError",
    "Usage",
}


def __getattr__(name: str) -> Any:
    if name in ("ScriptedChatClient", "tool_calls"):
        from motus.models import scripted

        return getattr(scripted, name)
    if name in _CLIENTS:
        from motus.models import clients

        return getattr(clients, name)
    raise AttributeError(f"module 'motus.models' has no attribute {name!r}")
