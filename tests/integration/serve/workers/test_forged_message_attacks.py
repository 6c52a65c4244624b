"""Attacks on "a worker message the server cannot apply ends its turn in error"
(``protocol.message_problem``, ``Turns._apply_or_end_locked``): what an agent's own process
can write to its worker's pipe, alone or racing a client, and what the server must still
guarantee. The agent is ``tests/agents/forged_message_attack.py`` (``attacker``).

The properties: a message from the agent's process changes nothing but its own turn; the
turn ends (or goes on) without holding a compute slot nobody will give back; the pool's
manager thread keeps reading every other turn's messages; no request answers 500 and the
server log carries no traceback the agent caused; what ``GET /sessions/{id}`` and
``GET /interrupts`` show is consistent (an interrupt id is pending at most once, a session
``interrupted`` waits on something a client can answer).

The bugs found here are fixed; the one test marked ``xfail(strict=True)`` is a known limit,
said in its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.conftest import Server, wait_until

ATTACKER = "tests.agents.forged_message_attack:attacker"


def resume(server: Server, sid: str, interrupt_id: str, value: object) -> requests.Response:
    return server.post(f"/sessions/{sid}/resume", json={"interrupt_id": interrupt_id, "value": value})


def body_of(server: Server, sid: str) -> dict:
    response = server.get(f"/sessions/{sid}")
    assert response.status_code == 200, response.text
    return response.json()


def ended(server: Server, sid: str, timeout: float) -> dict:
    """The session once its turn is over (neither ``running`` nor ``interrupted``)."""

    def check() -> dict | None:
        body = body_of(server, sid)
        return body if body["status"] not in ("running", "interrupted") else None

    return wait_until(check, timeout=timeout, what=f"session {sid} to end its turn")  # type: ignore[return-value]


def interrupted(server: Server, sid: str, count: int = 1, timeout: float = 10.0) -> dict:
    def check() -> dict | None:
        body = body_of(server, sid)
        return body if body["status"] == "interrupted" and len(body["interrupts"] or []) >= count else None

    return wait_until(check, timeout=timeout, what=f"session {sid} to wait on {count} interrupt(s)")  # type: ignore[return-value]


def applied(server: Server, sid: str, timeout: float = 10.0) -> dict:
    """The session once the server has applied what the agent sent before its ``marker``
    record (it shows in the live turn's journal), or once the turn is over."""

    def check() -> dict | None:
        body = body_of(server, sid)
        if body["status"] not in ("running", "interrupted"):
            return body
        steps = (body.get("turn") or {}).get("steps") or []
        return body if any(step.get("label") == "marker" for step in steps) else None

    return wait_until(check, timeout=timeout, what=f"session {sid} to apply the forged messages")  # type: ignore[return-value]


def started(sandbox: Path, gate: str, timeout: float = 10.0) -> str:
    """What the agent wrote in ``started-GATE`` once it got there."""
    path = sandbox / f"started-{gate}"
    wait_until(path.exists, timeout=timeout, what=f"the agent to reach gate {gate}")
    return path.read_text()


def release(sandbox: Path, gate: str) -> None:
    (sandbox / f"release-{gate}").write_text("")


def echo_runs(server: Server, sid: str, content: str, timeout: float) -> dict:
    """Send ``content`` to the (echo) session ``sid`` and wait for its reply."""
    server.send(sid, content)
    body = server.wait_for_status(sid, "idle", timeout=timeout)
    assert body["response"]["content"] == f"done: {content}", body
    return body


def no_traceback(server: Server) -> None:
    log = server.log()
    assert "Traceback" not in log and "pool listener failed" not in log, log[-4000:]


def serve(start_server: Callable[..., Server], *args: str, sandbox: Path | None = None) -> Server:
    """The attacker's server. Every request asks for its connection to be closed: a failed
    test's traceback keeps the last response (and its keep-alive socket) alive, and a
    graceful stop would wait for that socket."""
    env = {"MOTUS_EXAMPLE_DIR": str(sandbox)} if sandbox is not None else None
    return start_server(ATTACKER, *args, env=env).with_headers({"Connection": "close"})


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


# -- what holds ------------------------------------------------------------------------------


def test_unexpected_unreadable_and_late_messages_touch_nothing_else(start_server: Callable[..., Server], sandbox: Path) -> None:
    """Messages of types the server never expects are ignored; one that cannot be unpickled
    ends its turn with one line; a forged ``Result`` is the outcome and what follows it (a
    ``Failure``, an ``Interrupt``, a ``Record``, the real ``Result``) is never read; a record
    acknowledged twice is acknowledged twice. One compute slot: each turn gives it back."""
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    bystander = server.create_session()

    sid = server.create_session()
    echo_runs(server, sid, "unexpected", timeout=10)
    echo_runs(server, bystander, "after unexpected", timeout=10)

    sid = server.create_session()
    server.send(sid, "unreadable")
    body = ended(server, sid, timeout=10)
    assert body["status"] == "error" and body["error"].startswith("Worker sent an unreadable message: ValueError"), body
    assert server.get(f"/sessions/{sid}/messages").json() == []
    echo_runs(server, bystander, "after unreadable", timeout=10)

    sid = server.create_session()
    server.send(sid, "after-result")
    body = ended(server, sid, timeout=10)
    assert (body["status"], body["response"]["content"], body["interrupts"]) == ("idle", "forged", None), body
    assert [m["content"] for m in server.get(f"/sessions/{sid}/messages").json()] == ["after-result", "forged"]
    assert server.get("/interrupts").json() == []
    echo_runs(server, bystander, "after after-result", timeout=10)

    sid = server.create_session()
    echo_runs(server, sid, "ack-twice", timeout=10)
    echo_runs(server, bystander, "after ack-twice", timeout=10)

    no_traceback(server)
    assert server.stop() == 0


def test_a_forged_record_at_the_seq_a_real_interrupt_takes_next(start_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    """A finished tool record at seq 1, then a real ``interrupt()``, which the worker also
    numbers 1. The server may let the interrupt take the seq over (then, with
    ``--park-after 0`` on SQLite, the turn is parked, replayed from the journal, and the
    answer reaches the agent once) or end the turn as malformed; either way in one line,
    with no traceback, and the only compute slot is given back."""
    args = ["--workers", "1", "--store", sqlite_url(tmp_path), "--park-after", "0"]
    server = serve(start_server, *args, sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "record-then-interrupt")
    body = wait_until(lambda: (b := body_of(server, sid))["status"] != "running" and b, timeout=10, what="the interrupt")
    if body["status"] == "interrupted":  # type: ignore[index]
        assert len(body["interrupts"]) == 1, body  # type: ignore[index]
        interrupt_id = body["interrupts"][0]["interrupt_id"]  # type: ignore[index]
        assert resume(server, sid, interrupt_id, "yes").status_code == 200
        body = server.wait_for_status(sid, "idle")
        assert body["response"]["content"] == "answer: yes", body
        assert resume(server, sid, interrupt_id, "again").status_code == 404
    else:
        assert body["status"] == "error" and body["error"].startswith("Worker sent a malformed"), body  # type: ignore[index]
    echo_runs(server, sid, "next", timeout=10)
    no_traceback(server)
    assert server.stop() == 0


def test_what_a_worker_of_ours_sends_is_never_refused(start_server: Callable[..., Server], sandbox: Path) -> None:
    """No forgery, with ``--max-interrupts 1``: a payload at the worker's depth limit with a
    timeout and a deep default, then an interrupt the agent gives up on (still pending on
    the server, no longer counted by the worker), then another. The checks added against
    forged messages must not end such a turn."""
    server = serve(start_server, "--workers", "1", "--max-interrupts", "1", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "edge")

    def asking(question: str) -> str | None:
        body = body_of(server, sid)
        assert body["status"] in ("running", "interrupted"), body
        return next((i["interrupt_id"] for i in body["interrupts"] or [] if i["payload"].get("q") == question or
                     i["type"] == question), None)

    first = wait_until(lambda: asking("deepest"), timeout=10, what="the deepest interrupt")
    assert resume(server, sid, first, "a").status_code == 200  # type: ignore[arg-type]
    kept = wait_until(lambda: asking("kept"), timeout=10, what="the interrupt after the one given up")
    assert resume(server, sid, kept, "b").status_code == 200  # type: ignore[arg-type]
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "answer: a b"
    no_traceback(server)
    assert server.stop() == 0


def test_a_malformed_message_that_waits_for_a_locked_store_still_ends_its_turn(
    start_server: Callable[..., Server], sandbox: Path, tmp_path: Path
) -> None:
    """The backlog path: the store is locked by another connection when a malformed
    interrupt arrives, so ending the turn waits in the turn's backlog; once the lock goes,
    the retry ends the turn in error, and the only compute slot is given back."""
    import sqlite3

    args = ["--workers", "1", "--store", sqlite_url(tmp_path)]
    server = serve(start_server, *args, sandbox=sandbox)
    bystander = server.create_session()
    sid = server.create_session()
    server.send(sid, "malformed first second")
    started(sandbox, "first")
    locker = sqlite3.connect(tmp_path / "store.db", isolation_level=None, timeout=10)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        release(sandbox, "first")
        wait_until(lambda: "the worker's message waits and is retried" in server.log(), timeout=15, what="the backlog")
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    body = ended(server, sid, timeout=10)
    assert body["status"] == "error" and body["error"].startswith("Worker sent a malformed interrupt"), body
    echo_runs(server, bystander, "after the lock", timeout=10)
    release(sandbox, "second")
    assert server.stop() == 0


# -- bugs --------------------------------------------------------------------------------------


def test_a_half_written_frame_does_not_stall_every_other_turn(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "2", "--shutdown-timeout", "0.2", sandbox=sandbox)
    bystander = server.create_session()
    sid = server.create_session()
    try:
        server.send(sid, "partial gate")
        started(sandbox, "gate")
        # A second compute slot is free: only the manager thread stands between this turn
        # and its reply.
        echo_runs(server, bystander, "while a frame is half written", timeout=2.5)
    finally:
        release(sandbox, "gate")
    assert ended(server, sid, timeout=10)["status"] in ("idle", "error")
    assert server.stop() == 0


def test_a_message_whose_unpickling_raises_systemexit_does_not_end_the_manager(start_server: Callable[..., Server]) -> None:
    server = serve(start_server, "--workers", "2", "--shutdown-timeout", "0.2")
    sid = server.create_session()
    server.send(sid, "sysexit")
    body = ended(server, sid, timeout=2.5)
    assert body["status"] == "error", body
    echo_runs(server, server.create_session(), "after sysexit", timeout=2.5)
    assert server.stop() == 0


def test_a_pending_forged_interrupt_never_makes_a_view_answer_500(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "2", sandbox=sandbox)
    sessions = {command: server.create_session() for command in ("intkey", "deep")}
    try:
        for command, sid in sessions.items():
            server.send(sid, f"{command} {command}")
            started(sandbox, command)

            def settled() -> bool:  # the forged interrupt is applied, or its turn is over
                response = server.get(f"/sessions/{sid}")  # noqa: B023 - called at once
                return response.status_code != 200 or response.json()["status"] != "running"

            wait_until(settled, timeout=10, what=f"the forged interrupt ({command}) to be applied")
            for path in (f"/sessions/{sid}", "/interrupts"):
                response = server.get(path)
                assert response.status_code == 200, (command, path, response.text)
        no_traceback(server)
    finally:
        for command in sessions:
            release(sandbox, command)
    assert server.stop() == 0


def test_an_interrupt_payload_with_mixed_key_types_is_refused_as_malformed(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "mixedkeys gate")
    try:
        body = wait_until(lambda: (b := body_of(server, sid))["status"] != "running" and b, timeout=10, what="the forged interrupt")
        assert body["error"] is None or body["error"].startswith("Worker sent a malformed interrupt"), body  # type: ignore[index]
        no_traceback(server)
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


def test_a_forged_result_that_is_not_a_chat_message_never_makes_a_view_answer_500(start_server: Callable[..., Server]) -> None:
    server = serve(start_server, "--workers", "1")
    sid = server.create_session()
    server.send(sid, "badrole")
    wait_until(lambda: server.get(f"/sessions/{sid}").status_code != 200 or body_of(server, sid)["status"] != "running",
               timeout=10, what="the forged result")
    response = server.get(f"/sessions/{sid}")
    assert response.status_code == 200, response.text
    assert server.get(f"/sessions/{sid}/messages").status_code == 200
    echo_runs(server, sid, "the next turn", timeout=10)  # the history it left can be run on
    no_traceback(server)
    assert server.stop() == 0


def test_a_journal_record_never_makes_the_live_view_answer_500(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "2", sandbox=sandbox)
    sessions = {command: server.create_session() for command in ("args-bomb", "deep-record")}
    try:
        for command, sid in sessions.items():
            server.send(sid, f"{command} {command}")
            started(sandbox, command)

            def recorded() -> bool:  # the record is in the journal (or the view already fails)
                response = server.get(f"/sessions/{sid}")  # noqa: B023 - called at once
                return response.status_code != 200 or bool(response.json().get("turn", {}).get("steps"))

            wait_until(recorded, timeout=10, what=f"the record ({command}) to be applied")
            response = server.get(f"/sessions/{sid}")
            assert response.status_code == 200, (command, response.text)
        no_traceback(server)
    finally:
        for command in sessions:
            release(sandbox, command)
    assert server.stop() == 0


def test_reading_a_session_never_ends_the_server(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "2", "--shutdown-timeout", "0.2", sandbox=sandbox)
    bystander = server.create_session()
    echo_runs(server, bystander, "before", timeout=10)
    sid = server.create_session()
    server.send(sid, "exit-record gate")
    try:
        started(sandbox, "gate")

        def view() -> requests.Response | None:
            try:
                response = server.get(f"/sessions/{sid}")
            except requests.ConnectionError as exc:
                raise AssertionError(f"GET /sessions/{sid} got no answer: {exc}") from None
            steps = (response.json().get("turn") or {}).get("steps") if response.status_code == 200 else None
            return response if response.status_code != 200 or steps else None

        assert wait_until(view, timeout=10, what="the record in the live view").status_code == 200  # type: ignore[union-attr]
        echo_runs(server, bystander, "after", timeout=10)
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


@pytest.mark.parametrize("command", ["raise-surrogate", "huge-seq gate", "surrogate-type gate"])
def test_a_write_the_store_cannot_take_does_not_hold_the_slot(
    start_server: Callable[..., Server], tmp_path: Path, sandbox: Path, command: str
) -> None:
    args = ["--workers", "1", "--store", sqlite_url(tmp_path), "--shutdown-timeout", "0.2"]
    server = serve(start_server, *args, sandbox=sandbox)
    bystander = server.create_session()
    sid = server.create_session()
    server.send(sid, command)
    try:
        body = wait_until(lambda: (b := body_of(server, sid))["status"] != "running" and b, timeout=2.5, what="the turn to give its slot back")
        if command == "surrogate-type gate":  # a real interrupt: it may wait, and be answered
            if body["status"] == "interrupted":  # type: ignore[index]
                assert resume(server, sid, body["interrupts"][0]["interrupt_id"], "ok").status_code == 200  # type: ignore[index]
                assert server.wait_for_status(sid, "idle", timeout=5)["response"]["content"] == "answer: ok"
        else:
            assert body["status"] == "error", body  # type: ignore[index]
        echo_runs(server, bystander, "after a write the store cannot take", timeout=2.5)
        no_traceback(server)
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


def test_an_answered_interrupt_sent_again_never_leaves_a_session_waiting_on_nothing(
    start_server: Callable[..., Server], sandbox: Path, tmp_path: Path
) -> None:
    args = ["--workers", "1", "--store", sqlite_url(tmp_path), "--park-after", "0", "--shutdown-timeout", "0.2"]
    server = serve(start_server, *args, sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "resend-answered gate")
    try:
        interrupt_id = interrupted(server, sid)["interrupts"][0]["interrupt_id"]
        assert resume(server, sid, interrupt_id, interrupt_id).status_code == 200  # the agent sends it again
        body = applied(server, sid)
        # Waiting on nothing: with --park-after 0 its process is then killed, and nothing
        # ever resumes it.
        assert not (body["status"] == "interrupted" and not body["interrupts"]), body
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


def test_an_interrupt_id_is_pending_at_most_once(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "dup-id gate")
    try:
        body = applied(server, sid)
        ids = [item["interrupt_id"] for item in body["interrupts"] or []]
        assert len(ids) == len(set(ids)), body
        inbox = [item["interrupt_id"] for item in server.get("/interrupts").json()]
        assert len(inbox) == len(set(inbox)), inbox
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


def test_a_forged_interrupt_never_replaces_a_pending_one(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "replace-pending gate")
    try:
        real = started(sandbox, "gate")  # the real interrupt's id
        body = applied(server, sid)
        if body["status"] == "interrupted":
            assert real in {item["interrupt_id"] for item in body["interrupts"]}, body
            assert resume(server, sid, real, "yes").status_code == 200
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0


@pytest.mark.xfail(strict=True, reason=(
    "Known limit, by design: --max-interrupts is held by the worker (interrupt._Channel.interrupt), the only "
    "side that knows which pending interrupts the agent gave up on (asyncio.wait_for(interrupt(...), t)); the "
    "server applies any number an agent's process writes to its own pipe, so one turn shows more than the limit"
))
def test_max_interrupts_holds_for_what_the_pipe_carries(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", "--max-interrupts", "2", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "many 5 gate")
    try:
        body = applied(server, sid)
        assert len(body["interrupts"] or []) <= 2, body
    finally:
        release(sandbox, "gate")
    assert server.stop() == 0
