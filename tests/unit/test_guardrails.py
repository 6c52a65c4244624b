"""Guardrail chains (tool and agent level) and the approval gate's reading of resume values."""

from __future__ import annotations

import asyncio
import json

import pytest

from motus.agent import ReActAgent
from motus.guardrails import (
    InputGuardrailTripped,
    OutputGuardrailTripped,
    ToolInputGuardrailTripped,
    ToolOutputGuardrailTripped,
    run_tool_input_guardrails,
    run_tool_output_guardrails,
)
from motus.models import ChatMessage, OpenAIChatClient
from motus.tools import ToolRejected, tool
from motus.tools.approval import ApprovalDecision, parse_approval
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls, tool_messages


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_input_guardrail_receives_only_the_parameters_it_declares() -> None:
    seen: list[dict] = []

    def only_path(path: str) -> None:
        seen.append({"path": path})

    def everything(**kwargs: object) -> None:
        seen.append(dict(kwargs))

    result = run(run_tool_input_guardrails([only_path, everything], {"path": "a", "force": True}))
    assert result == {"path": "a", "force": True}
    assert seen == [{"path": "a"}, {"path": "a", "force": True}]


def test_input_chain_runs_in_order_each_seeing_the_previous_patch() -> None:
    def lower(path: str) -> dict:
        return {"path": path.lower()}

    async def prefix(path: str) -> dict:
        return {"path": "safe/" + path}

    assert run(run_tool_input_guardrails([lower, prefix], {"path": "A.TXT"})) == {"path": "safe/a.txt"}
    assert run(run_tool_input_guardrails([prefix, lower], {"path": "A.TXT"})) == {"path": "safe/a.txt"}


def test_input_guardrail_must_return_none_or_a_dict() -> None:
    with pytest.raises(TypeError, match="return None to pass, a dict to patch"):
        run(run_tool_input_guardrails([lambda: "yes"], {}))


def test_output_chain_replaces_in_order() -> None:
    assert run(run_tool_output_guardrails([lambda r: r + "!", lambda r: None, lambda r: r.upper()], "ok")) == "OK!"


def test_tool_guardrails_patch_block_and_replace_through_invoke() -> None:
    calls: list[str] = []

    def no_secrets(path: str) -> None:
        if "secret" in path:
            raise ToolInputGuardrailTripped(f"{path} is off limits")

    def normalise(path: str) -> dict:
        return {"path": path.strip("/")}

    async def redact(result: str) -> str | None:
        return result.replace("password", "********") if "password" in result else None

    def no_empty(result: str) -> None:
        if not result:
            raise ToolOutputGuardrailTripped("empty result")

    @tool(input_guardrails=[normalise, no_secrets], output_guardrails=[redact, no_empty])
    def read(path: str) -> str:
        """Read."""
        calls.append(path)
        return {"notes": "password=1", "empty": ""}.get(path, "text")

    assert run(read.invoke({"path": "/notes/"})) == "********=1"
    assert json.loads(run(read.invoke({"path": "secret"}))) == {"error": "secret is off limits"}
    assert json.loads(run(read.invoke({"path": "empty"}))) == {"error": "empty result"}
    assert calls == ["notes", "empty"]  # the blocked call never ran


def test_a_patch_is_validated_again() -> None:
    @tool(input_guardrails=[lambda count: {"count": "seven"}])
    def count_to(count: int) -> int:
        """Count."""
        return count

    assert json.loads(run(count_to.invoke({"count": 1}))) == {"error": "Invalid arguments for count_to: count: Input should be a valid integer, unable to parse string as an integer"}


def test_requires_approval_predicate_false_runs_without_asking() -> None:
    """A callable ``requires_approval`` that says no never reaches ``interrupt()``."""

    @tool(requires_approval=lambda path: path.startswith("/"))
    def delete(path: str) -> str:
        """Delete."""
        return f"deleted {path}"

    assert run(delete.invoke({"path": "scratch.txt"})) == "deleted scratch.txt"
    with pytest.raises(RuntimeError, match="outside motus serve worker"):  # yes -> it tries to ask
        run(delete.invoke({"path": "/etc/passwd"}))


@pytest.mark.parametrize(
    ("value", "decision"),
    [
        ({"approved": True}, ApprovalDecision(approved=True)),
        ({"approved": True, "tool_args": {"path": "b"}}, ApprovalDecision(approved=True, tool_args={"path": "b"})),
        ({"approved": False}, ApprovalDecision(approved=False)),
        ({"approved": False, "reason": " keep it "}, ApprovalDecision(approved=False, reason="keep it")),
        ({"approved": False, "reason": 42}, ApprovalDecision(approved=False)),
        ({}, ApprovalDecision(approved=False)),
        ({"approved": "true"}, ApprovalDecision(approved=False)),
        ({"approved": 1}, ApprovalDecision(approved=False)),
        ("yes", ApprovalDecision(approved=False)),
        (None, ApprovalDecision(approved=False)),
        ([True], ApprovalDecision(approved=False)),
        ({"approved": True, "tool_args": "path=b"}, ApprovalDecision(approved=False, reason="the approval's edited arguments were not an object")),
    ],
)
def test_resume_values_of_any_shape_are_read_safely(value: object, decision: ApprovalDecision) -> None:
    assert parse_approval(value) == decision


def test_tool_rejected_message() -> None:
    assert str(ToolRejected("user said no")) == "user said no"
    assert str(ToolRejected.by_user("delete_file")) == "User rejected delete_file"
    assert str(ToolRejected.by_user("delete_file", "not that one")) == "User rejected delete_file: not that one"
    assert ToolRejected.by_user("delete_file", "why").tool_name == "delete_file"
    assert isinstance(ToolRejected("x"), ToolInputGuardrailTripped)


# -- agent-level guardrails, through a real HTTP provider on loopback -------------------------


def _agent(fake: FakeProvider, **kwargs: object) -> ReActAgent:
    client = OpenAIChatClient(api_key="sk-test", base_url=fake.url, max_retries=0)
    return ReActAgent(client=client, model_name="fake-model", **kwargs)  # type: ignore[arg-type]


def test_agent_input_guardrail_rewrites_or_blocks_before_the_model(fake_provider: FakeProvider) -> None:
    def no_passwords(text: str) -> None:
        if "password" in text:
            raise InputGuardrailTripped("Do not share passwords")

    agent = _agent(fake_provider, input_guardrails=[lambda text: text.strip(), no_passwords])
    fake_provider.script(openai_text("hello"))
    response, state = run(agent.run_turn(ChatMessage.user_message("  hi  "), []))
    assert response.content == "hello"
    assert fake_provider.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]
    assert [m.content for m in state] == ["hi", "hello"]

    with pytest.raises(InputGuardrailTripped, match="Do not share passwords"):
        run(agent.run_turn(ChatMessage.user_message("my password is x"), state))
    assert len(fake_provider.requests) == 1  # the model was never asked


def test_agent_output_guardrail_rewrites_or_blocks_the_answer(fake_provider: FakeProvider) -> None:
    def no_swearing(text: str) -> None:
        if "darn" in text:
            raise OutputGuardrailTripped("impolite answer")

    agent = _agent(fake_provider, output_guardrails=[lambda text: text.replace("Hi", "Hello"), no_swearing])
    fake_provider.script(openai_text("Hi there"), openai_text("darn"))
    response, state = run(agent.run_turn(ChatMessage.user_message("hi"), []))
    assert response.content == "Hello there" and state[-1].content == "Hello there"
    with pytest.raises(OutputGuardrailTripped, match="impolite answer"):
        run(agent.run_turn(ChatMessage.user_message("again"), state))


def test_a_tripped_tool_guardrail_reaches_the_model_as_an_error(fake_provider: FakeProvider) -> None:
    def block(path: str) -> None:
        raise ToolInputGuardrailTripped(f"{path} is protected")

    @tool(input_guardrails=[block])
    def remove(path: str) -> str:
        """Remove."""
        raise AssertionError("must not run")

    agent = _agent(fake_provider, tools=[remove])
    fake_provider.script(openai_tool_calls(("call_1", "remove", {"path": "etc"})), openai_text("I could not remove it."))
    response, state = run(agent.run_turn(ChatMessage.user_message("remove etc"), []))
    assert response.content == "I could not remove it."
    assert tool_messages(fake_provider.requests[1].body) == [
        {"role": "tool", "content": json.dumps({"error": "etc is protected"}), "tool_call_id": "call_1"}
    ]
    assert [m.role for m in state] == ["user", "assistant", "tool", "assistant"]
