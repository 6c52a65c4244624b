"""The store contract (``motus.serve.store``): every guarantee of ``Store`` and ``SharedStore``,
one test per guarantee, run against each backend. A new backend is written against this module:
add it to ``BACKENDS`` (and to ``DURABLE`` or ``SHARED`` if it is one).

- ``store``: every backend (memory, SQLite, PostgreSQL): events and their order, audit records.
- ``durable``: the backends that outlive the process (SQLite, PostgreSQL): sessions, their
  live turn's journal and their history, read back by a fresh store on the same place.
- ``shared``: the backends several instances share (PostgreSQL), as two instances on one
  database: versions and ``StaleSession``, journal ownership, event order across instances,
  leases and claims, the listener.

Backend-specific behaviour (schema versions and migrations, one server per SQLite file, URLs,
pruning schedules) stays with its backend: ``tests/unit/test_store.py`` (SQLite, memory) and
``tests/integration/test_postgres_store.py``. The PostgreSQL runs use the session's throwaway
cluster (``pg_url``, a new database per test); they skip where PostgreSQL is not installed,
and fail instead under ``CI`` or ``MOTUS_REQUIRE_POSTGRES``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from motus.serve.journal import pack, unpack
from motus.serve.store import AuditRecord, Event, MemoryStore, SessionRecord, SharedStore, StaleSession, Store, StoreError, TurnRecord
from motus.serve.store import base as store_base
from motus.serve.store.sqlite import SqliteStore
from tests.unit.serve.store.records import ANSWERED, HISTORY, MESSAGE, MODEL_CALL, PENDING, REPLY, STARTED, live_turn, session

BACKENDS = ("memory", "sqlite", "postgresql")
DURABLE = ("sqlite", "postgresql")
SHARED = ("postgresql",)

# -- the backends ------------------------------------------------------------------------------


@dataclass
class Backend:
    """One place sessions are kept, and the stores opened on it (closed after the test).

    ``save`` and ``delete`` write as the server does: each write of a session is based on the
    version last written (what a shared store checks; the others ignore it), and the live
    turn is owned by the store that writes it (what a shared store's journal writes check)."""

    name: str
    make: Callable[[], Store]
    #: The seqs of a session's history rows, read from the database itself.
    history_rows: Callable[[str], list[int]] | None = None
    opened: list[Store] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)

    def open(self) -> Store:
        store = self.make()
        store.open()
        self.opened.append(store)
        return store

    def reload(self) -> list[SessionRecord]:
        """Every session, as a store opened afresh on the same place reads it (SQLite: the
        first store closed, one server per file; PostgreSQL: another instance)."""
        if self.name == "sqlite":
            for store in self.opened:
                store.close()
        fresh = self.open()
        try:
            return list(fresh.load())
        finally:
            fresh.close()

    def save(self, store: Store, record: SessionRecord, entries: Any = (), events: Any = (), audit: Any = ()) -> int:
        record.version = self.versions.get(record.session_id, 0)
        if isinstance(store, SharedStore) and record.turn is not None:
            record.owner = store.instance_id
        last = store.save(record, entries, events, audit)
        self.versions[record.session_id] = record.version
        return last

    def delete(self, store: Store, session_id: str, events: Any = ()) -> int:
        self.versions.pop(session_id, None)
        return store.delete(session_id, events)

    def expected(self, record: SessionRecord) -> SessionRecord:
        """``record`` as a store reads it back: with its version where one is kept."""
        if self.name not in SHARED:
            return record
        return replace(record, version=self.versions[record.session_id])

    def close(self) -> None:
        for store in self.opened:
            store.close()


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if name == "memory":
        return Backend(name, MemoryStore)
    if name == "sqlite":
        path = tmp_path / "sessions.sqlite3"

        def sqlite_rows(session_id: str) -> list[int]:
            sqlite = next(s for s in backend.opened if isinstance(s, SqliteStore) and s._conn is not None)  # noqa: SLF001
            rows = sqlite._conn.execute("SELECT seq FROM messages WHERE session_id = ? ORDER BY seq", (session_id,))  # type: ignore[union-attr]  # noqa: SLF001
            return [row[0] for row in rows]

        backend = Backend(name, lambda: SqliteStore(f"sqlite:///{path}", str(path)), sqlite_rows)
        return backend
    url = request.getfixturevalue("pg_url")
    from motus.serve.store.postgres import PostgresStore

    def postgres_rows(session_id: str) -> list[int]:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            return [row[0] for row in conn.execute("SELECT seq FROM motus_messages WHERE session_id = %s ORDER BY seq", (session_id,))]

    # A short lease, as the instances of a test have.
    return Backend(name, lambda: PostgresStore(url, lease_seconds=1.0), postgres_rows)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=DURABLE)
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def stores(pg_url: str) -> Iterator[list[Any]]:
    """Two instances on one shared database (a short lease)."""
    from motus.serve.store.postgres import PostgresStore

    opened = []
    for _ in range(2):
        store = PostgresStore(pg_url, lease_seconds=1.0)
        store.open()
        opened.append(store)
    yield opened
    for store in opened:
        store.close()


def record(session_id: str = "s1", version: int = 0, turn: TurnRecord | None = None, **changes: Any) -> SessionRecord:
    """A row as a shared store's instance writes it: based on ``version``."""
    fields: dict[str, Any] = {
        "session_id": session_id, "status": "interrupted" if turn else "idle", "state": [MESSAGE], "response": None,
        "error": None, "turn_id": turn.turn_id if turn else 0, "touched": 1.0, "turn": turn, "version": version,
    }
    fields.update(changes)
    return SessionRecord(**fields)


# -- every store: opening, events, audit -------------------------------------------------------


def test_check_opens_and_closes_again(backend: Backend) -> None:
    store = backend.make()
    store.check()
    store.check()
    assert store.kind == backend.name and store.durable == (backend.name in DURABLE)
    assert isinstance(store, SharedStore) == (backend.name in SHARED)


def test_events_get_increasing_seqs_and_are_read_after_a_cursor(backend: Backend) -> None:
    store = backend.open()
    assert store.event_bounds() == (0, 0)
    events = [Event(sid, "status", {"n": n}, at=float(n)) for n, sid in enumerate(["a", "b", "a", "b", "a"])]
    backend.save(store, session("b"))  # (a shared store deletes only what exists)
    last = backend.save(store, session("a"), events=events[:3])
    assert last == 3 and [e.seq for e in events[:3]] == [1, 2, 3]
    assert backend.delete(store, "b", events[3:]) == 5
    assert backend.save(store, session("a")) == 0  # no events: nothing assigned
    assert [e.seq for e in store.events_after(0)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in store.events_after(2, "a")] == [3, 5]
    assert [e.data for e in store.events_after(0, "b", limit=1)] == [{"n": 1}]
    assert store.events_after(5) == []
    assert store.event_bounds() == (1, 5)


def test_the_events_held_in_memory_are_bounded_in_bytes_and_a_durable_store_reads_the_rest(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``message`` event carries a whole response, so the newest events a store holds in
    memory (``RecentEvents``) are bounded by their bytes as well as their number: 60 events
    of 1 KB against a budget of 20 KB. A durable store reads the older ones from its rows;
    the memory store, whose log they are, starts its log later (a stream asking for older
    ones is told to reload). The newest always stays."""
    monkeypatch.setattr(store_base, "RECENT_EVENT_BYTES", 20_000)
    store = backend.open()
    for n in range(60):
        backend.save(store, session("a"), events=[Event("a", "message", {"content": "x" * 1_000, "n": n}, at=float(n))])
    held = store._recent  # type: ignore[attr-defined] # what is bounded: every store has one
    first, last = held.bounds()
    assert held.bytes <= 20_000 and last == 60 and first > 40, (held.bytes, first, last)
    if backend.name in DURABLE:
        assert [e.data["n"] for e in store.events_after(0, limit=100)] == list(range(60))
        assert store.event_bounds() == (1, 60)
    else:
        assert store.event_bounds() == (first, 60)
        assert [e.seq for e in store.events_after(0, limit=100)] == list(range(first, 61))


def test_audit_records_are_kept_per_session_in_order_and_go_with_it(backend: Backend) -> None:
    store = backend.open()
    first = AuditRecord("a", "resolved", 1.0, "ops", {"interrupt_id": "i1", "value": {"approved": True}})
    second = AuditRecord("a", "grant", 2.0, "ops", {"tool_name": "t"})
    backend.save(store, session("a"), audit=[first])
    backend.save(store, session("a"), audit=[second])
    backend.save(store, session("b"), audit=[AuditRecord("b", "revoke", 3.0, "x", {})])
    assert store.audit("a") == [first, second]
    backend.delete(store, "a")
    assert store.audit("a") == [] and len(store.audit("b")) == 1


# -- durable stores: sessions, journals, histories ---------------------------------------------


def test_a_session_with_a_live_turn_and_its_journal_round_trips(durable: Backend) -> None:
    store = durable.open()
    saved = session(turn=live_turn())
    durable.save(store, saved, [PENDING, ANSWERED])
    store.save_entries("s1", 1, [MODEL_CALL, STARTED])
    [loaded] = durable.reload()
    assert loaded.turn is not None
    assert loaded.turn.journal == [PENDING, ANSWERED, MODEL_CALL, STARTED]
    expected = session(turn=TurnRecord(**{**live_turn().__dict__, "journal": [PENDING, ANSWERED, MODEL_CALL, STARTED]}))
    assert loaded == durable.expected(replace(expected, owner=saved.owner))
    assert loaded.state == [MESSAGE, REPLY] and loaded.turn.message == MESSAGE
    assert isinstance(loaded.turn.journal[2].value, bytes) and unpack(loaded.turn.journal[1].value) == "blue"


def test_entries_are_inserted_or_replaced_by_seq(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session(turn=live_turn()), [PENDING, STARTED])
    finished = STARTED.finished(pack(("ok", "deleted")))
    answered = PENDING.finished(pack(("ok", True)), answered_at=5.0)
    store.save_entries("s1", 1, [finished])
    durable.save(store, session(turn=live_turn(), status="running"), [answered])
    [loaded] = durable.reload()
    assert loaded.status == "running"
    assert loaded.turn is not None and loaded.turn.journal == [answered, finished]


def test_a_save_without_state_keeps_the_stored_history(durable: Backend) -> None:
    """Interrupts and resumes do not change the history, so they do not rewrite it."""
    store = durable.open()
    durable.save(store, session())
    durable.save(store, session(turn=live_turn(), state=None, response=None))
    [loaded] = durable.reload()
    assert loaded.state == [MESSAGE, REPLY] and loaded.status == "interrupted" and loaded.response is None


def test_a_session_saved_without_a_turn_has_no_journal(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session(turn=live_turn()), [PENDING, MODEL_CALL])
    durable.save(store, session(status="idle"), [ANSWERED])  # the turn ended: its journal goes, entries ignored
    [loaded] = list(store.load())
    assert loaded.turn is None and loaded.status == "idle"
    durable.save(store, session(turn=live_turn(turn_id=2), status="running"))  # a new turn starts empty
    [loaded] = durable.reload()
    assert loaded.turn is not None and (loaded.turn.turn_id, loaded.turn.journal) == (2, [])


def test_a_new_turn_drops_the_journal_of_the_previous_one(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session(turn=live_turn(turn_id=1)), [PENDING])
    durable.save(store, session(turn=live_turn(turn_id=2), status="running"), [MODEL_CALL])
    [loaded] = list(store.load())
    assert loaded.turn is not None and loaded.turn.journal == [MODEL_CALL]


def test_delete_forgets_the_session_and_its_journal(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session("s1", turn=live_turn()), [PENDING])
    durable.save(store, session("s2", touched=1767225601.0))
    durable.delete(store, "s1")
    if isinstance(store, SharedStore):  # a shared store deletes only what exists (it checks the version)
        with pytest.raises(StaleSession):
            store.delete("never-there")
    else:
        store.delete("never-there")
    assert [r.session_id for r in store.load()] == ["s2"]
    durable.save(store, session("s1", turn=live_turn()))
    [s1] = [r for r in durable.reload() if r.session_id == "s1"]
    assert s1.turn is not None and s1.turn.journal == []


def test_sessions_load_oldest_write_first(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session("b", touched=2.0))
    durable.save(store, session("a", touched=3.0))
    durable.save(store, session("c", touched=1.0))
    assert [r.session_id for r in store.load()] == ["c", "b", "a"]


def test_one_session_reads_back_as_load_gives_it_and_an_unknown_one_is_none(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session("s1", turn=live_turn()), [PENDING, ANSWERED])
    durable.save(store, session("s2", touched=1767225601.0))
    loaded = {r.session_id: r for r in store.load()}
    assert store.load_one("s1") == loaded["s1"] and store.load_one("s2") == loaded["s2"]
    assert store.load_one("s1").turn.journal == [PENDING, ANSWERED]  # type: ignore[union-attr]
    assert store.load_one("never-there") is None


def test_the_queries_a_list_the_inbox_and_the_sweep_make_see_every_committed_write(durable: Backend) -> None:
    """Lists, counts, the inbox and the TTL sweep read the store, not the server's memory
    (which holds only some sessions): each sees what a returned save or delete committed."""
    store = durable.open()
    assert store.summaries() == [] and store.count() == 0 and store.pending_counts() == (0, 0)
    durable.save(store, session("idle-old", touched=1.0, state=[MESSAGE, REPLY]))
    durable.save(store, session("waiting", touched=2.0, turn=live_turn()), [PENDING])
    durable.save(store, session("failed", touched=3.0, status="error", error="boom"))
    durable.save(store, session("idle-new", touched=5.0))
    assert {s.session_id: s.status for s in store.summaries()} == {
        "idle-old": "idle", "waiting": "interrupted", "failed": "error", "idle-new": "idle"}
    assert store.count() == 4
    assert [s.session_id for s in store.summaries()] == ["idle-old", "waiting", "failed", "idle-new"]
    assert {s.session_id: s.total_messages for s in store.summaries()}["idle-old"] == 2
    assert store.pending_counts() == (1, 1)
    assert store.expired_ids(3.0) == ["idle-old", "failed"]  # a session waiting on a person never expires
    assert store.expired_ids(0.5) == []
    durable.delete(store, "idle-old")
    assert store.count() == 3 and "idle-old" not in [s.session_id for s in store.summaries()]
    assert store.expired_ids(10.0) == ["failed", "idle-new"]
    assert store.expired_ids(10.0, limit=1) == ["failed"]  # the sweep takes them a batch at a time


def test_pending_interrupts_and_live_turns_are_read_from_the_rows(durable: Backend) -> None:
    """What the inbox and a restart read without loading each session: the unanswered
    interrupts of interrupted sessions, and the live turns with whether they are timed."""
    store = durable.open()
    first = replace(PENDING, created_at=10.0)
    later = replace(PENDING, seq=7, ref="int-later", created_at=15.0)
    durable.save(store, session("asks", touched=2.0, turn=live_turn()), [first, ANSWERED, later])
    timed = replace(PENDING, ref="int-timed", created_at=12.0, expires_at=70.0)
    durable.save(store, session("expires", touched=3.0, turn=live_turn()), [timed])
    durable.save(store, session("runs", touched=1.0, status="running", turn=replace(live_turn(), deadline=None)), [STARTED])
    durable.save(store, session("idle", touched=4.0))
    assert [(sid, entry.ref) for sid, entry in store.pending_interrupts()] == [
        ("asks", "int-1"), ("expires", "int-timed"), ("asks", "int-later")]
    assert store.pending_interrupts()[2] == ("asks", later)
    assert store.pending_counts() == (2, 3)  # ANSWERED is not pending
    live = {turn.session_id: (turn.status, turn.timed) for turn in store.live_turns()}
    # live_turn() has a deadline: every turn made from it is timed; "runs" has none
    assert live == {"asks": ("interrupted", True), "expires": ("interrupted", True), "runs": ("running", False)}
    durable.save(store, session("asks", touched=5.0, turn=replace(live_turn(), deadline=None)))
    assert {t.session_id: t.timed for t in store.live_turns()}["asks"] is False
    durable.save(store, session("expires", touched=6.0, turn=replace(live_turn(), deadline=None)))
    assert {t.session_id: t.timed for t in store.live_turns()}["expires"] is True  # its interrupt expires


def test_a_title_its_senders_and_the_inbox_context_of_each_waiting_session_are_read_from_the_rows(durable: Backend) -> None:
    """What the inbox shows beside an interrupt: the session's title, the waiting turn (its
    message and sender) and its finished model records only; sessions not waiting are not
    read. A title round-trips, through a store opened afresh too."""
    store = durable.open()
    turn = replace(live_turn(), by="alice", started_at=1767225599.0)
    unfinished = replace(MODEL_CALL, seq=5, done=False, value=None)
    durable.save(store, session("asks", title="Invoices", turn=turn), [PENDING, MODEL_CALL, STARTED, unfinished])
    durable.save(store, session("runs", status="running", turn=live_turn()), [MODEL_CALL])
    durable.save(store, session("idle", title="Done already", senders={0: {"by": "alice", "at": 1.5}, 12: {"by": "bob", "at": 2.5}}))
    pending, contexts = store.inbox()
    assert pending == store.pending_interrupts() == [("asks", PENDING)]
    assert set(contexts) == {"asks"}
    assert contexts["asks"].title == "Invoices"
    assert (contexts["asks"].turn.message, contexts["asks"].turn.by, contexts["asks"].turn.started_at) == (MESSAGE, "alice", 1767225599.0)
    assert contexts["asks"].turn.journal == [MODEL_CALL]
    assert {s.session_id: s.title for s in store.summaries()} == {"asks": "Invoices", "runs": None, "idle": "Done already"}
    assert store.load_one("asks").title == "Invoices" and store.load_one("asks").turn.by == "alice"  # type: ignore[union-attr]
    reloaded = {r.session_id: r for r in durable.reload()}
    assert reloaded["idle"].title == "Done already" and reloaded["asks"].senders == {}
    assert reloaded["idle"].senders == {0: {"by": "alice", "at": 1.5}, 12: {"by": "bob", "at": 2.5}}


def test_the_inbox_of_some_sessions_is_the_whole_inbox_of_those_sessions(durable: Backend) -> None:
    """``inbox(session_ids)``: what a kept inbox reads again of the sessions that changed. It
    is the whole inbox's items and contexts of those sessions, in the same order; a session
    not waiting, unknown or not asked is not read."""
    store = durable.open()
    second = replace(PENDING, seq=2, ref="int-2", created_at=(PENDING.created_at or 0.0) + 1.0)
    durable.save(store, session("asks", title="Invoices", turn=live_turn()), [PENDING, MODEL_CALL])
    durable.save(store, session("twice", turn=live_turn()), [second, replace(PENDING, ref="int-3")])
    durable.save(store, session("other", turn=live_turn()), [replace(PENDING, ref="int-4")])
    durable.save(store, session("runs", status="running", turn=live_turn()), [MODEL_CALL])
    pending, contexts = store.inbox()
    for asked in ({"asks", "twice"}, {"twice", "runs", "nobody"}, {"other"}, set()):
        some, theirs = store.inbox(asked)
        assert some == [(sid, entry) for sid, entry in pending if sid in asked]
        assert theirs == {sid: context for sid, context in contexts.items() if sid in asked}
    assert store.inbox(["asks"])[1]["asks"].turn.journal == [MODEL_CALL]  # type: ignore[union-attr]


def test_the_senders_are_written_with_the_history_and_kept_by_a_save_without_it(durable: Backend) -> None:
    """The senders change only when a turn ends with its history: a save without ``state``
    (an interrupt, a resume) leaves the stored ones as they are, whatever its record says; a
    save with ``state`` writes them."""
    store = durable.open()
    alice = {0: {"by": "alice", "at": 1.5}}
    durable.save(store, session("s1", senders=alice))
    durable.save(store, session("s1", turn=live_turn(), state=None, senders={}), [PENDING])
    [loaded] = durable.reload()
    assert loaded.senders == alice and loaded.turn is not None
    store = durable.open()  # reload() closed a SQLite store (one server per file)
    both = {**alice, 2: {"by": "bob", "at": 2.5}}
    durable.save(store, session("s1", state=[MESSAGE, REPLY, MESSAGE, REPLY], senders=both, kept=2))
    [loaded] = durable.reload()
    assert loaded.senders == both and len(loaded.state) == 4


def test_the_store_takes_what_the_memory_store_does(durable: Backend) -> None:
    store = durable.open()
    durable.save(store, session(state=[{"role": "tool", "content": "x", "score": math.nan}], response={"inf": math.inf}))
    [loaded] = durable.reload()
    assert math.isnan(loaded.state[0]["score"]) and loaded.response == {"inf": math.inf}


def test_a_closed_store_refuses_reads_and_writes(durable: Backend) -> None:
    store = durable.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        store.save(session())
    with pytest.raises(StoreError, match="is closed"):
        list(store.load())


@pytest.mark.parametrize(
    ("new", "kept"),
    [
        ([*HISTORY, MESSAGE, REPLY], 100),  # appended
        ([*HISTORY[:40], {"role": "user", "content": "edited"}, *HISTORY[41:]], 40),  # an edit in the middle
        ([*HISTORY[:20], MESSAGE, *HISTORY[21:]], 20),
        (HISTORY[:10], 10),  # shorter: the rest is removed
        (HISTORY[:10], 0),
        (HISTORY[:5], 5),
        ([REPLY], 0),  # replaced
        ([], 0),
        (HISTORY, 100),  # unchanged
        ([MESSAGE], 99),  # a kept past the new history: written whole
    ],
)
def test_the_stored_history_is_the_new_one_whatever_was_kept(durable: Backend, new: list[dict], kept: int) -> None:
    store = durable.open()
    assert durable.history_rows is not None
    durable.save(store, session(state=HISTORY))
    assert durable.history_rows("s1") == list(range(100))
    changed = session(state=new, kept=kept)
    durable.save(store, changed)
    assert durable.history_rows("s1") == list(range(len(new)))
    if isinstance(store, SharedStore):  # another instance reads it at the version written
        loaded = durable.open().load_one("s1")  # type: ignore[attr-defined]
        assert loaded is not None and loaded.state == new and loaded.version == changed.version
    assert [r.state for r in durable.reload()] == [new]


@pytest.mark.parametrize("kept", [-1, 101, 10**6])
def test_a_kept_past_the_new_history_writes_it_whole(durable: Backend, kept: int) -> None:
    store = durable.open()
    durable.save(store, session(state=HISTORY))
    durable.save(store, session(state=HISTORY[:50], kept=kept))
    assert [r.state for r in durable.reload()] == [HISTORY[:50]]


def test_a_saved_history_without_state_is_left_as_it_is_and_delete_removes_it(durable: Backend) -> None:
    store = durable.open()
    assert durable.history_rows is not None
    durable.save(store, session(state=HISTORY))
    durable.save(store, session(state=None, status="running"))
    durable.save(store, session("s2", state=[MESSAGE]))
    assert len(durable.history_rows("s1")) == 100
    durable.delete(store, "s1")
    assert durable.history_rows("s1") == [] and len(durable.history_rows("s2")) == 1
    assert [(r.session_id, r.state) for r in durable.reload()] == [("s2", [MESSAGE])]


# -- shared stores: several instances on one database ------------------------------------------


def test_a_session_round_trips_exactly_with_odd_text(stores: list[Any]) -> None:
    a, b = stores
    saved = record(turn=TurnRecord(turn_id=1, message=MESSAGE), owner=a.instance_id)
    a.save(saved, [PENDING])
    assert saved.version > 0
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.state == [MESSAGE] and loaded.turn is not None
    assert loaded.turn.message == MESSAGE and loaded.turn.journal == [PENDING]
    assert (loaded.version, loaded.owner) == (saved.version, a.instance_id)
    assert b.version_of("s1") == saved.version and b.version_of("nope") is None
    assert [r.session_id for r in b.load()] == ["s1"] and b.load_one("nope") is None


def test_a_write_based_on_an_old_version_is_refused_and_changes_nothing(stores: list[Any]) -> None:
    a, b = stores
    created = record()
    a.save(created)
    with pytest.raises(StaleSession):
        b.save(record())  # a second create of the same id
    v = created.version
    first = record(version=v, status="running", state=None)
    a.save(first)
    with pytest.raises(StaleSession):
        b.save(record(version=v, status="error", state=None, error="late"))  # lost the race
    loaded = b.load_one("s1")
    assert loaded is not None and (loaded.status, loaded.error, loaded.version) == ("running", None, v + 1)
    with pytest.raises(StaleSession):
        b.delete("s1", version=v)
    b.delete("s1", version=v + 1)
    assert a.load_one("s1") is None
    again = record()
    b.save(again)  # the same id once more: its versions never repeat the first one's
    assert again.version > v + 1


def test_journal_records_are_written_only_by_the_turns_owner(stores: list[Any]) -> None:
    a, b = stores
    a.save(record(turn=TurnRecord(turn_id=1, message=MESSAGE), owner=a.instance_id))
    done = PENDING.finished(pack(("ok", {"approved": True})))
    with pytest.raises(StaleSession):
        b.save_entries("s1", 1, [done])
    a.save_entries("s1", 1, [done])
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.turn is not None and unpack(loaded.turn.journal[0].value) == {"approved": True}


def test_event_seqs_follow_commit_order_across_instances(stores: list[Any]) -> None:
    """Eight threads on two stores write 50 events each: every seq is used once, in order,
    and a reader that pulls after each write never sees a seq below one it has seen."""
    a, b = stores
    versions = {}
    for n in range(8):
        created = record(f"s{n}")
        a.save(created)
        versions[f"s{n}"] = created.version

    def write(store: Any, session_id: str) -> None:
        for i in range(50):
            saved = record(session_id, version=versions[session_id], state=None)
            store.save(saved, events=[Event(session_id, "status", {"i": i}, at=0.0)])
            versions[session_id] = saved.version

    threads = [threading.Thread(target=write, args=(stores[n % 2], f"s{n}")) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    a.pull_events()
    seqs = [e.seq for e in a.events_after(0, limit=1000)]
    assert seqs == list(range(1, 401))
    assert [e.data["i"] for e in a.events_after(0, "s3", limit=1000)] == list(range(50))
    assert a.event_bounds() == (1, 400)


def test_what_changed_since_a_seq_is_read_from_the_store_not_from_what_an_instance_heard(pg_url: str, stores: list[Any]) -> None:
    """``changed_since``: the newest seq and the sessions with events after a seq, whichever
    instance wrote them, read at once (the inbox of another instance must not wait for its
    listener); None when it cannot tell: a negative seq, a seq not reached, events pruned."""
    from motus.serve.store.postgres import PostgresStore

    a, b = stores
    newest, unknown = a.changed_since(-1)
    assert unknown is None
    assert a.changed_since(newest) == (newest, set())
    made = {sid: record(sid) for sid in ("s1", "s2", "s3")}
    for created in made.values():
        a.save(created)
    b.save(record("s2", version=made["s2"].version, state=None), events=[Event("s2", "status", {}, at=0.0)])
    b.delete("s3", events=[Event("s3", "deleted", {}, at=0.0)])
    assert a.changed_since(newest) == (newest + 2, {"s2", "s3"})
    assert a.changed_since(newest + 1) == (newest + 2, {"s3"})
    assert a.changed_since(newest + 3) == (newest + 2, None)  # not reached yet
    small = PostgresStore(pg_url, events_kept=1)
    small.open()
    try:
        version = made["s1"].version
        for i in range(1000):  # a prune runs once a thousand seqs
            saved = record("s1", version=version, state=None)
            small.save(saved, events=[Event("s1", "status", {"i": i}, at=0.0)])
            version = saved.version
        last, _ = small.changed_since(-1)
        assert small.changed_since(newest) == (last, None)  # pruned: read the inbox whole
        assert small.changed_since(last - 1) == (last, {"s1"})
    finally:
        small.close()


def test_a_lapsed_instances_turns_are_claimed_by_exactly_one_other(pg_url: str, stores: list[Any]) -> None:
    import psycopg

    from motus.serve.store.postgres import PostgresStore

    a, b = stores
    gone = PostgresStore(pg_url, lease_seconds=0.2)
    gone.open()
    for n in range(20):
        gone.save(record(f"s{n}", turn=TurnRecord(turn_id=1, message=MESSAGE), owner=gone.instance_id))
    gone._pool.close()  # dies without giving its lease up  # noqa: SLF001
    with psycopg.connect(pg_url, autocommit=True) as conn:  # its lease lapses
        conn.execute("UPDATE motus_leases SET expires = now() - interval '1 second' WHERE instance_id = %s", (gone.instance_id,))
    for live in (a, b):  # the live ones hold their leases for the whole test, however slow the machine
        live.lease_seconds = 15.0
        live.renew_lease()
    claimed: dict[str, list[str]] = {a.instance_id: [], b.instance_id: []}

    def claim(store: Any) -> None:
        for _ in range(5):
            claimed[store.instance_id].extend(store.claim_orphans(limit=3))

    threads = [threading.Thread(target=claim, args=(store,)) for store in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = claimed[a.instance_id] + claimed[b.instance_id]
    assert sorted(everything) == sorted(f"s{n}" for n in range(20)) and len(set(everything)) == 20
    owners = {r.session_id: r.owner for r in a.load()}
    assert all(owners[sid] == owner for owner, ids in claimed.items() for sid in ids)
    assert a.claim_orphans() == [] and b.claim_orphans() == []  # live owners keep theirs
    assert a.owner_alive(b.instance_id) and not a.owner_alive(gone.instance_id)


def test_the_listener_reports_changes_made_by_another_instance(stores: list[Any]) -> None:
    a, b = stores
    seen: list[tuple[str, int]] = []
    arrived = threading.Condition()

    def changed(session_id: str, version: int, new_events: bool) -> None:
        with arrived:
            seen.append((session_id, version))
            arrived.notify_all()

    listening = threading.Event()
    b.listen(changed, listening.set)  # called once LISTEN is in place
    assert listening.wait(10)
    a.save(record(), events=[Event("s1", "status", {"status": "idle"}, at=0.0)])
    with arrived:
        assert arrived.wait_for(lambda: any(sid == "s1" and version > 0 for sid, version in seen), timeout=10), seen
    assert [e.kind for e in b.events_after(0)] == ["status"]  # pulled before the call


def test_a_change_handled_while_the_instance_closes_ends_the_listener_without_a_traceback(
    stores: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """An instance shutting down closes its store while the listener may be telling the
    server of a change; the server's handler then reads a closed store. That is the end of
    listening, not a failure to log with its traceback."""
    a, b = stores
    failed: list[BaseException] = []
    listening = threading.Event()

    def changed(session_id: str, version: int, new_events: bool) -> None:
        b.close()  # what the shutdown does on its own thread, meanwhile
        try:
            b.load_one(session_id)
        except StoreError as exc:
            failed.append(exc)
            raise

    b.listen(changed, listening.set)
    assert listening.wait(10)
    listener = b._listener
    a.save(record(), events=[Event("s1", "status", {"status": "idle"}, at=0.0)])
    listener.join(timeout=10)
    assert not listener.is_alive()
    assert failed and "is closed" in str(failed[0])
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_audit_records_round_trip_and_go_with_the_session(stores: list[Any]) -> None:
    a, b = stores
    first = AuditRecord("s1", "resolved", 1.0, "ops", {"value": {"approved": True}})
    a.save(record(), audit=[first])
    assert b.audit("s1") == [first]
    b.delete("s1")
    assert a.audit("s1") == []


def test_a_kept_the_rows_do_not_bear_out_is_a_stale_session_that_changed_nothing(stores: list[Any]) -> None:
    """The caller says 50 messages are stored; only 10 are. The transaction is refused whole
    (the caller reads the session again and writes it whole)."""
    a, b = stores
    created = record(state=HISTORY[:10])
    a.save(created)
    with pytest.raises(StaleSession):
        a.save(record(version=created.version, state=HISTORY, kept=50, status="error", error="x"))
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.state == HISTORY[:10] and (loaded.version, loaded.status) == (created.version, "idle")
    again = record(version=created.version, state=HISTORY, kept=0)
    a.save(again)
    assert b.load_one("s1").state == HISTORY


def test_a_deleted_session_leaves_no_rows_and_its_id_starts_afresh(pg_url: str, stores: list[Any]) -> None:
    import psycopg

    a, b = stores
    created = record(state=HISTORY)
    a.save(created)
    b.delete("s1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM motus_messages WHERE session_id = 's1'").fetchone()[0] == 0
    a.save(record(state=[MESSAGE]))
    assert b.load_one("s1").state == [MESSAGE]


def test_an_instance_starting_on_an_up_to_date_database_takes_no_table_lock(pg_url: str) -> None:
    """Adding version 4's columns is done only where they are missing: an ``ALTER TABLE``
    takes the sessions table's strongest lock, which would wait behind any open transaction
    that read it (and hold every other instance's reads behind itself) at every start."""
    import threading

    import psycopg

    from motus.serve.store.postgres import PostgresStore

    first = PostgresStore(pg_url)
    first.open()  # an up-to-date database
    opened: list[BaseException | None] = []
    try:
        with psycopg.connect(pg_url) as reader:  # a transaction that read the sessions, still open
            reader.execute("SELECT count(*) FROM motus_sessions").fetchone()
            second = PostgresStore(pg_url)

            def start() -> None:
                try:
                    second.open()
                    opened.append(None)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    opened.append(exc)

            thread = threading.Thread(target=start)
            thread.start()
            thread.join(20)
            assert not thread.is_alive() and opened == [None], f"the start waited on the open transaction: {opened}"
            second.close()
    finally:
        first.close()
