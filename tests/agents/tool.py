"""Agents served by ``tests/integration/serve/approvals/test_react_agent.py``.

They are ``ReActAgent``s over the real HTTP clients, pointed at the scripted fake
provider the test starts (its URL arrives as ``$MOTUS_TEST_PROVIDER_URL`` through
``start_server(..., env=...)``). They use the example agent's file tools, so the
sandbox is ``$MOTUS_EXAMPLE_DIR``.
"""

from __future__ import annotations

import os

from examples.serving.hitl_agent import TOOLS, _inside
from motus.agent import ReActAgent
from motus.models.anthropic_client import AnthropicChatClient
from motus.models.openai_client import OpenAIChatClient
from motus.tools import tool

PROVIDER_URL = os.environ.get("MOTUS_TEST_PROVIDER_URL", "http://127.0.0.1:9")
PROVIDER_KEY = os.environ.get("MOTUS_TEST_PROVIDER_KEY", "sk-test-key")


@tool(requires_approval=lambda path: not path.startswith("scratch/"))
def write_note(path: str, text: str) -> str:
    """Write a text file in the sandbox; only paths outside scratch/ need approval."""
    target = _inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return f"Wrote {path}"


_RETRIES = {"max_retries": 2, "backoff": 0.01, "max_retry_after": 1.0}

files_openai = ReActAgent(
    client=OpenAIChatClient(api_key=PROVIDER_KEY, base_url=PROVIDER_URL, **_RETRIES),
    model_name="fake-model",
    system_prompt="You manage files.",
    tools=[*TOOLS, write_note],
)

files_anthropic = ReActAgent(
    client=AnthropicChatClient(api_key=PROVIDER_KEY, base_url=PROVIDER_URL, **_RETRIES),
    model_name="claude-fake",
    system_prompt="You manage files.",
    tools=TOOLS,
)
