"""Attacks on the approvals workflow (issue 13): event cursors, stream slots, expiry races,
remembered grants under replay, hostile agents and the live ``turn`` object.

Real ``motus serve`` processes. The agents these tests serve are defined at the bottom of
this module (the server imports ``tests.integration.serve.approvals.test_workflow_attacks:NAME``);
gated tool bodies come from ``tests/agents/approval.py`` and leave one line per run in
``ran-<tool>`` in the sandbox, so what really ran is counted on disk.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.conftest import Server, wait_until
from tests.integration.serve.approvals.test_workflow import env, ran, resume, shared_sandbox, start  # noqa: F401 - fixture

HERE = "tests.integration.serve.approvals.test_workflow_attacks"
CALLS = "tests.agents.approval:calls"
EXPIRING = "tests.agents.approval:expiring"


# -- helpers ------------------------------------------------------------------------------


def pending(server: Server, session_id: str, count: int = 1) -> list[dict]:
    def enough() -> list[dict] | None:  # from the inbox: GET /sessions/{id} is what some tests break
        items = [item for item in server.get("/interrupts").json() if item["session_id"] == session_id]
        return items if len(items) >= count else None

    return wait_until(enough, timeout=20, interval=0.02, what=f"{count} pending interrupts")  # type: ignore[return-value]


def settled(server: Server, session_id: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        body = server.wait(session_id, timeout=5)
        if body["status"] in ("idle", "error"):
            return body
        assert time.monotonic() < deadline, body


def raw_request(server: Server, request: bytes) -> socket.socket:
    """Send ``request`` on a fresh socket and return it, unread (a client that may walk away)."""
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(request)
    return sock


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def events_of(response: requests.Response) -> Iterator[dict]:
    """The events (``retry:`` and comments skipped) of a streamed response, as they come.
    One generator per response: ``iter_lines`` keeps what it read ahead."""
    lines = response.__dict__.setdefault("_attack_lines", response.iter_lines(decode_unicode=True))
    event: dict = {}
    for line in lines:
        if line == "":
            if "event" in event:
                yield event
            event = {}
        elif line.startswith(":") or line.startswith("retry:"):
            continue
        else:
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value


def first_events(response: requests.Response, count: int) -> list[dict]:
    """The next ``count`` events of a streamed response."""
    found: list[dict] = []
    for event in events_of(response):
        found.append(event)
        if len(found) == count:
            return found
    raise AssertionError(f"stream ended after {found}")


def open_streams(server: Server) -> int:
    return server.get("/health").json()["open_streams"]


# -- event cursors -------------------------------------------------------------------------


@pytest.mark.parametrize("cursor", ["\u00b2", "\u0663", "\uff11"])  # superscript two, Arabic-Indic three, fullwidth one
def test_a_non_ascii_digit_event_cursor_is_a_400_not_a_500(shared_server: Callable[..., Server], shared_sandbox: Path, cursor: str) -> None:
    """``str.isdigit`` accepts digits ``int`` refuses ("²"): the cursor check let them through
    to ``int()``, which raised, a 500. Any event id a client sends must be an ASCII number."""
    server = shared_server(CALLS, env=env(shared_sandbox))  # no test on it logs a traceback
    response = server.get("/events", params={"after": cursor})
    assert response.status_code == 400, response.text
    if cursor.encode("latin-1", "ignore"):
        # The same through the header (HTTP headers travel as latin-1).
        parts = urlsplit(server.url)
        sock = raw_request(server, b"GET /events HTTP/1.1\r\nHost: " + parts.netloc.encode()
                           + b"\r\nLast-Event-ID: " + cursor.encode("latin-1") + b"\r\nConnection: close\r\n\r\n")
        with sock:
            head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 400"), head[:200]
    assert "Internal server error" not in server.log() and "Traceback" not in server.log()
    wait_until(lambda: open_streams(server) == 0, timeout=10, what="no open streams")


def test_a_cursor_past_the_newest_event_is_told_to_reload(shared_server: Callable[..., Server], shared_sandbox: Path) -> None:
    """A client that reconnects with the ``Last-Event-ID`` of an earlier server life (a memory
    store restarts its sequence at 1; a SQLite file replaced) used to be served silently from
    that id on: every event up to it was skipped for good. An id the log never issued must
    get a ``reset`` (reload the state), like one older than the log keeps."""
    server = shared_server(CALLS, env=env(shared_sandbox))
    headers = {"Last-Event-ID": str(10**12)}
    with requests.get(server.url + "/events", headers=headers, stream=True, timeout=(5, 20)) as response:
        assert response.status_code == 200
        [event] = first_events(response, 1)
        assert event["event"] == "reset", event
    # And a client that then follows the reset's id sees the next change.
    session_id = server.create_session()
    newest = int(event["id"]) if event.get("id") not in (None, "None") else 0
    with requests.get(server.url + "/events", headers={"Last-Event-ID": str(newest)}, stream=True, timeout=(5, 20)) as response:
        [created] = first_events(response, 1)
        assert created["event"] == "status" and created["data"]["session_id"] == session_id


# -- stream slots ----------------------------------------------------------------------------


def test_abandoned_streams_give_their_slots_back_and_the_cap_holds(start_server: Callable[..., Server], sandbox: Path) -> None:
    # Streams that wait on threads (none held without one); held ones: test_held_waits.py.
    server = start_server(CALLS, "--max-streams", "8", "--max-waiting", "0", env=env(sandbox))
    parts = urlsplit(server.url)
    request = b"GET /events HTTP/1.1\r\nHost: " + parts.netloc.encode() + b"\r\n\r\n"
    head_request = b"HEAD /events HTTP/1.1\r\nHost: " + parts.netloc.encode() + b"\r\nConnection: close\r\n\r\n"
    for _round in range(3):
        socks = [raw_request(server, request) for _ in range(30)]
        heads = [read_head(sock) for sock in socks]
        accepted = [h for h in heads if h.startswith(b"HTTP/1.1 200")]
        refused = [h for h in heads if h.startswith(b"HTTP/1.1 503")]
        assert len(accepted) == 8 and len(refused) == 22, [h[:20] for h in heads]
        assert open_streams(server) == 8
        # A resume-sized request still gets through while every slot is taken.
        assert server.get("/sessions").status_code == 200
        for sock in socks:
            sock.close()  # walk away without reading
        wait_until(lambda: open_streams(server) == 0, timeout=15, interval=0.1, what="abandoned streams to give their slots back")
        with raw_request(server, head_request) as sock:  # HEAD takes a slot only while it is answered
            assert read_head(sock).startswith(b"HTTP/1.1 200")
        wait_until(lambda: open_streams(server) == 0, timeout=15, interval=0.1, what="a HEAD's slot back")


def test_sigterm_ends_open_streams_promptly(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(CALLS, env=env(sandbox))
    session_id = server.create_session()
    responses = [requests.get(server.url + "/events", stream=True, timeout=(5, 30)) for _ in range(4)]
    responses.append(requests.get(server.url + f"/sessions/{session_id}/events", stream=True, timeout=(5, 30)))
    try:
        wait_until(lambda: open_streams(server) == 5, timeout=10, what="5 open streams")
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"server still running 15 s after SIGTERM with open streams:\n{server.log()}")
        assert time.monotonic() - began < 15
    finally:
        for response in responses:
            response.close()


# -- expiry races ----------------------------------------------------------------------------


def test_a_resume_racing_the_expiry_resolves_the_interrupt_exactly_once(start_server: Callable[..., Server], sandbox: Path) -> None:
    """Many approvals fired at the instant an approval expires: exactly one resolution wins,
    the audit and the event log agree on who, and the tool runs only if a person won."""
    server = start_server(CALLS, "--workers", "2", env=env(sandbox, MOTUS_TEST_APPROVAL_TIMEOUT="0.4"))
    for round_ in range(4):
        session_id = start(server, f"send_money {round_}")
        [item] = pending(server, session_id)
        expires = time.time() + 0.4  # about when it expires; approvals straddle it
        codes: list[int] = []
        barrier = threading.Barrier(4)

        def hammer() -> None:
            barrier.wait()
            while True:
                response = resume(server, session_id, item["interrupt_id"], {"approved": True})
                codes.append(response.status_code)
                if response.status_code != 200 and time.time() > expires + 0.3:
                    return
                if response.status_code == 200:
                    return

        wait_until(lambda: time.time() > expires - 0.15, timeout=5, interval=0.005, what="the deadline to near")
        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        body = settled(server, session_id)
        assert codes.count(200) <= 1 and set(codes) <= {200, 404}, codes
        resolved = [r for r in server.get(f"/sessions/{session_id}/audit").json() if r["kind"] == "resolved"]
        assert len(resolved) == 1, resolved
        with requests.get(server.url + f"/sessions/{session_id}/events?after=0", stream=True, timeout=(5, 20)) as response:
            events = []
            for event in events_of(response):
                events.append(event)
                if event["event"] in ("message", "error"):  # the turn's end
                    break
        assert [e["data"]["by"] for e in events if e["event"] == "resolved"] == [resolved[0]["by"]]
        if resolved[0]["by"] == "timeout":
            assert codes.count(200) == 0 and str(round_) not in ran(sandbox, "send_money"), (codes, body)
        else:
            assert codes.count(200) == 1 and ran(sandbox, "send_money").count(str(round_)) == 1


def test_an_expiry_due_while_the_server_was_killed_fires_at_the_next_start(
    start_server: Callable[..., Server], sandbox: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'kill.db'}"
    first = start_server(EXPIRING, "--store", store, "--park-after", "never", env=env(sandbox))
    session_id = start(first, "1.5")
    [item] = pending(first, session_id)
    first.process.kill()  # kill -9: no parking, no goodbye
    first.process.wait(10)
    wait_until(lambda: not [p for p in first.descendants()], timeout=10, what="the killed server's workers to end")
    # Let the deadline pass while no server runs.
    deadline = time.time() + 1.6
    wait_until(lambda: time.time() > deadline, timeout=5, interval=0.05, what="the deadline to pass")
    second = start_server(EXPIRING, "--store", store, env=env(sandbox))
    body = settled(second, session_id)
    assert body["status"] == "idle" and "default" in body["response"]["content"], body
    audit = [r for r in second.get(f"/sessions/{session_id}/audit").json() if r["kind"] == "resolved"]
    assert [(r["by"], r["interrupt_id"]) for r in audit] == [("timeout", item["interrupt_id"])]
    assert resume(second, session_id, item["interrupt_id"], {"choice": "late"}).status_code == 404


# -- remembered grants and replay ----------------------------------------------------------------


def test_a_grant_given_mid_turn_does_not_run_a_rejected_parallel_call_on_replay(
    start_server: Callable[..., Server], sandbox: Path
) -> None:
    """Two calls of one gated tool run at once (``asyncio.gather``) and both ask. The person
    approves the first "for the session" and rejects the second. Without parking, the second
    never runs; with ``--park-after 0`` the turn is replayed, and the replay must do the same."""
    server = start_server(f"{HERE}:parallel_deletes", "--park-after", "0", env=env(sandbox))
    session_id = start(server, "a b")
    items = pending(server, session_id, 2)
    by_path = {item["payload"]["tool_args"]["path"]: item for item in items}
    wait_until(lambda: server.get("/health").json()["parked_turns"] == 1, timeout=15, what="the turn to park")
    assert resume(server, session_id, by_path["a"]["interrupt_id"], {"approved": True, "remember": "session"}).status_code == 200
    assert resume(server, session_id, by_path["b"]["interrupt_id"], {"approved": False, "reason": "not b"}).status_code == 200
    body = settled(server, session_id)
    assert ran(sandbox, "delete_file") == ["a"], (ran(sandbox, "delete_file"), body)
    assert body["status"] == "idle", body


def test_a_malformed_approval_that_the_gate_rejects_grants_nothing(shared_server: Callable[..., Server], shared_sandbox: Path) -> None:
    """``{"approved": true, "remember": "session", "tool_args": "x"}`` is a rejection to the gate
    (edited arguments that are not an object): the tool does not run. It must not be
    remembered as an approval either, or the next turn runs the tool unasked."""
    server = shared_server(CALLS, env=env(shared_sandbox))  # no other test here runs a tool
    session_id = start(server, "delete_file a")
    [item] = pending(server, session_id)
    value = {"approved": True, "remember": "session", "tool_args": "not an object"}
    assert resume(server, session_id, item["interrupt_id"], value).status_code == 200
    settled(server, session_id)
    assert ran(shared_sandbox, "delete_file") == []
    assert server.get(f"/sessions/{session_id}/grants").json() == []
    server.send(session_id, "delete_file b")
    assert server.wait_for_status(session_id, "interrupted")["interrupts"], "the next call must ask again"
    assert ran(shared_sandbox, "delete_file") == []


# -- hostile agents: timeouts and the live turn -------------------------------------------------------


def test_hostile_interrupt_timeouts_fail_the_turn_and_never_a_request(shared_server: Callable[..., Server], shared_sandbox: Path) -> None:
    server = shared_server(EXPIRING, env=env(shared_sandbox))  # no test on it logs a 500
    for text in ("nan", "inf", "-inf", "-1", "0"):
        session_id = start(server, text)
        body = settled(server, session_id)
        assert body["status"] == "error" and "timeout" in body["error"], (text, body)
        assert server.get("/interrupts").status_code == 200
    assert "Internal server error" not in server.log()


def test_an_interrupt_with_a_huge_timeout_does_not_break_the_api(shared_server: Callable[..., Server], shared_sandbox: Path) -> None:
    """A finite but huge timeout (1e12 s) expires past year 9999: turning it into an ISO date
    raised, so the session, the inbox and every event stream answered 500 or died (and a
    stream that reconnected hit the same event again, for ever). (The other test on this
    server leaves no turn running nor any interrupt pending: the event stream is this test's.)"""
    server = shared_server(EXPIRING, env=env(shared_sandbox))
    with requests.get(server.url + "/events", stream=True, timeout=(5, 20)) as stream:
        [ready] = first_events(stream, 1)
        assert ready["event"] == "ready"
        session_id = start(server, "1e12")
        events = []
        for event in events_of(stream):
            events.append(event)
            if event["event"] == "interrupt":
                break
    assert [e["event"] for e in events] == ["status", "status", "interrupt"], events
    assert isinstance(events[-1]["data"]["expires_at"], str)
    response = server.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["interrupts"][0]["expires_at"], str)
    inbox = server.get("/interrupts")
    assert inbox.status_code == 200 and [i["session_id"] for i in inbox.json()] == [session_id], inbox.text
    [item] = response.json()["interrupts"]
    assert resume(server, session_id, item["interrupt_id"], {"choice": "person"}).status_code == 200
    assert "person" in settled(server, session_id)["response"]["content"]


ODD_REPLIES = [
    {"choices": [{"message": "a bare string"}]},
    {"choices": [{"message": ["a", "list"]}]},
    {"choices": [{"message": {"content": 7, "tool_calls": 5}}]},
    {"choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "x", "arguments": "{not json"}}, "junk"]}}]},
    {"content": [{"type": "tool_use", "name": None, "input": "x" * 100_000}, "junk", {"type": "text", "text": 5}]},
    {"content": "not blocks"},
    {"choices": []},
    {"choices": [None]},
    {"choices": [{"message": {"content": "keys no text can hold", "\udc80": {"\ud800": 1}}}]},
    {"content": [{"type": "tool_use", "name": "x", "input": {"\udc80": [{"\ud800": 1}]}}]},
]


@pytest.mark.parametrize("index", range(len(ODD_REPLIES)))
def test_a_model_reply_of_any_shape_never_makes_the_live_turn_a_500(shared_server: Callable[..., Server], shared_sandbox: Path, index: int) -> None:
    server = shared_server(f"{HERE}:odd_model", env=env(shared_sandbox))
    session_id = start(server, str(index))
    pending(server, session_id)
    response = server.get(f"/sessions/{session_id}")
    assert response.status_code == 200, (ODD_REPLIES[index], response.text, server.log()[-2000:])
    steps = response.json()["turn"]["steps"]
    assert steps[0]["kind"] == "model" and steps[0]["status"] == "done"
    assert len(response.text) < 20_000


def test_a_step_result_that_is_not_json_never_makes_the_live_turn_a_500(start_server: Callable[..., Server], sandbox: Path) -> None:
    """A ``motus.step`` may return any picklable value (a set, a float NaN, bytes); the live
    ``turn`` object returned it as it was, and Flask could not serialise it: a 500 on
    ``GET /sessions/{id}`` for as long as the turn waited."""
    server = start_server(f"{HERE}:odd_step", env=env(sandbox))
    session_id = start(server, "go")
    pending(server, session_id)
    response = server.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    json.loads(response.text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    [step, _interrupt] = response.json()["turn"]["steps"]
    assert step["kind"] == "step" and step["status"] == "done"


# -- read-only keys ------------------------------------------------------------------------------


def test_a_read_only_key_cannot_write_through_any_method_or_override(start_server: Callable[..., Server], sandbox: Path) -> None:
    ops, viewer = "ops-secret-1", "viewer-secret-2"
    server = start_server(CALLS, "--api-key", f"ops={ops}", "--api-key", f"viewer={viewer}:read", env=env(sandbox))
    writer = server.with_headers({"Authorization": f"Bearer {ops}"})
    session_id = start(writer, "delete_file a")
    [item] = pending(writer, session_id)
    reader = {"Authorization": f"Bearer {viewer}"}
    body = json.dumps({"interrupt_id": item["interrupt_id"], "value": {"approved": True}})
    routes = ["/sessions", f"/sessions/{session_id}", f"/sessions/{session_id}/messages", f"/sessions/{session_id}/resume",
              f"/sessions/{session_id}/grants/delete_file", "/interrupts", "/events"]
    for path in routes:
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            response = requests.request(method, server.url + path, headers={**reader, "Content-Type": "application/json"}, data=body, timeout=10)
            assert response.status_code in (403, 405), (method, path, response.status_code)  # 405: no such route
        for override in ("POST", "DELETE", "PUT"):
            for header in ("X-HTTP-Method-Override", "X-Method-Override", "X-HTTP-Method"):
                response = requests.get(server.url + path, headers={**reader, header: override}, params={"_method": override}, timeout=10, stream=True)
                response.close()
                assert response.status_code in (200, 404, 405), (header, override, path, response.status_code)
    for method in ("HEAD", "OPTIONS"):
        response = requests.request(method, server.url + f"/sessions/{session_id}/resume", headers=reader, timeout=10)
        assert response.status_code in (200, 405), (method, response.status_code)
    assert ran(sandbox, "delete_file") == []
    assert writer.get(f"/sessions/{session_id}").json()["status"] == "interrupted"
    assert writer.get(f"/sessions/{session_id}/audit").json() == []
    wait_until(lambda: open_streams(writer) == 0, timeout=15, interval=0.1, what="no open streams")


def test_revoking_odd_tool_names_is_a_clean_404(shared_server: Callable[..., Server], shared_sandbox: Path) -> None:
    server = shared_server(CALLS, env=env(shared_sandbox))  # no test on it logs a 500
    session_id = server.create_session()
    for name in ("a%2Fb", "%00", "..", "%E2%80%AE", "x" * 3000, "%25"):
        response = requests.delete(server.url + f"/sessions/{session_id}/grants/{name}", timeout=10)
        assert response.status_code == 404, (name, response.status_code, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
    for params in ({"status": "done"}, {"status": ["pending", "pending"]}, {"wait": "maybe"}, {"timeout": "nan"}, {"timeout": "-1"}):
        assert server.get("/interrupts", params=params).status_code == 400, params
    assert server.get("/interrupts", params={"type": "\u202e\x00"}).json() == []
    assert server.delete(f"/sessions/{session_id}").status_code == 204
    assert server.get(f"/sessions/{session_id}/audit").status_code == 404
    assert "Internal server error" not in server.log()


# -- an object key that cannot be shown ----------------------------------------------------------


@pytest.mark.parametrize("where", ["top", "nested"])
def test_an_interrupt_payload_key_with_a_lone_surrogate_fails_its_own_turn_not_the_inbox(
    shared_server: Callable[..., Server], shared_sandbox: Path, where: str
) -> None:
    """An object key holding half of a UTF-16 pair survives JSON (escaped) but no view can
    show it (pydantic-core writes keys as UTF-8): such a pending interrupt made every
    ``GET /interrupts`` a 500 for everyone, and its session's view too. ``interrupt()``
    now refuses it, so the agent's own turn fails, naming the key; the rest answers."""
    server = shared_server(f"{HERE}:surrogate_keys", env=env(shared_sandbox))
    session_id = start(server, where)
    body = settled(server, session_id)
    assert body["status"] == "error", body
    assert "lone surrogate" in body["error"] and "\\udc80" in body["error"], body["error"]
    inbox = server.get("/interrupts")
    assert inbox.status_code == 200, inbox.text
    assert session_id not in [item["session_id"] for item in inbox.json()]
    assert "Internal server error" not in server.log()


def test_a_stored_payload_key_with_a_lone_surrogate_is_shown_replaced(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """What an earlier motus stored before such keys were refused at the door: a parked
    turn whose pending interrupt has them, at the top and nested. Its session and the inbox
    answer 200, the key shown with U+FFFD for each byte of the surrogate."""
    from motus.durable.journal import canonical_payload
    from motus.durable.records import INTERRUPT, JournalEntry
    from motus.serve.store import SessionRecord, TurnRecord
    from motus.serve.store.sqlite import SqliteStore

    path = tmp_path / "earlier.db"
    store = SqliteStore(f"sqlite:///{path}", str(path))
    store.open()
    payload = {"type": "confirm", "\udc80": 1, "a": [{"b\ud800": "\udc80 stays in a value"}]}
    entry = JournalEntry(seq=1, kind=INTERRUPT, key=canonical_payload(payload), label="confirm", ref="int-earlier",
                         payload=payload, created_at=time.time())
    message = {"role": "user", "content": "go"}
    turn = TurnRecord(turn_id=1, message=message, journal=[entry], started_at=time.time())
    store.save(SessionRecord("earlier", "interrupted", [], None, None, 1, time.time(), turn=turn), entries=[entry])
    store.close()
    server = start_server(CALLS, "--store", f"sqlite:///{path}")
    shown = {"type": "confirm", "\ufffd" * 3: 1, "a": [{"b" + "\ufffd" * 3: "\udc80 stays in a value"}]}
    inbox = server.get("/interrupts")
    assert inbox.status_code == 200, inbox.text
    assert [(item["interrupt_id"], item["payload"]) for item in inbox.json()] == [("int-earlier", shown)]
    view = server.get("/sessions/earlier")
    assert view.status_code == 200, view.text
    assert view.json()["interrupts"][0]["payload"] == shown
    assert "Internal server error" not in server.log()


# -- agents (imported by the server process) ------------------------------------------------------


async def parallel_deletes(message, state):  # type: ignore[no-untyped-def]
    """Delete every path the message lists, all at once (both gates ask at once)."""
    from tests.agents.approval import _reply, delete_file

    paths = (message.content or "").split()
    results = await asyncio.gather(*(delete_file.invoke({"path": path}) for path in paths), return_exceptions=True)
    return _reply(message, state, " | ".join(str(result) for result in results))


async def odd_model(message, state):  # type: ignore[no-untyped-def]
    """Journal one model reply of an odd shape (as a provider might send), then wait on a person."""
    from motus.serve import journal
    from motus.serve.interrupt import interrupt
    from tests.agents.approval import _reply

    reply = ODD_REPLIES[int(message.content or "0")]
    current = journal.current()
    assert current is not None
    await asyncio.to_thread(current.call_sync, "model", f"odd-{message.content}", "odd", lambda: reply)
    value = await interrupt({"type": "confirm", "prompt": "after an odd reply"})
    return _reply(message, state, f"got {value}")


async def odd_step(message, state):  # type: ignore[no-untyped-def]
    import motus
    from motus.serve.interrupt import interrupt
    from tests.agents.approval import _reply

    await motus.step("weird", lambda: {"tags": {"a", "b"}, "ratio": float("nan"), "raw": b"\x00\xff"})
    value = await interrupt({"type": "confirm", "prompt": "after a weird step"})
    return _reply(message, state, f"got {value}")


async def surrogate_keys(message, state):  # type: ignore[no-untyped-def]
    """Interrupts with a payload holding the object key ``"\\udc80"``, at the top level or
    nested, as the message says."""
    from motus.serve.interrupt import interrupt
    from tests.agents.approval import _reply

    inner = {"\udc80": 1}
    payload = {"type": "confirm", **inner} if message.content == "top" else {"type": "confirm", "a": [inner]}
    value = await interrupt(payload)
    return _reply(message, state, f"got {value}")


# -- the README's webhook verification snippet ----------------------------------------------------


def _readme_verify() -> Callable[..., bool]:
    readme = (Path(__file__).resolve().parents[4] / "README.md").read_text()
    start_at = readme.index("def verify(secret: str, raw_body: bytes, headers) -> bool:")
    block = readme[readme.rindex("```python", 0, start_at) + len("```python"): readme.index("```", start_at)]
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the documented snippet itself
    return scope["verify"]


def test_the_readme_verify_snippet_refuses_a_forged_non_ascii_signature() -> None:
    verify = _readme_verify()
    body = json.dumps({"session_id": "x", "timestamp": int(time.time())}).encode()
    assert verify("secret", body, {"X-Motus-Signature": "sha256=\u00e9", "X-Motus-Timestamp": "1"}) is False
