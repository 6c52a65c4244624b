"""A served ``ReActAgent`` over real model clients: approval gates, questions, errors.

Every test starts a real ``motus serve`` process whose agent (``tests.agents.tool``)
talks HTTP to a scripted fake provider that this test process runs on loopback. The
fake records each request, so a test can read exactly what the model was told after a
person approved, rejected, edited or answered.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.serving.hitl_agent import ORGANIZE_QUESTION, SAMPLE_FILES
from tests.conftest import Server, wait_until
from tests.support.fakes.providers import (
    FakeProvider,
    Reply,
    anthropic_text,
    anthropic_tool_use,
    openai_error,
    openai_text,
    openai_tool_calls,
    tool_messages,
)

KEY = "sk-test-key-never-shown"


@dataclass
class Served:
    server: Server
    fake: FakeProvider | None
    sandbox: Path

    def turn(self, text: str, session_id: str | None = None) -> tuple[str, dict]:
        """Send ``text`` (to a new session unless given) and long-poll until it is not running."""
        sid = session_id or self.server.create_session()
        self.server.send(sid, text)
        return sid, self.settle(sid)

    def settle(self, sid: str) -> dict:
        body = self.server.wait(sid, timeout=30)
        assert body["status"] != "running", body
        return body

    def all_interrupts(self, sid: str, count: int) -> dict:
        """The session once ``count`` interrupts are pending (they arrive one by one)."""

        def pending() -> dict | None:
            body = self.server.get(f"/sessions/{sid}").json()
            return body if len(body.get("interrupts") or []) >= count else None

        body = wait_until(pending, timeout=20, interval=0.02, what=f"{count} pending interrupts")
        assert body["status"] == "interrupted" and len(body["interrupts"]) == count, body
        return body

    def resume(self, sid: str, interrupt_id: str, value: object) -> dict:
        response = self.server.post(f"/sessions/{sid}/resume", json={"interrupt_id": interrupt_id, "value": value})
        assert response.status_code == 200, response.text
        return response.json()

    def messages(self, sid: str) -> list[dict]:
        response = self.server.get(f"/sessions/{sid}/messages")
        assert response.status_code == 200, response.text
        return response.json()


def _seed(sandbox: Path) -> None:
    for name, text in SAMPLE_FILES.items():
        (sandbox / name).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / name).write_text(text)


@pytest.fixture(scope="module")
def module_provider() -> Iterator[FakeProvider]:
    """One fake provider for the module's shared servers (their environment names its URL)."""
    with FakeProvider() as fake:
        yield fake


@pytest.fixture(scope="module")
def module_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("react") / "sandbox"


@pytest.fixture
def serve(shared_server: Callable[..., Server], module_provider: FakeProvider, module_sandbox: Path) -> Callable[[str], Served]:
    """One server per agent for the module. Each test starts as if on a server of its own:
    the sandbox seeded afresh, the fake provider with no request recorded and no reply
    queued (the tests before it waited for their turns to end)."""
    fake, sandbox = module_provider, module_sandbox
    shutil.rmtree(sandbox, ignore_errors=True)
    _seed(sandbox)
    with fake._lock:  # FakeProvider has no reset of its own
        fake._script.clear()
        fake.requests.clear()

    def start(agent: str = "tests.agents.tool:files_openai") -> Served:
        env = {
            "MOTUS_TEST_PROVIDER_URL": fake.url,
            "MOTUS_TEST_PROVIDER_KEY": KEY,
            "MOTUS_EXAMPLE_DIR": str(sandbox),
            "OPENROUTER_API_KEY": "",
        }
        server = shared_server(agent, "--workers", "2", "--shutdown-timeout", "5", env=env)
        return Served(server, fake, sandbox)

    return start


def only_interrupt(body: dict) -> dict:
    assert body["status"] == "interrupted", body
    assert len(body["interrupts"]) == 1, body
    return body["interrupts"][0]


def test_approved_call_runs_the_tool_and_the_conversation_continues(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(openai_tool_calls(("call_1", "delete_file", {"path": "old_logs.txt"})), openai_text("Deleted it."), openai_text("You are welcome."))
    sid, body = s.turn("delete the old logs file")

    pending = only_interrupt(body)
    assert pending["type"] == "tool_approval"
    assert pending["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "old_logs.txt"}}
    assert (s.sandbox / "old_logs.txt").exists()  # nothing runs before the person answers

    s.resume(sid, pending["interrupt_id"], {"approved": True})
    body = s.settle(sid)
    assert body["status"] == "idle" and body["response"]["content"] == "Deleted it."
    assert not (s.sandbox / "old_logs.txt").exists()
    assert tool_messages(s.fake.requests[1].body) == [{"role": "tool", "content": "Deleted old_logs.txt", "tool_call_id": "call_1"}]
    assert [m["role"] for m in s.messages(sid)] == ["user", "assistant", "tool", "assistant"]

    _, body = s.turn("thanks", sid)
    assert body["response"]["content"] == "You are welcome."
    assert [m["role"] for m in s.fake.requests[2].body["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert s.fake.requests[0].headers["authorization"] == f"Bearer {KEY}"


REJECTIONS = [
    ({"approved": False}, "User rejected delete_file"),
    ({"approved": False, "reason": "keep it for the audit"}, "User rejected delete_file: keep it for the audit"),
    ({}, "User rejected delete_file"),  # approved missing
    ("yes", "User rejected delete_file"),  # not an object
    ({"approved": "true"}, "User rejected delete_file"),  # approved not a bool
    ({"approved": True, "tool_args": "path=notes.txt"}, "User rejected delete_file: the approval's edited arguments were not an object"),
]


def test_rejections_of_every_shape_reach_the_model_as_a_tool_error(serve: Callable[..., Served]) -> None:
    s = serve()
    for number, (value, error) in enumerate(REJECTIONS):
        s.fake.script(openai_tool_calls(("call_1", "delete_file", {"path": "old_logs.txt"})), openai_text("OK, I kept it."))
        sid, body = s.turn("delete the old logs file")
        s.resume(sid, only_interrupt(body)["interrupt_id"], value)
        body = s.settle(sid)
        assert body["status"] == "idle" and body["response"]["content"] == "OK, I kept it.", value
        assert (s.sandbox / "old_logs.txt").exists()
        second_request = s.fake.requests[2 * number + 1].body
        assert tool_messages(second_request) == [{"role": "tool", "content": json.dumps({"error": error}), "tool_call_id": "call_1"}], value


def test_edited_arguments_run_and_the_model_is_told(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(openai_tool_calls(("call_1", "delete_file", {"path": "old_logs.txt"})), openai_text("Deleted notes instead."))
    sid, body = s.turn("delete the old logs file")
    s.resume(sid, only_interrupt(body)["interrupt_id"], {"approved": True, "tool_args": {"path": "notes.txt"}})
    assert s.settle(sid)["status"] == "idle"
    assert (s.sandbox / "old_logs.txt").exists() and not (s.sandbox / "notes.txt").exists()
    [message] = tool_messages(s.fake.requests[1].body)
    told = json.loads(message["content"])
    assert told["tool_args"] == {"path": "notes.txt"}
    assert told["result"] == "Deleted notes.txt"
    assert "edited" in told["note"]

    # Edited arguments that do not fit the schema are an error for the model, not a crash.
    s.fake.script(openai_tool_calls(("call_2", "delete_file", {"path": "old_logs.txt"})), openai_text("Hm."))
    sid, body = s.turn("delete the old logs file")
    s.resume(sid, only_interrupt(body)["interrupt_id"], {"approved": True, "tool_args": {"path": ["not", "a", "string"]}})
    assert s.settle(sid)["status"] == "idle"
    assert (s.sandbox / "old_logs.txt").exists()
    [message] = tool_messages(s.fake.requests[3].body)
    assert json.loads(message["content"])["error"].startswith("Invalid arguments for delete_file (as edited by the user): path:")


def test_ask_user_question_pauses_for_valid_questions_only(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(openai_tool_calls(("call_q", "ask_user_question", {"questions": [ORGANIZE_QUESTION]})), openai_text("By date it is."))
    sid, body = s.turn("help me clean up my downloads folder")
    pending = only_interrupt(body)
    assert pending["type"] == "user_input"
    assert pending["payload"] == {"type": "user_input", "questions": [ORGANIZE_QUESTION]}
    answers = {"answers": {"How would you like to organize the files?": "By date"}}
    s.resume(sid, pending["interrupt_id"], answers)
    body = s.settle(sid)
    assert body["status"] == "idle" and body["response"]["content"] == "By date it is."
    [message] = tool_messages(s.fake.requests[1].body)
    assert json.loads(message["content"]) == answers

    # An invalid question set goes back to the model without pausing.
    bad = {"questions": [{"question": "Which?", "header": "Pick", "options": [{"label": "Only", "description": "one option"}]}]}
    s.fake.script(openai_tool_calls(("call_q", "ask_user_question", bad)), openai_text("Let me ask properly."))
    _, body = s.turn("help me organize")
    # A pause would leave the session interrupted; it went straight to idle.
    assert body["status"] == "idle" and body["interrupts"] is None, body
    [message] = tool_messages(s.fake.requests[3].body)
    assert "questions.0.options: List should have at least 2 items" in json.loads(message["content"])["error"]


def test_two_gated_tools_in_one_step_are_two_concurrent_interrupts(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(
        openai_tool_calls(
            ("call_d", "delete_file", {"path": "old_logs.txt"}),
            ("call_m", "move_file", {"source": "notes.txt", "destination": "archive/notes.txt"}),
        ),
        openai_text("Both handled."),
    )
    sid, body = s.turn("delete and move both")
    body = s.all_interrupts(sid, 2)
    by_tool = {i["payload"]["tool_name"]: i for i in body["interrupts"]}
    assert set(by_tool) == {"delete_file", "move_file"}  # both pending at once: the calls run concurrently

    assert s.resume(sid, by_tool["move_file"]["interrupt_id"], {"approved": True})["status"] == "interrupted"
    s.resume(sid, by_tool["delete_file"]["interrupt_id"], {"approved": False})
    assert s.settle(sid)["status"] == "idle"
    assert (s.sandbox / "archive" / "notes.txt").exists() and (s.sandbox / "old_logs.txt").exists()
    assert tool_messages(s.fake.requests[1].body) == [  # in the model's order, whatever order they finished in
        {"role": "tool", "content": json.dumps({"error": "User rejected delete_file"}), "tool_call_id": "call_d"},
        {"role": "tool", "content": "Moved notes.txt to archive/notes.txt", "tool_call_id": "call_m"},
    ]


def test_a_predicate_asks_only_when_it_matters(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(
        openai_tool_calls(
            ("call_s", "write_note", {"path": "scratch/todo.txt", "text": "milk"}),
            ("call_r", "write_note", {"path": "report.txt", "text": "Q3"}),
        ),
        openai_text("Written."),
    )
    sid, body = s.turn("write two notes")
    pending = only_interrupt(body)
    assert pending["payload"]["tool_args"] == {"path": "report.txt", "text": "Q3"}
    # The ungated call runs while the gated one waits for a person (it may finish a moment later).
    scratch = s.sandbox / "scratch" / "todo.txt"
    wait_until(lambda: scratch.exists() and scratch.read_text() == "milk", timeout=20, what="the ungated write")
    assert not (s.sandbox / "report.txt").exists()
    s.resume(sid, pending["interrupt_id"], {"approved": True})
    assert s.settle(sid)["status"] == "idle"
    assert (s.sandbox / "report.txt").read_text() == "Q3"


def test_provider_errors_fail_the_turn_cleanly_and_transient_ones_are_retried(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.script(openai_error(f"Incorrect API key provided: {KEY}", 401, "invalid_api_key"))
    sid, body = s.turn("hello")
    assert body["status"] == "error"
    assert "ModelError: OpenAI returned HTTP 401: Incorrect API key provided: ***" in body["error"]
    assert KEY not in body["error"] and KEY not in s.server.log()
    assert s.messages(sid) == []  # the session keeps its previous state
    assert len(s.fake.requests) == 1

    # A transient error is retried (Retry-After honoured) and the turn succeeds.
    s.fake.script(openai_error("overloaded", 503, "server_error", headers={"Retry-After": "0"}), Reply(openai_text("Hello after a retry.")))
    _, body = s.turn("hello", sid)
    assert body["status"] == "idle" and body["response"]["content"] == "Hello after a retry."
    assert len(s.fake.requests) == 3


def test_the_anthropic_client_drives_an_approval(serve: Callable[..., Served]) -> None:
    s = serve("tests.agents.tool:files_anthropic")
    s.fake.script(anthropic_tool_use(("toolu_1", "delete_file", {"path": "old_logs.txt"}), text="I'll delete it."), anthropic_text("Gone."))
    sid, body = s.turn("delete the old logs file")
    pending = only_interrupt(body)
    assert pending["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "old_logs.txt"}}
    s.resume(sid, pending["interrupt_id"], {"approved": True})
    body = s.settle(sid)
    assert body["status"] == "idle" and body["response"]["content"] == "Gone."
    second = s.fake.requests[1]
    assert second.path == "/v1/messages" and second.headers["x-api-key"] == KEY
    assert second.body["messages"][-1] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Deleted old_logs.txt"}]}
    assert not (s.sandbox / "old_logs.txt").exists()


def test_the_example_agent_without_a_key(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """The README's quick start: the scripted fallback exercises the same interrupts."""
    sandbox = tmp_path / "example"
    server = start_server("examples.serving.hitl_agent:agent", env={"MOTUS_EXAMPLE_DIR": str(sandbox), "OPENROUTER_API_KEY": ""})
    s = Served(server, None, sandbox)  # no model API at all

    sid, body = s.turn("delete the old logs file")
    pending = only_interrupt(body)
    assert pending["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "old_logs.txt"}}
    s.resume(sid, pending["interrupt_id"], {"approved": True})
    assert s.settle(sid)["response"]["content"] == "Here is what happened:\n- delete_file: Deleted old_logs.txt"
    assert not (sandbox / "old_logs.txt").exists() and (sandbox / "notes.txt").exists()

    _, body = s.turn("help me organize my downloads", sid)
    pending = only_interrupt(body)
    assert pending["payload"] == {"type": "user_input", "questions": [ORGANIZE_QUESTION]}
    s.resume(sid, pending["interrupt_id"], {"answers": {"How would you like to organize the files?": "By type"}})
    assert "By type" in s.settle(sid)["response"]["content"]

    s.turn("delete and move both", sid)
    body = s.all_interrupts(sid, 2)
    assert sorted(i["payload"]["tool_name"] for i in body["interrupts"]) == ["delete_file", "move_file"]
    for pending in body["interrupts"]:
        s.resume(sid, pending["interrupt_id"], {"approved": False, "reason": "not now"})
    reply = s.settle(sid)["response"]["content"]
    assert '{"error": "User rejected delete_file: not now"}' in reply and '{"error": "User rejected move_file: not now"}' in reply
