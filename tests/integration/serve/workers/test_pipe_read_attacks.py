"""Attacks on the pool manager's non-blocking pipe reader (``motus.serve.pipes.Frames``,
``WorkerPool._receive`` / ``_reap``): a worker's message must never be lost, duplicated,
reordered or corrupted; a partial message must never become an outcome; one worker must
never stall the manager (every other turn) or leave its own turn running for ever. The agent
is ``tests/agents/pipe_read_attack.py`` (``attacker``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Server, wait_until
from tests.integration.serve.workers.test_forged_message_attacks import body_of, echo_runs, ended, release, started
from tests.integration.serve.workers.test_forged_message_attacks import no_traceback as shared_no_traceback

ATTACKER = "tests.agents.pipe_read_attack:attacker"
EXITED = "Worker process exited unexpectedly"


def serve(start_server: Callable[..., Server], *args: str, sandbox: Path) -> Server:
    return start_server(ATTACKER, *args, env={"MOTUS_EXAMPLE_DIR": str(sandbox)}).with_headers({"Connection": "close"})


@pytest.fixture(scope="module")
def shared_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox of the module's shared server (each test's gates have names of their own)."""
    return tmp_path_factory.mktemp("sandbox")


@pytest.fixture
def shared(shared_server: Callable[..., Server], shared_sandbox: Path) -> Server:
    """One ``--workers 2`` server for the tests that check, after their own attack, that its
    log has no traceback (so each also checks that none of the others left one)."""
    return serve(shared_server, "--workers", "2", sandbox=shared_sandbox)


def no_traceback(server: Server) -> None:
    shared_no_traceback(server)
    assert "pool manager pass failed" not in server.log()


# -- what holds ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [10, 300_000, 6_000_000])
def test_result_then_exit_is_read_as_last_words(shared: Server, size: int) -> None:
    """A Result written whole and followed at once by ``os._exit``: read from the dead
    worker's pipe (small: all of it still in the pipe; large: the tail after the worker
    exits), whole and uncorrupted."""
    server = shared
    sid = server.create_session()
    server.send(sid, f"result-exit {size}")
    body = server.wait_for_status(sid, "idle", timeout=20)
    assert body["response"]["content"] == "x" * size
    no_traceback(server)


def test_many_frames_in_one_write_are_each_applied_in_order(start_server: Callable[..., Server], sandbox: Path) -> None:
    """Hundreds of frames in one write (several per read, one split across reads): each
    read once, in order; none lost, none doubled."""
    server = serve(start_server, "--workers", "1", "--max-interrupts", "0", sandbox=sandbox)
    sid = server.create_session()
    count = 400
    server.send(sid, f"burst {count} b")
    started(sandbox, "b")

    def applied() -> dict | None:
        body = body_of(server, sid)
        if body["status"] not in ("running", "interrupted"):
            return body
        steps = (body.get("turn") or {}).get("steps") or []
        return body if any(step.get("label") == "marker" for step in steps) else None

    body = wait_until(applied, timeout=10, what="the marker after the burst")
    assert body["status"] == "interrupted", {k: v for k, v in body.items() if k != "interrupts"}
    ids = [entry["interrupt_id"] for entry in body["interrupts"]]  # type: ignore[index]
    assert ids == [f"burst-{n}" for n in range(count)]
    release(sandbox, "b")
    server.delete(f"/sessions/{sid}")
    no_traceback(server)


def test_burst_then_result_then_exit(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "burst-result 2000")
    body = server.wait_for_status(sid, "idle", timeout=10)
    assert body["response"]["content"] == "burst"
    echo_runs(server, sid, "after", timeout=10)


def test_sigkill_mid_result_ends_as_exited_and_others_run(shared: Server, shared_sandbox: Path) -> None:
    """Half a 5 MB Result frame, a stall (other turns run meanwhile), then SIGKILL: the turn
    ends as exited, never with what half a message holds."""
    server, sandbox = shared, shared_sandbox
    bystander = server.create_session()
    sid = server.create_session()
    server.send(sid, "half-kill 5000000 k")
    started(sandbox, "k")
    echo_runs(server, bystander, "meanwhile", timeout=5)
    assert body_of(server, sid)["status"] == "running"
    release(sandbox, "k")
    body = ended(server, sid, timeout=10)
    assert body["status"] == "error" and body["error"] == EXITED, body
    echo_runs(server, sid, "again", timeout=10)
    no_traceback(server)


def test_stalled_large_result_completes_whole(shared: Server, shared_sandbox: Path) -> None:
    """Half a 5 MB Result, a stall during which another session's turns run, then the rest:
    the outcome is exactly the stalled Result (not the worker's own later one)."""
    server, sandbox = shared, shared_sandbox
    bystander = server.create_session()
    sid = server.create_session()
    size = 5_000_000
    server.send(sid, f"half-finish {size} f")
    started(sandbox, "f")
    for n in range(3):
        echo_runs(server, bystander, f"meanwhile {n}", timeout=5)
    release(sandbox, "f")
    body = server.wait_for_status(sid, "idle", timeout=20)
    assert body["response"]["content"] == "y" * size
    no_traceback(server)


@pytest.mark.parametrize("ending", ["delete", "timeout"])
def test_turn_ended_mid_transfer(start_server: Callable[..., Server], sandbox: Path, ending: str) -> None:
    """A delete or the turn timeout while half a large frame is in: the turn ends at once,
    the worker is killed (``no_leaks``), the next turn runs."""
    args = ["--workers", "1"] + (["--timeout", "1.5"] if ending == "timeout" else [])
    server = serve(start_server, *args, sandbox=sandbox)
    sid = server.create_session()
    server.send(sid, "half-finish 3000000 d")
    started(sandbox, "d")
    if ending == "delete":
        assert server.delete(f"/sessions/{sid}").status_code in (200, 204)
        sid = server.create_session()
    else:
        body = ended(server, sid, timeout=10)
        assert body["status"] == "error" and "timed out" in body["error"], body
    echo_runs(server, sid, "next", timeout=10)  # the one compute slot was given back
    no_traceback(server)


def test_huge_claimed_size_costs_nothing_and_stalls_nobody(shared: Server, shared_sandbox: Path) -> None:
    """A header claiming 2**40 bytes: nothing allocated up front, other turns run, a delete
    ends it."""
    server, sandbox = shared, shared_sandbox
    bystander = server.create_session()
    sid = server.create_session()
    server.send(sid, "header -1 h")
    started(sandbox, "h")
    echo_runs(server, bystander, "meanwhile", timeout=5)
    import psutil

    rss = psutil.Process(server.process.pid).memory_info().rss
    assert rss < 1 << 30, rss
    release(sandbox, "h")
    assert server.delete(f"/sessions/{sid}").status_code in (200, 204)
    echo_runs(server, bystander, "after", timeout=10)
    no_traceback(server)


def test_grandchild_holding_pipe_does_not_hide_result(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    try:
        server.send(sid, "grandchild-result")
        body = server.wait_for_status(sid, "idle", timeout=10)
        assert body["response"]["content"] == "done: grandchild-result"
        echo_runs(server, sid, "next", timeout=10)
    finally:
        release(sandbox, "grandchild")


# -- bugs ------------------------------------------------------------------------------------


def test_negative_frame_size_ends_the_turn(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = serve(start_server, "--workers", "1", sandbox=sandbox)
    sid = server.create_session()
    try:
        server.send(sid, "header -2 n")
        started(sandbox, "n")
        body = ended(server, sid, timeout=5)
        assert body["status"] == "error" and "unreadable" in body["error"], body
    finally:
        release(sandbox, "n")
        ended(server, sid, timeout=40)  # (it ends as "exited": its own Result was swallowed too)


def test_grandchild_flooding_a_dead_workers_pipe_stalls_nobody(start_server: Callable[..., Server], sandbox: Path) -> None:
    """The worker exits at once; a grandchild it forked floods the pipe with whole frames for
    8 s. ``_reap`` drains 'last words' while ``conn.poll()`` holds: it must not keep the
    manager (every other turn) for as long as the flood lasts. Judged by order, not by a
    clock: another session's turn ends while the flood is still going."""
    server = serve(start_server, "--workers", "2", sandbox=sandbox)
    bystander = server.create_session()
    sid = server.create_session()
    server.send(sid, "grandchild-flood 8")
    wait_until(lambda: server.descendants(), timeout=5, what="the worker")
    echo_runs(server, bystander, "meanwhile", timeout=20)
    assert not (sandbox / "flood-ended").exists(), "the other session's turn waited for the flood to end"
    body = ended(server, sid, timeout=20)
    assert body["status"] == "error" and body["error"] == EXITED, body
