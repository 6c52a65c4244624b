"""Attacks on the fast stop: the gunicorn worker's ``os._exit`` after its shutdown, the
arbiter's wait on its signal queue, the zygote's watched import and pidfd wait, and a quick
stop (SIGINT, SIGQUIT) that lands during the worker's shutdown. Every test runs real ``motus serve`` processes and checks what a stop must still
guarantee: exit status 0, no surviving process, the last log lines, parked or cancelled
turns."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import Server, wait_until
from tests.integration.serve.durability.test_durability import health, resume_ok, store_url, wait_idle
from tests.integration.serve.approvals.test_hitl import WebhookSink, interrupted, start_turn
from tests.support.processes import alive as _alive
from tests.integration.serve.workers.test_zygote import is_zygote, serving


gunicorn_worker = serving


def zygote(server: Server) -> psutil.Process:
    worker = gunicorn_worker(server)
    found = [p for p in worker.children() if is_zygote(p)]
    assert len(found) == 1, [p.cmdline() for p in server.descendants()]
    return found[0]


def wait_exit(server: Server, timeout: float = 60.0) -> int:
    """Wait for the arbiter to exit on its own (after signals a test sent), then check that
    nothing it started survives it (``Server.stop`` does no more once it has exited)."""
    return server.process.wait(timeout)


# -- logs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_json_log_is_whole_after_a_stop(start_server: Callable[..., Server], unbuffered: str) -> None:
    """Every line of a ``--log-format json`` log parses, and the worker's and the arbiter's
    last lines are there, with standard streams buffered (as under a process manager) or not."""
    server = start_server("tests.agents:dispatch", "--log-format", "json", env={"PYTHONUNBUFFERED": unbuffered})
    worker = gunicorn_worker(server)
    sid = start_turn(server, "echo hi")
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "echo: hi"
    assert server.stop() == 0
    records = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    messages = [(r["pid"], r["message"]) for r in records]
    assert (worker.pid, f"Worker exiting (pid: {worker.pid})") in messages, messages[-10:]
    assert (server.process.pid, "Shutting down: Master") in messages, messages[-10:]
    # the access line of the last request the worker answered is not lost either
    assert any(r.get("logger") == "motus.access" and r.get("pid") == worker.pid for r in records)


# -- the zygote ---------------------------------------------------------------------------------


def test_sigterm_while_the_zygote_imports_the_agent(start_server: Callable[..., Server], sandbox: Path) -> None:
    # A fresh zygote imports the agent itself; one forked from the serving process inherits it.
    server = start_server("tests.agents.stop_attack:echo", env={"MOTUS_TEST_GATE_DIR": str(sandbox), "MOTUS_WORKER_START": "fresh-zygote"})
    pid_file = sandbox / "zygote.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=20, what="the zygote to import the agent")
    importing = psutil.Process(int(pid_file.read_text()))
    assert _alive(importing)
    assert server.stop() == 0
    assert not _alive(importing)


def test_sigkill_of_the_zygote_then_sigterm(start_server: Callable[..., Server]) -> None:
    server = start_server("tests.agents:dispatch")
    sid = start_turn(server, "echo one")
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "echo: one"
    old = zygote(server)
    old.kill()
    wait_until(lambda: not _alive(old), what="the zygote to die")
    assert server.stop() == 0


def test_sigkill_of_the_zygote_then_a_turn_then_sigterm(start_server: Callable[..., Server]) -> None:
    server = start_server("tests.agents:dispatch")
    old = wait_until(lambda: [p for p in gunicorn_worker(server).children() if is_zygote(p)], what="a zygote")[0]
    old.kill()
    wait_until(lambda: not _alive(old), what="the zygote to die")
    sid = start_turn(server, "echo two")
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "echo: two"
    assert server.stop() == 0


# -- signals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("signals", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT,)], ids=["double-sigterm", "sigint-alone"])
def test_a_stop_with_an_interrupted_turn_cancels_it_once(start_server: Callable[..., Server], signals: tuple[int, ...]) -> None:
    server = start_server("tests.agents:dispatch", "--store", "memory")
    sink = WebhookSink()
    try:
        sid = server.create_session()
        server.send(sid, "approval doomed", webhook={"url": sink.url})
        interrupted(server, sid)
        descendants = server.descendants()
        for sig in signals:
            server.process.send_signal(sig)
        assert wait_exit(server) == 0
        wait_until(lambda: not [p for p in descendants if _alive(p)], what="every process to end")
        [call] = sink.wait_for(1)
        assert call["body"]["error"] == "Turn cancelled"
    finally:
        sink.close()


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGQUIT])
def test_sigterm_then_quick_stop_while_a_turn_runs(start_server: Callable[..., Server], second: int) -> None:
    """A quick stop (SIGINT or SIGQUIT) that reaches the worker while its shutdown waits for a
    running turn cuts the wait short: the turn is cancelled and its webhook sent. (gunicorn's
    handler raised SystemExit into the shutdown, which then cancelled nothing.)"""
    server = start_server("tests.agents:dispatch", "--shutdown-timeout", "120", "--store", "memory")
    sink = WebhookSink()
    try:
        sid = server.create_session()
        server.send(sid, "hang", webhook={"url": sink.url})
        wait_until(lambda: server.get("/health").json()["running_workers"] == 1, what="the turn to run")
        descendants = server.descendants()
        worker = gunicorn_worker(server)
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: f"Worker exiting (pid: {worker.pid})" in server.log(), what="the worker to begin its shutdown")
        server.process.send_signal(second)
        assert wait_exit(server, timeout=60) == 0, server.log()
        wait_until(lambda: not [p for p in descendants if _alive(p)], timeout=20, what="every process to end")
        [call] = sink.wait_for(1)
        assert call["body"]["error"] == "Turn cancelled"
    finally:
        sink.close()


def test_sigterm_during_boot_before_health(tmp_path: Path) -> None:
    from tests.conftest import free_port, launch

    for attempt in range(3):
        port = free_port()
        log_path = tmp_path / f"boot-{attempt}.log"
        process = launch(["serve", "start", "tests.agents:echo", "--port", str(port)], log_path)
        try:
            wait_until(lambda: "Booting worker" in log_path.read_text(errors="replace"), timeout=30, interval=0.001, what="the worker to boot")
            tree = psutil.Process(process.pid).children(recursive=True)
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0, log_path.read_text()
            wait_until(lambda: not [p for p in tree if _alive(p)], what="every process to end")
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_sigkill_of_the_gunicorn_worker_with_a_running_turn_then_sigterm(start_server: Callable[..., Server]) -> None:
    server = start_server("tests.agents:dispatch")
    sid = start_turn(server, "hang")
    wait_until(lambda: server.get("/health").json()["running_workers"] == 1, what="the turn to run")
    descendants = server.descendants()
    gunicorn_worker(server).kill()
    server.process.send_signal(signal.SIGTERM)
    assert wait_exit(server) == 0
    wait_until(lambda: not [p for p in descendants if _alive(p)], timeout=20, what="every process to end")


# -- durable store -------------------------------------------------------------------------------


def test_sqlite_interrupted_and_running_turns_survive_a_stop_once(start_server: Callable[..., Server], tmp_path: Path) -> None:
    args = ["--store", store_url(tmp_path / "s.db"), "--shutdown-timeout", "0.5"]
    first = start_server("tests.agents:dispatch", *args)
    waiting = start_turn(first, "approval /x")
    [item] = interrupted(first, waiting)["interrupts"]
    done = start_turn(first, "echo kept")
    assert first.wait_for_status(done, "idle")["response"]["content"] == "echo: kept"
    assert first.stop() == 0
    second = start_server("tests.agents:dispatch", *args)
    state = health(second)
    assert state["parked_turns"] == 1 and state["total_sessions"] == 2, state
    assert second.get(f"/sessions/{done}").json()["response"]["content"] == "echo: kept"
    resume_ok(second, waiting, item["interrupt_id"], {"approved": True})
    assert wait_idle(second, waiting)["response"]["content"].startswith("approved=True")
    assert second.stop() == 0


def test_a_quick_stop_during_the_workers_shutdown_runs_no_inherited_atexit_handler(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """A SIGQUIT that lands inside the worker's shutdown no longer escapes the exit hook past
    its ``os._exit``, into finalisation and the arbiter's atexit handlers."""
    record = tmp_path / "exits.txt"
    server = start_server(
        "tests.agents.stop_attack:hang", "--shutdown-timeout", "120", "--store", "memory",
        env={"MOTUS_TEST_EXIT_RECORD": str(record)},
    )
    start_turn(server, "x")
    wait_until(lambda: server.get("/health").json()["running_workers"] == 1, what="the turn to run")
    worker = gunicorn_worker(server)
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: f"Worker exiting (pid: {worker.pid})" in server.log(), what="the worker to begin its shutdown")
    server.process.send_signal(signal.SIGINT)
    assert wait_exit(server, timeout=60) == 0, server.log()
    ran_in = {int(line) for line in record.read_text().split()}
    assert server.process.pid in ran_in
    assert worker.pid not in ran_in
