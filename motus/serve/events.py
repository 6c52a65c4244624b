"""Change notification for long polls and event streams: ``publish`` after a commit, ``wait``
until a check passes.

This is the one place that knows how a waiting request learns of a change. In one process
it is a ``threading.Condition`` per watched session; a store shared by several processes
would publish through the database instead (PostgreSQL ``LISTEN/NOTIFY``) behind the same
two calls.

Rules:

- ``publish`` is called *after* the change is committed and after the session's own lock is
  released, so a woken poll never sees a state a crash could take back, and the lock order
  is always: a Condition here, then (inside ``check``) a session's lock.
- ``wait`` evaluates ``check`` under the session's Condition, so a publish between the check
  and the wait cannot be missed.
- ``close`` (server shutdown) releases every waiter at once.
- ``ALL`` is a key of its own: every ``publish`` also wakes its waiters (the stream of every
  session's events), so a session's stream is woken only by that session. ``INBOX`` (the
  inbox long polls) is woken by a publish that may have changed pending interrupts.
- A request whose server can hold it without a thread (``waiting.current()`` gives a
  ``Ticket``) does not block: ``wait`` and ``hold`` register its ticket with the watch, under
  the same Condition, and ``wait`` raises ``Parked``; ``publish`` and ``close`` wake the
  registered tickets as they notify the blocked threads (see ``motus.serve.waiting``).

Thread ownership: ``_watched``, ``_closing`` and the inbox's generation and changes are
guarded by ``_lock``; each ``_Watch``'s ``waiters`` and ``parked`` by ``_lock`` too (taken
inside the watch's Condition, never the other way round), the rest of a watch by its
Condition.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import datetime, timezone
from collections.abc import Callable, Collection
from typing import TypeVar

from motus.serve.waiting import Parked, Ticket, current, wake_all

T = TypeVar("T")

#: Wait on this key to be woken by a change to any session.
ALL = "*"
#: Wait on this key to be woken when a session's pending interrupts may have changed (the
#: inbox): every publish that says so, and every publish of ``ALL``. ``inbox_key(kind)`` is
#: the same for one type of interrupt.
INBOX = "*inbox"
#: The latest inbox changes kept for ``Events.inbox_changes``: a reader further behind than
#: this reads the whole inbox again.
INBOX_CHANGES_KEPT = 4096


def inbox_key(kind: str | None) -> str:
    """The key an inbox long poll (of interrupts of type ``kind``, or all) waits on."""
    return INBOX if kind is None else f"{INBOX}:{kind}"


class _Watch:
    def __init__(self, key: str) -> None:
        self.key = key
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0  # threads waiting, plus tickets parked here
        self.parked: set[Ticket] = set()


class Events:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, _Watch] = {}
        self._closing = False
        #: Counts the publishes that may have changed the inbox (what ``inbox_generation``
        #: says), so that a reader can keep the inbox it computed until the next one.
        self._inbox_generation = 0
        #: The session of each of the latest such publishes, by generation (oldest first;
        #: ``ALL`` for a publish that may have changed any): what ``inbox_changes`` reads.
        self._inbox_changes: deque[tuple[int, str]] = deque(maxlen=INBOX_CHANGES_KEPT)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def inbox_generation(self) -> int:
        """Changes whenever a publish may have changed some session's pending interrupts,
        before the inbox long polls are woken: an inbox computed after reading it is good
        until it changes."""
        return self._inbox_generation

    def inbox_changes(self, since: int) -> set[str] | None:
        """The sessions whose pending interrupts may have changed after generation ``since``
        (every publish that counted a generation since), so a reader that kept the inbox of
        ``since`` reads those sessions again instead of the whole inbox. None when it cannot
        tell: a publish of ``ALL`` since, or ``since`` older than the changes kept."""
        with self._lock:
            changes = self._inbox_changes
            if since > self._inbox_generation:
                return None
            if since < self._inbox_generation and (not changes or changes[0][0] > since + 1):
                return None
            found = {session_id for generation, session_id in changes if generation > since}
        return None if ALL in found else found

    def publish(self, session_id: str, inbox: bool | Collection[str] = True) -> None:
        """Wake whoever waits on ``session_id`` or ``ALL``, and the inbox long polls: all of
        them (``inbox=True``: the publisher cannot tell what changed), none (``False`` or
        empty: the session's pending interrupts did not change), or those of every inbox and
        of the types given (the types of the interrupts that came or went)."""
        with self._lock:
            if inbox:
                self._inbox_generation += 1
                self._inbox_changes.append((self._inbox_generation, session_id))
            watches = [self._watched.get(session_id), self._watched.get(ALL)]
            if inbox is True or session_id == ALL:
                watches += [watch for key, watch in self._watched.items() if key.startswith(INBOX)]
            elif inbox:
                watches += [self._watched.get(INBOX), *(self._watched.get(inbox_key(kind)) for kind in inbox)]
        for watch in watches:
            if watch is not None:
                with watch.cond:
                    watch.cond.notify_all()
                    tickets = self._unpark_locked(watch, None)
                wake_all(tickets)

    def wait(self, session_id: str, check: Callable[[], T | None], timeout: float, may_park: bool = True) -> T | None:
        """Return ``check()`` as soon as it is not None, or None after ``timeout`` seconds or
        when the server is closing. ``check`` may raise (an unknown session): that propagates.

        Served with a ticket its worker may hold: raises ``Parked`` instead of blocking, and
        a run of the same request after a park waits only until the first run's deadline.
        ``may_park=False``: on this thread whatever the request's ticket (a caller that
        cannot be unwound by ``Parked``, such as a stream's body mid-generator)."""
        ticket = current() if may_park else None
        deadline = ticket.deadline if ticket is not None and ticket.deadline is not None else time.monotonic() + timeout
        watch = self._enter(session_id)
        try:
            with watch.cond:
                while True:
                    value = check()
                    if value is not None or self._closing:
                        return value
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    if ticket is not None and ticket.may_hold():
                        until = ticket.thread_until
                        if until is not None and until > time.monotonic():
                            watch.cond.wait(min(remaining, until - time.monotonic()))
                            continue  # a moment on its thread first (see ``Ticket``)
                        ticket.thread_until = None
                        ticket.deadline = deadline
                        self._park_locked(watch, ticket)
                        raise Parked(ticket)
                    watch.cond.wait(remaining)
        finally:
            self._leave(watch)

    def hold(self, key: str, check: Callable[[], object], ticket: Ticket) -> bool:
        """For a response already under way (an event stream): register ``ticket`` on
        ``key`` unless ``check()`` is truthy or the server is closing. True if registered:
        the caller hands itself to its worker, which is woken by the next publish."""
        watch = self._enter(key)
        try:
            with watch.cond:
                if self._closing or check():
                    return False
                self._park_locked(watch, ticket)
                return True
        finally:
            self._leave(watch)

    def forget(self, ticket: Ticket) -> None:
        """The worker gave up a parked ticket (deadline, client gone, stop): unregister it."""
        watch = ticket.watch
        if watch is not None:
            with watch.cond:
                self._unpark_locked(watch, ticket)

    def _enter(self, key: str) -> _Watch:
        with self._lock:
            watch = self._watched.get(key)
            if watch is None:
                watch = self._watched[key] = _Watch(key)
            watch.waiters += 1
            return watch

    def _leave(self, watch: _Watch) -> None:
        with self._lock:
            self._drop_locked(watch)

    def _drop_locked(self, watch: _Watch) -> None:
        watch.waiters -= 1
        if not watch.waiters and self._watched.get(watch.key) is watch:
            del self._watched[watch.key]

    def _park_locked(self, watch: _Watch, ticket: Ticket) -> None:
        """Under ``watch.cond``: register the ticket (it counts as a waiter until unparked)."""
        with self._lock:
            watch.waiters += 1
            watch.parked.add(ticket)
            ticket.watch, ticket.events = watch, self
            ticket.arm()

    def _unpark_locked(self, watch: _Watch, only: Ticket | None) -> list[Ticket]:
        """Under ``watch.cond``: unregister ``only``, or every parked ticket (returned, to be
        woken once the Condition is released)."""
        with self._lock:
            if only is not None:
                tickets = [only] if only in watch.parked else []
            else:
                tickets = list(watch.parked)
            for ticket in tickets:
                watch.parked.discard(ticket)
                ticket.watch = None
                self._drop_locked(watch)
        return tickets

    def close(self) -> None:
        with self._lock:
            self._closing = True
            watches = list(self._watched.values())
        for watch in watches:
            with watch.cond:
                watch.cond.notify_all()
                tickets = self._unpark_locked(watch, None)
            wake_all(tickets)


def isoformat(when: float | None) -> str | None:
    """A wall-clock time as ISO 8601 in UTC with milliseconds (``...T12:00:00.000Z``)."""
    if when is None:
        return None
    try:
        moment = datetime.fromtimestamp(when, timezone.utc)
    except (OverflowError, OSError, ValueError):
        # Past what a date can hold (an interrupt timeout of 1e12 s, say): the farthest date
        # there is, or the earliest, rather than a 500 on every view and stream showing it.
        moment = datetime.max.replace(tzinfo=timezone.utc) if when > 0 else datetime.min.replace(tzinfo=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
