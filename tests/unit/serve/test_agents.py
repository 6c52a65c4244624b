"""Pure parts: agent shape checks, result validation, ChatMessage, interrupt() outside a worker."""

from __future__ import annotations

import asyncio

import pytest

from motus.models import ChatMessage
from motus.serve.agents import AgentLoadError, check_turn_result, load_agent
from motus.serve.interrupt import interrupt


def test_interrupt_outside_a_worker() -> None:
    with pytest.raises(RuntimeError) as info:
        asyncio.run(interrupt({"type": "x"}))
    assert str(info.value) == "interrupt() called outside motus serve worker subprocess"


def test_chat_message_json_omits_nulls() -> None:
    message = ChatMessage.assistant_message(content="hi")
    assert message.model_dump(mode="json") == {"role": "assistant", "content": "hi"}
    assert ChatMessage.model_validate({"content": "x"}).role == "user"
    tool = ChatMessage.tool_message('{"ok": true}', tool_call_id="call_1", name="f")
    assert tool.model_dump() == {"role": "tool", "content": '{"ok": true}', "tool_call_id": "call_1", "name": "f"}
    with_calls = ChatMessage.model_validate(
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}
    )
    assert with_calls.model_dump(mode="json")["tool_calls"] == [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]


def test_check_turn_result() -> None:
    reply = ChatMessage.assistant_message("ok")
    assert check_turn_result((reply, [reply])) == (reply, [reply])
    response, state = check_turn_result(({"role": "assistant", "content": "d"}, [{"content": "u"}]))
    assert response.content == "d" and state[0].role == "user"
    with pytest.raises(TypeError, match="Agent returned str 'nope'"):
        check_turn_result("nope")
    with pytest.raises(TypeError, match="as the response"):
        check_turn_result((5, []))
    with pytest.raises(TypeError, match="as the new state"):
        check_turn_result((reply, "x"))
    with pytest.raises(TypeError, match=r"new state\[1\]"):
        check_turn_result((reply, [reply, 3]))


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("no_colon", "must look like"),
        (":attr", "must look like"),
        ("tests.agents:", "must look like"),
        ("tests.not_there:x", "Could not import module"),
        ("tests.agents:nothing", "has no attribute"),
        ("tests.agents:asyncio", "not an agent"),
    ],
)
def test_load_agent_errors(path: str, needle: str) -> None:
    with pytest.raises(AgentLoadError, match=needle):
        load_agent(path)


def test_load_agent_accepts_every_shape() -> None:
    assert callable(load_agent("tests.agents:echo"))
    assert callable(load_agent("tests.agents:sync_echo"))
    assert hasattr(load_agent("tests.agents:counting"), "run_turn")
