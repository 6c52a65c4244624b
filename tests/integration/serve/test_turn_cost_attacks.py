"""Attacks on the per-turn cost changes (a finished worker skipping asyncio's clean-up, the
pool's manager writing small jobs itself, gunicorn's heartbeat, the cached loopback check).

1. A zygote's child skips asyncio's clean-up when ``_nothing_to_clean_up`` says nothing is
   left (``worker._run_on(..., exiting=True)``), then ``os._exit``s.
2. The pool's manager thread writes a small ``Job`` itself (``WorkerPool._send_job_at_once``);
   it must never block.
3. ``MotusWorker.notify`` touches gunicorn's heartbeat at most once a second.
4. ``auth.is_loopback`` is an ``lru_cache``.

Agents: ``tests.cost_agents:agent`` (see its docstring). The pool tests run a real
``WorkerPool`` (real zygote, real worker processes) in this process, so they can launch jobs
from the manager thread itself and inject faults around the dispatch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from motus.serve import auth, worker
from motus.serve import pool as pool_module
from motus.serve.gunicorn_app import MotusWorker
from motus.serve.pool import Handle, WorkerPool
from motus.serve.protocol import Failure, Job, Result
from multiprocessing.reduction import ForkingPickler
from tests.conftest import Server, wait_until
from tests.integration.serve.test_approvals_attacks import raw_request, read_head
from tests.integration.serve.test_zygote import (
    assert_ended,
    assert_no_500,
    finished,
    the_zygote,
    kill_and_wait,
    recorded,
)

AGENT = "tests.cost_agents:agent"
StartServer = Callable[..., Server]


def cost_env(sandbox: Path, **extra: str) -> dict[str, str]:
    return {"COST_SANDBOX": str(sandbox), **extra}


@pytest.fixture(scope="module")
def cost_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox of the module's shared server: each test uses marker tags of its own."""
    return tmp_path_factory.mktemp("cost")


@pytest.fixture
def shared(shared_server: StartServer, cost_sandbox: Path) -> Server:
    """The module's shared server, for tests that only run turns of their own and look for no
    500 in its log (none of them causes one)."""
    return shared_server(AGENT, "--workers", "2", env=cost_env(cost_sandbox))


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


# == 1. the skipped asyncio clean-up ==========================================================
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


def test_scheduled_callbacks_of_a_served_agent_run_before_its_worker_exits(shared: Server, cost_sandbox: Path) -> None:
    """The same, through a real server: each callback writes its marker; with
    ``MOTUS_WORKER_START=multiprocessing`` (asyncio.run's clean-up) every marker appears."""
    server, sandbox = shared, cost_sandbox
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


def test_what_the_exit_must_still_do_after_a_skipped_clean_up(shared: Server, cost_sandbox: Path) -> None:
    """Regression: with the clean-up skipped, a custom default executor's work is still
    waited for, an asyncio subprocess and a non-daemon thread still end with the worker,
    and an agent that stops the loop itself still gets its reply through."""
    server, sandbox = shared, cost_sandbox
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
    deployments); ``zygote._child`` flushes it before ``os._exit``. But the server closes a
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


# == 2. the manager thread's own send of a small job =========================================

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
    """Queued turns with long histories (200,000 messages, ~24 MB pickled) launched on the
    manager thread. The manager only needs to know a job is past 32 KiB; pickling it whole
    (and throwing that away: the sender pickles it again) stalls the thread that reads every
    worker's results for as long as that takes (~200 ms here). What the manager's pickler
    wrote is counted: nothing when the messages' text alone is past the limit, and at most
    one frame past the limit when it is not (the bytes are in the messages' other fields)."""
    pool, listener, _ = pool
    written: dict[str, int] = {}
    current: list[str] = []

    class Counting(pool_module._CappedBuffer):
        def write(self, data):  # type: ignore[no-untyped-def]
            written[current[-1]] = written.get(current[-1], 0) + len(data)
            return super().write(data)

    monkeypatch.setattr(pool_module, "_CappedBuffer", Counting)
    original = pool._send_job_at_once

    def naming(handle: Handle, message: object) -> bool:
        current.append(handle.session_id)
        return original(handle, message)

    monkeypatch.setattr(pool, "_send_job_at_once", naming)
    text = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "x" * 100} for i in range(200_000)]
    fields = [{"role": "user", "content": "", "user_params": {"pad": "x" * 100}} for i in range(200_000)]
    huge_text, huge_fields = job_handle("huge-text", "size", text), job_handle("huge-fields", "size", fields)
    launch_from_manager(pool, listener, [huge_text, huge_fields])
    assert content_of(listener.wait(huge_text, timeout=60)) == "size 4 200000"
    assert content_of(listener.wait(huge_fields, timeout=60)) == "size 4 200000"
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
        wait_until(lambda: not psutil.pid_exists(warm.process.pid) or psutil.Process(warm.process.pid).status() == psutil.STATUS_ZOMBIE,
                   timeout=5, what="the warm process to die")
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


# == 3. the heartbeat ===========================================================================


class _Tmp:
    def __init__(self) -> None:
        self.touched: list[float] = []

    def notify(self) -> None:
        self.touched.append(_clock[0])


_clock = [0.0]


def test_the_heartbeat_is_never_older_than_a_second_plus_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """gunicorn's loop calls ``notify`` once a pass (a pass waits at most 1 s for events);
    whatever the passes' spacing, including a pass that blocked for 50 s, the file is
    touched at the first pass a second or more after the last touch, and never more than
    once a second. The arbiter's 60 s limit is then never approached by a live loop."""
    worker_ = MotusWorker.__new__(MotusWorker)
    worker_._notified_at = float("-inf")
    worker_.tmp = _Tmp()
    monkeypatch.setattr("motus.serve.gunicorn_app.time.monotonic", lambda: _clock[0])
    rng = random.Random(7)
    _clock[0] = 1000.0
    gaps = [rng.uniform(0, 1.0) for _ in range(2000)] + [50.0] + [rng.uniform(0, 0.01) for _ in range(500)] + [1.0] * 20
    for gap in gaps:
        _clock[0] += gap
        before = worker_.tmp.touched[-1] if worker_.tmp.touched else None
        worker_.notify()
        last = worker_.tmp.touched[-1]
        assert _clock[0] - last < MotusWorker.NOTIFY_EVERY_SECONDS  # touched now, or less than a second ago
        if before is not None and last != before:
            assert last - before >= MotusWorker.NOTIFY_EVERY_SECONDS
    touches = worker_.tmp.touched
    assert len(touches) <= (touches[-1] - touches[0]) / MotusWorker.NOTIFY_EVERY_SECONDS + 1


# == 4. the cached is_loopback ================================================================

HOSTILE = [
    "localhost", "LOCALHOST".lower(), "localhost.", "localhost.localdomain", "127.0.0.1", "127.1", "127.000.000.001",
    "0x7f.0.0.1", "2130706433", "[::1]", "[::1", "::1]", "::1", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]",
    "[::1%25lo]", "[::1%lo]", "::1%lo", "[]", "[", "]", "", " ", "127.0.0.1 ", "\u0131ocalhost", "ｌｏｃａｌｈｏｓｔ",
    "１２７.０.０.１", "127.0.0.1\x00", "[::1]\x00", "[[::1]]", "[127.0.0.1]", "0.0.0.0", "[::]", "128.0.0.1",
    "126.255.255.255", "127.255.255.255", "x" * 8190, "[" + "1:" * 4000 + "]", "٣٧.0.0.1",
]


def test_cached_is_loopback_agrees_with_the_plain_function_and_stays_bounded() -> None:
    plain = auth.is_loopback.__wrapped__
    expected = {host: plain(host) for host in HOSTILE}
    auth.is_loopback.cache_clear()
    rng = random.Random(3)
    for round_ in range(3):
        for host in HOSTILE:
            assert auth.is_loopback(host) == expected[host], repr(host[:40])
        for n in range(1000):  # push everything out of the cache
            junk = f"evil-{round_}-{n}-{rng.random()}.example"
            assert auth.is_loopback(junk) is False
    assert auth.is_loopback.cache_info().currsize <= 256
    assert expected["127.0.0.1"] and expected["[::1]"] and expected["localhost"]
    assert not expected["127.1"] and not expected["[::1"] and not expected["localhost."]


def _raw_get(server: Server, host: bytes) -> int:
    """The status of ``GET /health`` sent with ``Host: host``, exactly as given."""
    with raw_request(server, b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n") as sock:
        return int(read_head(sock).split(b" ", 2)[1])


def test_hostile_host_headers_get_the_right_answer_and_never_a_500(shared: Server) -> None:
    server = shared
    good = [b"localhost", b"127.0.0.1:9", b"[::1]:80", b"LOCALHOST", b"[::1]"]
    bad = [b"evil.example", b"127.1", b"[::1", b"[::1].evil", b"localhost.", b"x" * 8000,
           "ｌｏｃａｌｈｏｓｔ".encode(), b"\xff\xfe", b"[" + b"1:" * 3000 + b"]"]
    for round_ in range(2):
        for host in good:
            assert _raw_get(server, host) == 200, host
        for host in bad:
            assert _raw_get(server, host) in (400, 431), host[:40]
        for n in range(300):  # more distinct names than the cache holds
            assert _raw_get(server, f"h{round_}-{n}.example".encode()) == 400
    assert_no_500(server)
