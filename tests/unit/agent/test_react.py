"""``ReActAgent`` in-process, against a scripted OpenAI-protocol server on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest

from motus.agent import ReActAgent
from motus.models import AnthropicChatClient, ChatMessage, ModelError, OpenAIChatClient
from motus.tools import tool
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, anthropic_text, anthropic_tool_use, openai_error, openai_text, openai_tool_calls, tool_messages


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def client(fake: FakeProvider) -> OpenAIChatClient:
    return OpenAIChatClient(api_key="sk-test", base_url=fake.url, max_retries=0)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_loop_state_and_next_turn(fake_provider: FakeProvider) -> None:
    agent = ReActAgent(client=client(fake_provider), model_name="m", system_prompt="You add.", tools=[add])
    fake_provider.script(openai_tool_calls(("c1", "add", {"a": 2, "b": "3"})), openai_text("5"), openai_text("again 5"))

    response, state = run(agent.run_turn(ChatMessage.user_message("2+3?"), []))
    assert response == ChatMessage.assistant_message("5")
    assert [(m.role, m.content) for m in state] == [("user", "2+3?"), ("assistant", None), ("tool", "5"), ("assistant", "5")]
    assert state[2].tool_call_id == "c1" and state[2].name == "add"

    first, second = fake_provider.requests[0].body, fake_provider.requests[1].body
    assert first["messages"][0] == {"role": "system", "content": "You add."}
    assert first["tools"] == [{"type": "function", "function": add.definition()}]
    assert tool_messages(second) == [{"role": "tool", "content": "5", "tool_call_id": "c1"}]

    # The next turn continues the conversation (dicts are accepted as state too).
    _, state2 = run(agent.run_turn({"role": "user", "content": "and again?"}, [m.model_dump() for m in state]))
    third = fake_provider.requests[2].body["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert len(state2) == 6 and all(m.role != "system" for m in state2)


def test_tool_calls_of_one_step_run_concurrently_and_answer_in_call_order(fake_provider: FakeProvider) -> None:
    arrived: list[str] = []
    gate: dict[str, asyncio.Event] = {}  # the event is created inside the turn's loop

    @tool
    async def meet(name: str) -> str:
        """Wait until both calls are running at the same time."""
        arrived.append(name)
        if len(arrived) == 2:
            gate["event"].set()
        # Run one after the other, this would wait forever for the second call.
        await asyncio.wait_for(gate["event"].wait(), timeout=10)
        return f"met {name}"

    async def turn() -> tuple[ChatMessage, list[ChatMessage]]:
        gate["event"] = asyncio.Event()
        agent = ReActAgent(client=client(fake_provider), model_name="m", tools=[meet])
        return await agent.run_turn(ChatMessage.user_message("meet"), [])

    fake_provider.script(openai_tool_calls(("c1", "meet", {"name": "a"}), ("c2", "meet", {"name": "b"})), openai_text("done"))
    _, state = run(turn())
    assert sorted(arrived) == ["a", "b"]
    assert [(m.tool_call_id, m.content) for m in state if m.role == "tool"] == [("c1", "met a"), ("c2", "met b")]


def test_unknown_tool_and_step_limit(fake_provider: FakeProvider) -> None:
    agent = ReActAgent(client=client(fake_provider), model_name="m", tools=[add], max_steps=2)
    fake_provider.script(openai_tool_calls(("c1", "nope", {})), openai_tool_calls(("c2", "add", {"a": 1, "b": 1})))
    response, state = run(agent.run_turn(ChatMessage.user_message("loop"), []))
    assert json.loads(state[2].content or "") == {"error": "Unknown tool 'nope'; available tools: add"}
    assert response.content == "I stopped after 2 steps without reaching a final answer."
    assert [m.role for m in state] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert len(fake_provider.requests) == 2


def test_a_model_error_ends_the_turn(fake_provider: FakeProvider) -> None:
    agent = ReActAgent(client=client(fake_provider), model_name="m")
    fake_provider.script(openai_error("model not found", 404))
    with pytest.raises(ModelError, match="HTTP 404: model not found"):
        run(agent.run_turn(ChatMessage.user_message("hi"), []))


def test_over_the_anthropic_protocol(fake_provider: FakeProvider) -> None:
    agent = ReActAgent(client=AnthropicChatClient(api_key="k", base_url=fake_provider.url), model_name="claude", system_prompt="Add.", tools=[add])
    fake_provider.script(anthropic_tool_use(("toolu_1", "add", {"a": 4, "b": 5})), anthropic_text("9"))
    response, state = run(agent.run_turn(ChatMessage.user_message("4+5"), []))
    assert response.content == "9"
    second = fake_provider.requests[1].body
    assert second["system"] == "Add."
    assert second["messages"][-1] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "9"}]}
    assert [m.role for m in state] == ["user", "assistant", "tool", "assistant"]


def test_duplicate_tool_names_and_bad_max_steps_are_rejected(fake_provider: FakeProvider) -> None:
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ReActAgent(client=client(fake_provider), model_name="m", tools=[add, add])
    with pytest.raises(ValueError, match="max_steps"):
        ReActAgent(client=client(fake_provider), model_name="m", max_steps=0)


def test_plain_functions_are_wrapped_as_tools(fake_provider: FakeProvider) -> None:
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    agent = ReActAgent(client=client(fake_provider), model_name="m", tools=[shout])
    assert agent.tools["shout"].description == "Shout."
