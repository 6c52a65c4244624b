"""The guardrails guide: guardrails written as it writes them run unchanged.

Tool calls go through ``Tool.invoke`` (the path a model's call takes); agent turns go
through ``ReActAgent`` against a fake provider that is a real HTTP server on loopback.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from motus.agent import ReActAgent
from motus.guardrails import InputGuardrailTripped, OutputGuardrailTripped, ToolInputGuardrailTripped, ToolRejected
from motus.models import ChatMessage, OpenAIChatClient
from motus.tools import tool
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls, tool_messages


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


# -- tool input guardrails: only the parameters they declare ---------------------------------------


def block_drop(query: str) -> None:
    if "DROP" in query.upper():
        raise ToolInputGuardrailTripped("DROP statements are forbidden")


def redact_api_key(token: str) -> dict:
    return {"token": token.replace("sk-secret", "[REDACTED]")}


@tool(input_guardrails=[block_drop, redact_api_key])
async def execute_sql(query: str, timeout: int = 30, database: str = "main") -> str:
    """Run a SQL query."""
    return f"ran {query!r} on {database} within {timeout}s"


@tool(input_guardrails=[block_drop, redact_api_key])
async def call_api(token: str, path: str) -> str:
    """Call an API."""
    return f"GET {path} with {token}"


def test_a_guardrail_declaring_a_parameter_the_call_lacks_is_skipped() -> None:
    # redact_api_key wants `token`, which execute_sql has not: it is skipped, not a TypeError.
    assert run(execute_sql.invoke({"query": "SELECT 1"})) == "ran 'SELECT 1' on main within 30s"
    assert json.loads(run(execute_sql.invoke({"query": "drop table users"}))) == {"error": "DROP statements are forbidden"}
    # And the other way round: block_drop wants `query`, which call_api has not.
    assert run(call_api.invoke({"token": "sk-secret", "path": "/v1"})) == "GET /v1 with [REDACTED]"


def test_a_parameter_with_a_default_is_not_required() -> None:
    seen: list[tuple[str, bool]] = []

    def audit(path: str, strict: bool = False) -> None:
        seen.append((path, strict))

    @tool(input_guardrails=[audit])
    def read(path: str) -> str:
        """Read."""
        return path

    assert run(read.invoke({"path": "a.txt"})) == "a.txt"
    assert seen == [("a.txt", False)]


def test_a_guardrail_may_reject_in_its_own_words() -> None:
    def ask_policy(path: str) -> None:
        raise ToolRejected("user said no")

    @tool(input_guardrails=[ask_policy])
    def remove(path: str) -> str:
        """Remove."""
        raise AssertionError("must not run")

    assert str(ToolRejected("user said no")) == "user said no"
    assert isinstance(ToolRejected("x"), ToolInputGuardrailTripped)
    assert json.loads(run(remove.invoke({"path": "a"}))) == {"error": "user said no"}


# -- agent guardrails: (value) or (value, agent) -----------------------------------------------------


def _agent(fake: FakeProvider, **kwargs: object) -> ReActAgent:
    client = OpenAIChatClient(api_key="sk-test", base_url=fake.url, max_retries=0)
    return ReActAgent(client=client, model_name="fake-model", **kwargs)  # type: ignore[arg-type]


def test_agent_guardrails_that_take_the_agent_get_it(fake_provider: FakeProvider) -> None:
    seen: list[tuple[str, object]] = []

    def input_check(value: str, agent: ReActAgent) -> str:
        seen.append(("input", agent))
        return f"[{agent.model_name}] {value}"

    def keyword_only(value: str, *, agent: ReActAgent) -> None:
        seen.append(("keyword", agent))

    def positional(text, who):  # noqa: ANN001, ANN202 - any name for the second parameter
        seen.append(("positional", who))

    def output_check(value: str, agent: ReActAgent) -> str:
        seen.append(("output", agent))
        return value.upper()

    agent = _agent(fake_provider, input_guardrails=[input_check, keyword_only, positional], output_guardrails=[output_check])
    fake_provider.script(openai_text("hello"))
    response, state = run(agent.run_turn(ChatMessage.user_message("hi"), []))
    assert response.content == "HELLO"
    assert fake_provider.requests[0].body["messages"] == [{"role": "user", "content": "[fake-model] hi"}]
    assert seen == [("input", agent), ("keyword", agent), ("positional", agent), ("output", agent)]


def test_agent_guardrails_that_take_the_value_alone_still_work(fake_provider: FakeProvider) -> None:
    def optional_second(value: str, strict: bool = False) -> str:  # a default: not asking for the agent
        assert strict is False
        return value.strip()

    agent = _agent(fake_provider, input_guardrails=[optional_second])
    fake_provider.script(openai_text("ok"))
    assert run(agent.run_turn(ChatMessage.user_message("  hi  "), []))[0].content == "ok"
    assert fake_provider.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]


def test_an_agent_guardrail_blocks_with_the_agent_in_hand(fake_provider: FakeProvider) -> None:
    def on_topic(value: str, agent: ReActAgent) -> None:
        if "weather" not in value:
            raise InputGuardrailTripped(f"{agent.model_name} only talks about the weather")

    def no_shouting(value: str, agent: ReActAgent) -> None:
        if value.isupper():
            raise OutputGuardrailTripped("no shouting")

    agent = _agent(fake_provider, input_guardrails=[on_topic], output_guardrails=[no_shouting])
    with pytest.raises(InputGuardrailTripped, match="fake-model only talks about the weather"):
        run(agent.run_turn(ChatMessage.user_message("stocks?"), []))
    assert fake_provider.requests == []  # the model was never asked
    fake_provider.script(openai_text("SUNNY"))
    with pytest.raises(OutputGuardrailTripped, match="no shouting"):
        run(agent.run_turn(ChatMessage.user_message("weather?"), []))


def test_a_skipped_tool_guardrail_inside_an_agent_turn(fake_provider: FakeProvider) -> None:
    agent = _agent(fake_provider, tools=[execute_sql])
    fake_provider.script(openai_tool_calls(("call_1", "execute_sql", {"query": "SELECT 1"})), openai_text("done"))
    response, _ = run(agent.run_turn(ChatMessage.user_message("run it"), []))
    assert response.content == "done"
    assert tool_messages(fake_provider.requests[1].body) == [
        {"role": "tool", "content": "ran 'SELECT 1' on main within 30s", "tool_call_id": "call_1"}
    ]
