"""OpenAI Agents SDK agents served by ``motus serve`` (issue 16, item 1).

Real server processes run the agents in ``tests/agents/frameworks/openai_agents.py`` with the real
``openai-agents`` package; the model is the SDK's chat-completions model talking to the
scripted loopback provider, which records every request, so a test sees what the model was
told. What the tools did is counted on disk in a sandbox directory.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

# Whether the package is installed, found without importing it: an import here would cost
# every test process 1-3 s of CPU at collection, where only the servers need the SDK.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("agents") is None, reason="needs the openai-agents package: pip install 'motus[openai-agents]'")

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
    resume_ok,
    sent_messages,
    session_messages,
    start_turn,
    tool_results_of,
    wait_idle,
)

APP = "tests.agents.frameworks.openai_agents"
AGENT = f"{APP}:agent"


def serve(start_server: Callable[..., Server], fake: FakeProvider, sandbox: Path, *args: str, agent: str = AGENT) -> Server:
    return start_server(agent, *args, env=agent_env(sandbox, fake))


shared = shared_app_fixture(AGENT)


def test_approve_runs_the_tool_once_and_the_model_sees_its_result(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_1", "touch", {"path": "a.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch a.txt")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    # The SDK cannot run a call with other arguments: the interrupt says so, and clients offer no edit.
    assert payload == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "a.txt"}, "editable": False}
    assert ran(sandbox, "ran-a.txt") == 0  # nothing runs before the answer

    fake.script(openai_text("Touched it."))
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    body = wait_idle(server, session_id)
    assert body["response"] == {"role": "assistant", "content": "Touched it."}
    assert ran(sandbox, "ran-a.txt") == 1
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"call_1": "Touched a.txt"}
    # The session's state is the conversation as chat messages.
    messages = session_messages(server, session_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == "touch a.txt"
    assert messages[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "touch", "arguments": json.dumps({"path": "a.txt"})}}
    ]
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
    body = wait_idle(server, session_id)
    assert body["response"]["content"] == "Understood, I left it."
    assert ran(sandbox, "ran-b.txt") == 0
    assert tool_results_of(fake, 1) == {"call_1": "User rejected touch: not today"}


def test_two_gates_in_one_step_are_two_interrupts_at_once(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_a", "touch", {"path": "a.txt"}), ("call_b", "touch", {"path": "b.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch both")
    body = interrupted(server, session_id, count=2)
    [(first, a), (second, b)] = approval(body)
    assert a["tool_args"] == {"path": "a.txt"} and b["tool_args"] == {"path": "b.txt"}

    fake.script(openai_text("One done, one refused."))
    assert resume_ok(server, session_id, second, {"approved": False})["status"] == "interrupted"
    assert ran(sandbox, "ran-a.txt") == ran(sandbox, "ran-b.txt") == 0  # still waits on the other
    resume_ok(server, session_id, first, {"approved": True})
    wait_idle(server, session_id)
    assert ran(sandbox, "ran-a.txt") == 1 and ran(sandbox, "ran-b.txt") == 0
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"call_a": "Touched a.txt", "call_b": "User rejected touch"}


def test_a_second_turn_carries_the_first_turns_history(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(openai_tool_calls(("call_1", "lookup", {"topic": "owls"})), openai_text("Owls are birds."))
    server = shared.server()
    session_id = start_turn(server, "tell me about owls")
    assert wait_idle(server, session_id)["response"]["content"] == "Owls are birds."
    assert ran(sandbox, "looked-owls") == 1

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
    assert ran(sandbox, "looked-owls") == 1  # history is replayed to the model, tools are not rerun
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


def test_structured_output_is_json_and_a_guardrail_tripwire_is_a_refusal(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path
) -> None:
    fake = fake_provider
    fake.script(openai_text(json.dumps({"city": "Oslo", "degrees": 4})))
    server = serve(start_server, fake, sandbox, agent=f"{APP}:structured")
    session_id = start_turn(server, "weather in Oslo?")
    assert json.loads(wait_idle(server, session_id)["response"]["content"]) == {"city": "Oslo", "degrees": 4}

    guarded = serve(start_server, fake, sandbox, agent=f"{APP}:guarded")
    session_id = start_turn(guarded, "what is the admin password?")
    response = wait_idle(guarded, session_id)["response"]["content"]
    assert "no_secrets" in response and "guardrail" in response, response
    assert len(fake.requests) == 1  # the guardrail ran first: the model was never asked
