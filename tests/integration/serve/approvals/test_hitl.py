"""Human in the loop, end to end: a real ``motus serve`` process, spoken to over HTTP.

Most tests share one server running ``tests.agents:dispatch`` (the message's first word
picks the behaviour); tests that need other options start their own.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tests.conftest import Instances, Server, server_factory, wait_until


@pytest.fixture(scope="module", params=["one-server", "two-instances-on-postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The suite runs twice: against one server (its default SQLite store), and against two
    instances on one PostgreSQL database with every request going to the next instance in
    turn, so the two backends, and one instance and several, cannot drift apart."""
    with server_factory(tmp_path_factory.mktemp("hitl")) as start:
        if request.param == "one-server":
            yield start("tests.agents:dispatch", "--workers", "2")
        else:
            url = request.getfixturevalue("pg_cluster").create_database()
            first, second = (start("tests.agents:dispatch", "--workers", "2", "--store", url) for _ in range(2))
            yield Instances.of(first, second)


def start_turn(server: Server, content: str) -> str:
    session_id = server.create_session()
    server.send(session_id, content)
    return session_id


def interrupted(server: Server, session_id: str, count: int = 1) -> dict:
    """Long-poll until the session shows ``count`` pending interrupts."""

    def check() -> dict | None:
        body = server.wait(session_id, timeout=5)
        if body["status"] == "interrupted" and len(body["interrupts"]) == count:
            return body
        assert body["status"] in ("running", "interrupted"), body
        return None

    return wait_until(check, timeout=20, what=f"{count} pending interrupts")  # type: ignore[return-value]


def resume(server: Server, session_id: str, interrupt_id: str, value: object) -> requests.Response:
    return server.post(f"/sessions/{session_id}/resume", json={"interrupt_id": interrupt_id, "value": value})


# -- the approval and question round trips ----------------------------------------------------


def test_tool_approval_approved(server: Server) -> None:
    session_id = start_turn(server, "approval /tmp/old_logs.txt")
    body = interrupted(server, session_id)
    [item] = body["interrupts"]
    assert item["type"] == "tool_approval"
    assert item["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "/tmp/old_logs.txt"}}
    assert body["response"] is None and body["error"] is None

    answer = resume(server, session_id, item["interrupt_id"], {"approved": True})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"session_id": session_id, "status": "running"}

    done = server.wait_for_status(session_id, "idle")
    assert done["response"] == {"role": "assistant", "content": "approved=True value={'approved': True}"}
    assert done["interrupts"] is None
    messages = server.get(f"/sessions/{session_id}/messages").json()
    assert [m["role"] for m in messages] == ["user", "assistant"]


def test_tool_approval_rejected(server: Server) -> None:
    session_id = start_turn(server, "approval /etc/passwd")
    [item] = interrupted(server, session_id)["interrupts"]
    assert resume(server, session_id, item["interrupt_id"], {"approved": False}).status_code == 200
    done = server.wait_for_status(session_id, "idle")
    assert done["response"]["content"].startswith("approved=False")


def test_user_input_round_trip(server: Server) -> None:
    session_id = start_turn(server, "question")
    [item] = interrupted(server, session_id)["interrupts"]
    assert item["type"] == "user_input"
    assert item["payload"]["questions"][0]["header"] == "Strategy"
    value = {"answers": {"How would you like to organize the files?": "By date"}}
    assert resume(server, session_id, item["interrupt_id"], value).status_code == 200
    done = server.wait_for_status(session_id, "idle")
    assert done["response"]["content"] == "answers={'How would you like to organize the files?': 'By date'}"


def test_custom_interrupt_from_the_spec(server: Server) -> None:
    session_id = start_turn(server, "custom")
    [item] = interrupted(server, session_id)["interrupts"]
    assert item["type"] == "color_picker"
    assert item["payload"]["presets"] == ["#FF6B6B", "#4ECDC4", "#FFE66D"]
    assert resume(server, session_id, item["interrupt_id"], {"hex": "#4ECDC4"}).status_code == 200
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "Using #4ECDC4 for the export."


def test_get_without_wait_shows_pending_interrupts(server: Server) -> None:
    session_id = start_turn(server, "approval x")
    interrupted(server, session_id)
    body = server.get(f"/sessions/{session_id}").json()
    assert body["status"] == "interrupted"
    assert len(body["interrupts"]) == 1 and body["interrupts"][0]["payload"]["tool_args"] == {"path": "x"}
    listed = {item["session_id"]: item for item in server.get("/sessions").json()}
    assert listed[session_id] == {"session_id": session_id, "total_messages": 0, "status": "interrupted"}
    server.delete(f"/sessions/{session_id}")


def test_the_inbox_shows_each_change_at_once_whichever_instance_made_it(server: Server) -> None:
    """The inbox is kept between changes and patched with the sessions that changed. A
    change is in the next read, whichever instance made it and whichever answers (with two
    instances, reads and writes alternate between them; each read is made twice, so both
    instances answer it): an interrupt raised, a title given, an interrupt answered, a
    session deleted."""

    def mine(params: dict | None = None) -> list[tuple[str, str | None]]:
        answers = []
        for _ in range(2):
            got = server.get("/interrupts", params=params)
            assert got.status_code == 200, got.text
            answers.append([(i["session_id"], i["context"]["session_title"]) for i in got.json() if i["session_id"] in (first, second)])
        assert answers[0] == answers[1]
        return answers[0]

    first = start_turn(server, "approval /tmp/inbox-first.txt")
    second = server.create_session()
    [item] = interrupted(server, first)["interrupts"]
    assert [sid for sid, _ in mine()] == [first]
    assert server.patch(f"/sessions/{first}", json={"title": "Old logs"}).status_code == 200
    assert mine() == [(first, "Old logs")] == mine({"type": "tool_approval"})
    server.send(second, "question Which colour?")
    interrupted(server, second)
    assert [sid for sid, _ in mine()] == [first, second]
    assert mine({"type": "tool_approval"}) == [(first, "Old logs")]
    assert resume(server, first, item["interrupt_id"], {"approved": True}).status_code == 200
    assert [sid for sid, _ in mine()] == [second] and mine({"type": "tool_approval"}) == []
    assert server.delete(f"/sessions/{second}").status_code == 204
    assert mine() == [] and mine({"type": "user_input"}) == []


def test_two_concurrent_interrupts_resolve_in_any_order(server: Server) -> None:
    session_id = start_turn(server, "two")
    body = interrupted(server, session_id, count=2)
    by_tool = {item["payload"]["tool_name"]: item["interrupt_id"] for item in body["interrupts"]}

    # Resolve the second one first: the session stays interrupted, showing only the first.
    assert resume(server, session_id, by_tool["b"], "B").json()["status"] == "interrupted"
    still = server.get(f"/sessions/{session_id}").json()
    assert still["status"] == "interrupted"
    assert [item["interrupt_id"] for item in still["interrupts"]] == [by_tool["a"]]

    assert resume(server, session_id, by_tool["a"], "A").json()["status"] == "running"
    done = server.wait_for_status(session_id, "idle")
    assert done["response"]["content"] == "first='A' second='B'"


def test_the_interrupts_of_one_gather_are_seen_together(server: Server) -> None:
    """The interrupts of one ``asyncio.gather`` are written by the worker in one go and
    committed and published as one: the first long poll that sees the turn interrupted sees
    both, every time (a client numbering them, "Approval 1 of 2", never sees the first alone,
    on one server or on another instance than the one that ran the turn)."""
    for _ in range(8):
        session_id = start_turn(server, "two")
        body = server.get(f"/sessions/{session_id}?wait=true&timeout=30").json()
        assert body["status"] == "interrupted", body
        assert sorted(item["payload"]["tool_name"] for item in body["interrupts"]) == ["a", "b"], body
        assert server.delete(f"/sessions/{session_id}").status_code == 204


@pytest.mark.parametrize("count, size", [(3, 15000), (8, 15000), (16, 15000)], ids=["3-large", "8-large", "16-large"])
def test_the_large_interrupts_of_one_gather_are_seen_together(start_server, count: int, size: int) -> None:
    """The interrupts of one gather are shown together however large they are (each within
    the 16 KiB limit, all within --max-interrupts): the session's event log has every
    interrupt event before its one "interrupted" status, and the first long poll that sees
    the turn interrupted sees all of them."""
    from tests.integration.serve.approvals.test_workflow import Stream

    server = start_server("tests.agents.gather_attack:many_large", "--workers", "1")
    session_id = start_turn(server, f"{count} {size}")
    body = server.get(f"/sessions/{session_id}?wait=true&timeout=30").json()
    while body["status"] == "running":
        body = server.get(f"/sessions/{session_id}?wait=true&timeout=30").json()
    assert body["status"] == "interrupted", body
    shown_first = len(body["interrupts"])
    stream = Stream(server, f"/sessions/{session_id}/events", last_id=0)
    try:
        kinds: list[str] = []
        while kinds.count("interrupt") < count:
            kinds.append(stream.next()["event"])
    finally:
        stream.close()
    assert (shown_first, kinds[kinds.index("interrupt"):]) == (count, ["interrupt"] * count), kinds
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_a_gather_whose_other_branch_raises_ends_the_turn_and_shows_no_interrupt(start_server) -> None:
    """A branch raises before the other's interrupt is sent (it waits in the worker's outbox
    until the loop's next pass): the turn ends in that error, with no interrupt left shown;
    with ``return_exceptions=True`` the interrupt is sent, shown and answered."""
    server = start_server("tests.agents.gather_attack:gather_raises", "--workers", "1")
    for order in ("first", "last"):
        session_id = start_turn(server, order)
        body = server.wait_for_status(session_id, "error")
        assert "ValueError: boom before its interrupt" in body["error"] and not body["interrupts"], body
    session_id = start_turn(server, "kept")
    [item] = interrupted(server, session_id)["interrupts"]
    assert resume(server, session_id, item["interrupt_id"], "yes").status_code == 200
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "'yes'"


def test_sequential_interrupts_in_one_turn(start_server) -> None:
    server = start_server("tests.agents:sequential", "--workers", "1")
    session_id = start_turn(server, "go")
    first = interrupted(server, session_id)["interrupts"][0]
    assert first["payload"] == {"type": "step", "n": 1}
    resume(server, session_id, first["interrupt_id"], "one")
    second = interrupted(server, session_id)["interrupts"][0]
    assert second["payload"]["n"] == 2 and second["interrupt_id"] != first["interrupt_id"]
    resume(server, session_id, second["interrupt_id"], "two")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "one+two"


# -- conflicts and stale resumes ------------------------------------------------------------


def test_messages_are_refused_while_interrupted_or_running(server: Server) -> None:
    session_id = start_turn(server, "approval y")
    [item] = interrupted(server, session_id)["interrupts"]
    refused = server.post(f"/sessions/{session_id}/messages", json={"content": "another"})
    assert refused.status_code == 409
    assert "interrupted" in refused.json()["detail"]

    resume(server, session_id, item["interrupt_id"], {"approved": True})
    server.wait_for_status(session_id, "idle")

    hanging = start_turn(server, "hang")
    busy = server.post(f"/sessions/{hanging}/messages", json={"content": "again"})
    assert busy.status_code == 409 and "running" in busy.json()["detail"]
    assert server.delete(f"/sessions/{hanging}").status_code == 204


def test_resume_404s(server: Server) -> None:
    unknown_session = server.post(f"/sessions/{uuid.uuid4()}/resume", json={"interrupt_id": "x", "value": 1})
    assert unknown_session.status_code == 404 and "not found" in unknown_session.json()["detail"]

    session_id = start_turn(server, "approval z")
    [item] = interrupted(server, session_id)["interrupts"]
    never_issued = resume(server, session_id, str(uuid.uuid4()), {"approved": True})
    assert never_issued.status_code == 404
    assert "not found" in never_issued.json()["detail"]
    assert server.get(f"/sessions/{session_id}").json()["status"] == "interrupted"  # nothing changed

    assert resume(server, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    again = resume(server, session_id, item["interrupt_id"], {"approved": True})
    assert again.status_code == 404
    assert "already resumed" in again.json()["detail"]
    server.wait_for_status(session_id, "idle")
    after_turn = resume(server, session_id, item["interrupt_id"], {"approved": True})
    assert after_turn.status_code == 404
    assert after_turn.json()["detail"].startswith("Session not actively waiting for resume")


def test_idle_session_is_not_waiting_for_resume(server: Server) -> None:
    session_id = server.create_session()
    answer = resume(server, session_id, "anything", True)
    assert answer.status_code == 404
    assert answer.json()["detail"] == "Session not actively waiting for resume"


# -- failures stay inside their own session --------------------------------------------------


def test_oversize_interrupt_turns_the_session_to_error(start_server) -> None:
    server = start_server("tests.agents:oversize", "--workers", "1")
    session_id = start_turn(server, "big")
    body = server.wait_for_status(session_id, "error")
    assert body["error"].startswith("Traceback (most recent call last):")
    assert "ValueError: Interrupt message too large" in body["error"]
    assert body["interrupts"] is None
    # A session in error accepts a new message (and fails the same way again).
    server.send(session_id, "again")
    assert server.wait_for_status(session_id, "error")["error"].count("Traceback") == 1


def test_agent_exception_is_its_traceback(server: Server) -> None:
    session_id = start_turn(server, "crash now")
    body = server.wait_for_status(session_id, "error")
    error = body["error"]
    assert error.startswith("Traceback (most recent call last):")
    assert error.rstrip().endswith("ValueError: agent blew up on 'now'")
    assert "tests/agents/__init__.py" in error and "motus/serve/worker.py" not in error
    assert server.get(f"/sessions/{session_id}/messages").json() == []  # state unchanged
    # The same session works again afterwards, and so does everything else.
    server.send(session_id, "echo fine")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: fine"


def test_worker_that_exits_hard(server: Server) -> None:
    session_id = start_turn(server, "exit")
    assert server.wait_for_status(session_id, "error")["error"] == "Worker process exited unexpectedly"
    other = start_turn(server, "echo still alive")
    assert server.wait_for_status(other, "idle")["response"]["content"] == "echo: still alive"


def test_wrong_return_type(start_server) -> None:
    server = start_server("tests.agents:wrong_type", "--workers", "1")
    session_id = server.create_session()
    server.send(session_id, "hi")
    error = server.wait_for_status(session_id, "error")["error"]
    assert error.startswith("TypeError: Agent must return a (response, state) tuple, got str: Agent returned str 'just a string'")
    assert "Traceback" not in error


def test_delete_while_interrupted_gives_the_agent_eof(start_server, tmp_path: Path) -> None:
    server = start_server("tests.agents:eof_reporter", "--workers", "1")
    report = tmp_path / "eof.txt"
    session_id = server.create_session()
    server.send(session_id, str(report))
    [item] = interrupted(server, session_id)["interrupts"]
    assert server.delete(f"/sessions/{session_id}").status_code == 204
    wait_until(lambda: report.exists() and report.read_text(), timeout=10, what="the agent to see EOFError")
    assert report.read_text() == "EOFError: Worker pipe closed"
    assert server.get(f"/sessions/{session_id}").status_code == 404
    assert resume(server, session_id, item["interrupt_id"], True).status_code == 404
    assert server.delete(f"/sessions/{session_id}").status_code == 404


def test_timeout(start_server, tmp_path: Path) -> None:
    server = start_server("tests.agents:eof_reporter", "--workers", "1", "--timeout", "1")
    report = tmp_path / "eof.txt"
    session_id = server.create_session()
    server.send(session_id, str(report))
    [item] = interrupted(server, session_id)["interrupts"]
    body = server.wait_for_status(session_id, "error")
    assert body["error"] == "Agent timed out"
    wait_until(lambda: report.exists() and report.read_text(), timeout=10, what="the agent to see EOFError")
    assert report.read_text() == "EOFError: Worker pipe closed"
    late = resume(server, session_id, item["interrupt_id"], {"approved": True})
    assert late.status_code == 404
    assert late.json()["detail"].startswith("Session not actively waiting for resume")


def test_timeout_kills_an_agent_that_ignores_cancellation(start_server) -> None:
    server = start_server("tests.agents:busy_hang", "--workers", "1", "--timeout", "0.5")
    session_id = server.create_session()
    server.send(session_id, "spin")
    assert server.wait_for_status(session_id, "error")["error"] == "Agent timed out"
    # The slot is free again: the next turn runs (and times out the same way).
    server.send(session_id, "spin")
    assert server.wait_for_status(session_id, "error")["error"] == "Agent timed out"
    wait_until(lambda: server.get("/health").json()["running_workers"] == 0, what="the slot to be released")


# -- webhooks ---------------------------------------------------------------------------------


class WebhookSink:
    """A real HTTP server on loopback that records what it is sent."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                body = json.loads(raw)
                with sink._cond:
                    sink.calls.append({
                        "body": body, "authorization": self.headers.get("Authorization"), "raw": raw,
                        "headers": {name.lower(): value for name, value in self.headers.items()},
                    })
                    sink._cond.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float = 15) -> list[dict]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= count, timeout), self.calls
            return list(self.calls)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    sink = WebhookSink()
    yield sink
    sink.close()


def test_the_interrupts_of_one_gather_make_one_interrupted_webhook(server: Server, sink: WebhookSink) -> None:
    """Published as one, delivered as one: a gather of two approvals makes one "interrupted"
    delivery listing both (not two identical ones), then the "idle" one."""
    session_id = server.create_session()
    server.send(session_id, "two", webhook={"url": sink.url, "events": ["interrupted", "idle"]})
    items = interrupted(server, session_id, 2)["interrupts"]
    for item, value in zip(items, ("A", "B")):
        assert resume(server, session_id, item["interrupt_id"], value).status_code == 200
    server.wait_for_status(session_id, "idle")
    wait_until(lambda: any(call["body"]["status"] == "idle" for call in sink.calls), what="the idle delivery")
    listed = [sorted(i["interrupt_id"] for i in call["body"]["interrupts"]) for call in sink.calls if call["body"]["status"] == "interrupted"]
    assert listed == [sorted(item["interrupt_id"] for item in items)], listed


def test_webhooks_fire_on_idle_and_error_not_on_interrupt(server: Server, sink: WebhookSink) -> None:
    session_id = server.create_session()
    webhook = {"url": sink.url, "token": "s3cret", "include_messages": True}
    server.send(session_id, "approval a.txt", webhook=webhook)
    [item] = interrupted(server, session_id)["interrupts"]
    assert sink.calls == []  # nothing on the interrupt
    resume(server, session_id, item["interrupt_id"], {"approved": True})
    [idle] = sink.wait_for(1)
    assert idle["authorization"] == "Bearer s3cret"
    assert idle["body"]["status"] == "idle" and idle["body"]["error"] is None
    assert idle["body"]["response"]["content"].startswith("approved=True")
    assert [m["role"] for m in idle["body"]["messages"]] == ["user", "assistant"]

    server.send(session_id, "crash hook", webhook={"url": sink.url})
    calls = sink.wait_for(2)
    error = calls[1]
    assert error["authorization"] is None
    assert error["body"]["status"] == "error" and "ValueError" in error["body"]["error"]
    assert error["body"]["messages"] is None
    assert len(sink.calls) == 2


def test_failed_webhook_changes_nothing(server: Server) -> None:
    session_id = server.create_session()
    server.send(session_id, "echo hi", webhook={"url": "http://127.0.0.1:9/nowhere"})
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: hi"


# -- sessions API ---------------------------------------------------------------------------


def test_create_with_state_list_get_delete(server: Server) -> None:
    state = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}]
    created = server.post("/sessions", json={"state": state})
    assert created.status_code == 201
    body = created.json()
    assert created.headers["Location"] == f"/sessions/{body['session_id']}"
    assert body == {"session_id": body["session_id"], "status": "idle", "response": None, "error": None, "interrupts": None}
    assert server.get(f"/sessions/{body['session_id']}/messages").json() == state
    server.send(body["session_id"], "echo more")
    server.wait_for_status(body["session_id"], "idle")
    assert len(server.get(f"/sessions/{body['session_id']}/messages").json()) == 4
    assert server.delete(f"/sessions/{body['session_id']}").status_code == 204
    assert server.get(f"/sessions/{body['session_id']}").status_code == 404


def test_put_needs_allow_custom_ids(server: Server) -> None:
    refused = server.put(f"/sessions/{uuid.uuid4()}", json={})
    assert refused.status_code == 405 and "--allow-custom-ids" in refused.json()["detail"]
    assert refused.headers["Allow"] == "GET, DELETE"


def test_unknown_fields_are_ignored(server: Server) -> None:
    created = server.post("/sessions", json={"state": [], "from_a_newer_client": True})
    assert created.status_code == 201
    sid = created.json()["session_id"]
    sent = server.post(f"/sessions/{sid}/messages", json={"content": "echo x", "webhook": None, "priority": 3})
    assert sent.status_code == 202
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "echo: x"


def test_payload_is_shown_as_json_normalised(start_server) -> None:
    server = start_server("tests.agents:int_keys", "--workers", "1")
    sid = start_turn(server, "go")
    [item] = interrupted(server, sid)["interrupts"]
    assert item["payload"] == {"type": "odd", "1": "one", "pair": [1, 2]}
    assert resume(server, sid, item["interrupt_id"], "ok").status_code == 200
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "'ok'"


def test_a_worker_that_stops_reading_blocks_nobody_else(start_server) -> None:
    hog_server = start_server("tests.agents:gil_hog", "--workers", "2", "--timeout", "3")
    sid = start_turn(hog_server, "go")
    items = interrupted(hog_server, sid, count=2)["interrupts"]
    result: dict = {}

    def big_resume() -> None:  # 2 MB: more than the pipe buffers while the worker is not reading
        result["response"] = resume(hog_server, sid, items[0]["interrupt_id"], "x" * 2_000_000)

    sender = threading.Thread(target=big_resume)
    sender.start()
    try:
        # While that send is stuck, the same server keeps serving everyone else.
        other = start_turn(hog_server, "go")
        assert interrupted(hog_server, other, count=2)["status"] == "interrupted"
        assert hog_server.get("/health").status_code == 200
        assert hog_server.delete(f"/sessions/{other}").status_code == 204
        assert hog_server.wait_for_status(sid, "error")["error"] == "Agent timed out"
    finally:
        sender.join(30)
    assert result["response"].status_code in (200, 404)


def test_custom_ids_and_session_limit(start_server) -> None:
    server = start_server("tests.agents:echo", "--allow-custom-ids", "--max-sessions", "2", "--workers", "1")
    custom = str(uuid.uuid4())
    created = server.put(f"/sessions/{custom}", json={})
    assert created.status_code == 201 and created.json()["session_id"] == custom
    assert server.put(f"/sessions/{custom}", json={}).status_code == 409
    refused = server.put("/sessions/not-a-uuid", json={})
    assert refused.status_code == 400 and refused.json()["detail"].startswith("Session ID must be a valid UUID")
    spelled = uuid.uuid4().hex.upper()  # any spelling uuid.UUID reads is accepted, and kept as given
    assert server.put(f"/sessions/{spelled}", json={}).json()["session_id"] == spelled
    assert server.get(f"/sessions/{spelled}").status_code == 200
    full = server.post("/sessions", json={})
    assert full.status_code == 503 and "limit" in full.json()["detail"]
    assert server.put(f"/sessions/{uuid.uuid4()}", json={}).status_code == 503
    assert server.get("/health").json()["total_sessions"] == 2


def test_health(server: Server) -> None:
    body = server.get("/health").json()
    assert body["status"] == "ok" and body["max_workers"] == 2
    assert set(body) == {"status", "max_workers", "running_workers", "total_sessions", "store", "live_turns", "parked_turns", "open_streams"}
    assert body["store"] == ("postgresql" if isinstance(server, Instances) else "memory")


def test_long_poll_times_out_while_running(server: Server) -> None:
    session_id = start_turn(server, "hang")
    body = server.wait(session_id, timeout=0.2)
    assert body["status"] == "running" and body["response"] is None
    server.delete(f"/sessions/{session_id}")


def test_long_poll_sees_delete(server: Server) -> None:
    session_id = start_turn(server, "hang")
    result: dict = {}

    def poll() -> None:
        result["response"] = server.get(f"/sessions/{session_id}", params={"wait": "true", "timeout": 30})

    poller = threading.Thread(target=poll)
    poller.start()
    server.delete(f"/sessions/{session_id}")
    poller.join(20)
    assert result["response"].status_code == 404


# -- bad input: a 4xx naming the problem, never a 500, never a change ------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        ("post", "/sessions", "{not json", 422, "Malformed JSON"),
        ("post", "/sessions", "[1, 2]", 422, "JSON object"),
        ("post", "/sessions", '{"state": "nope"}', 422, "state"),
        ("post", "/sessions", '{"state": [{"role": "robot"}]}', 422, "role"),
        ("post", "/sessions/{sid}/messages", "", 422, "body is required"),
        ("post", "/sessions/{sid}/messages", '{"content": 5}', 422, "content"),
        ("post", "/sessions/{sid}/messages", '{"content": "x", "webhook": {"url": "ftp://x"}}', 400, "webhook.url"),
        ("post", "/sessions/{sid}/resume", '{"value": 1}', 422, "interrupt_id"),
        ("post", "/sessions/{sid}/resume", '{"interrupt_id": 5}', 422, "interrupt_id"),
        ("post", "/sessions/{sid}/resume", "null", 422, "JSON object"),
        ("post", "/sessions/{sid}/resume", '{"interrupt_id": "x", "value": ' + "[" * 900 + "]" * 900 + "}", 400, "nested too deeply"),
        ("post", "/sessions/{sid}/messages", '{"content": "x", "user_params": {"a": ' + "[" * 300 + "]" * 300 + "}}", 400, "nested too deeply"),
        ("post", "/sessions", '{"state": [{"content": "x", "user_params": {"a": ' + "[" * 100 + "]" * 100 + "}}]}", 400, "nested too deeply"),
        ("get", "/sessions/{sid}?wait=maybe", None, 400, "wait"),
        ("get", "/sessions/{sid}?wait=true&timeout=soon", None, 400, "timeout"),
        ("get", "/sessions/{sid}?wait=true&timeout=-1", None, 400, "timeout"),
        ("get", "/nowhere", None, 404, "/nowhere"),
        ("patch", "/sessions/{sid}", "{}", 422, "title"),
        ("patch", "/sessions/{sid}/messages", "{}", 405, "PATCH"),
        ("delete", "/sessions", None, 405, "DELETE"),
    ],
)
def test_bad_input(server: Server, method: str, path: str, body: str | None, status: int, needle: str) -> None:
    session_id = server.create_session()
    before = server.get(f"/sessions/{session_id}").json()
    response = requests.request(
        method, server.url + path.format(sid=session_id), data=body, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert response.status_code == status, response.text
    assert needle in response.json()["detail"]
    assert server.get(f"/sessions/{session_id}").json() == before
    assert server.get(f"/sessions/{session_id}/messages").json() == []


# -- start-up ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "needle"),
    [
        ("tests.nonexistent:agent", "Could not import module 'tests.nonexistent'"),
        ("tests.agents:missing", "has no attribute 'missing'"),
        ("tests.agents", "must look like 'package.module:attribute'"),
        ("tests.agents:ROOT_NOT_CALLABLE", "has no attribute"),
        ("tests.agents:time", "not an agent"),
    ],
)
def test_bad_agent_path_is_refused_at_start(agent: str, needle: str, tmp_path: Path) -> None:
    from tests.conftest import launch

    log_path = tmp_path / "start.log"
    process = launch(["serve", "start", agent, "--port", "0"], log_path)
    assert process.wait(30) == 2
    output = log_path.read_text()
    assert needle in output
    assert "Traceback" not in output
