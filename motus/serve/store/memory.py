"""``--store memory``: nothing is written anywhere; sessions end with the process.

The server's working copy (``motus.serve.turns``) is the only copy, which is exactly the
behaviour of the first release: a restart loses every session.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from motus.serve.protocol import JournalEntry
from motus.serve.store.base import SessionRecord, Store


class MemoryStore(Store):
    kind = "memory"
    durable = False

    def __init__(self) -> None:
        self.url = "memory"

    def load(self) -> Iterator[SessionRecord]:
        return iter(())

    def save(self, record: SessionRecord, entries: Sequence[JournalEntry] = ()) -> None:
        pass  # the working copy in memory is the session

    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        pass

    def delete(self, session_id: str) -> None:
        pass
