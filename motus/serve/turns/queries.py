"""Queries: what the API reads about sessions (a session, its messages and live turn, its
grants and audit, lists, the inbox of pending interrupts, counts for health and metrics, and
long polls), a mixin of ``Turns``.

Guarantees: every read of one session is made under its lock on an up-to-date copy (on a
shared store, the row's version is checked first: ``Machine._read``), and returns a snapshot
(``SessionView``, copies of lists and dicts) that is safe to use once the lock is released;
a deleted session is a 404. With a store that outlives the process, lists, counts and the
inbox are queries of the store (the server holds only some sessions in memory, and the store
has every committed change, another instance's too); with memory, of the sessions held.
Reads change nothing and publish nothing.

Threads: request threads. The sessions are the machine's, each guarded by its own lock;
``_inbox_cache`` (the machine's, an ``InboxCache``) is replaced whole when the generation
changes and its lists are never changed once stored (readers get copies; a patch makes new
lists), so it needs no lock: a race only computes the same inbox twice, and a reader that
replaces a newer cache with an older one only makes the next reader patch again.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from motus.serve.errors import SessionNotFound
from motus.serve.events import inbox_key
from motus.durable.records import JournalEntry
from motus.serve.live import agent_text
from motus.serve.store import AuditRecord, DurableStore, SessionSummary, SharedStore
from motus.serve.turns.replicas import ask_store
from motus.serve.turns.state import PendingInterrupt, Session, SessionStatus, SessionView, TurnState, pending_interrupt

if TYPE_CHECKING:
    from motus.serve.turns.machine import Machine

T = TypeVar("T")

#: Inboxes of one type kept (one per ``?type=`` asked) until the inbox's next change.
INBOX_CACHE_KINDS = 16
#: Answers kept with one inbox (one per type and limit asked) until its next change, and
#: the bytes they may hold in all: the answers worth keeping are those many readers wait
#: for at once (an approver's poll, an Inbox view's first page); a whole inbox of 50,000
#: is ~35 MB, and keeping it and its type's beside the entries they were joined from took
#: a server with 100,000 sessions past 250 MiB.
INBOX_ANSWERS_KEPT = 8
INBOX_ANSWER_BYTES = 4 << 20
#: A kept inbox is patched when at most this many sessions changed since it was read, and
#: read whole again past it (a read of that many sessions costs about as much).
INBOX_PATCH_MOST = 512


@dataclass
class InboxCache:
    """The inbox as of ``generation`` (one process: an ``Events.inbox_generation``; a shared
    store: its newest event's seq, ``SharedStore.changed_since``): the whole one once read,
    and one list per type asked. A type's list is a filter of the whole one when that was
    read first (the same entries, no copy), else read from the store for that type alone
    (cheaper: no context is built for the other types); reading the whole one drops the
    lists read alone. Types
    partition the entries, so the cache holds one copy of each pending interrupt at most,
    and only of the current generation: a new generation starts from the lists read before
    it, patched (``Queries._caught_up``; the types filtered from the whole one are filtered
    again when asked), so the memory it holds is bounded by the pending interrupts, not by
    the types clients ask for (16 types each read from the store once held 16 inboxes)."""

    generation: int
    whole: list[Any] | None = None
    kinds: dict[str, list[Any]] = field(default_factory=dict)
    #: Answers made from these lists (``Queries.inbox_answer``), by type and key.
    answers: dict[tuple[str | None, Any], Any] = field(default_factory=dict)
    #: How many items each session has in a list (by type; None: the whole one), once
    #: counted, with the list counted: each item says its number among its session's
    #: (``position`` of ``of``). Two readers may make a type's list at once; each uses only
    #: the counts of its own.
    counts: dict[str | None, tuple[list[Any], dict[str, int]]] = field(default_factory=dict)
    #: What ``answers`` hold, as their ``size`` said (within ``INBOX_ANSWER_BYTES``): one
    #: count, shared (as ``answers`` is) by the caches a new type's list is added to, and
    #: changed with ``answers`` under ``lock``.
    answer_bytes: list[int] = field(default_factory=lambda: [0])
    lock: threading.Lock = field(default_factory=threading.Lock)


class Queries:
    """The reads of ``Turns`` (on the machine's state)."""

    def __len__(self: Machine) -> int:
        """How many sessions exist (in the store, when it outlives the process)."""
        store = self.store
        if isinstance(store, DurableStore):
            return ask_store(store.count)
        with self._registry:
            return len(self._sessions)

    def get(self: Machine, session_id: str) -> SessionView:
        return self._read(session_id, Session.view)

    def messages(self: Machine, session_id: str) -> list[dict[str, Any]]:
        return self._read(session_id, lambda session: list(session.state))

    def messages_and_senders(self: Machine, session_id: str) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """The history, and who sent which of its user messages (by index), of one moment."""
        return self._read(session_id, lambda session: (list(session.state), dict(session.senders)))

    def live(self: Machine, session_id: str) -> tuple[int, dict[str, Any], list[JournalEntry], float | None, str | None] | None:
        """A snapshot of the live turn (its id, message, journal, start time and sender), or None
        when the session has no turn running or waiting."""
        try:
            return self._read(session_id, _live_turn)
        except SessionNotFound:
            return None

    def get_with_live(
        self: Machine, session_id: str
    ) -> tuple[SessionView, LiveTurn | None]:
        """The session's view and its live turn (``live``), read under one lock: the
        interrupts a response lists and the steps it shows are of the same moment (read
        apart, a step written after the last interrupt could show beside a list without it)."""
        return self._read(session_id, lambda session: (session.view(), _live_turn(session)))

    def grants(self: Machine, session_id: str) -> dict[str, dict[str, Any]]:
        return self._read(session_id, lambda session: dict(session.grants))

    def audit(self: Machine, session_id: str) -> list[AuditRecord]:
        self.get(session_id)  # 404 for an unknown session
        store = self.store
        return ask_store(lambda: store.audit(session_id))  # a 503 that says when to ask again

    def inbox(self: Machine, kind: str | None = None) -> list[InboxEntry]:
        """Every pending interrupt of every session (of type ``kind``), oldest first, each
        with what an approver needs to know of its turn (``TurnContext``).

        Kept between changes, since one interrupt wakes every inbox long poll at once and
        each reads it, and an open Inbox view reads it at every change; brought up to date
        by reading again only the sessions that changed since: with thousands pending, the
        whole inbox is a read of every waiting session. With one process, what changed is
        what was published (``Events.inbox_generation``, ``Events.inbox_changes``); on a
        shared store, it is asked of the store at each read (``SharedStore.changed_since``),
        since another instance's change is committed there before it is published here."""
        return list(self._kept_inbox(kind)[1])

    def inbox_answer(
        self: Machine,
        kind: str | None,
        key: Hashable,
        render: Callable[[list[InboxEntry], Mapping[str, int]], T],
        size: Callable[[T], int] = lambda answer: 0,
    ) -> T:
        """``render(inbox(kind), counts)``, where ``counts`` says how many items each session
        has in that list; kept with the kept inbox until its next change, under ``key``
        (what else the answer depends on, such as a limit), while the kept answers' ``size``
        stays within ``INBOX_ANSWER_BYTES``: the open Inbox views and the approvers' polls
        woken by one change all read the same answer, made once. ``render`` must change
        neither (the kept ones)."""
        cache, found = self._kept_inbox(kind)
        memo = (kind, key)
        answer = cache.answers.get(memo)
        if answer is None:
            counted = cache.counts.get(kind)
            if counted is not None and counted[0] is found:
                counts = counted[1]
            else:  # counted once a change (the whole one's are patched with it)
                counts = Counter(entry.session_id for entry in found)
                cache.counts[kind] = (found, counts)
            answer = render(found, counts)
            weight = size(answer)
            # Keys come from clients' queries: bounded in number and in bytes.
            with cache.lock:
                if len(cache.answers) < INBOX_ANSWERS_KEPT and cache.answer_bytes[0] + weight <= INBOX_ANSWER_BYTES:
                    cache.answers[memo] = answer
                    cache.answer_bytes[0] += weight
        return answer  # type: ignore[no-any-return]

    def _kept_inbox(self: Machine, kind: str | None) -> tuple[InboxCache, list[InboxEntry]]:
        """The kept inbox (brought up to date) and its list for ``kind``, not copied."""
        cache = self._inbox_cache
        store = self.store
        if isinstance(store, SharedStore):
            label, changed = ask_store(lambda: store.changed_since(cache.generation))
        else:
            label = self.events.inbox_generation  # read before the inbox: a change meanwhile makes it stale
            changed = self.events.inbox_changes(cache.generation) if label != cache.generation else set()
        if label != cache.generation:
            cache = self._caught_up(cache, label, changed)
        if kind is None:
            if cache.whole is None:
                cache = InboxCache(label, self._read_inbox(None))  # its types are filtered from it from now on
            found = cache.whole
        else:
            found = cache.kinds.get(kind)
            if found is None:
                if cache.whole is not None:
                    found = [entry for entry in cache.whole if entry.item.type == kind]
                else:
                    found = self._read_inbox(kind)
                kinds = {} if len(cache.kinds) >= INBOX_CACHE_KINDS else dict(cache.kinds)  # types come from clients' queries
                kinds[kind] = found
                cache = InboxCache(label, cache.whole, kinds, cache.answers, cache.counts, cache.answer_bytes, cache.lock)  # the lists it had are the same
        self._inbox_cache = cache
        return cache, found

    def _caught_up(self: Machine, cache: InboxCache, label: int, changed: set[str] | None) -> InboxCache:
        """The kept inbox brought to ``label``: its lists with the entries of the sessions
        ``changed`` since read again (the same entries as a whole read, a session's being
        replaced by what it shows now), or an empty cache when it cannot tell which changed
        (None) or too many did. A type's list filtered from the whole one is filtered again
        when asked; one read alone is patched alone."""
        if (cache.whole is None and not cache.kinds) or changed is None or len(changed) > INBOX_PATCH_MOST:
            return InboxCache(label)
        fresh = self._read_inbox(None, changed) if changed else []
        if cache.whole is not None:
            whole = _patched(cache.whole, changed, fresh)
            counted = cache.counts.get(None)
            if counted is None or counted[0] is not cache.whole:
                return InboxCache(label, whole)
            counts = dict(counted[1])  # patched too: counting thousands at each change costs more than the patch
            for session_id in changed:
                counts.pop(session_id, None)
            for entry in fresh:
                counts[entry.session_id] = counts.get(entry.session_id, 0) + 1
            return InboxCache(label, whole, counts={None: (whole, counts)})
        kinds = {kind: _patched(found, changed, [entry for entry in fresh if entry.item.type == kind])
                 for kind, found in cache.kinds.items()}
        return InboxCache(label, None, kinds)

    def _read_inbox(self: Machine, kind: str | None, session_ids: Collection[str] | None = None) -> list[InboxEntry]:
        """The inbox (of type ``kind``) read from the store, or from the sessions held
        without one; of the sessions ``session_ids`` only, when given."""
        store = self.store
        if isinstance(store, DurableStore):
            pending, contexts = ask_store(lambda: store.inbox(session_ids))
            found = []
            for session_id, entry in pending:
                stored = contexts.get(session_id)
                turn = stored.turn if stored is not None else None
                item = pending_interrupt(entry, turn.approvals.get(entry.ref or "", ()) if turn is not None else ())
                if kind is None or item.type == kind:
                    context = turn_context(stored.title if stored is not None else None, turn, turn.journal if turn is not None else ())
                    found.append(InboxEntry(session_id, item, context))
            # In Python's order of ids, which ``_patched`` keeps, not the database's collation
            # (they differ for interrupts of one gather, which share their time).
            found.sort(key=inbox_order)
            return found
        found = []
        if session_ids is None:
            sessions = self._all()
        else:
            with self._registry:
                sessions = [self._sessions[sid] for sid in session_ids if sid in self._sessions]
        for session in sessions:
            with session.lock:
                if session.deleted:
                    continue
                items = [item for item in session.view().interrupts if kind is None or item.type == kind]
                if items:
                    turn = session.turn
                    context = turn_context(session.title, turn, turn.replies() if turn is not None else [])
                    found.extend(InboxEntry(session.session_id, item, context) for item in items)
        found.sort(key=inbox_order)
        return found

    def wait_inbox(self: Machine, kind: str | None, timeout: float) -> list[InboxEntry]:
        """``inbox`` as soon as it is not empty, or empty after ``timeout`` seconds."""
        found = self.events.wait(inbox_key(kind), lambda: self.inbox(kind) or None, timeout)
        return found or []

    def list(self: Machine) -> list[SessionSummary]:
        store = self.store
        if isinstance(store, DurableStore):
            return ask_store(store.summaries)
        summaries = []
        for session in self._all():
            with session.lock:
                if not session.deleted:
                    summaries.append(_summary(session))
        return summaries

    def summary(self: Machine, session_id: str) -> SessionSummary:
        """One session as ``list`` shows it."""
        return self._read(session_id, _summary)

    def in_memory(self: Machine) -> int:
        """Sessions held in memory now (with a durable store: the cache, ``_trim``)."""
        with self._registry:
            return len(self._sessions)

    def counts(self: Machine) -> dict[str, int]:
        """This instance's live turns (each held in memory) and parked ones. With one
        process and a durable store, every interrupted session of the store is parked but
        those waiting here with a process (a parked one may not be held); on a shared store,
        the parked turns held here (another instance's are its own to count)."""
        live = parked = waiting = 0
        for session in self._all():
            turn = session.turn
            state = turn.state if turn is not None else None
            if state is TurnState.PARKED:
                parked += 1
            elif state is not None and state not in (TurnState.ENDED, TurnState.ELSEWHERE):
                live += 1
                waiting += state is TurnState.WAITING
        store = self.store
        if isinstance(store, DurableStore) and not isinstance(store, SharedStore):
            interrupted, _ = ask_store(store.pending_counts)
            parked = max(0, interrupted - waiting)
        running = self.slots.in_use()
        return {"running_workers": running, "live_turns": live, "parked_turns": parked}

    def interrupt_counts(self: Machine) -> tuple[int, int]:
        """For metrics: interrupts waiting on a person, and how many of them belong to
        parked turns (with a durable store: every pending one whose turn has no process)."""
        pending = parked = 0
        store = self.store
        if isinstance(store, DurableStore):
            # Counted by the store; parked: with one process, all but those of turns waiting
            # here with a process; on a shared store, those of parked turns held here
            # (another instance's are counted pending, not parked: only it knows).
            _, pending = ask_store(store.pending_counts)
            held = {TurnState.WAITING: 0, TurnState.PARKED: 0}
            for session in self._all():
                with session.lock:
                    turn = session.turn
                    if turn is not None and turn.state in held:
                        held[turn.state] += len(turn.pending())
            if isinstance(store, SharedStore):
                return pending, held[TurnState.PARKED]
            return pending, max(0, pending - held[TurnState.WAITING])
        for session in self._all():
            with session.lock:
                turn = session.turn
                if turn is None or session.status is not SessionStatus.INTERRUPTED:
                    continue
                count = len(turn.pending())
                pending += count
                if turn.state is TurnState.PARKED:
                    parked += count
        return pending, parked

    def wait(self: Machine, session_id: str, timeout: float) -> SessionView:
        """Block until the session is not ``running`` or ``timeout`` seconds pass; at once
        while the server is closing. ``SessionNotFound`` if it is (or gets) deleted."""

        def check() -> SessionView | None:
            view = self.get(session_id)
            return view if view.status is not SessionStatus.RUNNING else None

        view = self.events.wait(session_id, check, timeout)
        return view if view is not None else self.get(session_id)


@dataclass(frozen=True)
class TurnContext:
    """Why an inbox item asks: the session's title and the waiting turn's message, sender,
    start time and what the agent said in it so far."""

    title: str | None
    message: dict[str, Any] | None
    by: str | None
    started_at: float | None
    agent_text: str | None


@dataclass(frozen=True)
class InboxEntry:
    """One pending interrupt in the inbox, with its session and its turn's context."""

    session_id: str
    item: PendingInterrupt
    context: TurnContext
    #: Its item's JSON text, once written (``motus.serve.inbox_json.inbox_text``): an entry
    #: is kept until its session changes, and the whole inbox is read at every change.
    rendered: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def turn_context(title: str | None, turn: Any, replies: Iterable[JournalEntry]) -> TurnContext:
    """The context of a waiting turn (a ``Turn`` or a ``TurnRecord``, or None) whose finished
    model records are ``replies``."""
    if turn is None:
        return TurnContext(title, None, None, None, None)
    return TurnContext(title, turn.message, turn.by, turn.started_at, agent_text(replies))


def inbox_order(entry: InboxEntry) -> tuple[float, str]:
    """Where an entry stands in the inbox: oldest first, then by id (the store's order)."""
    return (entry.item.created_at or 0.0, entry.item.interrupt_id)


def _patched(entries: list[InboxEntry], changed: Collection[str], fresh: Iterable[InboxEntry]) -> list[InboxEntry]:
    """``entries`` (in inbox order) with those of the sessions ``changed`` replaced by
    ``fresh`` (what those sessions show now), in inbox order. A new list: a kept one is
    never changed (readers hold copies of it)."""
    kept = [entry for entry in entries if entry.session_id not in changed]
    for entry in fresh:
        bisect.insort(kept, entry, key=inbox_order)
    return kept


def _summary(session: Session) -> SessionSummary:
    return SessionSummary(session.session_id, session.status.value, len(session.state), session.title)


class LiveTurn(NamedTuple):
    """A turn not ended, as ``describe_turn`` shows it (copies: safe outside the lock)."""

    turn_id: int
    message: dict[str, Any]
    journal: list[JournalEntry]
    started_at: float | None
    by: str | None
    history_at: int  # the history's length: where the turn's messages will start


def _live_turn(session: Session) -> LiveTurn | None:
    turn = session.turn
    if turn is None or turn.state is TurnState.ENDED:
        return None
    return LiveTurn(turn.turn_id, turn.message, list(turn.journal.values()), turn.started_at, turn.by, len(session.state))

