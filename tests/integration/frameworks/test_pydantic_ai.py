"""Pydantic AI agents served by ``motus serve`` (issue 16, item 2).

Real server processes run the agents in ``tests/agents/frameworks/pydantic_ai.py`` with the real
``pydantic-ai-slim`` package; the model is Pydantic AI's OpenAI chat model talking to the
scripted loopback provider, which records every request. What the tools did is counted on
disk in a sandbox directory.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

# Whether the package is installed, found without importing it: an import here would cost
# every test process 1-3 s of CPU at collection, where only the servers need the SDK.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("pydantic_ai") is None, reason="needs the pydantic-ai package: pip install 'motus[pydantic-ai]'")

from tests.conftest import Server  # noqa: E402
from tests.support.fakes.fixtures import fake_provider  # noqa: E402,F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls  # noqa: E402
from tests.integration.frameworks.helpers import (  # noqa: E402
    SharedApp,
    shared_app_fixture,
    module_provider,  # noqa: F401 - fixture
    module_sandbox,  # noqa: F401 - fixture
    check_a_parked_turn_replays_without_the_model_or_a_tool,
    check_an_approval_survives_kill_9,
    agent_env,
    approval,
    interrupted,
    ran,
    refused_start,
    resume_ok,
    sent_messages,
    session_messages,
    start_turn,
    tool_results_of,
    wait_idle,
)

APP = "tests.agents.frameworks.pydantic_ai"
AGENT = f"{APP}:agent"


def serve(start_server: Callable[..., Server], fake: FakeProvider, sandbox: Path, *args: str) -> Server:
    return start_server(AGENT, *args, env=agent_env(sandbox, fake))


shared = shared_app_fixture(AGENT)


def test_approve_runs_the_tool_once_and_the_model_sees_its_result(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_1", "touch", {"path": "a.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch a.txt")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    assert payload == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "a.txt"}}
    assert ran(sandbox, "ran-a.txt") == 0

    fake.script(openai_text("Touched it."))
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    body = wait_idle(server, session_id)
    assert body["response"] == {"role": "assistant", "content": "Touched it."}
    assert ran(sandbox, "ran-a.txt") == 1
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"call_1": "Touched a.txt"}
    messages = session_messages(server, session_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    [call] = messages[1]["tool_calls"]
    assert call["id"] == "call_1" and call["function"]["name"] == "touch"
    assert json.loads(call["function"]["arguments"]) == {"path": "a.txt"}
    assert messages[2] == {"role": "tool", "content": "Touched a.txt", "tool_call_id": "call_1", "name": "touch"}
    assert messages[3] == {"role": "assistant", "content": "Touched it."}


def test_reject_never_runs_the_tool_and_the_model_sees_the_rejection(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_1", "touch", {"path": "b.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch b.txt")
    [(interrupt_id, _)] = approval(interrupted(server, session_id))
    fake.script(openai_text("Understood, I left it."))
    resume_ok(server, session_id, interrupt_id, {"approved": False, "reason": "not today"})
    assert wait_idle(server, session_id)["response"]["content"] == "Understood, I left it."
    assert ran(sandbox, "ran-b.txt") == 0
    assert tool_results_of(fake, 1) == {"call_1": "User rejected touch: not today"}


def test_two_gates_in_one_step_and_edited_arguments(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_a", "touch", {"path": "a.txt"}), ("call_b", "touch", {"path": "b.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch both")
    [(first, a), (second, b)] = approval(interrupted(server, session_id, count=2))
    assert a["tool_args"] == {"path": "a.txt"} and b["tool_args"] == {"path": "b.txt"}

    fake.script(openai_text("One done, one refused."))
    assert resume_ok(server, session_id, second, {"approved": False})["status"] == "interrupted"
    assert ran(sandbox, "ran-a.txt") == 0
    resume_ok(server, session_id, first, {"approved": True, "tool_args": {"path": "c.txt"}})
    wait_idle(server, session_id)
    assert ran(sandbox, "ran-a.txt") == 0 and ran(sandbox, "ran-b.txt") == 0 and ran(sandbox, "ran-c.txt") == 1
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"call_a": "Touched c.txt", "call_b": "User rejected touch"}


def test_a_second_turn_carries_the_first_turns_history(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_1", "lookup", {"topic": "owls"})), openai_text("Owls are birds."))
    server = shared.server()
    session_id = start_turn(server, "tell me about owls")
    assert wait_idle(server, session_id)["response"]["content"] == "Owls are birds."

    fake.script(openai_text("They hunt at night."))
    server.send(session_id, "and what else?")
    assert wait_idle(server, session_id)["response"]["content"] == "They hunt at night."
    second = sent_messages(fake, 2)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert second[1]["content"] == "tell me about owls"
    assert second[2]["tool_calls"][0]["id"] == "call_1" and second[2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert second[3] == {"role": "tool", "tool_call_id": "call_1", "content": "Facts about owls"}
    assert second[4]["content"] == "Owls are birds."
    assert second[5]["content"] == "and what else?"
    assert ran(sandbox, "looked-owls") == 1
    assert [m["role"] for m in session_messages(server, session_id)] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_a_parked_turn_resumes_without_asking_the_model_or_running_a_tool_again(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path, tmp_path: Path
) -> None:
    check_a_parked_turn_replays_without_the_model_or_a_tool(
        lambda *args: serve(start_server, fake_provider, sandbox, *args), fake_provider, sandbox, tmp_path / "s.db"
    )


def test_an_approval_survives_kill_9_and_a_restart_on_sqlite(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path, tmp_path: Path
) -> None:
    check_an_approval_survives_kill_9(
        lambda *args: serve(start_server, fake_provider, sandbox, *args), fake_provider, sandbox, tmp_path / "s.db"
    )


def test_an_agent_with_approval_tools_but_no_deferred_output_is_refused_at_start_up(tmp_path: Path) -> None:
    code, output = refused_start([f"{APP}:wrong"], tmp_path)
    assert code != 0
    assert "requires approval" in output or "require approval" in output, output
    assert "remove" in output and "output_type=[str, DeferredToolRequests]" in output, output
    assert "Traceback" not in output, output
