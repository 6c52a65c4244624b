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
- ``ALL`` is a key of its own: every ``publish`` also wakes its waiters (the inbox and the
  stream of every session's events), so a session's stream is woken only by that session.

Thread ownership: ``_watched`` and ``_closing`` are guarded by ``_lock``; each ``_Watch``'s
fields by its own Condition.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Wait on this key to be woken by a change to any session.
ALL = "*"


class _Watch:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0


class Events:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, _Watch] = {}
        self._closing = False

    @property
    def closing(self) -> bool:
        return self._closing

    def publish(self, session_id: str) -> None:
        with self._lock:
            watches = [self._watched.get(session_id), self._watched.get(ALL)]
        for watch in watches:
            if watch is not None:
                with watch.cond:
                    watch.cond.notify_all()

    def wait(self, session_id: str, check: Callable[[], T | None], timeout: float) -> T | None:
        """Return ``check()`` as soon as it is not None, or None after ``timeout`` seconds or
        when the server is closing. ``check`` may raise (an unknown session): that propagates."""
        with self._lock:
            watch = self._watched.setdefault(session_id, _Watch())
            watch.waiters += 1
        deadline = time.monotonic() + timeout
        try:
            with watch.cond:
                while True:
                    value = check()
                    if value is not None or self._closing:
                        return value
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    watch.cond.wait(remaining)
        finally:
            with self._lock:
                watch.waiters -= 1
                if not watch.waiters and self._watched.get(session_id) is watch:
                    del self._watched[session_id]

    def close(self) -> None:
        with self._lock:
            self._closing = True
            watches = list(self._watched.values())
        for watch in watches:
            with watch.cond:
                watch.cond.notify_all()


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
