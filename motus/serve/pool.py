"""Worker processes: one fresh process per turn launch, started ahead of need, watched by one thread.

This module is mechanism only: it starts processes, carries messages over their pipes and
ends them. Which turn may run, when, and what a message means is policy, and belongs to
``motus.serve.turns``.

Data flow::

    turns (any thread)                  manager thread (exactly one)            worker processes
    ------------------                  ----------------------------            ----------------
    launch(job) ──▶ take a warm proc,   wait(all conns + all sentinels          warm: blocked in
                    or queue for one    + wakeup pipe, next kill deadline)      conn.recv() for
    send(handle, msg) ── pipe ──────────────┼──────────────────────────────▶    its one Job
    stop(handle) ── close pipe, kill later  │ message ──▶ listener.worker_message
    kill(handle) ── SIGKILL now (parking)   │ sentinel w/o Result/Failure ──▶
      (after hold_if_quiet: SIGSTOP, and    │      listener.worker_exited
      nothing unread or in the manager's hands)
    spawner thread                          │ kill deadlines, reaping
      keeps `warm` processes ready,         ▼
      each for exactly one job
    sender thread: the sends the manager decides on and must not make itself (a resume, a large job)

Guarantees and rules:

- Exactly one thread (the manager) calls ``recv()`` on worker connections and closes them,
  so a descriptor is never closed while it is being waited on. Other threads send, each send
  serialised by the handle's ``send_lock``; a closed connection is never written to. No send
  happens under a lock, and the manager sends nothing that could block (the sender thread
  does), so a worker that stops reading blocks only the thread writing to it, never the
  server. The one send the manager makes itself is a small job to the process it has just
  been given: nothing was ever written to that pipe, so the write fits in its buffer whole
  (``_send_job_at_once``; the limit is ``motus.serve.pipes.inline_job_limit``).
- After ``stop`` or ``kill`` the listener hears nothing more from that handle: the caller has
  already decided how the turn ends. A handle's process is never signalled after it is reaped.
- ``stop`` closes the pipe: an agent awaiting ``interrupt()`` sees ``EOFError("Worker pipe
  closed")`` and gets a short grace period to run its handlers; then its whole process group
  is killed. ``kill`` (parking) ends the group at once: no handler runs, since the turn is not
  over, only its process.
- Each worker process runs one job, then exits; processes are started ahead of need by a
  fork server with the agent already loaded (``motus.serve.processes``: our zygote, or
  ``multiprocessing``'s forkserver), so a turn does not pay for interpreter start-up and the
  threaded server is never forked.
- A process that cannot be started fails, with that reason, every job waiting for one
  (each job launched later gets its own attempt); spare processes are then refilled with a
  growing back-off, never in a loop.
- Listener callbacks run on the manager thread without the pool lock held.
- The manager never waits on one worker: it reads what a readable pipe holds and passes on
  only whole messages (``motus.serve.pipes.Frames``), so a worker stalled halfway through a
  message holds up its own turn, not every other one.

Thread ownership: every ``Handle`` and ``_Warm`` field is guarded by ``WorkerPool._lock``,
except ``conn`` writes (``send_lock``), and its reads, ``frames`` and ``close`` (manager
thread only). ``reading`` is written by the manager alone, with no lock, and read by
``hold_if_quiet`` as a hint that counts only while the worker is stopped (then nothing new
can arrive to set it).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from motus.durable.interrupt import EXIT_GRACE_SECONDS
from motus.durable.records import Failure, Interrupts, Job, Result, interrupts_problem
from motus.serve.errors import ServerUnavailable
from motus.serve.metrics import NO_METRICS, Hooks
from motus.serve.pipes import Frames, inline_job_limit, pickled_within, readable, unpickle
from motus.serve.processes import WorkerProcess, launcher, wait_stopped
from motus.serve.zygote import wait_readable

log = logging.getLogger(__name__)

#: After closing a stopped turn's pipe, how long before its process group is killed.
CANCEL_GRACE_SECONDS = EXIT_GRACE_SECONDS + 0.5
#: A send still stuck this long when its pipe must close means the worker stopped reading.
BLOCKED_SEND_SECONDS = 0.2
#: Top up warm processes only after no turn has run code for this long (unless short).
REFILL_IDLE_SECONDS = 0.02
#: After a worker reported its outcome, how long it may take to exit before it is killed.
REAP_GRACE_SECONDS = 5.0
#: After a process fails to start, refills wait this long, doubling with each failure in a
#: row up to the maximum (a launched job does not wait: it gets an attempt at once).
START_RETRY_SECONDS = 0.5
START_RETRY_MAX_SECONDS = 30.0
#: How long the manager reads what an exited worker left in its pipe (its last words).
LAST_WORDS_SECONDS = 1.0
#: How long ``hold_if_quiet`` waits for a worker it sent SIGSTOP to be stopped (it is let go on
#: if it is not: parking is tried again later).
HOLD_WAIT_SECONDS = 0.2

Sends = list[tuple["Handle", object]]


class PoolListener(Protocol):
    """What the pool reports, always from the manager thread, never under the pool lock."""

    def worker_message(self, handle: Handle, message: object) -> None: ...

    def worker_messages(self, handle: Handle, messages: list[object]) -> None:
        """Messages one read of the handle's pipe held, in order (the interrupts of one
        ``asyncio.gather`` come in one write): handled as one, so what they change is seen
        together."""
        ...

    def worker_exited(self, handle: Handle) -> None: ...


class PoolClosed(ServerUnavailable):
    """The pool is shutting down and takes no new turns."""


@dataclass(eq=False)
class Handle:
    """One launch of one turn: its process and pipe (a replay is a new handle)."""

    session_id: str
    turn_id: int
    job: Job
    process: WorkerProcess | None = None
    conn: Connection | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    finished: bool = False  # outcome reported, or stopped/killed: the listener hears no more
    close_requested: bool = False
    conn_closed: bool = False
    close_blocked_since: float | None = None  # a sender held send_lock when we came to close
    reaped: bool = False  # its process has exited and been joined: never signal its pid again
    kill_at: float | None = None
    frames: Frames = field(default_factory=Frames)  # what its worker wrote, not yet whole (manager only)
    #: The manager is reading its pipe or passing on what it read (set by the manager,
    #: read by ``hold_if_quiet``).
    reading: bool = False


@dataclass(eq=False)
class _Warm:
    """A started process waiting for its one job."""

    process: WorkerProcess
    conn: Connection
    kill_at: float | None = None


class _Wakeup:
    """Self-pipe that lets any thread wake the manager out of ``wait()``."""

    def __init__(self) -> None:
        self.reader, self.writer = multiprocessing.Pipe(duplex=False)
        self._lock = threading.Lock()
        self._closed = False

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                self.writer.send_bytes(b"")

    def drain(self) -> None:
        while self.reader.poll():
            self.reader.recv_bytes()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.writer.close()
        self.reader.close()


class WorkerPool:
    """Runs jobs in fresh worker processes; see the module docstring for the rules."""

    def __init__(
        self,
        listener: PoolListener,
        agent_path: str | None,
        agent_blob: bytes | None = None,
        warm: int = 2,
        busy: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        metrics: Hooks = NO_METRICS,
    ) -> None:
        self.metrics = metrics
        # Enough warm processes for a burst of new turns, and as many again so a refill can
        # wait until no turn is running (see _should_spawn_locked).
        self.warm_target = warm
        self.warm_low = max(1, warm // 2)
        self._listener = listener
        # agent_blob: the pickled agent object (see agents.agent_blob)
        self._launcher = launcher(agent_path, agent_blob)
        self._start_failures = 0  # failed process starts in a row
        self._retry_start_at = 0.0  # no refill before this after a failed start (clock)
        self._busy = busy
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # warm taken, jobs waiting, stopping
        self._procs: dict[int, Handle | _Warm] = {}  # every process not yet reaped, by sentinel
        self._waiting: deque[Handle] = deque()  # launched, waiting for a warm process
        self._to_close: set[Handle] = set()  # handles whose pipe the manager must close
        self._warm: deque[_Warm] = deque()
        self._spawning = 0
        self._last_dispatch = 0.0
        self._stopped = False
        self._wakeup = _Wakeup()
        self._outbox: queue.SimpleQueue[Sends | None] = queue.SimpleQueue()
        self._inline_limit = inline_job_limit()
        self._manager = threading.Thread(target=self._manage, name="motus-pool-manager", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="motus-pool-sender", daemon=True)
        self._spawner = threading.Thread(target=self._spawn_loop, name="motus-pool-spawner", daemon=True)

    # -- public API (any thread) -------------------------------------------------------------

    def start(self) -> None:
        self._manager.start()
        self._spawner.start()
        self._sender.start()

    def process_count(self) -> int:
        """Processes this pool has started and not yet reaped (warm spares included)."""
        with self._lock:
            return len(self._procs) + len(self._warm)

    def stats(self) -> dict[str, int]:
        """For metrics: processes alive (warm ones included) and warm ones ready."""
        with self._lock:
            return {"processes": len(self._procs) + len(self._warm), "warm": len(self._warm)}

    def launch(self, handle: Handle) -> None:
        """Run ``handle.job`` in a fresh process now, or as soon as a warm one is ready. A
        handle stopped before it was launched (a delete racing the start) is never run."""
        with self._lock:
            if self._stopped:
                raise PoolClosed("Server is shutting down")
            if handle.finished:
                return
            self._waiting.append(handle)
            sends = self._pump_locked()
            self._changed.notify_all()  # a waiting job may need the spawner
        self.deliver(sends)

    def send(self, handle: Handle, message: object) -> None:
        """Send one message to a live handle (no lock may be held: a send can block)."""
        self.deliver([(handle, message)])

    def stop(self, handle: Handle) -> None:
        """End a handle gracefully: close its pipe (the agent sees ``EOFError``), kill its
        group after a grace period. The listener hears nothing more from it."""
        with self._lock:
            self._finish_locked(handle, grace=CANCEL_GRACE_SECONDS)
        self._wake()

    def kill(self, handle: Handle) -> None:
        """End a handle now, with no grace and no handler run (parking)."""
        with self._lock:
            self._finish_locked(handle, grace=0.0)
        self._wake()

    def hold_if_quiet(self, handle: Handle) -> bool:
        """Stop ``handle``'s worker (SIGSTOP to its process group) and say whether it has
        said nothing that is not yet applied: nothing in its pipe, nothing read and not yet
        whole, nothing being passed on by the manager. True: it is left stopped, for the
        caller to ``kill`` (parking) or ``let_go``; stopped, it can say nothing more in
        between, so nothing it starts is cut short unseen. False: it could not be stopped,
        or it had more to say, and it goes on (SIGCONT). Any thread, no session lock held
        (it waits, up to ``HOLD_WAIT_SECONDS``, for the stop to take)."""
        with self._lock:
            pid = self._signal_locked(handle, signal.SIGSTOP)
        if pid is None:
            return False
        quiet = False
        try:
            stopped = wait_stopped(pid, HOLD_WAIT_SECONDS)
            with self._lock:
                quiet = stopped and not handle.finished and not handle.reaped and not handle.conn_closed and not handle.reading \
                    and not handle.frames.buffered() and handle.conn is not None and not readable(handle.conn.fileno())
        finally:
            if not quiet:  # whatever happened, a worker not to be killed is never left stopped
                self.let_go(handle)
        return quiet

    def let_go(self, handle: Handle) -> None:
        """Let a worker ``hold_if_quiet`` stopped go on (the turn was not parked after all)."""
        with self._lock:
            self._signal_locked(handle, signal.SIGCONT)

    def _signal_locked(self, handle: Handle, signum: int) -> int | None:
        """Send ``signum`` to the process group of a handle's live worker; its pid, or None
        (no process, ended, reaped, or gone: never a pid that may have been reused)."""
        process = handle.process
        if process is None or process.pid is None or handle.finished or handle.reaped or handle.conn is None or handle.conn_closed:
            return None
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            return None
        return process.pid

    def shutdown(self) -> None:
        """Kill what is left, end every process and thread. Idempotent. The caller has
        already stopped or killed the handles it cares about."""
        with self._lock:
            self._stopped = True
            for handle in list(self._waiting):
                handle.finished = True
            self._waiting.clear()
            for item in self._procs.values():
                if isinstance(item, Handle):
                    self._finish_locked(item, grace=CANCEL_GRACE_SECONDS)
            for warm in self._warm:
                self._procs[warm.process.sentinel] = warm
            self._warm.clear()
            self._changed.notify_all()
        self._wake()
        self._launcher.interrupt()  # a start in progress gives up at once
        if self._spawner.is_alive():
            self._spawner.join()
        if self._manager.is_alive():
            self._manager.join()
        if self._sender.is_alive():
            self._outbox.put(None)
            self._sender.join()
        self._launcher.close()

    def _wake(self) -> None:
        """Make the manager look again at what changed. On the manager thread itself there is
        nothing to do: it looks again when the current pass ends."""
        if threading.current_thread() is not self._manager:
            self._wakeup.wake()

    def _send_loop(self) -> None:
        """Sender thread: performs the sends the manager thread decided on."""
        while True:
            sends = self._outbox.get()
            if sends is None:
                return
            try:
                self.deliver(sends)
            except Exception:
                log.exception("sending to workers failed")

    # -- internals (under _lock unless said otherwise) -----------------------------------

    def _finish_locked(self, handle: Handle, grace: float) -> None:
        if handle.finished:
            return
        handle.finished = True
        if handle.process is None:
            if handle in self._waiting:
                self._waiting.remove(handle)
            return  # still waiting for a process: nothing started
        self._request_close_locked(handle)
        if not handle.reaped:
            if grace <= 0:
                handle.process.kill_group()
            handle.kill_at = self._clock() + (grace if grace > 0 else REAP_GRACE_SECONDS)

    def _pump_locked(self) -> Sends:
        """Give warm processes to waiting jobs. Returns the sends to perform after unlocking."""
        sends: Sends = []
        while self._waiting:
            warm = self._take_warm_locked()
            if warm is None:
                break
            handle = self._waiting.popleft()
            handle.process, handle.conn = warm.process, warm.conn
            self._procs[warm.process.sentinel] = handle
            sends.append((handle, handle.job))
        if sends:
            self._last_dispatch = self._clock()
        return sends

    def _take_warm_locked(self) -> _Warm | None:
        while self._warm:
            warm = self._warm.popleft()
            self._changed.notify_all()  # the spawner refills
            if warm.process.is_alive():
                return warm
            self._procs[warm.process.sentinel] = warm  # reap it
            self._wake()
        return None

    def deliver(self, sends: Sends) -> None:
        """Send to workers. Call with no lock held: a send blocks while a worker is not
        reading, and must never stall other sessions. On the manager thread the sends are
        handed to the sender thread instead, so the manager never blocks. A dead pipe is left
        to the manager (the sentinel reports how the worker ended); a message that cannot be
        pickled is reported to the listener as the turn's ``Failure``."""
        if not sends:
            return
        if threading.current_thread() is self._manager:
            later = [(handle, message) for handle, message in sends if not self._send_job_at_once(handle, message)]
            if later:
                self._outbox.put(later)
            return
        started = False
        for handle, message in sends:
            undeliverable = None
            with handle.send_lock:
                if handle.conn is None or handle.conn_closed:
                    continue
                try:
                    handle.conn.send(message)
                except OSError as exc:
                    log.info("worker of session %s is gone (%s); its sentinel will say how", handle.session_id, exc)
                except Exception as exc:  # pickling: recursion, an unpicklable value
                    undeliverable = f"Could not deliver {type(message).__name__} to the agent: {type(exc).__name__}: {exc}"
            if undeliverable is not None:
                log.warning("session %s: %s", handle.session_id, undeliverable)
                self._report_outcome(handle, Failure(error=undeliverable))
            started = started or isinstance(message, Job)
        if started:
            self._wake()

    def _send_job_at_once(self, handle: Handle, message: object) -> bool:
        """On the manager thread: send a job to the process it was just given, when the
        write cannot block, and say whether it was dealt with. A turn that waited for a
        compute slot is launched from here (its slot was freed by a result the manager
        read), and handing its job to the sender thread cost a thread hand-off each time.

        Only a ``Job``, the first message its pipe ever carries, pickled to at most
        ``_inline_limit`` bytes: it fits in the empty send buffer, so the write returns at
        once even if the process never reads (a dead one fails it with EPIPE). Anything
        else, or a job that cannot be pickled (the sender reports why), goes to the sender."""
        if not isinstance(message, Job):
            return False
        data = pickled_within(message, self._inline_limit)
        if data is None:  # too big, or the sender reports why it cannot be pickled
            return False
        if not handle.send_lock.acquire(blocking=False):
            return False
        try:
            if handle.conn is not None and not handle.conn_closed:
                try:
                    handle.conn.send_bytes(data)
                except OSError as exc:
                    log.info("worker of session %s is gone (%s); its sentinel will say how", handle.session_id, exc)
        finally:
            handle.send_lock.release()
        return True

    def _report_outcome(self, handle: Handle, outcome: Result | Failure) -> None:
        """The turn's outcome is known: end the handle (the process exits by itself) and tell
        the listener once. Any thread, no lock held."""
        with self._lock:
            if handle.finished:
                return
            self._finish_locked(handle, grace=REAP_GRACE_SECONDS)
        self._wake()
        self._report(self._listener.worker_message, handle, outcome)

    def _report(self, callback: Callable[..., None], handle: Handle, *args: Any) -> None:
        try:
            callback(handle, *args)
        except Exception:
            log.exception("pool listener failed for session %s", handle.session_id)

    # -- spawner thread -----------------------------------------------------------------

    def _should_spawn_locked(self) -> tuple[bool, float | None]:
        """Start a process now? Otherwise, how long to wait before asking again.

        Starting a process costs this process a little of its time (under the GIL) and
        several milliseconds of CPU in the fork server and the child, which on a small machine
        slows the turn that is running. So: refill at once only below the low-water mark
        (a burst could find no process) or when a launched job waits for one; otherwise wait
        until no turn has been running code for ``REFILL_IDLE_SECONDS``.
        """
        have = len(self._warm) + self._spawning
        if self._waiting and have < len(self._waiting) + self.warm_low:
            return True, None  # a launched job always gets its attempt, even after failures
        if have >= self.warm_target:
            return False, None
        backoff = self._retry_start_at - self._clock()
        if backoff > 0:
            return False, backoff  # the last start failed: refill later, never in a loop
        if have < self.warm_low:
            return True, None
        if self._busy():
            return False, 0.05  # a turn is running code: ask again soon
        idle_for = self._clock() - self._last_dispatch
        if idle_for >= REFILL_IDLE_SECONDS:
            return True, None
        return False, REFILL_IDLE_SECONDS - idle_for

    def _spawn_loop(self) -> None:
        """Spawner thread. On its way out it wakes the manager, which may be waiting only for
        the last start to end before it can stop."""
        try:
            self._spawn_forever()
        finally:
            self._wake()

    def _spawn_forever(self) -> None:
        while True:
            with self._lock:
                while not self._stopped:
                    spawn, wait_for = self._should_spawn_locked()
                    if spawn:
                        break
                    self._changed.wait(wait_for)
                if self._stopped:
                    return
                self._spawning += 1
            warm, error, failed = None, None, []
            try:
                started = time.perf_counter()
                warm = self._start_process()
                self.metrics.worker_started(time.perf_counter() - started)
            except Exception as exc:
                error = f"Could not start a worker process: {type(exc).__name__}: {exc}"
                with self._lock:
                    stopping = self._stopped
                if not stopping:  # a start cut short by shutdown is no failure
                    self._log_start_failure(error)
            with self._lock:
                self._spawning -= 1
                if warm is None:
                    failed = self._start_failed_locked()
                else:
                    self._start_failures, self._retry_start_at = 0, 0.0
            if warm is None:
                for handle in failed:
                    self._report_outcome(handle, Failure(error=error or "Could not start a worker process"))
                continue
            with self._lock:
                stopped = self._stopped
                if stopped:
                    self._procs[warm.process.sentinel] = warm
                    sends: Sends = []
                else:
                    self._warm.append(warm)
                    sends = self._pump_locked()
            self.deliver(sends)  # wakes the manager if a job went out
            if stopped:
                self._wake()  # it closes what was started too late

    def _start_failed_locked(self) -> list[Handle]:
        """A process could not be started: every job waiting for one fails now (the caller
        reports them, outside the lock), and refills back off, 0.5 s doubling up to 30 s.
        A job launched later still gets its own attempt at once."""
        self._start_failures += 1
        backoff = min(START_RETRY_MAX_SECONDS, START_RETRY_SECONDS * 2 ** (self._start_failures - 1))
        self._retry_start_at = self._clock() + backoff
        failed = list(self._waiting)
        return failed

    def _log_start_failure(self, error: str) -> None:
        """The first failure of a run with its traceback; later ones in one line each."""
        if self._start_failures == 0:
            log.exception("%s", error)
        else:
            log.warning("%s (%d failures in a row)", error, self._start_failures + 1)

    def _start_process(self) -> _Warm:
        process, conn = self._launcher.start()
        return _Warm(process=process, conn=conn)

    # -- manager thread -----------------------------------------------------------------

    def _manage(self) -> None:
        """Manager thread. A failing pass is logged and the loop goes on: one bad event must
        not leave every live turn without the thread that reads their results."""
        failures = 0
        try:
            while True:
                try:
                    if not self._manage_once():
                        return
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("pool manager pass failed (%d in a row)", failures)
                    threading.Event().wait(min(1.0, 0.01 * failures))  # never a hot loop
        finally:
            self._wakeup.close()

    def _manage_once(self) -> bool:
        with self._lock:
            self._close_requested_locked()
            if self._stopped and not self._procs and not self._spawning and not self._to_close:
                for warm in self._warm:
                    warm.conn.close()
                return False
            readers: dict[Any, Handle] = {}
            for item in self._procs.values():
                if isinstance(item, Handle) and item.conn is not None and not item.conn_closed and not item.close_requested:
                    readers[item.conn] = item
            sentinels = dict(self._procs)
            timeout = self._next_deadline_locked()
        ready = wait_readable([*readers, *sentinels, self._wakeup.reader], timeout)
        for obj in ready:
            if obj is self._wakeup.reader:
                self._wakeup.drain()
            elif obj in readers:
                self._receive(readers[obj])
        for obj in ready:
            if obj in sentinels:
                self._reap(sentinels[obj])
        self._check_deadlines()
        return True

    def _request_close_locked(self, handle: Handle) -> None:
        handle.close_requested = True
        if not handle.conn_closed:
            self._to_close.add(handle)

    def _close_requested_locked(self) -> None:
        """Close the pipes of ended handles (manager thread only).

        Never waits for a handle's ``send_lock`` while holding the pool lock: if a thread is
        blocked sending to a worker that stopped reading, kill the worker's process group
        instead, which fails that send with EPIPE, and close on a later pass.
        """
        now = self._clock()
        for handle in list(self._to_close):
            if handle.conn_closed:
                self._to_close.discard(handle)
            elif handle.send_lock.acquire(blocking=False):
                try:
                    handle.conn_closed = True
                    if handle.conn is not None:
                        handle.conn.close()
                finally:
                    handle.send_lock.release()
                self._to_close.discard(handle)
            elif handle.close_blocked_since is None:
                handle.close_blocked_since = now  # usually a send that ends in microseconds
            elif now - handle.close_blocked_since > BLOCKED_SEND_SECONDS and not handle.reaped:
                handle.process.kill_group()  # the worker stopped reading: EPIPE frees the sender
        for item in list(self._procs.values()):
            if isinstance(item, _Warm) and self._stopped and not item.conn.closed:
                item.conn.close()
                item.kill_at = self._clock() + CANCEL_GRACE_SECONDS

    def _next_deadline_locked(self) -> float | None:
        deadlines = [item.kill_at for item in self._procs.values() if item.kill_at is not None]
        if self._to_close:
            deadlines.append(self._clock() + 0.02)  # a close waits on a blocked sender
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self._clock())

    def _receive(self, handle: Handle) -> bool:
        """Read what a readable worker pipe holds, without blocking, and pass on each whole
        message in order (manager thread only; see ``motus.serve.pipes.Frames``). False once the pipe has
        ended."""
        handle.reading = True  # before the read: hold_if_quiet sees what the manager has in hand
        try:
            try:
                open_ = handle.frames.read(handle.conn.fileno())  # type: ignore[union-attr]
            except OSError:
                open_ = False
            together: list[object] = []  # the messages of this read before an outcome, passed on as one
            while (frame := handle.frames.take()) is not None:
                message = unpickle(frame)  # a Failure if the agent's process wrote something unreadable
                if isinstance(message, (Result, Failure)):
                    self._report_together(handle, together)
                    self._report_outcome(handle, message)
                    return open_
                if isinstance(message, Interrupts) and interrupts_problem(message) is None:
                    together.extend(message.interrupts)  # one gather's, whole (a malformed one ends its turn)
                    continue
                together.append(message)
            self._report_together(handle, together)
        finally:
            handle.reading = False
        if not open_:
            with self._lock:
                # The worker closed its end; its sentinel reports how it ended.
                self._request_close_locked(handle)
                self._close_requested_locked()
        return open_

    def _report_together(self, handle: Handle, messages: list[object]) -> None:
        if not messages:
            return
        with self._lock:
            if handle.finished:
                return
        self._report(self._listener.worker_messages, handle, messages)

    def _reap(self, item: Handle | _Warm) -> None:
        """A process exited: report a turn that never said how it ended, then forget it."""
        if isinstance(item, Handle):
            with self._lock:
                unfinished = not item.finished
            if unfinished and item.conn is not None and not item.conn_closed:
                # Its last words may still be in the pipe (a Result sent just before exit).
                try:
                    # Bounded: a process it left behind may hold the pipe open and keep writing.
                    until = time.monotonic() + LAST_WORDS_SECONDS
                    while not item.finished and time.monotonic() < until and item.conn.poll():
                        if not self._receive(item) or item.conn_closed:
                            break
                except (OSError, EOFError, ValueError) as exc:
                    log.debug("nothing more to read from session %s's worker: %s", item.session_id, exc)
            with self._lock:
                report = not item.finished
                if report:
                    self._finish_locked(item, grace=REAP_GRACE_SECONDS)
            if report:
                self._report(self._listener.worker_exited, item)
        with self._lock:
            self._procs.pop(item.process.sentinel, None)  # type: ignore[union-attr]
            if isinstance(item, Handle):
                self._request_close_locked(item)
                self._close_requested_locked()
            elif not item.conn.closed:
                item.conn.close()
        item.process.kill_group(only_group=True)  # whatever the agent left in its group
        item.process.join(timeout=1)  # type: ignore[union-attr]
        with self._lock:
            if isinstance(item, Handle):
                item.reaped = True
            item.process.close()  # type: ignore[union-attr]

    def _check_deadlines(self) -> None:
        now = self._clock()
        to_kill = []
        with self._lock:
            for item in self._procs.values():
                if item.kill_at is not None and item.kill_at <= now:
                    to_kill.append(item.process)
                    item.kill_at = None
        for process in to_kill:
            process.kill_group()
