"""Compute slots: how many turns run code at once (``--workers``), and the turns queued for one.

Guarantees:

- A slot is held exactly while a turn is RUNNING. ``dispatch`` reserves a slot for the next
  queued turn, then asks ``grant`` (which re-checks the turn under its session lock) to
  start it, and takes the slot back if the turn moved on meanwhile; so a resume queued for a
  turn that interrupted again can never keep a slot (the deadlock of the first release).
- ``ready`` may hold stale entries (a turn ended, deleted or already running): ``grant``
  refuses them, and the slot is free again at once.

Threads: ``free`` and ``ready`` are guarded by ``lock``, a condition that wakes a shutdown
waiting for the running turns to finish. It is never held while taking a session lock:
``grant`` runs outside it (lock order: session lock -> ``lock``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable

from motus.serve.turns.state import Turn


class Slots:
    """``count`` compute slots and the queue of turns waiting for one."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.lock = threading.Condition(threading.Lock())
        self.free = count
        self.ready: deque[Turn] = deque()  # may hold stale entries: grant re-checks

    def busy(self) -> bool:
        """Whether any turn holds a slot."""
        with self.lock:
            return self.free < self.count

    def in_use(self) -> int:
        with self.lock:
            return self.count - self.free

    def release(self, freed: int, queued: Iterable[Turn]) -> None:
        """Give ``freed`` slots back and queue ``queued`` turns for one; wakes waiters."""
        with self.lock:
            self.free += freed
            self.ready.extend(queued)
            self.lock.notify_all()

    def wait(self, timeout: float) -> None:
        """Sleep until a slot is released (or ``timeout`` seconds pass)."""
        with self.lock:
            self.lock.wait(timeout)

    def dispatch(self, grant: Callable[[Turn], bool]) -> None:
        """Hand free slots to queued turns: ``grant(turn)`` starts one (True) or refuses a
        stale entry (False, the slot is freed again). Any thread, no session lock held."""
        while True:
            with self.lock:
                if self.free <= 0 or not self.ready:
                    return
                turn = self.ready.popleft()
                self.free -= 1
            if not grant(turn):
                with self.lock:
                    self.free += 1
                    self.lock.notify_all()
