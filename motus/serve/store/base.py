"""The store interface: what survives the server process, and the rows it is made of.

A backend persists sessions and the journals of their live turns. The server keeps the
working copy in memory (``motus.serve.turns``) and writes through: every change is saved
here, in one transaction, *before* the request that caused it is answered and before any
long poll is woken, so a 200/202 (or a state a poll saw) is never taken back by a crash.

Backends:

- ``memory``: saves nothing; today's behaviour, nothing survives the process.
- ``sqlite:///PATH``: one file, one server process (see ``motus.serve.store.sqlite``).

Threads: request threads and the pool's manager thread all write; a backend serialises its
own writes and must be safe to call from any thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from motus.serve.protocol import JournalEntry

#: The schema version this code writes and understands.
SCHEMA_VERSION = 1


class StoreError(Exception):
    """The store cannot be opened or written. The message is one line saying what to do."""


@dataclass
class TurnRecord:
    """A live turn (running or interrupted): enough to replay it from the top."""

    turn_id: int
    message: dict[str, Any]
    webhook: dict[str, Any] | None = None
    deadline: float | None = None  # wall-clock time.time(); survives restarts
    journal: list[JournalEntry] = field(default_factory=list)


@dataclass
class SessionRecord:
    session_id: str
    status: str
    state: list[dict[str, Any]] | None  # None in a save: the stored history is unchanged
    response: dict[str, Any] | None
    error: str | None
    turn_id: int
    touched: float  # wall-clock time of the last write
    turn: TurnRecord | None = None


class Store(ABC):
    """A place sessions and turn journals outlive the process."""

    #: Short name for ``/health``: "memory", "sqlite", ...
    kind: str = ""
    #: Whether anything survives a restart (parking and replay at start depend on it).
    durable: bool = False

    def open(self) -> None:
        """Create or check the schema and claim the store for this process.
        Raises ``StoreError`` with a one-line reason."""

    def close(self) -> None:
        """Release the store (idempotent)."""

    def check(self) -> None:
        """Open and close again: what a CLI does before it starts serving."""
        self.open()
        self.close()

    @abstractmethod
    def load(self) -> Iterator[SessionRecord]:
        """Every session, with its live turn and that turn's journal."""

    @abstractmethod
    def save(self, record: SessionRecord, entries: Sequence[JournalEntry] = ()) -> None:
        """Write the session (and its live turn's row, or no turn) plus ``entries`` of the
        live turn's journal (inserted or replaced by ``seq``), atomically. A session
        without a live turn keeps no journal. ``record.state`` None keeps the stored
        history (it must exist: a session is first saved with its state)."""

    @abstractmethod
    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        """Insert or replace journal records of a live turn, atomically."""

    @abstractmethod
    def delete(self, session_id: str) -> None:
        """Forget the session and its journal."""
