"""The store interface: what survives the server process, and the rows it is made of.

A backend persists sessions and the journals of their live turns. The server keeps the
working copy in memory (``motus.serve.turns``) and writes through: every change is saved
here, in one transaction, *before* the request that caused it is answered and before any
long poll is woken, so a 200/202 (or a state a poll saw) is never taken back by a crash.

Backends:

Two interfaces: ``Store``, what one server process needs (``memory``: nothing survives
the process; ``sqlite:///PATH``: one file, see ``motus.serve.store.sqlite``), and
``SharedStore``, what several instances on one store need on top of it (``postgresql://``,
see ``motus.serve.store.postgres``). ``tests/unit/serve/store/test_contract.py`` states
every method's guarantee and runs against each backend: a new one is written against it.

Threads: request threads and the pool's manager thread all write; a backend serialises its
own writes and must be safe to call from any thread.
"""

from __future__ import annotations

import bisect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from motus.durable.jsonshape import without_lone_surrogate_keys
from motus.durable.records import JournalEntry

#: The schema version this code writes and understands. 2 added the event log, the audit
#: records, a session's grants, and an interrupt's creation time, expiry and default. 3
#: keeps a session's history as a row a message (``messages`` / ``motus_messages``), so a
#: turn writes only what it changed; the ``state`` column of earlier versions holds ``''``.
#: 4 adds a session's title and who sent which of its messages (``sessions.title``,
#: ``sessions.senders``; NULL in rows written before them). 5 lets a live turn's column carry
#: the approvals given towards a quorum (``TurnRecord.approvals``): an instance of version 4
#: would neither count them nor keep them, so it refuses to start on such a store.
SCHEMA_VERSION = 5

#: How many events a store keeps for clients that reconnect (``Last-Event-ID``); older ones
#: are pruned, and a client asking for them is told to reload (a ``reset`` event).
EVENTS_KEPT = 100_000
#: The newest events every store also keeps in memory, for the streams a change wakes (the
#: memory store keeps only these: its whole event log lives in the server's memory).
RECENT_EVENTS = 10_000
#: ... and no more than about this many bytes of their data (as JSON), whatever their number:
#: a ``message`` event carries a whole response, up to ``--max-request-bytes`` (10 MiB), so a
#: count alone let 10,000 large ones hold gigabytes, deleted sessions' included.
RECENT_EVENT_BYTES = 32 << 20
#: What an event costs beyond its data's JSON (the object, its dict, the lists' slots).
_EVENT_OVERHEAD = 256


class StoreError(Exception):
    """The store cannot be opened or written. The message is one line saying what to do."""


class StaleSession(Exception):
    """A shared store refused a write: the session's row changed since this instance last
    read it (another instance wrote it, deleted it, or took over its turn), or a session
    being created already exists. The caller reads the session again and decides anew."""


@dataclass
class TurnRecord:
    """A live turn (running or interrupted): enough to replay it from the top."""

    turn_id: int
    message: dict[str, Any]
    webhook: dict[str, Any] | None = None
    deadline: float | None = None  # wall-clock time.time(); survives restarts
    journal: list[JournalEntry] = field(default_factory=list)
    #: The session's grants when the turn started: a replay must see the same ones.
    grants: tuple[str, ...] = ()
    started_at: float | None = None  # wall clock
    #: The name of the API key that sent the turn's message (None before version 4).
    by: str | None = None
    #: Interrupt id -> the approvals given so far towards its quorum (``motus.api.approvers``),
    #: each ``{"by": key name, "at": wall clock}``, oldest first. In the row, so a partial
    #: quorum survives restarts and another instance's write is refused rather than lost.
    approvals: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)


def senders_json(senders: dict[int, dict[str, Any]]) -> str | None:
    """The ``senders`` column: None when there are none."""
    return dump_json({str(index): sender for index, sender in senders.items()}) if senders else None


def dump_json(value: Any) -> str | None:
    """A stored JSON column. ASCII escapes: what a client sent is kept as written (a lone
    surrogate, a NUL), which SQLite's UTF-8 and PostgreSQL's text would refuse raw."""
    return None if value is None else json.dumps(value)


def load_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def turn_json(turn: TurnRecord | None) -> str | None:
    """A live turn's column (its journal is rows of its own); None without one."""
    if turn is None:
        return None
    fields = {"message": turn.message, "webhook": turn.webhook, "deadline": turn.deadline,
              "grants": list(turn.grants), "started_at": turn.started_at, "by": turn.by}
    if turn.approvals:  # only with a partial quorum: other rows stay as they were
        fields["approvals"] = {ref: [dict(given) for given in approvals] for ref, approvals in turn.approvals.items()}
    return dump_json(fields)


#: A journal row's columns, as both schemas name them, in the order ``stored_entry`` reads them.
JOURNAL_COLUMNS = (
    "seq, kind, key, label, done, value, ref, payload, answered_at, answered_by, parent, created_at, expires_at, default_value"
)
#: The same, of a journal aliased ``j`` in a join.
JOURNAL_COLUMNS_OF_J = ", ".join("j." + column.strip() for column in JOURNAL_COLUMNS.split(","))


def stored_entry(row: Sequence[Any]) -> JournalEntry:
    """A journal entry read back (``JOURNAL_COLUMNS``; a driver may give blobs as views)."""
    return JournalEntry(
        seq=row[0], kind=row[1], key=row[2], label=row[3], done=bool(row[4]), value=_blob(row[5]), ref=row[6],
        payload=_stored_payload(row[7]), answered_at=row[8], answered_by=row[9], parent=row[10], created_at=row[11],
        expires_at=row[12], default=_blob(row[13]),
    )


def _stored_payload(text: str | None) -> Any:
    """An interrupt's stored payload. An earlier motus let an agent give one an object key
    holding a lone surrogate (refused at the door since: ``interrupt()``, and the server's
    check of a worker's message); no view can show such a key (pydantic-core writes keys as
    UTF-8), so it is read back with U+FFFD in its place. The JSON text spells a surrogate
    ``\\udXXX``: anything else is not looked through."""
    payload = load_json(text)
    return without_lone_surrogate_keys(payload) if text is not None and "\\ud" in text else payload


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def stored_session(
    columns: Sequence[Any], journal: list[JournalEntry], history: Sequence[str], version: int = 0, owner: str | None = None
) -> SessionRecord:
    """A session read back: ``columns`` are its row's session_id, status, response, error,
    turn_id, touched, turn, grants, title and senders as stored; ``history`` its messages' JSON, in order."""
    session_id, status, response, error, turn_id, touched, turn, grants, title, senders = columns
    return SessionRecord(
        session_id=session_id,
        status=status,
        state=[load_json(body) for body in history],
        response=load_json(response),
        error=error,
        turn_id=turn_id,
        touched=touched,
        turn=turn_from_json(turn_id, turn, journal),
        grants=load_json(grants) or {},
        title=title,
        senders={int(index): sender for index, sender in (load_json(senders) or {}).items()},
        version=version,
        owner=owner,
    )


def inbox_contexts(
    sessions: Sequence[Sequence[Any]], replies: Sequence[tuple[str, JournalEntry]]
) -> dict[str, InboxContext]:
    """The contexts of ``DurableStore.inbox`` from its reads: each interrupted session's
    session_id, turn_id, turn column and title; and their live turns' finished model
    records, with the session id, in order."""
    journals: dict[str, list[JournalEntry]] = {}
    for session_id, entry in replies:
        journals.setdefault(session_id, []).append(entry)
    return {
        session_id: InboxContext(title, turn_from_json(turn_id, turn, journals.get(session_id, [])))
        for session_id, turn_id, turn, title in sessions
    }


def has_deadline(text: str | None) -> bool:
    """Whether a live turn's column gives it a deadline."""
    live = load_json(text)
    return isinstance(live, dict) and live.get("deadline") is not None


def turn_from_json(turn_id: int, text: str | None, journal: list[JournalEntry]) -> TurnRecord | None:
    live = load_json(text)
    if live is None:
        return None
    return TurnRecord(
        turn_id=turn_id, message=live["message"], webhook=live.get("webhook"), deadline=live.get("deadline"),
        journal=journal, grants=tuple(live.get("grants") or ()), started_at=live.get("started_at"), by=live.get("by"),
        approvals={ref: tuple(given) for ref, given in (live.get("approvals") or {}).items()},
    )


@dataclass
class Event:
    """One change clients can watch (``GET /events``): committed with the change itself, in
    the same transaction, so an event is never seen for a change a crash took back.
    ``seq`` is assigned by the store when it commits: strictly increasing, never reused."""

    session_id: str
    kind: str  # status | interrupt | resolved | approval | message | error | grant | revoke | title | said
    data: dict[str, Any]
    at: float  # wall clock
    seq: int = 0
    #: The length of ``data`` as JSON, when a store wrote or read it as such (0: not known);
    #: what ``RecentEvents`` counts against its byte budget.
    size: int = field(default=0, compare=False, repr=False)


class RecentEvents:
    """The newest committed events, in seq order, kept in memory so the many streams a
    change wakes read it without a query each. Not thread-safe: its store calls it under
    the store's own lock (``extend`` right after the commit, so only committed events are
    ever here). Holds between ``keep`` and ``2 * keep`` events (trimmed in halves), and, when
    their data passes ``max_bytes``, drops the oldest down to half of it: the newest event
    always stays. What was dropped is read from the store (or, for the memory store, whose
    log this is, a client asking for it is told to reload)."""

    def __init__(self, keep: int, max_bytes: int | None = None) -> None:
        self.keep = max(1, keep)
        self.max_bytes = max(1, RECENT_EVENT_BYTES if max_bytes is None else max_bytes)
        self._events: list[Event] = []
        self._seqs: list[int] = []
        self._sizes: list[int] = []
        self.bytes = 0  # the sum of _sizes

    def extend(self, events: Sequence[Event]) -> None:
        for event in events:
            if self._seqs and event.seq <= self._seqs[-1]:
                continue  # never out of order (seqs are assigned under the same lock)
            size = (event.size or len(json.dumps(event.data))) + _EVENT_OVERHEAD
            self._events.append(event)
            self._seqs.append(event.seq)
            self._sizes.append(size)
            self.bytes += size
        drop = len(self._events) - self.keep if len(self._events) > 2 * self.keep else 0
        left = self.bytes - sum(self._sizes[:drop])
        if left > self.max_bytes:
            while drop < len(self._sizes) - 1 and left > self.max_bytes // 2:
                left -= self._sizes[drop]
                drop += 1
        if drop:
            self.bytes = left
            del self._events[:drop], self._seqs[:drop], self._sizes[:drop]

    def covers(self, after: int) -> bool:
        """Whether every event with a seq above ``after`` that the store has is here."""
        return bool(self._seqs) and after >= self._seqs[0] - 1

    def after(self, after: int, session_id: str | None, limit: int) -> list[Event]:
        found = []
        for event in self._events[bisect.bisect_right(self._seqs, after):]:
            if session_id is None or event.session_id == session_id:
                found.append(event)
                if len(found) >= limit:
                    break
        return found

    def bounds(self) -> tuple[int, int] | None:
        return (self._seqs[0], self._seqs[-1]) if self._seqs else None


@dataclass(frozen=True)
class AuditRecord:
    """Who decided what: an interrupt resolved (by a key's name or ``timeout``), a grant
    given or revoked. Kept for as long as the session; survives restarts when durable."""

    session_id: str
    kind: str  # resolved | approval (one towards a quorum) | grant | revoke
    at: float
    by: str
    data: dict[str, Any]


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
    #: Remembered approvals: tool name -> {"by": key name, "at": wall clock}.
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Shared stores only: the row's version this change was based on (0: a new session),
    #: set to the new one by a successful ``save``; and the instance that runs the live turn.
    version: int = 0
    owner: str | None = None
    #: In a save with ``state``: how many of its leading messages the store already holds,
    #: unchanged (a turn that appended to its history). A hint: a store may rewrite them.
    kept: int = 0
    #: What people call the session: one a client set, or its first user message, shortened.
    title: str | None = None
    #: Who sent the user messages that started turns, by their index in the history:
    #: {index: {"by": key name, "at": wall clock}} (the newest ``SENDERS_KEPT``). They
    #: change only with the history, so a save writes them only with ``state``; in a save
    #: without it the stored ones stay (serialising up to 200 of them at every interrupt and
    #: resume was the largest part of a save's CPU in a long session).
    senders: dict[int, dict[str, Any]] = field(default_factory=dict)


class Store(ABC):
    """A place sessions and turn journals outlive the process, for one server process.

    Every method is abstract: a backend says what each does, even where that is nothing
    (the memory store opens nothing). What only several processes on one store need is
    ``SharedStore``'s."""

    #: Short name for ``/health``: "memory", "sqlite", ...
    kind: str = ""
    #: Whether anything survives a restart (parking and replay at start depend on it).
    durable: bool = False
    #: Where it is, for logs and messages (never a password).
    url: str = ""

    @abstractmethod
    def open(self) -> None:
        """Create or check the schema and claim the store for this process.
        Raises ``StoreError`` with a one-line reason."""

    @abstractmethod
    def close(self) -> None:
        """Release the store (idempotent)."""

    def check(self) -> None:
        """Open and close again: what a CLI does before it starts serving."""
        self.open()
        self.close()

    @abstractmethod
    def load(self) -> Iterator[SessionRecord]:
        """Every session, with its live turn and that turn's journal, oldest write first."""

    @abstractmethod
    def save(
        self,
        record: SessionRecord,
        entries: Sequence[JournalEntry] = (),
        events: Sequence[Event] = (),
        audit: Sequence[AuditRecord] = (),
    ) -> int:
        """Write the session (and its live turn's row, or no turn) plus ``entries`` of the
        live turn's journal (inserted or replaced by ``seq``), ``events`` and ``audit``
        records, atomically. A session without a live turn keeps no journal.
        ``record.state`` None keeps the stored history (it must exist: a session is first
        saved with its state). Sets each event's ``seq``; returns the last one (0 without events)."""

    @abstractmethod
    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        """Insert or replace journal records of a live turn, atomically."""

    @abstractmethod
    def delete(self, session_id: str, events: Sequence[Event] = ()) -> int:
        """Forget the session, its journal and its audit records; append ``events``.
        Returns the last event seq (0 without events)."""

    @abstractmethod
    def events_after(self, after: int, session_id: str | None = None, limit: int = 500) -> list[Event]:
        """Events with ``seq > after`` (of one session, or all), oldest first."""

    @abstractmethod
    def event_bounds(self) -> tuple[int, int]:
        """(the oldest seq still kept, the newest seq); (0, 0) when there are none. A
        client whose ``Last-Event-ID`` is below oldest - 1 has missed pruned events."""

    @abstractmethod
    def audit(self, session_id: str) -> list[AuditRecord]:
        """The session's audit records, oldest first."""


@dataclass(frozen=True)
class SessionSummary:
    """What a list of sessions shows of one (``GET /sessions``)."""

    session_id: str
    status: str
    total_messages: int
    title: str | None = None


@dataclass(frozen=True)
class LiveTurn:
    """A session whose turn is live, as ``DurableStore.live_turns`` lists it."""

    session_id: str
    status: str
    timed: bool  # a deadline, or a pending interrupt with an expiry


@dataclass(frozen=True)
class InboxContext:
    """An interrupted session, as the inbox shows it beside its pending interrupts."""

    title: str | None
    turn: TurnRecord | None  # its live turn, with only the finished model records as journal


class DurableStore(Store):
    """A store whose sessions outlive the process (SQLite, PostgreSQL). The server keeps
    only some of them in memory (the session cache of ``motus.serve.turns.machine``) and reads the rest from here
    on demand; lists, counts, the inbox and the TTL sweep ask the store, not the memory.

    Every query sees what a ``save`` or ``delete`` that returned has committed."""

    durable = True

    @abstractmethod
    def load_one(self, session_id: str) -> SessionRecord | None:
        """One session as ``load`` gives it, or None if it does not exist."""

    @abstractmethod
    def summaries(self) -> list[SessionSummary]:
        """Every session's id, status and number of messages, oldest write first."""

    @abstractmethod
    def count(self) -> int:
        """How many sessions exist."""

    @abstractmethod
    def pending_counts(self) -> tuple[int, int]:
        """How many sessions are ``interrupted``, and how many interrupts they wait on (for
        ``/health`` and the metrics, without reading each)."""

    @abstractmethod
    def pending_interrupts(self) -> list[tuple[str, JournalEntry]]:
        """Every interrupt waiting on a person (of a session whose status is
        ``interrupted``, not yet answered), with its session's id; oldest first (by creation
        time, then id)."""

    @abstractmethod
    def inbox(
        self, session_ids: Collection[str] | None = None
    ) -> tuple[list[tuple[str, JournalEntry]], dict[str, InboxContext]]:
        """``pending_interrupts``, and what an approver needs to know of each of their
        sessions: its title, and its live turn's message and finished model records. Read
        in one snapshot: an item is never shown beside another turn's message. With
        ``session_ids``, of those sessions only (the ones whose inbox changed since a kept
        inbox was read: ``Queries.inbox``), in the same order."""

    @abstractmethod
    def live_turns(self) -> list[LiveTurn]:
        """The sessions with a live turn (running or interrupted), oldest write first, with
        what a restart needs to know without reading each: whether the turn has a deadline
        or a pending interrupt that expires (both are timed in memory)."""

    @abstractmethod
    def expired_ids(self, cutoff: float, limit: int | None = None) -> list[str]:
        """The idle and error sessions last written at or before ``cutoff`` (wall clock),
        oldest first, at most ``limit`` of them: what the TTL sweep removes."""


class SharedStore(DurableStore):
    """A store several server processes (instances) share, such as PostgreSQL.

    On top of ``Store``: every write of an existing session is checked against the row's
    ``version`` (``StaleSession`` when another instance wrote first), a create of a session
    that exists is ``StaleSession``, journal records are written only by the instance that
    owns the live turn, each instance holds a lease it renews, and the live turns of an
    instance whose lease lapsed are taken over, each by exactly one other."""

    durable = True
    #: This process's name in the store (the owner of the turns it runs).
    instance_id: str
    #: An instance that has not renewed its lease for this long is taken for gone.
    lease_seconds: float

    @abstractmethod
    def delete(self, session_id: str, events: Sequence[Event] = (), version: int | None = None) -> int:
        """``Store.delete``, only if the row still has ``version`` (any, when None);
        ``StaleSession`` when it does not, or the session does not exist."""

    @abstractmethod
    def version_of(self, session_id: str) -> int | None:
        """The stored row's version, or None if the session does not exist."""

    @abstractmethod
    def listen(self, on_change: Callable[[str, int, bool], None], on_reconnect: Callable[[], None]) -> None:
        """Start calling ``on_change(session_id, version, new_events)`` for every change
        committed by any instance (``version`` 0: deleted, -1: changed, re-read it;
        ``new_events``: events of it arrived here only now), and ``on_reconnect()`` once
        listening and again after changes may have been missed."""

    @abstractmethod
    def renew_lease(self, fresh: bool = False) -> None:
        """Tell the other instances this one is alive for another lease period (``fresh``:
        on a new connection, not a pooled one; after this instance lost its lease)."""

    @abstractmethod
    def claim_orphans(self, limit: int = 100) -> list[str]:
        """Take over (owner := this instance) live turns whose owner's lease lapsed, each
        by exactly one instance; returns their session ids."""

    @abstractmethod
    def owner_alive(self, owner: str) -> bool:
        """Whether instance ``owner`` holds a live lease (and is connected)."""

    @abstractmethod
    def pull_events(self) -> set[str]:
        """Fetch events committed by any instance into the events kept in memory; returns
        the sessions they belong to."""

    @abstractmethod
    def changed_since(self, seq: int) -> tuple[int, set[str] | None]:
        """The newest committed event's seq, and the sessions with an event after ``seq``
        up to it, read in one snapshot from the store (not from what this instance's
        listener has heard so far); None for the sessions when it cannot tell (``seq`` is
        negative, or events after it are no longer kept). Every change of what the inbox
        shows commits an event with it, so a kept inbox labelled with the newest seq before
        it was read is brought up to date by reading these sessions again."""
