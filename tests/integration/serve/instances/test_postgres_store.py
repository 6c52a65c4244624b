"""The PostgreSQL store on its own (``motus.serve.store.postgres``), against a real
throwaway cluster: what several instances rely on, one guarantee per test. The server-level
behaviour is in ``tests/integration/serve/instances/test_several_instances.py``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import psycopg
import pytest

from motus.serve.journal import pack, unpack
from motus.serve.protocol import INTERRUPT, JournalEntry
from motus.serve.store import SCHEMA_VERSION, AuditRecord, Event, SessionRecord, StaleSession, StoreError, TurnRecord, store_from_url
from motus.serve.store.postgres import PostgresStore
from tests.conftest import free_port

PENDING = JournalEntry(seq=1, kind=INTERRUPT, key="k", label="tool_approval", ref="i-1", payload={"type": "tool_approval"})
MESSAGE = {"role": "user", "content": "hi \u0000 there \ud800 \u202e"}  # a NUL, a lone surrogate, a bidi override


def record(session_id: str = "s1", version: int = 0, turn: TurnRecord | None = None, **changes: object) -> SessionRecord:
    fields: dict[str, object] = {
        "session_id": session_id, "status": "interrupted" if turn else "idle", "state": [MESSAGE], "response": None,
        "error": None, "turn_id": turn.turn_id if turn else 0, "touched": 1.0, "turn": turn, "version": version,
    }
    fields.update(changes)
    return SessionRecord(**fields)  # type: ignore[arg-type]


def turn(turn_id: int = 1) -> TurnRecord:
    return TurnRecord(turn_id=turn_id, message=MESSAGE)


@pytest.fixture
def stores(pg_url: str) -> Iterator[list[PostgresStore]]:
    """Two stores on one database, as two instances have (a short lease)."""
    opened = []
    for _ in range(2):
        store = PostgresStore(pg_url, lease_seconds=1.0)
        store.open()
        opened.append(store)
    yield opened
    for store in opened:
        store.close()


def test_a_session_round_trips_exactly_with_odd_text(stores: list[PostgresStore]) -> None:
    a, b = stores
    saved = record(turn=turn(), owner=a.instance_id)
    a.save(saved, [PENDING])
    assert saved.version > 0
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.state == [MESSAGE] and loaded.turn is not None
    assert loaded.turn.message == MESSAGE and loaded.turn.journal == [PENDING]
    assert (loaded.version, loaded.owner) == (saved.version, a.instance_id)
    assert [r.session_id for r in b.load()] == ["s1"] and b.load_one("nope") is None


def test_a_write_based_on_an_old_version_is_refused_and_changes_nothing(stores: list[PostgresStore]) -> None:
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


def test_journal_records_are_written_only_by_the_turns_owner(stores: list[PostgresStore]) -> None:
    a, b = stores
    a.save(record(turn=turn(), owner=a.instance_id))
    done = PENDING.finished(pack(("ok", {"approved": True})))
    with pytest.raises(StaleSession):
        b.save_entries("s1", 1, [done])
    a.save_entries("s1", 1, [done])
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.turn is not None and unpack(loaded.turn.journal[0].value) == {"approved": True}


def test_event_seqs_follow_commit_order_across_instances(stores: list[PostgresStore]) -> None:
    """Eight threads on two stores write 50 events each: every seq is used once, in order,
    and a reader that pulls after each write never sees a seq below one it has seen."""
    a, b = stores
    versions = {}
    for n in range(8):
        created = record(f"s{n}")
        a.save(created)
        versions[f"s{n}"] = created.version

    def write(store: PostgresStore, session_id: str) -> None:
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


def test_a_lapsed_instances_turns_are_claimed_by_exactly_one_other(pg_url: str, stores: list[PostgresStore]) -> None:
    a, b = stores
    gone = PostgresStore(pg_url, lease_seconds=0.2)
    gone.open()
    for n in range(20):
        gone.save(record(f"s{n}", turn=turn(), owner=gone.instance_id))
    gone._pool.close()  # dies without giving its lease up  # noqa: SLF001
    with psycopg.connect(pg_url, autocommit=True) as conn:  # its lease lapses
        conn.execute("UPDATE motus_leases SET expires = now() - interval '1 second' WHERE instance_id = %s", (gone.instance_id,))
    claimed: dict[str, list[str]] = {a.instance_id: [], b.instance_id: []}

    def claim(store: PostgresStore) -> None:
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


def test_the_listener_reports_changes_made_by_another_instance(stores: list[PostgresStore]) -> None:
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


def test_audit_records_round_trip_and_go_with_the_session(stores: list[PostgresStore]) -> None:
    a, b = stores
    first = AuditRecord("s1", "resolved", 1.0, "ops", {"value": {"approved": True}})
    a.save(record(), audit=[first])
    assert b.audit("s1") == [first]
    b.delete("s1")
    assert a.audit("s1") == []


def test_a_database_from_a_newer_motus_is_refused(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.check()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE motus_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        PostgresStore(pg_url).check()


def test_an_unreachable_database_is_one_line_naming_where_without_the_password() -> None:
    port = free_port()
    store = store_from_url(f"postgresql://app:hunter2@127.0.0.1:{port}/motus")
    with pytest.raises(StoreError) as caught:
        store.check()
    message = str(caught.value)
    assert f"127.0.0.1:{port}/motus" in message and "hunter2" not in message and "\n" not in message
    assert "hunter2" not in store.url


# -- version 3: the history, a row a message ----------------------------------------------------

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} \u0000 \ud800"} for i in range(60)]


def history_rows(url: str, session_id: str = "s1") -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM motus_messages WHERE session_id = %s ORDER BY seq", (session_id,))]


@pytest.mark.parametrize(
    ("new", "kept"),
    [
        ([*HISTORY, MESSAGE], 60),  # appended
        ([*HISTORY[:20], MESSAGE, *HISTORY[21:]], 20),  # an edit in the middle
        (HISTORY[:5], 5),  # shorter
        ([MESSAGE], 0),  # replaced
        ([], 0),
        (HISTORY, 60),  # unchanged
        ([MESSAGE], 99),  # a kept past the new history: written whole
    ],
)
def test_a_history_is_stored_as_rows_and_a_save_writes_what_follows_kept(
    pg_url: str, stores: list[PostgresStore], new: list[dict], kept: int
) -> None:
    a, b = stores
    created = record(state=HISTORY)
    a.save(created)
    assert history_rows(pg_url) == list(range(60))
    changed = record(version=created.version, state=new, kept=kept)
    a.save(changed)
    assert history_rows(pg_url) == list(range(len(new)))
    loaded = b.load_one("s1")
    assert loaded is not None and loaded.state == new and loaded.version == changed.version
    assert [r.state for r in b.load()] == [new]


def test_a_kept_the_rows_do_not_bear_out_is_a_stale_session_that_changed_nothing(pg_url: str, stores: list[PostgresStore]) -> None:
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
    assert b.load_one("s1").state == HISTORY  # type: ignore[union-attr]


def test_a_deleted_session_leaves_no_rows_and_its_id_starts_afresh(pg_url: str, stores: list[PostgresStore]) -> None:
    a, b = stores
    created = record(state=HISTORY)
    a.save(created)
    b.delete("s1")
    assert history_rows(pg_url) == []
    a.save(record(state=[MESSAGE]))
    assert b.load_one("s1").state == [MESSAGE]  # type: ignore[union-attr]


def test_a_version_2_database_has_its_histories_moved_to_rows_by_the_first_start(pg_url: str) -> None:
    made = PostgresStore(pg_url)
    made.open()
    made.save(record("kept", state=[]))
    made.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what version 2 left: whole histories, no rows
        conn.execute("DROP TABLE motus_messages")
        conn.execute("UPDATE motus_meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute(
            "INSERT INTO motus_sessions (session_id, status, state, turn_id, touched, version) VALUES "
            "('v2-a', 'idle', %s, 0, 2.0, 1), ('v2-b', 'idle', %s, 0, 3.0, 1), ('v2-c', 'idle', '[]', 0, 4.0, 1)",
            (json.dumps(HISTORY), json.dumps([MESSAGE])),
        )
    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    threads = [threading.Thread(target=store.open) for store in stores]  # two instances start together
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        loaded = {r.session_id: r.state for r in stores[1].load()}
        assert loaded == {"kept": [], "v2-a": HISTORY, "v2-b": [MESSAGE], "v2-c": []}
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert {row[0] for row in conn.execute("SELECT state FROM motus_sessions")} == {""}
            assert conn.execute("SELECT count(*) FROM motus_messages").fetchone()[0] == 61
            assert conn.execute("SELECT value FROM motus_meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        for store in stores:
            store.close()
