"""A tool runner built wrongly (``tests/integration/frameworks/test_anthropic.py``): it requires approval for a tool it does
not have, so importing this module fails, and ``motus serve start`` must say why."""

from __future__ import annotations

import anthropic
from anthropic import beta_tool

from motus.anthropic import ToolRunner


@beta_tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"Facts about {topic}"


runner = ToolRunner(
    client=anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="sk-ant-test-key"),
    model="claude-fake",
    tools=[lookup],
    requires_approval={"remove"},
)
