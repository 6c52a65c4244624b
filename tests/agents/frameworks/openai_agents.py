"""OpenAI Agents SDK agents served by ``tests/integration/frameworks/test_openai_agents.py`` (imported by the server
subprocess as ``tests.agents.frameworks.openai_agents:NAME``).

The model is the SDK's own ``OpenAIChatCompletionsModel`` talking to the scripted loopback
provider the test runs (``$MOTUS_TEST_PROVIDER_URL``). The tools count what ran in the test's
sandbox (``$MOTUS_EXAMPLE_DIR``): ``ran-<path>`` gets one line per run of ``touch``,
``looked-<topic>`` one per run of ``lookup``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agents import Agent, GuardrailFunctionOutput, OpenAIChatCompletionsModel, function_tool, input_guardrail
from openai import AsyncOpenAI
from pydantic import BaseModel

PROVIDER_URL = os.environ.get("MOTUS_TEST_PROVIDER_URL", "http://127.0.0.1:9")


def _append(name: str, line: str) -> None:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")
    with open(root / name, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@function_tool(needs_approval=True)
def touch(path: str) -> str:
    """Create an empty file at the path."""
    _append(f"ran-{path}", str(os.getpid()))
    return f"Touched {path}"


@function_tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    _append(f"looked-{topic}", str(os.getpid()))
    return f"Facts about {topic}"


def _model() -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=PROVIDER_URL + "/v1", api_key="sk-test-key", max_retries=0)
    return OpenAIChatCompletionsModel(model="fake-model", openai_client=client)


agent = Agent(name="files", instructions="You manage files.", tools=[touch, lookup], model=_model())


class Weather(BaseModel):
    city: str
    degrees: int


structured = Agent(name="weather", instructions="Report the weather.", output_type=Weather, model=_model())


@input_guardrail(run_in_parallel=False)
def no_secrets(context, agent, user_input) -> GuardrailFunctionOutput:  # noqa: ANN001 - the SDK's signature
    text = user_input if isinstance(user_input, str) else str(user_input[-1].get("content"))
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="password" in text)


guarded = Agent(name="guarded", instructions="Be careful.", input_guardrails=[no_secrets], model=_model())
