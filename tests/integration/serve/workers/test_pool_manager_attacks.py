"""Attacks on the pool's manager thread writing a small ``Job`` itself
(``WorkerPool._send_job_at_once``): it must never block, never pickle a huge job whole, and
every job, inline or handed to the sender thread, must run.

Agents: ``tests.agents.turn_cost:agent`` (see its docstring). The pool tests run a real
``WorkerPool`` (real zygote, real worker processes) in this process, so they can launch jobs
from the manager thread itself and inject faults around the dispatch.

The other attacks on the per-turn cost changes are beside what they attack: the worker's
skipped clean-up in ``test_worker_exit_attacks.py``, gunicorn's heartbeat in
``serve/lifecycle/test_heartbeat_attacks.py``, the cached loopback check in
``serve/hardening/test_host_check_attacks.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from motus.serve import pipes as pipes_module
from motus.serve.pool import Handle, WorkerPool
from motus.serve.protocol import Failure, Job, Result
from multiprocessing.reduction import ForkingPickler
from tests.conftest import Server, wait_until
from tests.support.processes import alive
from tests.integration.serve.workers.test_zygote import (
    assert_no_500,
    finished,
    the_zygote,
    kill_and_wait,
)

AGENT = "tests.agents.turn_cost:agent"
StartServer = Callable[..., Server]


def cost_env(sandbox: Path, **extra: str) -> dict[str, str]:
    return {"COST_SANDBOX": str(sandbox), **extra}



# == the manager thread's own send of a small job =========================================

MANAGER = "motus-pool-manager"


class Listener:
    """The pool's listener: keeps each handle's outcome; can run a hook (on the manager
    thread) when the first outcome arrives."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.outcomes: dict[Handle, object] = {}
        self.hook: Callable[[], None] | None = None
        self.hook_thread: str | None = None

    def worker_message(self, handle: Handle, message: object) -> None:
        if isinstance(message, (Result, Failure)):
            self._outcome(handle, message)

    def worker_messages(self, handle: Handle, messages: list[object]) -> None:
        for message in messages:
            self.worker_message(handle, message)

    def worker_exited(self, handle: Handle) -> None:
        self._outcome(handle, "exited")

    def _outcome(self, handle: Handle, outcome: object) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            self.hook_thread = threading.current_thread().name
            hook()
        with self._changed:
            self.outcomes[handle] = outcome
            self._changed.notify_all()

    def wait(self, handle: Handle, timeout: float = 20.0) -> object:
        with self._changed:
            if not self._changed.wait_for(lambda: handle in self.outcomes, timeout):
                raise AssertionError(f"no outcome for {handle.session_id} within {timeout}s")
            return self.outcomes[handle]


def job_handle(name: str, content: str, state: list | None = None) -> Handle:
    job = Job(session_id=name, turn_id=1, message={"role": "user", "content": content}, state=state or [])
    return Handle(session_id=name, turn_id=1, job=job)


def handle_of_pickled_size(name: str, size: int) -> Handle:
    """A ``size`` job whose pickle is exactly ``size`` bytes."""
    pad = max(0, size - len(ForkingPickler.dumps(job_handle(name, "size ").job)))
    for _ in range(20):
        handle = job_handle(name, "size " + "x" * pad)
        got = len(ForkingPickler.dumps(handle.job))
        if got == size:
            return handle
        pad += size - got
    raise AssertionError(f"could not make a job of {size} bytes")


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, sandbox: Path) -> Iterator[tuple[WorkerPool, Listener, list[tuple[str, bool]]]]:
    """A real pool (zygote launcher) with 6 warm processes; ``inline`` records, for each job
    the manager sent, whether it wrote it itself."""
    monkeypatch.setenv("COST_SANDBOX", str(sandbox))
    listener = Listener()
    pool = WorkerPool(listener, AGENT, warm=6)
    inline: list[tuple[str, bool]] = []
    original = pool._send_job_at_once

    def recording(handle: Handle, message: object) -> bool:
        done = original(handle, message)
        if isinstance(message, Job):
            inline.append((handle.session_id, done))
        return done

    pool._send_job_at_once = recording  # type: ignore[method-assign]
    pool.start()
    try:
        wait_until(lambda: pool.stats()["warm"] >= 6, timeout=15, what="six warm processes")
        yield pool, listener, inline
    finally:
        pool.shutdown()


def launch_from_manager(pool: WorkerPool, listener: Listener, handles: list[Handle], before: Callable[[], None] = lambda: None) -> None:
    """Launch ``handles`` on the manager thread (as a queued turn is, when a result frees its
    slot): a trigger turn's outcome runs the launches."""

    def launch_all() -> None:
        before()
        for handle in handles:
            pool.launch(handle)

    listener.hook = launch_all
    trigger = job_handle("trigger", "echo trigger")
    pool.launch(trigger)
    assert isinstance(listener.wait(trigger), Result)
    assert listener.hook_thread == MANAGER, listener.hook_thread


def content_of(outcome: object) -> str:
    assert isinstance(outcome, Result), outcome
    return outcome.response["content"]


def test_jobs_at_and_around_the_inline_limit_all_run(pool) -> None:
    pool, listener, inline = pool
    limit = pool._inline_limit
    assert 0 < limit <= 32 * 1024
    handles = {size: handle_of_pickled_size(f"s{size}", size) for size in (limit - 1, limit, limit + 1, 3 * limit)}
    launch_from_manager(pool, listener, list(handles.values()))
    for size, handle in handles.items():
        assert content_of(listener.wait(handle)) == f"size {len(handle.job.message['content'])} 0", size
    sent = dict(inline)
    assert sent == {f"s{limit - 1}": True, f"s{limit}": True, f"s{limit + 1}": False, f"s{3 * limit}": False}


def test_the_manager_does_not_pickle_a_huge_job_before_it_knows_it_is_too_big(pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued turns with long histories (20,000 messages, ~2.4 MB pickled, 75 times the
    limit) launched on the manager thread. The manager only needs to know a job is past
    32 KiB; pickling it whole (and throwing that away: the sender pickles it again) stalls
    the thread that reads every worker's results for as long as that takes (~200 ms for
    200,000 messages here). What the manager's pickler
    wrote is counted: nothing when the messages' text alone is past the limit, and at most
    one frame past the limit when it is not (the bytes are in the messages' other fields)."""
    pool, listener, _ = pool
    written: dict[str, int] = {}
    current: list[str] = []

    class Counting(pipes_module._CappedBuffer):
        def write(self, data):  # type: ignore[no-untyped-def]
            written[current[-1]] = written.get(current[-1], 0) + len(data)
            return super().write(data)

    monkeypatch.setattr(pipes_module, "_CappedBuffer", Counting)
    original = pool._send_job_at_once
    COUNT = 20_000  # noqa: N806

    def naming(handle: Handle, message: object) -> bool:
        current.append(handle.session_id)
        return original(handle, message)

    monkeypatch.setattr(pool, "_send_job_at_once", naming)
    text = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "x" * 100} for i in range(COUNT)]
    fields = [{"role": "user", "content": "", "user_params": {"pad": "x" * 100}} for i in range(COUNT)]
    huge_text, huge_fields = job_handle("huge-text", "size", text), job_handle("huge-fields", "size", fields)
    launch_from_manager(pool, listener, [huge_text, huge_fields])
    assert content_of(listener.wait(huge_text, timeout=60)) == f"size 4 {COUNT}"
    assert content_of(listener.wait(huge_fields, timeout=60)) == f"size 4 {COUNT}"
    assert "huge-text" in current and written.get("huge-text", 0) == 0, written
    assert 0 < written["huge-fields"] <= pool._inline_limit + 2**16 + 64, f"the manager pickled {written['huge-fields']} bytes of one job"


def test_a_send_lock_held_elsewhere_sends_the_job_later_without_blocking_the_manager(pool) -> None:
    pool, listener, inline = pool
    held = job_handle("held", "echo held")
    free = job_handle("free", "echo free")
    held.send_lock.acquire()
    try:
        launch_from_manager(pool, listener, [held, free])  # a manager blocked on the lock never launches `free`
        assert content_of(listener.wait(free)) == "echo: free"
        assert held not in listener.outcomes  # its job waits for the lock, in the sender thread
    finally:
        held.send_lock.release()
    assert content_of(listener.wait(held)) == "echo: held"
    assert dict(inline) == {"held": False, "free": True}


def test_a_warm_process_dead_at_dispatch_is_reported_and_the_manager_goes_on(pool) -> None:
    """The race of a warm process killed (kill -9) right before its job goes out: it still
    looks alive when taken, the manager's write meets a closed pipe. The turn must be
    reported (its process exited), not lost, and the manager must keep serving."""
    pool, listener, inline = pool
    doomed = job_handle("doomed", "echo doomed")
    after = job_handle("after", "echo after")

    def kill_the_next_warm_process() -> None:
        with pool._lock:
            warm = pool._warm[0]
        psutil.Process(warm.process.pid).kill()
        wait_until(lambda: not alive(warm.process.pid), timeout=5, what="the warm process to die")
        warm.process.is_alive = lambda: True  # type: ignore[method-assign]  # the check ran before the kill

    launch_from_manager(pool, listener, [doomed, after], before=kill_the_next_warm_process)
    assert listener.wait(doomed) == "exited"
    assert content_of(listener.wait(after)) == "echo: after"
    assert dict(inline)["doomed"] is True


def test_a_worker_that_never_reads_blocks_neither_the_manager_nor_a_small_job(pool) -> None:
    """One warm process stopped (SIGSTOP): it never reads. A job at the limit to it goes out
    from the manager at once; a 2 MB job to another stopped one fills its pipe and holds the
    sender thread; a small job launched after both still runs. Then both are let go."""
    pool, listener, inline = pool
    limit = pool._inline_limit
    stopped: list[psutil.Process] = []

    def stop_the_next_two() -> None:  # on the manager thread, after the trigger took its process
        with pool._lock:
            stopped.extend(psutil.Process(warm.process.pid) for warm in list(pool._warm)[:2])
        for proc in stopped:
            proc.suspend()

    try:
        at_limit = handle_of_pickled_size("at-limit", limit)
        big = job_handle("big", "size " + "y" * 2_000_000)
        small = job_handle("small", "echo small")
        # A manager blocked on a stopped worker's pipe would never launch `small`.
        launch_from_manager(pool, listener, [at_limit, big, small], before=stop_the_next_two)
        assert len(stopped) == 2
        assert content_of(listener.wait(small)) == "echo: small"
        assert at_limit not in listener.outcomes and big not in listener.outcomes
    finally:
        for proc in stopped:
            proc.resume()
    assert content_of(listener.wait(at_limit)).startswith("size ")
    assert content_of(listener.wait(big)) == "size 2000005 0"
    assert dict(inline) == {"at-limit": True, "big": False, "small": True}


def test_a_job_that_cannot_be_pickled_fails_its_turn_when_launched_by_the_manager(pool) -> None:
    pool, listener, inline = pool
    bad = job_handle("bad", "echo bad", state=[{"role": "user", "content": "x", "oops": lambda: None}])
    good = job_handle("good", "echo good")
    launch_from_manager(pool, listener, [bad, good])
    outcome = listener.wait(bad)
    assert isinstance(outcome, Failure) and outcome.error.startswith("Could not deliver Job to the agent:"), outcome
    assert content_of(listener.wait(good)) == "echo: good"
    assert dict(inline) == {"bad": False, "good": True}


def test_queued_turns_with_workers_1_survive_the_zygote_dying_deletes_and_sizes(start_server: StartServer, sandbox: Path) -> None:
    """--workers 1: one turn holds the slot while 24 wait (sizes around the 32 KiB the
    manager sends itself, one 3 MB message); the zygote is killed and every third queued
    session is deleted; then the slot frees. Every remaining turn runs, in full, no 500."""
    server = start_server(AGENT, "--workers", "1", env=cost_env(sandbox))
    gated = server.create_session()
    server.send(gated, "gate first")
    wait_until((sandbox / "first.pid").exists, what="the gated turn to run")
    queued: dict[str, int] = {}
    for n in range(24):
        size = 3_000_000 if n == 11 else 32_500 + 20 * n
        session_id = server.create_session()
        server.send(session_id, "size " + "z" * (size - 5))
        queued[session_id] = size
    deleted = set(list(queued)[::3])
    zygote = the_zygote(server, warm=None)
    kill_and_wait(zygote)
    for session_id in deleted:
        assert server.delete(f"/sessions/{session_id}").status_code in (200, 204)
    (sandbox / "first.go").write_text("")
    body = finished(server, gated)
    assert body["status"] == "idle" and body["response"]["content"] == "gate first opened", body
    for session_id, size in queued.items():
        if session_id in deleted:
            continue
        body = finished(server, session_id, timeout=30)
        assert body["status"] == "idle", body
        assert body["response"]["content"] == f"size {size} 0"
    assert_no_500(server)
