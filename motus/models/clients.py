"""Model clients over ``requests``: OpenAI, OpenRouter and Anthropic.

The interface they share (and that any client of your own, or the offline scripted
client in ``examples.serving.hitl_agent``, implements) is documented in
:mod:`motus.models.base`::

    completion = client.chat(model="...", messages=[ChatMessage, ...], tools=[tool.definition(), ...])
    completion.message      # assistant ChatMessage: content and/or tool_calls
    completion.usage        # Usage(prompt_tokens, completion_tokens), .total_tokens

Retries, timeouts and error handling are in :mod:`motus.models.http`.
"""

from __future__ import annotations

from motus.models.anthropic_client import AnthropicChatClient
from motus.models.base import ChatClient, ChatCompletion, ModelError, Usage
from motus.models.openai_client import OpenAIChatClient, OpenRouterChatClient

__all__ = [
    "ChatClient",
    "ChatCompletion",
    "ModelError",
    "Usage",
    "OpenAIChatClient",
    "OpenRouterChatClient",
    "AnthropicChatClient",
]
