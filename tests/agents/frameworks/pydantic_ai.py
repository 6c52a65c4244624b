"""Pydantic AI agents served by ``tests/integration/frameworks/test_pydantic_ai.py`` (imported by the server subprocess as
``tests.agents.frameworks.pydantic_ai:NAME``).

The model is Pydantic AI's own ``OpenAIChatModel`` talking to the scripted loopback provider
the test runs (``$MOTUS_TEST_PROVIDER_URL``). The tools count what ran in the test's sandbox
(``$MOTUS_EXAMPLE_DIR``): ``ran-<path>`` gets one line per run of ``touch``, ``looked-<topic>``
one per run of ``lookup``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

PROVIDER_URL = os.environ.get("MOTUS_TEST_PROVIDER_URL", "http://127.0.0.1:9")


def _append(name: str, line: str) -> None:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")
    with open(root / name, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _model() -> OpenAIChatModel:
    return OpenAIChatModel("fake-model", provider=OpenAIProvider(base_url=PROVIDER_URL + "/v1", api_key="sk-test-key"))


agent = Agent(_model(), name="files", instructions="You manage files.", output_type=[str, DeferredToolRequests])


@agent.tool_plain(requires_approval=True)
def touch(path: str) -> str:
    """Create an empty file at the path."""
    _append(f"ran-{path}", str(os.getpid()))
    return f"Touched {path}"


@agent.tool_plain
def lookup(topic: str) -> str:
    """Look a topic up."""
    _append(f"looked-{topic}", str(os.getpid()))
    return f"Facts about {topic}"


#: Built wrongly: an approval-required tool, but no DeferredToolRequests output type.
wrong = Agent(_model(), name="wrong", instructions="You manage files.")


@wrong.tool_plain(requires_approval=True)
def remove(path: str) -> str:
    """Remove a file."""
    return f"Removed {path}"
