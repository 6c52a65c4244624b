"""Timers: turn deadlines, interrupt expiries, parking, store retries, and the housekeeping
thread that fires them (with the TTL sweep and, on a shared store, the lease renewal).

Guarantees:

- A timer fires at or after its time (wall clock; one set in monotonic time is converted when
  set), in time order, on the housekeeping thread; a timer whose turn moved on meanwhile
  does nothing. One that finds the store away is set again ``STORE_RETRY_SECONDS`` later.
- A turn is parked only while it waits on a person, its worker has been quiet for
  ``PARK_SETTLE_SECONDS`` (the other interrupts of one ``asyncio.gather`` arrive first), no
  call of it (a step, a model call, a gated tool) is inside its body, none of its worker's
  messages waits for the store (the backlog), and its worker, stopped while this is looked
  at, has nothing in its pipe or in the pool manager's hands: so parking never cuts a call
  short, to run again on replay, and never turns an approved action into an "outcome
  unknown". (Found by attack: a step's *started* mark still in the pipe, or in the backlog
  while the store was locked, was not seen, and the step ran twice.)
- An expired interrupt is resolved with its default, ``by`` timeout, exactly as a resume.
- The housekeeper never sleeps longer than ``MAX_TIMER_WAIT`` at once, and stops once the
  machine is stopped.

Threads: the heap is guarded by ``Timers.lock`` (a condition: ``schedule`` wakes the
housekeeper). It is never held while firing a timer, which takes its session's lock itself
(lock order: session lock -> ``Timers.lock``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from motus.serve.errors import ServerUnavailable
from motus.durable.journal import unpack
from motus.serve.store import StaleSession
from motus.serve.turns.state import BY_TIMEOUT, TIMED_OUT, After, SessionStatus, Turn, TurnState

if TYPE_CHECKING:
    from motus.serve.turns.machine import Machine

log = logging.getLogger(__name__)

#: The housekeeper never sleeps longer than this at once (threading's own limit is lower
#: than an infinite --timeout or --park-after); it simply looks again.
MAX_TIMER_WAIT = 3600.0
#: A waiting turn is parked only after its worker has said nothing for this long, so the
#: other interrupts of one ``asyncio.gather`` arrive before its process ends.
PARK_SETTLE_SECONDS = 0.1
#: A turn that could not be parked yet (a call in flight, its worker had more to say) is
#: looked at again after this.
PARK_RETRY_SECONDS = 0.5
#: The TTL sweep removes this many sessions at most between two looks at the timers.
SWEEP_BATCH = 100
#: How often the housekeeper trims the session cache, and how many sessions it looks at
#: each time (a request's trim looks at ``machine.TRIM_LOOK``).
TRIM_EVERY_SECONDS = 1.0
TRIM_EVERY_LOOK = 1024
#: A worker message the store refused is tried again this often, and for this long.
STORE_RETRY_SECONDS = 0.5
STORE_GIVE_UP_SECONDS = 60.0


class Timers:
    """A heap of ``(when, kind, turn, arg)`` timers, and the loop that fires them."""

    def __init__(self, clock: Callable[[], float], stopped: Callable[[], bool]) -> None:
        self._clock = clock
        self._stopped = stopped
        self.lock = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, str, Turn, int]] = []
        self._counter = itertools.count()

    def schedule(self, when: float, kind: str, turn: Turn, monotonic: bool = False, arg: int = 0) -> None:
        wall = when if not monotonic else self._clock() + (when - time.monotonic())
        with self.lock:
            heapq.heappush(self._heap, (wall, next(self._counter), kind, turn, arg))
            self.lock.notify_all()

    def wake(self) -> None:
        """Wake the housekeeper (to see that the machine stopped)."""
        with self.lock:
            self.lock.notify_all()

    def run(self, fire: Callable[[str, Turn, int], None], every: list[tuple[float | None, Callable[[], object]]]) -> None:
        """The housekeeping thread: fire each timer when due, and each ``(period, action)``
        of ``every`` once a period (None: never), until the machine stops. An action that
        returns True did one batch of a longer job: it runs again as soon as the timers due
        by then have fired (and the other actions due), not a whole period later, so that no
        job holds the thread for long."""
        ticks = [time.monotonic() + period if period else None for period, _ in every]
        while True:
            due: list[tuple[str, Turn, int]] = []
            with self.lock:
                while not self._stopped():
                    now = self._clock()
                    while self._heap and self._heap[0][0] <= now:
                        _, _, kind, turn, arg = heapq.heappop(self._heap)
                        due.append((kind, turn, arg))
                    pending = [tick for tick in ticks if tick is not None]
                    if due or any(time.monotonic() >= tick for tick in pending):
                        break
                    waits = [self._heap[0][0] - now] if self._heap else []
                    waits.extend(tick - time.monotonic() for tick in pending)
                    self.lock.wait(min(max(0.0, min(waits)), MAX_TIMER_WAIT) if waits else None)
                if self._stopped():
                    return
            for kind, turn, arg in due:
                try:
                    fire(kind, turn, arg)
                except Exception:
                    log.exception("%s of session %s failed", kind, turn.session_id)
            for index, (period, action) in enumerate(every):
                tick = ticks[index]
                if tick is not None and time.monotonic() >= tick:
                    ticks[index] = time.monotonic() + (period or 1.0)
                    if action():
                        ticks[index] = time.monotonic()


class TimedMoves:
    """The transitions timers make (a mixin of ``Turns``, on the machine's state)."""

    def _housekeep(self: Machine) -> None:
        # Shared stores: the lease is renewed (and lapsed ones' turns taken over) three
        # times a lease, so one missed renewal never lets it lapse.
        sweep_every = min(max(self.ttl / 4, 0.05), 5.0) if self.ttl else None
        self.timers.run(self._fire, [
            (self.replicas.lease_every, self.replicas.renew),
            (sweep_every, self._sweep_now),
            (TRIM_EVERY_SECONDS if self._cache_limit else None, self._trim_now),
        ])

    def _fire(self: Machine, kind: str, turn: Turn, arg: int) -> None:
        if kind == "timeout":
            self._time_out(turn)
        elif kind == "expire":
            self._expire(turn, arg)
        elif kind == "retry":
            self._retry_backlog(turn)
        else:
            self._park(turn, now=kind == "park now")

    def _sweep_now(self: Machine) -> bool:
        """One batch of the TTL sweep (``SWEEP_BATCH`` sessions); True while there may be
        more. The whole sweep's count is logged once it ends (``_swept``: this thread's)."""
        try:
            removed, more = self.sweep_batch(limit=SWEEP_BATCH)
        except Exception:
            log.exception("TTL sweep failed")
            removed, more = [], False
        self._swept += len(removed)
        if not more:
            if self._swept:
                log.info("TTL sweep removed %d idle or errored sessions", self._swept)
            self._swept = 0
        return more

    def _trim_now(self: Machine) -> bool:
        """Bring the session cache back to its size when nothing reads from the store (a
        trim otherwise follows such a read): after a burst thousands of sessions whose turns
        have ended stay held. True while it forgot some and the cache is still over."""
        return self._trim(TRIM_EVERY_LOOK)

    def _time_out(self: Machine, turn: Turn) -> None:
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = After()
        try:
            with session.lock:
                self.replicas.fresh_locked(session, after)
                if session.deleted or session.turn is not turn or turn.state in (TurnState.ENDED, TurnState.ELSEWHERE):
                    return
                if turn.deadline is not None and turn.deadline > self._clock():
                    self.timers.schedule(turn.deadline, "timeout", turn)
                    return
                self._end_locked(session, turn, error=TIMED_OUT, after=after)
        except (StaleSession, ServerUnavailable):
            session.stale = True  # looked at again shortly, on the row as it then is
            self.timers.schedule(time.monotonic() + STORE_RETRY_SECONDS, "timeout", turn, monotonic=True)
        finally:
            self._finish(after)

    def _expire(self: Machine, turn: Turn, seq: int) -> None:
        """An interrupt's timeout passed: resolve it with its default, ``by`` timeout."""
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = After()
        try:
            with session.lock:
                self.replicas.fresh_locked(session, after)
                if session.deleted or session.turn is not turn or session.status is not SessionStatus.INTERRUPTED:
                    return
                pending = turn.pending()
                entry = next((e for e in pending if e.seq == seq), None)
                if entry is None or entry.expires_at is None:
                    return  # answered meanwhile
                if entry.expires_at > self._clock():
                    self.timers.schedule(entry.expires_at, "expire", turn, arg=seq)
                    return
                value = unpack(entry.default)
                self._resolve_locked(session, turn, entry, len(pending) == 1, value, BY_TIMEOUT, after, expired=True)
        except (StaleSession, ServerUnavailable):
            session.stale = True  # answered elsewhere meanwhile, or the store is away: looked at again
            self.timers.schedule(time.monotonic() + STORE_RETRY_SECONDS, "expire", turn, monotonic=True, arg=seq)
        finally:
            self._finish(after)

    def _park(self: Machine, turn: Turn, now: bool = False) -> None:
        """WAITING -> PARKED once it has waited ``park_after`` (``now``: at once, the live
        turns being over budget) and its worker is quiet: nothing in flight that the turn
        has applied (a call started and not done), nothing it could not store yet (the
        backlog), and nothing it has said that is not applied yet (``WorkerPool.hold_if_quiet``,
        which stops the worker while it looks, so that it cannot start a call between the
        look and the kill: the call would be cut short and run again on replay)."""
        session = self._lookup(turn.session_id)
        if session is None or self.park_after is None:
            return
        kind = "park now" if now else "park"
        with session.lock:
            if session.turn is not turn or turn.state is not TurnState.WAITING or turn.handle is None:
                return
            quiet_at = turn.last_heard + max(0.0 if now else self.park_after, PARK_SETTLE_SECONDS)
            if time.monotonic() < quiet_at or turn.under_way():
                retry = quiet_at if time.monotonic() < quiet_at else time.monotonic() + PARK_RETRY_SECONDS
                self.timers.schedule(retry, kind, turn, monotonic=True)
                return
            handle = turn.handle
        pool = self.pool
        if pool is not None and not pool.hold_if_quiet(handle):
            self.timers.schedule(time.monotonic() + PARK_RETRY_SECONDS, kind, turn, monotonic=True)
            return
        after = After()
        with session.lock:
            # Stopped, the worker said nothing more; a request may have changed the turn.
            parked = session.turn is turn and turn.state is TurnState.WAITING and turn.handle is handle and not turn.under_way()
            if parked:
                after.kill.append(handle)
                turn.handle = None
                turn.move(TurnState.PARKED)
            elif session.turn is turn and turn.state is TurnState.WAITING and turn.handle is handle:
                self.timers.schedule(time.monotonic() + PARK_RETRY_SECONDS, kind, turn, monotonic=True)
        if not parked and pool is not None:
            pool.let_go(handle)
        self._finish(after)
