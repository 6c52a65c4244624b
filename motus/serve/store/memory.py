"""``--store memory``: sessions end with the process.

The server's working copy (``motus.serve.turns``) is the only copy of the sessions, which is
exactly the behaviour of the first release: a restart loses every session. What only the
store holds, the event log and the audit records, is kept here in memory: the newest
``RECENT_EVENTS`` events, fewer when their data passes ``RECENT_EVENT_BYTES`` (a client that
reconnects after missing more gets a ``reset``), and every audit record of a session until it
is deleted.

Threads: every method takes ``_lock``; seqs are assigned under it, so they increase in the
order the changes were saved.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from motus.durable.records import JournalEntry
from motus.serve.store.base import RECENT_EVENTS, AuditRecord, Event, RecentEvents, SessionRecord, Store


class MemoryStore(Store):
    kind = "memory"
    durable = False

    def __init__(self, events_kept: int = RECENT_EVENTS) -> None:
        self.url = "memory"
        self._lock = threading.Lock()
        self._recent = RecentEvents(events_kept)
        self._seq = 0
        self._audit: dict[str, list[AuditRecord]] = {}

    def open(self) -> None:
        """Nothing to open or claim: the store is this object."""

    def close(self) -> None:
        """Nothing to release: what it holds goes with the process."""

    def load(self) -> Iterator[SessionRecord]:
        return iter(())  # nothing was kept: the working copy was the only one

    def save(
        self,
        record: SessionRecord,
        entries: Sequence[JournalEntry] = (),
        events: Sequence[Event] = (),
        audit: Sequence[AuditRecord] = (),
    ) -> int:
        with self._lock:
            if audit:
                self._audit.setdefault(record.session_id, []).extend(audit)
            return self._append(events)

    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        pass  # the working copy in memory is the journal

    def delete(self, session_id: str, events: Sequence[Event] = ()) -> int:
        with self._lock:
            self._audit.pop(session_id, None)
            return self._append(events)

    def _append(self, events: Sequence[Event]) -> int:
        for event in events:
            self._seq += 1
            event.seq = self._seq
        self._recent.extend(events)
        return self._seq if events else 0

    def events_after(self, after: int, session_id: str | None = None, limit: int = 500) -> list[Event]:
        with self._lock:
            return self._recent.after(after, session_id, limit)

    def event_bounds(self) -> tuple[int, int]:
        with self._lock:
            bounds = self._recent.bounds()
            if bounds is None:
                return (self._seq + 1, self._seq) if self._seq else (0, 0)
            return bounds

    def audit(self, session_id: str) -> list[AuditRecord]:
        with self._lock:
            return list(self._audit.get(session_id, ()))
