"""Group commit for the SQLite store: while one thread's commit is on its way to the disk,
the writes other threads hand over queue up, and the next commit takes them all, in one
transaction and one fsync.

Why: with ``synchronous=FULL`` a commit waits for the disk, and the store's connection is
one. Each thread committing on its own held the connection's lock across its statements and
its fsync, and under load every statement's return also waited for the GIL behind the other
threads while holding that lock: concurrent turns queued on it one commit at a time.

How (a leader and followers, no thread of its own): a write is a function of the connection.
The thread that hands one over when no commit is under way *leads*: it takes the queue,
commits it, and wakes the writers it committed. Writes handed over meanwhile wait, each on
its own event; when the leader is done it hands the lead to the oldest of them, which
commits everything queued by then. Alone, a thread commits its own write with no hand-off.

Guarantees:

- ``submit`` returns (or raises) only once its write is committed (or known not to be):
  "a 2xx means on disk" holds as when each write committed alone.
- A batch is one ``BEGIN IMMEDIATE`` ... ``COMMIT``. Writes in it are applied in the order
  they were handed over, each inside a savepoint when there are several: a write that raises
  is rolled back alone and its caller gets its exception; the others commit. If the commit
  itself fails, the transaction is rolled back and every caller of the batch gets the error.
- ``after`` of a write runs once the batch is committed, in hand-over order, by the leader,
  under ``lock`` (the store publishes the write's events there: never before they are on
  disk, never out of order).
- After ``close`` no write is accepted; the ones already handed over are committed first.

Threads: any thread may lead; one leads at a time (``_leading``). The leader holds ``lock``
(the connection's lock, which the store's readers take too) for its batch and its ``after``s.
``_queue``, ``_leading``, ``_closing`` and ``taken`` are guarded by ``_wake``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The most writes one transaction takes: a burst is split so no caller waits on a huge one.
MAX_BATCH = 256


class _Write(Generic[T]):
    __slots__ = ("fn", "after", "wake", "finished", "lead", "result", "error")

    def __init__(self, fn: Callable[[sqlite3.Connection], T], after: Callable[[T], None] | None) -> None:
        self.fn = fn
        self.after = after
        self.wake = threading.Event()  # set when finished, or when handed the lead
        self.finished = False
        self.lead = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommitter:
    """Commits the writes ``submit``\\ ted to it on ``connection``, many to a transaction."""

    def __init__(self, connection: sqlite3.Connection, lock: threading.Lock) -> None:
        self.connection = connection
        self.lock = lock
        self._wake = threading.Condition(threading.Lock())
        self._queue: list[_Write[Any]] = []
        self._leading = False
        self._closing = False
        #: Writes taken from the queue, transactions and writes committed (benchmarks, tests).
        self.taken = 0
        self.batches = 0
        self.writes = 0

    def submit(self, fn: Callable[[sqlite3.Connection], T], after: Callable[[T], None] | None = None) -> T:
        """Run ``fn(connection)`` in the next transaction; return its result once committed,
        or raise its exception (or the commit's)."""
        write: _Write[T] = _Write(fn, after)
        with self._wake:
            if self._closing:
                raise sqlite3.ProgrammingError("the store is closed")
            self._queue.append(write)
            write.lead = not self._leading
            self._leading = True
        try:
            while not write.finished:
                if write.lead:
                    self._lead()
                else:
                    write.wake.wait()
                    write.wake.clear()
        except BaseException:
            self._abandon(write)  # a signal's exception (Ctrl-C) while it waited
            raise
        if write.error is not None:
            raise write.error
        return write.result

    def close(self) -> None:
        """Refuse new writes; return once the ones handed over are committed (idempotent)."""
        with self._wake:
            self._closing = True
            self._wake.wait_for(lambda: not self._leading)

    # -- the leader ----------------------------------------------------------------------

    def _lead(self) -> None:
        """Commit what is queued (this thread's own write first among them), then hand the
        lead to the oldest write queued meanwhile, or give it up."""
        with self._wake:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            batch[0].lead = False  # this thread's own write: it leads now
            self.taken += len(batch)
        interrupted: BaseException | None = None
        try:
            with self.lock:
                interrupted = self._commit(batch)
        except BaseException as exc:  # never leave a caller waiting, whatever failed
            for write in batch:
                if not write.finished and write.error is None:
                    write.error = exc
            log.exception("the store failed a batch of %d writes", len(batch))
        finally:
            with self._wake:
                successor = self._queue[0] if self._queue else None
                if successor is not None:
                    successor.lead = True
                else:
                    self._leading = False
                    self._wake.notify_all()  # a close waiting for the last commit
            for write in batch:
                write.finished = True
                write.wake.set()
            if successor is not None:
                successor.wake.set()
        if interrupted is not None:
            raise interrupted  # on this thread, where it came: the batch is committed all the same

    def _abandon(self, write: _Write[Any]) -> None:
        """The thread of ``write`` leaves ``submit`` before it finished: a write still queued
        is dropped (never run), and a lead it was handed goes to the next queued write, or is
        given up, so no one waits on a thread that is gone. A write already taken into a
        batch is its leader's to finish."""
        with self._wake:
            if not any(queued is write for queued in self._queue):
                return
            self._queue = [queued for queued in self._queue if queued is not write]
            if not write.lead:
                return
            write.lead = False
            successor = self._queue[0] if self._queue else None
            if successor is not None:
                successor.lead = True
            else:
                self._leading = False
                self._wake.notify_all()
        if successor is not None:
            successor.wake.set()

    def _commit(self, batch: list[_Write[Any]]) -> BaseException | None:
        """Returns what interrupted an ``after`` (a ``BaseException`` that is no ``Exception``,
        say Ctrl-C on this thread), for the leader to raise once every write is finished."""
        db = self.connection
        alone = len(batch) == 1
        db.execute("BEGIN IMMEDIATE")
        try:
            for write in batch:
                if alone:
                    write.result = write.fn(db)
                    continue
                db.execute("SAVEPOINT w")
                try:
                    write.result = write.fn(db)
                except BaseException as exc:
                    db.execute("ROLLBACK TO w")
                    write.error = exc
                db.execute("RELEASE w")
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            for write in batch:
                if write.error is None:
                    write.error = exc
            return None
        self.batches += 1
        interrupted: BaseException | None = None
        for write in batch:
            if write.error is None:
                self.writes += 1
                if write.after is not None:
                    try:
                        write.after(write.result)
                    except Exception:  # committed all the same: the caller is told it was
                        log.exception("a store write's follow-up failed after its commit")
                    except BaseException as exc:  # the others' follow-ups still run
                        log.exception("a store write's follow-up was interrupted after its commit")
                        interrupted = interrupted or exc
        return interrupted
