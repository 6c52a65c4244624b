"""The zygote's rehearsal turn (``worker.rehearse``), attacked through hostile agent modules.

The agent module is imported in the zygote *before* the rehearsal runs, so whatever it does
to the process at import (an asyncio policy, monkeypatches, threads, signal handlers, closed
descriptors, a tiny recursion limit) is in place while our stand-in turn runs. Expected: turns
still work, or every turn fails with one line (never a hang, a 500, or a leaked process), and
the server stays healthy. The stand-in turn must never show on a real server either.

The agent is ``tests.agents.zygote:agent`` with ``$ZYGOTE_HOSTILE`` picking the misbehaviour.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from motus.serve.worker import REHEARSAL_SECONDS
from tests.conftest import Server
from tests.integration.serve.approvals.test_hitl import interrupted, resume
from tests.integration.serve.workers.test_zygote import (
    AGENT, WARM, agent_env, alive, assert_ended, assert_no_500, echo_ok, finished, health, metric, recorded,
    serving, the_zygote, turn,
)

StartServer = Callable[..., Server]


def start(start_server: StartServer, sandbox: Path, *args: str, **env: str) -> Server:
    return start_server(AGENT, "--workers", "2", *args, env=agent_env(sandbox, **env))


def interrupt_round_trip(server: Server, sandbox: Path, tag: str) -> None:
    """A turn through the agent's own ``interrupt()`` (the reference it imported): paused,
    resumed, answered; the ``sleep`` it started ends with the turn."""
    session_id = server.create_session()
    server.send(session_id, f"spawn_wait {tag}")
    [item] = interrupted(server, session_id)["interrupts"]
    assert resume(server, session_id, item["interrupt_id"], {"ok": tag}).status_code == 200
    body = finished(server, session_id)
    assert body["status"] == "idle", body
    assert body["response"]["content"] == f"resumed {{'ok': '{tag}'}}"
    assert_ended([recorded(sandbox, tag)], what=f"the background process of {tag}")


def assert_serves(server: Server, sandbox: Path) -> None:
    echo_ok(server, WARM + 2)  # more turns than warm processes: refills are forked too
    interrupt_round_trip(server, sandbox, "hitl")
    the_zygote(server, warm=None)  # the zygote that served them is still there
    assert health(server)["status"] == "ok"
    assert_no_500(server)


def assert_fails_each_turn_with_one_line(server: Server, turns: int = 3) -> list[str]:
    errors = []
    for n in range(turns):
        started = time.monotonic()
        body = turn(server, f"echo doomed{n}", timeout=20)
        assert time.monotonic() - started < 20
        assert body["status"] == "error", body
        assert body["error"] and "\n" not in body["error"], body["error"]
        errors.append(body["error"])
    assert health(server)["status"] == "ok"
    assert_no_500(server)
    return errors


# -- 1. patches and policies that leave turns able to run: they still run --------------------


@pytest.mark.parametrize(
    "hostile",
    [
        "policy_subclass", "pickle_wrap", "socketpair_wrap", "uuid_const", "interrupt_async",
        "thread", "sigchld", "sigalrm", "close_std", "dup2_std", "debug_logging", "recursion50",
    ],
)
def test_hostile_import_that_leaves_turns_runnable_still_serves(start_server: StartServer, sandbox: Path, hostile: str) -> None:
    server = start(start_server, sandbox, ZYGOTE_HOSTILE=hostile)
    assert_serves(server, sandbox)


def test_agent_that_replaced_the_public_interrupt_still_serves(start_server: StartServer, sandbox: Path) -> None:
    server = start(start_server, sandbox, ZYGOTE_HOSTILE="interrupt_sync")
    assert_serves(server, sandbox)


@pytest.mark.parametrize(("hostile", "why"), [("uuid_raises", "uuid4 is disabled"), ("pickle_raises", "pickle.dumps is disabled")])
def test_turns_that_never_pause_run_when_what_a_pause_needs_is_broken(
    start_server: StartServer, sandbox: Path, hostile: str, why: str
) -> None:
    """The rehearsal always pauses, so it fails here; the zygote serves without it, says so in
    one line of the server's log, and turns that never pause do not pay for it."""
    server = start(start_server, sandbox, ZYGOTE_HOSTILE=hostile)
    echo_ok(server, 2)
    [line] = [line for line in server.log().splitlines() if "serving without the rehearsal turn" in line]
    assert line.endswith(why), line


# -- 2. patches that break every turn: one line each, no hang, server healthy ----------------


@pytest.mark.parametrize("hostile", ["policy_raises", "new_loop_raises"])
def test_hostile_import_that_breaks_turns_fails_each_with_one_line(start_server: StartServer, sandbox: Path, hostile: str) -> None:
    server = start(start_server, sandbox, ZYGOTE_HOSTILE=hostile)
    errors = assert_fails_each_turn_with_one_line(server)
    # The cause, not "exited unexpectedly": the worker could not make its loop, and says why.
    assert all(error.startswith("Could not create the worker's event loop: RuntimeError: ") for error in errors), errors


# -- 3. a rehearsal that never ends -----------------------------------------------------------


def test_a_rehearsal_that_never_ends_does_not_hold_turns(start_server: StartServer, sandbox: Path) -> None:
    """Past ``REHEARSAL_SECONDS`` the zygote gives the rehearsal up and serves: echo turns
    (which never claim an interrupt) complete, and the server's log says why, in one line."""
    server = start(start_server, sandbox, "--shutdown-timeout", "1", ZYGOTE_HOSTILE="claim_hang")
    body = turn(server, "echo stuck", timeout=REHEARSAL_SECONDS + 15)
    assert body["status"] == "idle", body
    [line] = [line for line in server.log().splitlines() if "serving without the rehearsal turn" in line]
    assert "TimeoutError" in line, line


def test_server_killed_during_a_hung_rehearsal_takes_the_zygote_with_it(start_server: StartServer, sandbox: Path) -> None:
    """The watcher of ``_exit_if_abandoned`` covers the rehearsal too, not only the import."""
    server = start(start_server, sandbox, ZYGOTE_HOSTILE="uuid_block")
    zygote = the_zygote(server, warm=0)
    assert not zygote.children()
    serving(server).kill()
    assert_ended([zygote], timeout=5, what="the zygote stuck in its rehearsal after kill -9 of the server")


def test_sigterm_during_a_hung_rehearsal_is_prompt(start_server: StartServer, sandbox: Path) -> None:
    server = start(start_server, sandbox, "--shutdown-timeout", "1", ZYGOTE_HOSTILE="uuid_block")
    zygote = the_zygote(server, warm=0)
    stopping = time.monotonic()
    assert server.stop() == 0  # fails if anything outlives the server
    assert time.monotonic() - stopping < 6.0
    assert not alive(zygote)


# -- 4. the stand-in turn never shows on a real server -----------------------------------------


def test_the_rehearsal_never_shows_in_sessions_metrics_or_logs(start_server: StartServer, sandbox: Path) -> None:
    server = start(start_server, sandbox)
    echo_ok(server, 3)
    interrupt_round_trip(server, sandbox, "real")
    assert "rehearsal" not in server.log().lower(), [l for l in server.log().splitlines() if "rehearsal" in l.lower()]
    assert "rehearsal" not in server.get("/sessions").text.lower()
    metrics = server.get("/metrics").text
    assert "rehearsal" not in metrics.lower()
    # Exactly the four real turns and the one real interrupt: the stand-in's are not counted.
    assert metric(metrics, "motus_turns_started_total") == 4
    assert metric(metrics, "motus_turns_ended_total") == 4
    assert metric(metrics, "motus_interrupts_total") == 1
    assert server.get("/sessions/rehearsal").status_code == 404
    # With the agent's import turning on DEBUG logging everywhere, still nothing.
    noisy = start(start_server, sandbox, ZYGOTE_HOSTILE="debug_logging")
    echo_ok(noisy, 2)
    interrupt_round_trip(noisy, sandbox, "noisy")
    assert "rehearsal" not in noisy.log().lower(), [l for l in noisy.log().splitlines() if "rehearsal" in l.lower()]
