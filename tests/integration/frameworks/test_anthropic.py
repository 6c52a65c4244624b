"""Anthropic SDK tool runners served by ``motus serve`` (issue 16, item 3): ``motus.anthropic``.

Real server processes run the runners in ``tests/agents/frameworks/anthropic.py`` with the real ``anthropic``
package; the model is the SDK's client talking to the scripted loopback provider (Messages
API), which records every request. What the tools did is counted on disk in a sandbox directory.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

# Whether the package is installed, found without importing it: an import here would cost
# every test process 1-3 s of CPU at collection, where only the servers need the SDK.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("anthropic") is None, reason="needs the anthropic package: pip install 'motus[anthropic]'")

from tests.conftest import Server  # noqa: E402
from tests.support.fakes.fixtures import fake_provider  # noqa: E402,F401 - fixture
from tests.support.fakes.providers import FakeProvider, anthropic_text, anthropic_tool_use  # noqa: E402
from tests.integration.serve.durability.test_durability import assert_parked  # noqa: E402
from tests.integration.frameworks.helpers import (  # noqa: E402
    SharedApp,
    shared_app_fixture,
    module_provider,  # noqa: F401 - fixture
    module_sandbox,  # noqa: F401 - fixture
    agent_env,
    approval,
    interrupted,
    kill_server,
    ran,
    refused_start,
    resume_ok,
    session_messages,
    start_turn,
    store_url,
    wait_idle,
)

APP = "tests.agents.frameworks.anthropic"


def serve(start_server: Callable[..., Server], fake: FakeProvider, sandbox: Path, *args: str, name: str = "runner") -> Server:
    return start_server(f"{APP}:{name}", *args, env=agent_env(sandbox, fake))


shared = shared_app_fixture(f"{APP}:runner")


def sent(fake: FakeProvider, index: int) -> list[dict]:
    """The Messages API messages of model request ``index``."""
    request = fake.requests[index]
    assert request.path.startswith("/v1/messages"), request.path
    return request.body["messages"]


def tool_results_of(fake: FakeProvider, index: int) -> dict[str, tuple[str, bool]]:
    """``tool_use_id -> (content, is_error)`` of the tool results the model got in request ``index``."""
    results = {}
    for message in sent(fake, index):
        if message["role"] == "user" and isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_result":
                    results[block["tool_use_id"]] = (block["content"], bool(block.get("is_error")))
    return results


def test_approve_runs_the_tool_once_and_the_model_sees_its_result(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(anthropic_tool_use(("toolu_1", "touch", {"path": "a.txt"}), text="I'll touch it."))
    server = shared.server()
    session_id = start_turn(server, "touch a.txt")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    assert payload == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "a.txt"}}
    assert ran(sandbox, "ran-a.txt") == 0
    first = fake.requests[0]
    assert first.body["model"] == "claude-fake" and first.body["system"] == "You manage files." and first.body["max_tokens"] == 512
    assert {tool["name"] for tool in first.body["tools"]} == {"touch", "lookup"}
    assert first.body["messages"] == [{"role": "user", "content": "touch a.txt"}]
    assert "anthropic-version" in first.headers  # the real SDK's Messages API request
    assert "sk-ant-test-key" in first.headers.get("x-api-key", "") + first.headers.get("authorization", "")

    fake.script(anthropic_text("Touched it."))
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    body = wait_idle(server, session_id)
    assert body["response"] == {"role": "assistant", "content": "Touched it."}
    assert ran(sandbox, "ran-a.txt") == 1
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"toolu_1": ("Touched a.txt", False)}
    assert sent(fake, 1)[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "I'll touch it."}, {"type": "tool_use", "id": "toolu_1", "name": "touch", "input": {"path": "a.txt"}}],
    }
    messages = session_messages(server, session_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == "I'll touch it."
    [call] = messages[1]["tool_calls"]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "touch"
    assert json.loads(call["function"]["arguments"]) == {"path": "a.txt"}
    assert messages[2] == {"role": "tool", "content": "Touched a.txt", "tool_call_id": "toolu_1", "name": "touch"}
    assert messages[3] == {"role": "assistant", "content": "Touched it."}


def test_reject_never_runs_the_tool_and_the_model_sees_the_rejection(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(anthropic_tool_use(("toolu_1", "touch", {"path": "b.txt"})))
    server = shared.server()
    session_id = start_turn(server, "touch b.txt")
    [(interrupt_id, _)] = approval(interrupted(server, session_id))
    fake.script(anthropic_text("Understood, I left it."))
    resume_ok(server, session_id, interrupt_id, {"approved": False, "reason": "not today"})
    assert wait_idle(server, session_id)["response"]["content"] == "Understood, I left it."
    assert ran(sandbox, "ran-b.txt") == 0
    assert tool_results_of(fake, 1) == {"toolu_1": ("User rejected touch: not today", True)}
    messages = session_messages(server, session_id)
    assert messages[2] == {"role": "tool", "content": "User rejected touch: not today", "tool_call_id": "toolu_1", "name": "touch"}


def test_two_gates_in_one_step_an_ungated_tool_and_edited_arguments(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(
        anthropic_tool_use(
            ("toolu_a", "touch", {"path": "a.txt"}), ("toolu_l", "lookup", {"topic": "owls"}), ("toolu_b", "touch", {"path": "b.txt"})
        )
    )
    server = shared.server()
    session_id = start_turn(server, "touch both")
    [(first, a), (second, b)] = approval(interrupted(server, session_id, count=2))
    assert a["tool_args"] == {"path": "a.txt"} and b["tool_args"] == {"path": "b.txt"}
    assert ran(sandbox, "looked-owls") == 0  # tools run after the reply's approvals are all in

    fake.script(anthropic_text("One done, one refused."))
    assert resume_ok(server, session_id, second, {"approved": False})["status"] == "interrupted"
    assert ran(sandbox, "ran-a.txt") == 0 and ran(sandbox, "looked-owls") == 0
    resume_ok(server, session_id, first, {"approved": True, "tool_args": {"path": "c.txt"}})
    assert wait_idle(server, session_id)["response"]["content"] == "One done, one refused."
    assert ran(sandbox, "ran-a.txt") == 0 and ran(sandbox, "ran-b.txt") == 0 and ran(sandbox, "ran-c.txt") == 1
    assert ran(sandbox, "looked-owls") == 1
    assert len(fake.requests) == 2
    [results] = [m["content"] for m in sent(fake, 1)[2:] if m["role"] == "user"]
    assert [block["tool_use_id"] for block in results] == ["toolu_a", "toolu_l", "toolu_b"]  # the model's order, one message
    assert tool_results_of(fake, 1) == {
        "toolu_a": ("Touched c.txt", False),
        "toolu_l": ("Facts about owls", False),
        "toolu_b": ("User rejected touch", True),
    }


def test_approval_by_name_on_the_runner_with_the_sync_client(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path
) -> None:
    fake = fake_provider
    fake.script(anthropic_tool_use(("toolu_1", "lookup", {"topic": "owls"})))
    server = serve(start_server, fake, sandbox, name="by_name")
    session_id = start_turn(server, "owls?")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    assert payload == {"type": "tool_approval", "tool_name": "lookup", "tool_args": {"topic": "owls"}}
    fake.script(anthropic_text("Owls are birds."))
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    assert wait_idle(server, session_id)["response"]["content"] == "Owls are birds."
    assert ran(sandbox, "looked-owls") == 1
    assert tool_results_of(fake, 1) == {"toolu_1": ("Facts about owls", False)}
    assert "system" not in fake.requests[0].body and fake.requests[0].body["max_tokens"] == 1024


def test_a_second_turn_carries_the_first_turns_history(shared: SharedApp) -> None:
    fake, sandbox = shared.fake, shared.sandbox
    fake.script(anthropic_tool_use(("toolu_1", "lookup", {"topic": "owls"})), anthropic_text("Owls are birds."))
    server = shared.server()
    session_id = start_turn(server, "tell me about owls")
    assert wait_idle(server, session_id)["response"]["content"] == "Owls are birds."

    fake.script(anthropic_text("They hunt at night."))
    server.send(session_id, "and what else?")
    assert wait_idle(server, session_id)["response"]["content"] == "They hunt at night."
    assert sent(fake, 2) == [
        {"role": "user", "content": "tell me about owls"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"topic": "owls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Facts about owls"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Owls are birds."}]},
        {"role": "user", "content": "and what else?"},
    ]
    assert ran(sandbox, "looked-owls") == 1
    assert [m["role"] for m in session_messages(server, session_id)] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_a_parked_turn_resumes_without_asking_the_model_or_running_a_tool_again(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path, tmp_path: Path
) -> None:
    fake = fake_provider
    fake.script(
        anthropic_tool_use(("toolu_1", "lookup", {"topic": "logs"})),
        anthropic_tool_use(("toolu_2", "touch", {"path": "logs.txt"})),
    )
    server = serve(start_server, fake, sandbox, "--store", store_url(tmp_path / "s.db"), "--park-after", "0")
    session_id = start_turn(server, "look up logs, then touch logs.txt")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    assert payload["tool_args"] == {"path": "logs.txt"}
    assert ran(sandbox, "looked-logs") == 1 and len(fake.requests) == 2
    assert_parked(server, sandbox)  # the worker is gone: the resume replays the turn

    fake.script(anthropic_text("All done."))
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    assert wait_idle(server, session_id)["response"]["content"] == "All done."
    assert len(fake.requests) == 3
    assert ran(sandbox, "looked-logs") == 1 and ran(sandbox, "ran-logs.txt") == 1
    assert tool_results_of(fake, 2) == {"toolu_1": ("Facts about logs", False), "toolu_2": ("Touched logs.txt", False)}


def test_an_approval_survives_kill_9_and_a_restart_on_sqlite(
    start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path, tmp_path: Path
) -> None:
    fake = fake_provider
    fake.script(anthropic_tool_use(("toolu_a", "touch", {"path": "a.txt"}), ("toolu_b", "touch", {"path": "b.txt"})))
    args = ("--store", store_url(tmp_path / "s.db"))
    first = serve(start_server, fake, sandbox, *args)
    session_id = start_turn(first, "touch both")
    before = interrupted(first, session_id, count=2)["interrupts"]
    kill_server(first)

    second = serve(start_server, fake, sandbox, *args)
    body = second.get(f"/sessions/{session_id}").json()
    assert body["status"] == "interrupted" and body["interrupts"] == before, body
    [(first_id, _), (second_id, _)] = approval(body)
    fake.script(anthropic_text("Both touched."))
    resume_ok(second, session_id, first_id, {"approved": True})
    resume_ok(second, session_id, second_id, {"approved": True})
    assert wait_idle(second, session_id)["response"]["content"] == "Both touched."
    assert ran(sandbox, "ran-a.txt") == 1 and ran(sandbox, "ran-b.txt") == 1
    assert len(fake.requests) == 2
    assert tool_results_of(fake, 1) == {"toolu_a": ("Touched a.txt", False), "toolu_b": ("Touched b.txt", False)}


def test_a_runner_gating_a_tool_it_does_not_have_is_refused_at_start_up(tmp_path: Path) -> None:
    code, output = refused_start(["tests.agents.frameworks.anthropic_wrong:runner"], tmp_path)
    assert code != 0
    assert "requires_approval" in output and "'remove'" in output and "'lookup'" in output, output
    assert "Traceback" not in output, output


def test_the_example_asks_before_deleting_notes(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """``examples/anthropic/notes_agent.py`` works offline as its doc says (issue 16, item 6),
    like the other framework examples in ``test_examples.py``."""
    notes = tmp_path / "notes"  # missing: the example creates it with its sample notes
    env = {"MOTUS_EXAMPLE_DIR": str(notes), "MOTUS_EXAMPLE_OFFLINE": "1", "ANTHROPIC_API_KEY": ""}
    server = start_server("examples.anthropic.notes_agent:agent", env=env)
    assert "using the offline scripted model because MOTUS_EXAMPLE_OFFLINE is set" in server.log()  # says so at start
    session_id = start_turn(server, "delete groceries and todo")
    [(groceries, first), (todo, second)] = approval(interrupted(server, session_id, count=2))
    assert first == {"type": "tool_approval", "tool_name": "delete_note", "tool_args": {"name": "groceries"}}
    assert second == {"type": "tool_approval", "tool_name": "delete_note", "tool_args": {"name": "todo"}}
    assert not notes.exists()  # no tool ran yet (the first tool that runs creates the samples)

    resume_ok(server, session_id, todo, {"approved": False, "reason": "still need it"})
    resume_ok(server, session_id, groceries, {"approved": True})
    response = wait_idle(server, session_id)["response"]["content"]
    assert response == "delete_note: Deleted groceries; delete_note: User rejected delete_note: still need it"
    assert not (notes / "groceries.txt").exists() and (notes / "todo.txt").exists()

    server.send(session_id, "list")
    assert wait_idle(server, session_id)["response"]["content"] == "list_notes: ideas, todo"
    roles = [m["role"] for m in session_messages(server, session_id)]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool", "assistant"]
