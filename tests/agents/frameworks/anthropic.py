"""Anthropic tool runners served by ``tests/integration/frameworks/test_anthropic.py`` (imported by the server subprocess
as ``tests.agents.frameworks.anthropic:NAME``).

The model is the real ``anthropic`` SDK client talking to the scripted loopback provider the
test runs (``$MOTUS_TEST_PROVIDER_URL``, Messages API). The tools count what ran in the test's
sandbox (``$MOTUS_EXAMPLE_DIR``): ``ran-<path>`` gets one line per run of ``touch``,
``looked-<topic>`` one per run of ``lookup``.
"""

from __future__ import annotations

import os
from pathlib import Path

import anthropic
from anthropic import beta_async_tool, beta_tool

from motus.anthropic import ToolRunner, requires_approval

PROVIDER_URL = os.environ.get("MOTUS_TEST_PROVIDER_URL", "http://127.0.0.1:9")


def _append(name: str, line: str) -> None:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")
    with open(root / name, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@requires_approval
@beta_tool
def touch(path: str) -> str:
    """Create an empty file at the path."""
    _append(f"ran-{path}", str(os.getpid()))
    return f"Touched {path}"


@beta_async_tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    _append(f"looked-{topic}", str(os.getpid()))
    return f"Facts about {topic}"


#: The async client, approval marked on the tool.
runner = ToolRunner(
    client=anthropic.AsyncAnthropic(base_url=PROVIDER_URL, api_key="sk-ant-test-key", max_retries=0),
    model="claude-fake",
    max_tokens=512,
    system="You manage files.",
    tools=[touch, lookup],
)

#: The sync client, approval by name on the runner (``lookup`` is gated here, ``touch`` still is by its mark).
by_name = ToolRunner(
    client=anthropic.Anthropic(base_url=PROVIDER_URL, api_key="sk-ant-test-key", max_retries=0),
    model="claude-fake",
    tools=[touch, lookup],
    requires_approval={"lookup"},
)
