"""Worker processes: one fresh process per turn, started ahead of need, watched by one thread.

Data flow::

    request threads                     manager thread (exactly one)            worker processes
    ---------------                     ----------------------------            ----------------
    submit(job) ──▶ _ready queue ─┐     wait(all conns + all sentinels          warm: blocked in
    resume(value) ── send ──────────┼──▶      + wakeup pipe, next deadline)      conn.recv() for
    cancel(turn) ── mark, wake ─────┘       │ Interrupt ──▶ listener              its one Job
                                            │ Result/Failure ──▶ listener
    spawner thread                          │ sentinel w/o result ──▶ "exited
      keeps `warm` processes ready,         │      unexpectedly"
      each for exactly one turn             │ deadlines: timeout, kill after
                                            │      grace, reap
    sender thread                           ▼
      performs the sends the manager   listener (AgentServer) updates the sessions
      decides on (a slot freed: start
      the next queued turn)

Guarantees and rules:

- Exactly one thread (the manager) calls ``recv()`` on worker connections and closes them,
  so a descriptor is never closed while it is being waited on. Other threads send, each send
  serialised by the turn's ``send_lock``; a closed connection is never written to. No send
  happens under a lock, and the manager never sends itself (the sender thread does), so a
  worker that stops reading blocks only the thread writing to it, never the server.
- Compute slots: ``max_workers`` bounds the turns that are running code. A turn waiting on a
  human is *parked* and holds no slot; when its last interrupt is resolved it queues for a
  slot again (its final resume is delivered when it gets one). There is no thread per worker,
  so the number of live (interrupted) turns is bounded only by memory.
- Each worker process runs one turn, then exits; processes are started ahead of need from a
  forkserver with the agent module preloaded (spawn where forkserver is missing), so a turn
  does not pay for interpreter start-up and the threaded server is never forked.
- Cancelling a turn (delete, timeout, shutdown) closes its pipe: an agent awaiting
  ``interrupt()`` sees ``EOFError("Worker pipe closed")`` and gets a short grace period to run
  its handlers; then the worker's whole process group is killed. No worker outlives the pool.
- Listener callbacks run on the manager thread without the pool lock held.

Lock order: the listener's own lock (AgentServer) may be held while calling into the pool;
the pool never calls the listener while holding ``_lock``.
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
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from motus.serve.agents import agent_module
from motus.serve.interrupt import EXIT_GRACE_SECONDS, Failure, Interrupt, Job, Result, Resume
from motus.serve.sessions import ServerUnavailable
from motus.serve.worker import worker_main

log = logging.getLogger(__name__)

#: After closing a cancelled turn's pipe, how long before its process group is killed.
CANCEL_GRACE_SECONDS = EXIT_GRACE_SECONDS + 0.5
#: A send still stuck this long when its pipe must close means the worker stopped reading.
BLOCKED_SEND_SECONDS = 0.2
#: Top up warm processes only after no turn has run code for this long (unless short).
REFILL_IDLE_SECONDS = 0.02
#: After a worker reported its outcome, how long it may take to exit before it is killed.
REAP_GRACE_SECONDS = 5.0

TIMED_OUT = "Agent timed out"
CANCELLED = "Turn cancelled"
EXITED = "Worker process exited unexpectedly"


Sends = list[tuple["Turn", "Job | Resume"]]


class TurnListener(Protocol):
    """What the pool reports, always from the manager thread, never under the pool lock."""

    def turn_interrupted(self, turn: Turn, interrupt: Interrupt) -> None: ...

    def turn_completed(self, turn: Turn, result: Result) -> None: ...

    def turn_failed(self, turn: Turn, error: str) -> None: ...


class PoolClosed(ServerUnavailable):
    """The pool is shutting down and takes no new turns."""


@dataclass(eq=False)
class Turn:
    """One turn's process and pipe. Fields are guarded by ``WorkerPool._lock``."""

    session_id: str
    turn_id: int
    job: Job
    deadline: float | None
    process: BaseProcess | None = None
    conn: Connection | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    holds_slot: bool = False
    parked: bool = False
    finished: bool = False  # its outcome is decided (reported, or cancelled)
    close_requested: bool = False
    conn_closed: bool = False
    close_blocked_since: float | None = None  # a sender held send_lock when we came to close
    reaped: bool = False  # its process has exited and been joined: never signal its pid again
    kill_at: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.session_id, self.turn_id)


@dataclass(eq=False)
class _Warm:
    """A started process waiting for its one job."""

    process: BaseProcess
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


WORKER_PROCESS_NAME = "motus-worker"


def _skip_main_for_workers() -> None:
    """Workers must not re-run the server's ``__main__``.

    ``multiprocessing`` re-imports the parent's main script in every spawned or forkserver
    child (as ``__mp_main__``) unless it is a ``-m pkg.__main__`` module. For a worker that is
    pure cost at best (the ``motus`` console script, gunicorn's script) and a second server
    at worst (a user's ``AgentServer(...).run()`` without a main guard). Workers need nothing
    from ``__main__``: the agent is imported by its module path. So for processes named
    ``WORKER_PROCESS_NAME`` the preparation data leaves the main module out. The wrapper is
    installed once and changes nothing for any other process.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_motus_wrapper", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if name == WORKER_PROCESS_NAME:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._motus_wrapper = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def _context(agent_module: str | None) -> multiprocessing.context.BaseContext:
    _skip_main_for_workers()
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["motus.serve.worker"] + ([agent_module] if agent_module else []))
        return ctx
    return multiprocessing.get_context("spawn")


class WorkerPool:
    """Runs turns in fresh worker processes; see the module docstring for the rules."""

    def __init__(
        self,
        listener: TurnListener,
        agent_path: str | None,
        agent_obj: Any = None,
        max_workers: int = 0,
        timeout: float = 0,
        warm: int | None = None,
        max_interrupts: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_workers = max_workers or (os.cpu_count() or 1)
        self.timeout = timeout
        self.max_interrupts = max_interrupts
        # Enough warm processes for a burst of max_workers new turns, and as many again so a
        # refill can wait until no turn is running (see _spawn_loop).
        self.warm_target = warm if warm is not None else min(2 * self.max_workers, 16)
        self.warm_low = min(self.warm_target, max(1, self.max_workers))
        self._listener = listener
        self._agent_path = agent_path
        self._agent_obj = agent_obj
        self._clock = clock
        self._ctx = _context(agent_module(agent_path) if agent_path else None)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # turns finished/parked, warm taken
        self._turns: dict[tuple[str, int], Turn] = {}  # live turns (outcome not decided)
        self._procs: dict[int, Turn | _Warm] = {}  # every process not yet reaped, by sentinel
        self._ready: deque[tuple[Turn, Job | Resume]] = deque()
        self._to_close: set[Turn] = set()  # turns whose pipe the manager must close
        self._warm: deque[_Warm] = deque()
        self._spawning = 0
        self._free_slots = self.max_workers
        self._last_dispatch = 0.0
        self._closing = False
        self._stopped = False
        self._wakeup = _Wakeup()
        self._outbox: queue.SimpleQueue[Sends | None] = queue.SimpleQueue()
        self._manager = threading.Thread(target=self._manage, name="motus-pool-manager", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="motus-pool-sender", daemon=True)
        self._spawner = threading.Thread(target=self._spawn_loop, name="motus-pool-spawner", daemon=True)

    # -- public API (request threads) ------------------------------------------------------

    def start(self) -> None:
        self._manager.start()
        self._spawner.start()
        self._sender.start()

    def running_count(self) -> int:
        with self._lock:
            return self.max_workers - self._free_slots

    def submit(self, session_id: str, turn_id: int, message: dict[str, Any], state: list[dict[str, Any]]) -> Sends:
        """Queue a turn. Returns what to send; pass it to ``deliver`` once no lock is held."""
        job = Job(session_id=session_id, turn_id=turn_id, message=message, state=state, max_interrupts=self.max_interrupts)
        deadline = self._clock() + self.timeout if self.timeout else None
        turn = Turn(session_id=session_id, turn_id=turn_id, job=job, deadline=deadline)
        with self._lock:
            if self._closing:
                raise PoolClosed("Server is shutting down")
            self._turns[turn.key] = turn
            self._ready.append((turn, job))
            sends = self._pump()
            self._changed.notify_all()  # a queued job may need the spawner
        self._wakeup.wake()  # a new deadline, maybe a new connection to watch
        return sends

    def park(self, session_id: str, turn_id: int) -> Sends:
        """The turn waits on a human: give its compute slot to the next turn.
        Returns what to send (to ``deliver`` once no lock is held)."""
        with self._lock:
            turn = self._turns.get((session_id, turn_id))
            if turn is None or turn.parked:
                return []
            turn.parked = True
            if turn.holds_slot:
                turn.holds_slot = False
                self._free_slots += 1
            self._changed.notify_all()
            return self._pump()

    def resume(self, session_id: str, turn_id: int, interrupt_id: str, value: Any, unpark: bool) -> Sends | None:
        """Route a resume value. ``unpark``: it was the last pending one, so the turn needs a
        compute slot again; the value then waits in the queue until one is free.

        Returns what to send (pass it to ``deliver`` once no lock is held), or None when the
        turn's worker is gone (it ended, failed or was cancelled).
        """
        message = Resume(interrupt_id=interrupt_id, value=value)
        with self._lock:
            turn = self._turns.get((session_id, turn_id))
            if turn is None or turn.finished or turn.process is None:
                return None
            if unpark and turn.parked:
                turn.parked = False
                self._ready.append((turn, message))
                return self._pump()
            return [(turn, message)]

    def cancel(self, session_id: str, turn_id: int) -> Sends:
        """End a turn now (its session was deleted); no listener event follows. Returns what
        to send to the turns that got its slot (to ``deliver`` once no lock is held)."""
        with self._lock:
            turn = self._turns.get((session_id, turn_id))
            if turn is None:
                return []
            self._finish_locked(turn, cancel=True)
            sends = self._pump()
        self._wakeup.wake()
        return sends

    def shutdown(self, timeout: float = 0) -> None:
        """Stop: let running turns finish for ``timeout`` seconds (0 = as long as they take),
        cancel the rest and every turn waiting on a human ("Turn cancelled"), end all
        processes and threads. Idempotent."""
        with self._lock:
            already = self._closing
            self._closing = True
            self._changed.notify_all()
        if already:
            self._join()
            return
        deadline = self._clock() + timeout if timeout else None
        with self._lock:
            while True:
                self._cancel_parked_locked()
                busy = [t for t in self._turns.values() if not t.parked]
                if not busy:
                    break
                remaining = None if deadline is None else deadline - self._clock()
                if remaining is not None and remaining <= 0:
                    break
                self._changed.wait(remaining)
            cancelled = [t for t in self._turns.values()]
            for turn in cancelled:
                self._finish_locked(turn, cancel=True)
            self._stopped = True
            for warm in self._warm:
                self._procs[warm.process.sentinel] = warm
            self._warm.clear()
            self._changed.notify_all()
        for turn in cancelled:
            self._report(self._listener.turn_failed, turn, CANCELLED)
        self._wakeup.wake()
        self._join()

    def _join(self) -> None:
        if self._spawner.is_alive():
            self._spawner.join()
        if self._manager.is_alive():
            self._manager.join()
        if self._sender.is_alive():
            self._outbox.put(None)
            self._sender.join()

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

    def _cancel_parked_locked(self) -> None:
        parked = [t for t in self._turns.values() if t.parked]
        for turn in parked:
            self._finish_locked(turn, cancel=True)
        if parked:
            self._wakeup.wake()
            # Report outside the lock: temporarily release it.
            self._lock.release()
            try:
                for turn in parked:
                    self._report(self._listener.turn_failed, turn, CANCELLED)
            finally:
                self._lock.acquire()

    def _finish_locked(self, turn: Turn, cancel: bool) -> None:
        """Decide the turn's outcome: release its slot; on cancel, close its pipe soon."""
        if turn.finished:
            return
        turn.finished = True
        self._turns.pop(turn.key, None)
        if turn.holds_slot:
            turn.holds_slot = False
            self._free_slots += 1
        turn.parked = False
        if turn.process is None:
            return  # still queued: nothing started
        self._request_close_locked(turn)
        turn.kill_at = self._clock() + (CANCEL_GRACE_SECONDS if cancel else REAP_GRACE_SECONDS)
        self._changed.notify_all()

    def _pump(self) -> list[tuple[Turn, Job | Resume]]:
        """Hand free slots to queued work. Returns the sends to perform after unlocking."""
        sends: list[tuple[Turn, Job | Resume]] = []
        while self._free_slots > 0 and self._ready:
            turn, message = self._ready[0]
            if turn.finished:
                self._ready.popleft()
                continue
            if isinstance(message, Job):
                warm = self._take_warm_locked()
                if warm is None:
                    break
                turn.process, turn.conn = warm.process, warm.conn
                self._procs[warm.process.sentinel] = turn
            self._ready.popleft()
            self._free_slots -= 1
            turn.holds_slot = True
            sends.append((turn, message))
        if sends:
            self._last_dispatch = self._clock()
            self._changed.notify_all()
        return sends

    def _take_warm_locked(self) -> _Warm | None:
        while self._warm:
            warm = self._warm.popleft()
            self._changed.notify_all()  # the spawner refills
            if warm.process.is_alive():
                return warm
            self._procs[warm.process.sentinel] = warm  # reap it
            self._wakeup.wake()
        return None

    def deliver(self, sends: Sends) -> None:
        """Send to workers. Call with no lock held: a send blocks while a worker is not
        reading, and must never stall other sessions. On the manager thread the sends are
        handed to the sender thread instead, so the manager never blocks. A dead pipe is left
        to the manager (the sentinel reports how the worker ended); a message that cannot be
        pickled fails its turn rather than leaving it waiting for a value that never comes."""
        if not sends:
            return
        if threading.current_thread() is self._manager:
            self._outbox.put(sends)
            return
        started = False
        for turn, message in sends:
            undeliverable = None
            with turn.send_lock:
                if turn.conn is None or turn.conn_closed:
                    continue
                try:
                    turn.conn.send(message)
                except OSError as exc:
                    log.info("worker of session %s is gone (%s); its sentinel will say how", turn.session_id, exc)
                except Exception as exc:  # pickling: recursion, an unpicklable value
                    undeliverable = f"Could not deliver {type(message).__name__} to the agent: {type(exc).__name__}: {exc}"
            if undeliverable is not None:
                log.warning("session %s: %s", turn.session_id, undeliverable)
                self._fail(turn, undeliverable)
            started = started or isinstance(message, Job)
        if started:
            self._wakeup.wake()

    def _fail(self, turn: Turn, error: str) -> None:
        """End a live turn from any thread (no lock held) and report it failed."""
        with self._lock:
            if turn.finished:
                return
            self._finish_locked(turn, cancel=True)
            sends = self._pump()
        self._wakeup.wake()
        self.deliver(sends)
        self._report(self._listener.turn_failed, turn, error)

    def _report(self, callback: Callable[..., None], turn: Turn, arg: Any) -> None:
        try:
            callback(turn, arg)
        except Exception:
            log.exception("turn listener failed for session %s", turn.session_id)

    # -- spawner thread -----------------------------------------------------------------

    def _should_spawn_locked(self) -> tuple[bool, float | None]:
        """Start a process now? Otherwise, how long to wait before asking again.

        Starting a process costs about a millisecond of this process' time (under the GIL)
        and several more of CPU in the forkserver and the child, which on a small machine
        slows the turn that is running. So: refill at once only below the low-water mark
        (a burst could find no process) or when a queued turn needs one; otherwise wait
        until no turn has been running code for ``REFILL_IDLE_SECONDS``.
        """
        have = len(self._warm) + self._spawning
        if have >= self.warm_target:
            return False, None
        waiting = any(isinstance(message, Job) for _, message in self._ready)
        if have < self.warm_low or waiting:
            return True, None
        if self._free_slots < self.max_workers:
            return False, None  # a turn is running: wait for it to end (we are notified)
        idle_for = self._clock() - self._last_dispatch
        if idle_for >= REFILL_IDLE_SECONDS:
            return True, None
        return False, REFILL_IDLE_SECONDS - idle_for

    def _spawn_loop(self) -> None:
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
            warm = None
            try:
                warm = self._start_process()
            except Exception:
                log.exception("could not start a worker process")
            with self._lock:
                self._spawning -= 1
                if warm is None:
                    self._changed.wait(1.0)  # do not spin on a failing start
                    continue
                if self._stopped:
                    self._procs[warm.process.sentinel] = warm
                    sends: list[tuple[Turn, Job | Resume]] = []
                else:
                    self._warm.append(warm)
                    sends = self._pump()
            self.deliver(sends)
            self._wakeup.wake()

    def _start_process(self) -> _Warm:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(child, self._agent_path, None if self._agent_path else self._agent_obj),
            name=WORKER_PROCESS_NAME,
        )
        try:
            process.start()
        finally:
            child.close()
        return _Warm(process=process, conn=parent)

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
            readers: dict[Any, Turn] = {}
            for item in self._procs.values():
                if isinstance(item, Turn) and item.conn is not None and not item.conn_closed and not item.close_requested:
                    readers[item.conn] = item
            sentinels = dict(self._procs)
            timeout = self._next_deadline_locked()
        ready = wait([*readers, *sentinels, self._wakeup.reader], timeout)
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

    def _request_close_locked(self, turn: Turn) -> None:
        turn.close_requested = True
        if not turn.conn_closed:
            self._to_close.add(turn)

    def _close_requested_locked(self) -> None:
        """Close the pipes of ended turns (manager thread only).

        Never waits for a turn's ``send_lock`` while holding the pool lock: if a request
        thread is blocked sending to a worker that stopped reading, kill the worker's
        process group instead, which fails that send with EPIPE, and close on a later pass.
        """
        now = self._clock()
        for turn in list(self._to_close):
            if turn.conn_closed:
                self._to_close.discard(turn)
            elif turn.send_lock.acquire(blocking=False):
                try:
                    turn.conn_closed = True
                    if turn.conn is not None:
                        turn.conn.close()
                finally:
                    turn.send_lock.release()
                self._to_close.discard(turn)
            elif turn.close_blocked_since is None:
                turn.close_blocked_since = now  # usually a send that ends in microseconds
            elif now - turn.close_blocked_since > BLOCKED_SEND_SECONDS and not turn.reaped:
                _kill_group(turn.process)  # the worker stopped reading: EPIPE frees the sender
        for item in list(self._procs.values()):
            if isinstance(item, _Warm) and self._stopped and not item.conn.closed:
                item.conn.close()
                item.kill_at = self._clock() + CANCEL_GRACE_SECONDS

    def _next_deadline_locked(self) -> float | None:
        deadlines = []
        for turn in self._turns.values():
            if turn.deadline is not None:
                deadlines.append(turn.deadline)
        for item in self._procs.values():
            if item.kill_at is not None:
                deadlines.append(item.kill_at)
        if self._to_close:
            deadlines.append(self._clock() + 0.02)  # a close waits on a blocked sender
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self._clock())

    def _receive(self, turn: Turn) -> None:
        """Read one message from a worker (manager thread only)."""
        try:
            message = turn.conn.recv()  # type: ignore[union-attr]
        except (EOFError, OSError):
            with self._lock:
                # The worker closed its end; its sentinel reports how it ended.
                self._request_close_locked(turn)
                self._close_requested_locked()
            return
        except Exception as exc:  # an unpicklable message from the agent's process
            message = Failure(error=f"Worker sent an unreadable message: {type(exc).__name__}: {exc}")
        self._handle(turn, message)

    def _handle(self, turn: Turn, message: object) -> None:
        with self._lock:
            if turn.finished:
                return
            if isinstance(message, Interrupt):
                pass
            elif isinstance(message, (Result, Failure)):
                self._finish_locked(turn, cancel=False)
                sends = self._pump()
            else:
                log.warning("ignored unexpected %s from the worker of session %s", type(message).__name__, turn.session_id)
                return
        if isinstance(message, Interrupt):
            self._report(self._listener.turn_interrupted, turn, message)
            return
        self.deliver(sends)
        if isinstance(message, Result):
            self._report(self._listener.turn_completed, turn, message)
        else:
            self._report(self._listener.turn_failed, turn, message.error)  # type: ignore[union-attr]

    def _reap(self, item: Turn | _Warm) -> None:
        """A process exited: report a turn that never said how it ended, then forget it."""
        if isinstance(item, Turn):
            with self._lock:
                unfinished = not item.finished
            if unfinished and item.conn is not None and not item.conn_closed:
                # Its last words may still be in the pipe (a Result sent just before exit).
                try:
                    while not item.finished and item.conn.poll():
                        self._receive(item)
                        if item.conn_closed:
                            break
                except (OSError, EOFError, ValueError):
                    pass  # nothing more to read: treated as exiting without a result below
            with self._lock:
                report = not item.finished
                if report:
                    self._finish_locked(item, cancel=False)
                    sends = self._pump()
            if report:
                self.deliver(sends)
                self._report(self._listener.turn_failed, item, EXITED)
        with self._lock:
            self._procs.pop(item.process.sentinel, None)  # type: ignore[union-attr]
            if isinstance(item, Turn):
                self._request_close_locked(item)
                self._close_requested_locked()
            elif not item.conn.closed:
                item.conn.close()
        _kill_group(item.process, only_group=True)  # whatever the agent left in its group
        item.process.join(timeout=1)
        with self._lock:
            if isinstance(item, Turn):
                item.reaped = True
            item.process.close()

    def _check_deadlines(self) -> None:
        now = self._clock()
        timed_out = []
        to_kill = []
        with self._lock:
            for turn in list(self._turns.values()):
                if turn.deadline is not None and turn.deadline <= now:
                    self._finish_locked(turn, cancel=True)
                    timed_out.append(turn)
            for item in self._procs.values():
                if item.kill_at is not None and item.kill_at <= now:
                    to_kill.append(item.process)
                    item.kill_at = None
            sends = self._pump() if timed_out else []
        self.deliver(sends)
        for turn in timed_out:
            self._report(self._listener.turn_failed, turn, TIMED_OUT)
        for process in to_kill:
            _kill_group(process)


def _kill_group(process: BaseProcess | None, only_group: bool = False) -> None:
    """SIGKILL a worker and its process group (it called setpgrp). "Already dead" is fine.
    Callers never pass a reaped process (its pid may belong to someone else by now)."""
    if process is None:
        return
    try:
        if process.pid is None:
            return
    except ValueError:  # the process object is closed: it was reaped
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not only_group:
            try:
                process.kill()
            except (ProcessLookupError, ValueError):
                pass  # it is already gone
