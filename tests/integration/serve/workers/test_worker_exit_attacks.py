"""Attacks on a finished worker skipping asyncio's clean-up: a zygote's child skips it when
``_nothing_to_clean_up`` says nothing is left (``worker._run_on(..., exiting=True)``), then
``os._exit``s. What the agent scheduled before its reply must still run, and what the exit
must still do (wait for executor work, end subprocesses and threads, flush stdout) it does.

Agents: ``tests.agents.turn_cost:agent`` (see its docstring).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import pytest

from motus.serve import worker
from tests.conftest import Server
from tests.integration.serve.workers.test_pool_manager_attacks import AGENT, StartServer, cost_env
from tests.integration.serve.workers.test_zygote import (
    assert_ended,
    assert_no_500,
    finished,
    recorded,
)


def marker(sandbox: Path, tag: str, timeout: float = 5.0) -> str | None:
    """What ``TAG.done`` says once it exists, or None if it never appears within ``timeout``."""
    path = sandbox / f"{tag}.done"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return path.read_text()


def run_turn(server: Server, content: str) -> dict:
    session_id = server.create_session()
    server.send(session_id, content)
    return finished(server, session_id)


# == the skipped asyncio clean-up ==========================================================
#
# asyncio.run's clean-up runs the loop three more times: callbacks already scheduled when the
# main coroutine returned (a future's done callback, a call_soon chain, a timer due now) run
# there. ``_nothing_to_clean_up`` looks at tasks, async generators and the default executor,
# not at the loop's ready queue, so a zygote's child drops those callbacks.

def _call_soon_chain(seen: list[str]):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, seen.append, "ran")
    return main()


def _thread_done_cb(seen: list[str]):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.add_done_callback(lambda done: seen.append(f"callback {done.result()}"))
        poster = threading.Thread(target=loop.call_soon_threadsafe, args=(future.set_result, "ran"))
        poster.start()
        poster.join()
    return main()


def _executor_done_cb(seen: list[str]):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        executor = concurrent.futures.ThreadPoolExecutor(1)
        work = loop.run_in_executor(executor, sum, [1, 2, 3])
        work.add_done_callback(lambda done: seen.append(f"callback {done.result()}"))
        executor.shutdown(wait=True)
    return main()


def _timer_chain(seen: list[str]):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_later, 0, seen.append, "timer")
    return main()


SCHEDULED = {
    "call_soon_chain": (_call_soon_chain, "ran"),
    "thread_done_cb": (_thread_done_cb, "callback ran"),
    "executor_done_cb": (_executor_done_cb, "callback 6"),
    "timer_chain": (_timer_chain, "timer"),
}


@pytest.mark.parametrize("how", list(SCHEDULED))
def test_unit_callbacks_scheduled_before_the_end_run_as_under_asyncio_run(how: str) -> None:
    """Reference first (no ``exiting``: asyncio.run's clean-up), then the zygote child's way
    (``exiting=True``): the agent must observe the same thing."""
    make, expected = SCHEDULED[how]
    observed = {}
    for exiting in (False, True):
        seen: list[str] = []
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            worker._run_on(loop, make(seen), exiting=exiting)
        finally:
            asyncio.set_event_loop(None)
            if not loop.is_closed():
                loop.close()
        observed[exiting] = seen
    assert observed[False] == [expected], observed  # asyncio.run's semantics
    assert observed[True] == observed[False], f"{how}: asyncio.run ran {observed[False]}, the exiting child ran {observed[True]}"


def test_scheduled_callbacks_of_a_served_agent_run_before_its_worker_exits(start_server: StartServer, sandbox: Path) -> None:
    """The same, through a real server: each callback writes its marker; with
    ``MOTUS_WORKER_START=multiprocessing`` (asyncio.run's clean-up) every marker appears."""
    server = start_server(AGENT, "--workers", "2", env=cost_env(sandbox))
    missing = []
    for how, (_, expected) in SCHEDULED.items():
        body = run_turn(server, f"{how} {how}")
        assert body["status"] == "idle", body
        got = marker(sandbox, how, timeout=1.0)
        if got != expected:
            missing.append(f"{how}: {got!r} (expected {expected!r})")
    assert not missing, "callbacks the agent scheduled before replying never ran: " + "; ".join(missing)
    assert_no_500(server)


def test_reference_multiprocessing_workers_run_those_callbacks(start_server: StartServer, sandbox: Path) -> None:
    """Control for the test above: workers that do not skip the clean-up run them all."""
    server = start_server(AGENT, "--workers", "2", env=cost_env(sandbox, MOTUS_WORKER_START="multiprocessing"))
    for how, (_, expected) in SCHEDULED.items():
        body = run_turn(server, f"{how} {how}")
        assert body["status"] == "idle", body
        assert marker(sandbox, how) == expected, how


def test_what_the_exit_must_still_do_after_a_skipped_clean_up(start_server: StartServer, sandbox: Path) -> None:
    """Regression: with the clean-up skipped, a custom default executor's work is still
    waited for, an asyncio subprocess and a non-daemon thread still end with the worker,
    and an agent that stops the loop itself still gets its reply through."""
    server = start_server(AGENT, "--workers", "2", env=cost_env(sandbox))
    assert run_turn(server, "custom_default custom")["status"] == "idle"
    assert marker(sandbox, "custom") == "finished"

    assert run_turn(server, "subprocess sub")["status"] == "idle"
    assert_ended([recorded(sandbox, "sub")], what="the agent's asyncio subprocess")

    assert run_turn(server, "thread thr")["status"] == "idle"
    assert_ended([recorded(sandbox, "thr")], what="the worker holding a non-daemon thread")

    body = run_turn(server, "stop_loop")
    assert body["status"] == "idle" and body["response"]["content"] == "stopped the loop", body
    assert_no_500(server)


def test_unflushed_prints_of_successful_turns_reach_the_server_log(start_server: StartServer, sandbox: Path) -> None:
    """stdout is block-buffered when it is a file or a pipe (no PYTHONUNBUFFERED, as in most
    deployments); ``zygote_process._child`` flushes it before ``os._exit``. But the server closes a
    worker's pipe as soon as it has read the Result, and when the child's loop sees that EOF
    before it stops, ``run_worker`` takes the pipe for a cancelled turn and SIGKILLs its own
    group. That kill now flushes first; before, about a third of such prints were lost."""
    server = start_server(AGENT, "--workers", "2", env=cost_env(sandbox, PYTHONUNBUFFERED=""))
    for n in range(20):
        assert run_turn(server, f"print p{n}q")["status"] == "idle"

    def missing() -> list[int]:
        log = server.log()
        return [n for n in range(20) if f"p{n}q-printed" not in log]

    deadline = time.monotonic() + 5
    while missing() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not missing(), f"prints of {len(missing())} of 20 successful turns never reached the log: {missing()}"
