"""Agent shapes, capacity, TTL, shutdown and the other ways to run the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, Server, free_port, launch, server_env, wait_healthy, wait_until
from tests.integration.serve.approvals.test_hitl import WebhookSink, interrupted, resume, start_turn


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ("tests.agents:sync_echo", "sync echo: hi"),
        ("tests.agents:counting", "turn 1: hi"),
    ],
)
def test_agent_shapes(start_server, agent: str, expected: str) -> None:
    server = start_server(agent, "--workers", "1")
    session_id = start_turn(server, "hi")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == expected
    server.send(session_id, "again")
    second = server.wait_for_status(session_id, "idle")["response"]["content"]
    assert second.endswith("again")
    if agent.endswith("counting"):
        assert second == "turn 2: again"  # the state came back from the first turn


def test_interrupted_sessions_hold_no_compute_slot(shared_server) -> None:
    server = shared_server("tests.agents:dispatch", "--allow-custom-ids", "--workers", "1")  # no other test leaves a turn running
    waiting = [start_turn(server, "approval f") for _ in range(6)]
    pending = {sid: interrupted(server, sid)["interrupts"][0]["interrupt_id"] for sid in waiting}
    # With one slot and six sessions waiting on a human, another session still runs turns.
    other = start_turn(server, "echo through")
    assert server.wait_for_status(other, "idle")["response"]["content"] == "echo: through"
    assert server.get("/health").json()["running_workers"] == 0
    for sid, interrupt_id in pending.items():
        assert resume(server, sid, interrupt_id, {"approved": True}).status_code == 200
    for sid in waiting:
        assert server.wait_for_status(sid, "idle")["response"]["content"].startswith("approved=True")


def test_ttl_sweeps_idle_and_error_but_not_interrupted(start_server) -> None:
    server = start_server("tests.agents:dispatch", "--workers", "2", "--ttl", "0.5")
    idle = server.create_session()
    failed = start_turn(server, "crash x")
    server.wait_for_status(failed, "error")
    waiting = start_turn(server, "approval keep")
    [item] = interrupted(server, waiting)["interrupts"]
    wait_until(
        lambda: server.get(f"/sessions/{idle}").status_code == 404 and server.get(f"/sessions/{failed}").status_code == 404,
        timeout=15,
        what="the TTL sweep",
    )
    listed = [s["session_id"] for s in server.get("/sessions").json()]
    assert listed == [waiting]
    assert resume(server, waiting, item["interrupt_id"], {"approved": True}).status_code == 200
    assert server.wait_for_status(waiting, "idle")["status"] == "idle"


def test_sigterm_cancels_interrupted_turns_and_leaves_no_process(start_server) -> None:
    server = start_server("tests.agents:dispatch", "--workers", "2")
    sink = WebhookSink()
    try:
        session_id = server.create_session()
        server.send(session_id, "approval doomed", webhook={"url": sink.url})
        interrupted(server, session_id)
        workers = server.descendants()
        assert len(workers) >= 3  # the gunicorn worker, the forkserver, the turn's process
        assert server.stop() == 0
        [call] = sink.wait_for(1)
        assert call["body"]["status"] == "error" and call["body"]["error"] == "Turn cancelled"
    finally:
        sink.close()


def test_shutdown_timeout_bounds_the_wait_for_running_turns(start_server) -> None:
    server = start_server("tests.agents:dispatch", "--shutdown-timeout", "0.5")
    sink = WebhookSink()
    try:
        session_id = server.create_session()
        server.send(session_id, "hang", webhook={"url": sink.url})
        wait_until(lambda: server.get("/health").json()["running_workers"] == 1, what="the turn to run")
        assert server.stop() == 0
        [call] = sink.wait_for(1)
        assert call["body"]["error"] == "Turn cancelled"
    finally:
        sink.close()


def test_killed_server_leaves_no_orphans(start_server) -> None:
    server = start_server("tests.agents:dispatch", "--workers", "2")
    session_id = start_turn(server, "approval orphan")
    interrupted(server, session_id)
    descendants = server.descendants()
    gunicorn_worker = psutil.Process(server.process.pid).children()[0]
    gunicorn_worker.kill()  # the process holding sessions and pool dies without any cleanup
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(30)

    def all_gone() -> bool:
        return not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    wait_until(all_gone, timeout=15, what="workers and forkserver to exit on their own")


def test_flask_cli_plugin(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "flask.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flask", "motus", "serve", "tests.agents:echo", "--port", str(port), "--workers", "1"],
            cwd=ROOT,
            env=server_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)  # type: ignore[arg-type]
    try:
        wait_healthy(server.url, process, log_path)  # type: ignore[arg-type]
        session_id = start_turn(server, "via flask")
        assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: via flask"
    finally:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(30)
        finally:
            if server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait()
    assert server.process.returncode in (0, -signal.SIGINT)


def _gunicorn(
    workers: int, port: int, log_path: Path, app: str = "wsgi:app", worker_class: str = "gthread", env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-w", str(workers), "-k", worker_class, "--threads", "8",
             "-b", f"127.0.0.1:{port}", "--no-control-socket", app],
            cwd=ROOT,
            env=server_env({"MOTUS_AGENT": "tests.agents:echo", "MOTUS_WORKERS": "1", **(env or {})}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_wsgi_under_gunicorn(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    process = _gunicorn(1, port, log_path)
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)  # type: ignore[arg-type]
    try:
        wait_healthy(server.url, process, log_path)  # type: ignore[arg-type]
        session_id = start_turn(server, "via wsgi")
        assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: via wsgi"
    finally:
        assert server.stop() == 0


def test_packaged_wsgi_with_the_motus_worker_takes_its_settings_from_the_environment(tmp_path: Path) -> None:
    """``gunicorn 'motus.serve.wsgi:app'`` as the README runs it: the app ships in the package,
    and a setting the old top-level module could not take (here ``--max-sessions``) reaches
    the server from its variable."""
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    env = {"MOTUS_THREADS": "8", "MOTUS_MAX_SESSIONS": "1", "MOTUS_STORE": "memory"}
    process = _gunicorn(1, port, log_path, "motus.serve.wsgi:app", "motus.serve.gunicorn_app.MotusWorker", env)
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)  # type: ignore[arg-type]
    try:
        wait_healthy(server.url, process, log_path)  # type: ignore[arg-type]
        session_id = start_turn(server, "via the package")
        assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: via the package"
        assert server.post("/sessions", json={}).status_code == 503
    finally:
        assert server.stop() == 0


def test_wsgi_refuses_a_second_gunicorn_worker(tmp_path: Path) -> None:
    log_path = tmp_path / "gunicorn.log"
    process = _gunicorn(2, free_port(), log_path)
    try:
        assert process.wait(60) != 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "Refusing to start a second gunicorn worker" in log_path.read_text()
    assert "-w 1" in log_path.read_text()


def test_port_in_use_is_a_clear_error(shared_server, tmp_path: Path) -> None:
    server = shared_server("tests.agents:echo", "--workers", "1")
    port = server.url.rsplit(":", 1)[1]
    log_path = tmp_path / "second.log"
    process = launch(["serve", "start", "tests.agents:echo", "--port", port], log_path)
    assert process.wait(30) == 1
    assert f"Port {port} on 127.0.0.1 is already in use" in log_path.read_text()


def test_custom_id_session_survives_unrelated_failures(shared_server) -> None:
    server = shared_server("tests.agents:dispatch", "--allow-custom-ids", "--workers", "1")
    custom = str(uuid.uuid4())
    assert server.put(f"/sessions/{custom}", json={"state": [{"role": "user", "content": "old"}]}).status_code == 201
    crashed = start_turn(server, "exit")
    server.wait_for_status(crashed, "error")
    server.send(custom, "echo after")
    assert server.wait_for_status(custom, "idle")["response"]["content"] == "echo: after"
    assert len(server.get(f"/sessions/{custom}/messages").json()) == 3


def _heartbeat_mtime(worker: psutil.Process) -> float:
    """The modification time of the gunicorn worker's heartbeat file: the one regular file it
    holds open that has been deleted (gunicorn unlinks it at once and touches it to say the
    worker is alive; the arbiter kills a worker whose file is older than ``timeout``)."""
    found = []
    for fd in os.listdir(f"/proc/{worker.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{worker.pid}/fd/{fd}")
            if target.endswith("(deleted)") and not target.startswith(("socket:", "pipe:", "anon_inode:")):
                found.append(os.stat(f"/proc/{worker.pid}/fd/{fd}").st_mtime)
        except FileNotFoundError:
            continue  # a descriptor closed while we looked
    assert len(found) == 1, f"expected one heartbeat file, found {len(found)}"
    return found[0]


def test_the_worker_tells_the_arbiter_it_is_alive_about_once_a_second(shared_server) -> None:
    """gunicorn's loop touches the heartbeat file on every pass (two or three a turn under
    load); motus does it at most once a second, which is all the arbiter's 60 s limit needs.
    The heartbeat must keep going while the server is idle and while it is busy."""
    server = shared_server("tests.agents:echo", "--workers", "1")  # the other test on it leaves its worker alone
    [worker] = [child for child in psutil.Process(server.process.pid).children() if "serve" in child.cmdline()]
    first = _heartbeat_mtime(worker)
    wait_until(lambda: _heartbeat_mtime(worker) > first, timeout=10, what="a heartbeat while idle")

    seen = set()
    started = time.monotonic()
    for _ in range(300):  # hundreds of passes of the worker's loop
        assert server.get("/health").status_code == 200
        seen.add(_heartbeat_mtime(worker))
    elapsed = time.monotonic() - started
    assert len(seen) <= elapsed + 2, f"{len(seen)} heartbeats in {elapsed:.1f} s"
    busy_last = max(seen)
    wait_until(lambda: _heartbeat_mtime(worker) > busy_last, timeout=10, what="a heartbeat after the burst")


def test_the_gunicorn_worker_ends_without_running_the_arbiters_exit_handlers(start_server, tmp_path: Path) -> None:
    """The gunicorn worker is a fork of the arbiter, which imported the agent: an ``atexit``
    handler the agent's module registered is the arbiter's to run, once, not the worker's
    too. The worker ends with ``os._exit`` once its server has shut down (see
    ``motus.serve.gunicorn.app.end_worker_process``); its status and its last log line survive that."""
    record = tmp_path / "exits.txt"
    server = start_server("tests.agents.stop_attack:echo", env={"MOTUS_TEST_EXIT_RECORD": str(record)})
    [worker] = [child for child in psutil.Process(server.process.pid).children() if "serve" in child.cmdline()]
    session_id = start_turn(server, "hi")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "echo: hi"
    assert server.stop() == 0
    ran_in = {int(line) for line in record.read_text().split()}
    assert server.process.pid in ran_in
    assert worker.pid not in ran_in
    assert f"Worker exiting (pid: {worker.pid})" in server.log()
    assert "Shutting down: Master" in server.log()


def test_a_sigterm_right_after_the_worker_died_still_stops_the_server(start_server) -> None:
    """Two races between a worker's death and a SIGTERM to the arbiter, each of which once
    left the arbiter waiting for a worker until its graceful timeout:

    - the SIGTERM and the dead worker's SIGCHLD taken off the arbiter's queue together,
      SIGTERM first (made certain here by stopping the arbiter while both arrive: its
      handlers then run in signal-number order): the stop must reap the dead worker without
      waiting for another SIGCHLD;
    - gunicorn forking a replacement just before the SIGTERM: the new worker may get the
      signal before it has its own handlers, and lose it, so the arbiter sends it again.
    """
    for wait_for_replacement in (False, True, True):
        server = start_server("tests.agents:echo")
        arbiter = psutil.Process(server.process.pid)
        [worker] = [child for child in arbiter.children() if "serve" in child.cmdline()]
        if wait_for_replacement:
            worker.kill()
            wait_until(lambda: any(child.pid != worker.pid for child in arbiter.children()), what="gunicorn to fork a new worker")
        else:
            arbiter.suspend()
            try:
                worker.kill()
                wait_until(lambda: worker.status() == psutil.STATUS_ZOMBIE, what="the worker to die")
                server.process.send_signal(signal.SIGTERM)
            finally:
                arbiter.resume()
            assert server.process.wait(20) == 0  # not stop(): a second SIGTERM could meet the arbiter's exit
        assert server.stop(timeout=20) == 0


def test_a_stopped_server_leaves_no_lock_file_and_a_killed_ones_is_swept(start_server, tmp_path: Path) -> None:
    """The worker's one-worker lock file (``gunicorn-<arbiter pid>.lock``) goes when its
    arbiter exits; one left by a server killed with ``kill -9`` (nobody holds its lock) goes at
    the next start, and one a live server holds stays."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    left = runtime / "gunicorn-999999999.lock"  # a killed server's
    left.write_text("")
    other = runtime / "notes.txt"  # not ours: never touched
    other.write_text("keep")
    first = start_server("tests.agents:echo", env=env)
    mine = runtime / f"gunicorn-{first.process.pid}.lock"
    wait_until(lambda: not left.exists(), what="the killed server's lock file to be swept")
    assert mine.exists() and other.read_text() == "keep"
    second = start_server("tests.agents:echo", env=env)
    theirs = runtime / f"gunicorn-{second.process.pid}.lock"
    wait_until(theirs.exists, what="the second server's lock file")
    assert mine.exists()  # held by a live worker: the second server's sweep left it
    assert first.stop() == 0
    assert not mine.exists(), sorted(p.name for p in runtime.iterdir())
    assert second.stop() == 0
    assert sorted(p.name for p in runtime.iterdir()) == ["notes.txt"]
