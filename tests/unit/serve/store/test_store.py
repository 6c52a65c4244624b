"""The session stores (``motus.serve.store``): what only the SQLite and memory backends do
(one server per file, the files it refuses, schema migrations, pruning, how little a save
writes), and store URLs, with SQLite files under ``tmp_path``. What every store guarantees is
the store contract, ``tests/unit/serve/store/test_contract.py``."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from motus.serve.store import (
    SCHEMA_VERSION,
    Event,
    MemoryStore,
    SessionRecord,
    StoreError,
    default_store_url,
    store_from_url,
)
from motus.serve.store.base import RecentEvents
from motus.serve.store.sqlite import SqliteStore
from tests.conftest import wait_until
from tests.unit.serve.store.records import MESSAGE, MODEL_CALL, PENDING, REPLY, live_turn, session


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.sqlite3"


@pytest.fixture
def opened(db_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.open()
    yield store
    store.close()


def reopen(store: SqliteStore) -> list[SessionRecord]:
    """Close ``store`` and load everything through a fresh store on the same file."""
    store.close()
    fresh = SqliteStore(store.url, store.path)
    fresh.open()
    try:
        return list(fresh.load())
    finally:
        fresh.close()


# -- round trips -----------------------------------------------------------------------------


def test_the_memory_store_keeps_nothing() -> None:
    store = MemoryStore()
    store.check()
    store.save(session(turn=live_turn()), [PENDING])
    store.save_entries("s1", 1, [MODEL_CALL])
    store.delete("s1")
    assert list(store.load()) == [] and not store.durable and store.kind == "memory"


# -- one server per file ---------------------------------------------------------------------


def test_recent_events_keep_the_newest_within_their_count_and_their_bytes() -> None:
    """``RecentEvents``: past twice its count it keeps the newest ``keep``; past its bytes it
    drops the oldest down to half of them; an event larger than the whole budget is kept
    alone (the newest always stays, so a stream woken by it reads it without a query)."""
    held = RecentEvents(keep=5, max_bytes=10_000)
    held.extend([Event("a", "status", {"n": n}, at=0.0, seq=n) for n in range(1, 11)])
    assert held.bounds() == (1, 10)  # at twice the count: not yet
    held.extend([Event("a", "status", {"n": 11}, at=0.0, seq=11)])
    assert held.bounds() == (7, 11) and held.covers(6) and not held.covers(5)
    held.extend([Event("a", "message", {"content": "x" * 20_000}, at=0.0, seq=12)])
    assert held.bounds() == (12, 12) and held.bytes > 10_000
    held.extend([Event("a", "message", {"content": "y" * 3_000}, at=0.0, seq=n) for n in (13, 14, 15)])
    first, last = held.bounds()
    assert last == 15 and first > 12 and held.bytes <= 10_000
    assert held.bytes == sum(len(json.dumps(e.data)) + 256 for e in held.after(0, None, 100))


def test_a_second_open_of_the_same_file_is_refused_until_the_first_closes(db_path: Path) -> None:
    first = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    second = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    first.open()
    try:
        with pytest.raises(StoreError) as refused:
            second.open()
        message = str(refused.value)
        assert str(db_path) in message and f"pid {os.getpid()}" in message and "PostgreSQL" in message
        assert "\n" not in message
        first.save(session())  # the first is unaffected
    finally:
        first.close()
    second.open()
    try:
        assert [r.session_id for r in second.load()] == ["s1"]
    finally:
        second.close()


def test_check_opens_and_closes(db_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.check()
    store.check()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    conn.close()


def test_open_creates_the_folder(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "s.sqlite3"
    store = SqliteStore(f"sqlite:///{path}", str(path))
    store.open()
    store.close()
    assert path.is_file()


# -- files it must not use -------------------------------------------------------------------


def test_a_corrupt_file_is_refused_with_a_one_line_message(db_path: Path) -> None:
    garbage = random.Random(7).randbytes(8192)
    db_path.write_bytes(garbage)
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    for _ in range(2):  # the failed open released its claim on the file
        with pytest.raises(StoreError) as refused:
            store.open()
        message = str(refused.value)
        assert "\n" not in message and str(db_path) in message and "not a usable SQLite database" in message
    assert db_path.read_bytes() == garbage


def test_a_file_from_a_newer_motus_is_refused_and_not_modified(db_path: Path) -> None:
    made = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    made.open()
    made.save(session(turn=live_turn()), [PENDING])
    made.close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    before = db_path.read_bytes()

    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    with pytest.raises(StoreError) as refused:
        store.open()
    message = str(refused.value)
    assert "\n" not in message and "schema version 99" in message and f"({SCHEMA_VERSION})" in message
    assert db_path.read_bytes() == before
    with pytest.raises(StoreError, match="schema version 99"):  # and the claim was released
        store.open()


def test_a_newer_schema_with_other_tables_is_not_modified(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '99')")
        conn.execute("CREATE TABLE turns_v99 (id TEXT PRIMARY KEY)")
    conn.close()
    before = db_path.read_bytes()
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    with pytest.raises(StoreError, match="schema version 99.*The file was not changed"):
        store.open()
    assert db_path.read_bytes() == before


def test_an_unreadable_schema_version_is_refused(db_path: Path) -> None:
    SqliteStore(f"sqlite:///{db_path}", str(db_path)).check()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE meta SET value = 'v-two' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(StoreError, match="unreadable schema version 'v-two'") as refused:
        SqliteStore(f"sqlite:///{db_path}", str(db_path)).open()
    assert "\n" not in str(refused.value)


# -- URLs ------------------------------------------------------------------------------------


def test_store_from_url_accepts_memory_and_sqlite_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(store_from_url("memory"), MemoryStore)
    assert isinstance(store_from_url("  memory\n"), MemoryStore)

    relative = store_from_url("sqlite:///data/s.db")
    assert isinstance(relative, SqliteStore)
    assert (relative.url, relative.path) == ("sqlite:///data/s.db", str(tmp_path / "data" / "s.db"))

    absolute = store_from_url(f"sqlite:///{tmp_path}/abs.db")  # sqlite:////tmp/...
    assert isinstance(absolute, SqliteStore) and absolute.path == str(tmp_path / "abs.db")
    assert absolute.url.startswith("sqlite:////")
    absolute.open()  # and it is a working store
    absolute.close()


@pytest.mark.parametrize(
    "url",
    ["", "sqlite:///", "sqlite:///data/", "sqlite://s.db", "sqlite:s.db", "mysql://db/x", "Memory", "file.db",
     "sqlite:///:memory:", "sqlite:///s.db?mode=ro", "sqlite:///s.db?synchronous=off"],
)
def test_store_from_url_rejects_malformed_urls(url: str) -> None:
    with pytest.raises(StoreError) as refused:
        store_from_url(url)
    message = str(refused.value)
    assert "\n" not in message and ("sqlite:///" in message or "memory" in message)


def test_synchronous_normal_is_the_one_option(tmp_path: Path) -> None:
    assert store_from_url(f"sqlite:///{tmp_path}/a.db").synchronous == "FULL"  # type: ignore[attr-defined]
    relaxed = store_from_url(f"sqlite:///{tmp_path}/b.db?synchronous=normal")
    assert relaxed.synchronous == "NORMAL" and relaxed.path == str(tmp_path / "b.db")  # type: ignore[attr-defined]
    relaxed.open()
    try:
        assert relaxed._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # type: ignore[attr-defined, union-attr]
    finally:
        relaxed.close()


def test_default_store_url_is_named_after_the_agent() -> None:
    assert default_store_url("pkg.mod:agent") == "sqlite:///.motus/pkg.mod.agent.sqlite3"
    assert default_store_url("my agents/x y:bot") == "sqlite:///.motus/my_agents_x_y.bot.sqlite3"
    assert default_store_url(None) == "memory"
    assert default_store_url("") == "memory"


# -- version 2: events, audit, grants, interrupt deadlines ------------------------------------

_VERSION_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, state TEXT NOT NULL, response TEXT,
    error TEXT, turn_id INTEGER NOT NULL, touched REAL NOT NULL, turn TEXT);
CREATE TABLE journal (session_id TEXT NOT NULL, turn_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
    key TEXT NOT NULL, label TEXT NOT NULL, done INTEGER NOT NULL, value BLOB, ref TEXT, payload TEXT,
    answered_at REAL, answered_by TEXT, parent INTEGER, PRIMARY KEY (session_id, turn_id, seq));
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO sessions VALUES ('old', 'interrupted', '[]', NULL, NULL, 1, 1767225600.0,
    '{"message": {"role": "user", "content": "hi"}, "webhook": null, "deadline": null}');
INSERT INTO journal VALUES ('old', 1, 1, 'interrupt', '{}', 'confirm', 0, NULL, 'int-old', '{"type": "confirm"}',
    NULL, NULL, NULL);
"""


def test_a_version_1_file_is_upgraded_in_place_and_keeps_its_sessions(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(_VERSION_1)
    conn.close()
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.open()
    try:
        [record] = list(store.load())
        assert record.session_id == "old" and record.grants == {} and record.turn is not None
        [entry] = record.turn.journal
        assert (entry.ref, entry.created_at, entry.expires_at, entry.default) == ("int-old", None, None, None)
        assert record.turn.grants == ()
        store.save(session("old", grants={"delete_file": {"by": "ops", "at": 1.0}}),
                   events=[Event("old", "grant", {"tool_name": "delete_file"}, at=1.0)])
    finally:
        store.close()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    conn.close()
    assert reopen_path(db_path)[0].grants == {"delete_file": {"by": "ops", "at": 1.0}}


def reopen_path(db_path: Path) -> list[SessionRecord]:
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.open()
    try:
        return list(store.load())
    finally:
        store.close()


def test_old_events_are_pruned_and_bounds_say_so(db_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path), events_kept=10)
    store.open()
    try:
        for n in range(1000):
            store.save(session("a"), events=[Event("a", "status", {"n": n}, at=0.0)])
        oldest, newest = store.event_bounds()
        assert newest == 1000 and oldest == 991
        assert [e.seq for e in store.events_after(0)][:1] == [991]
    finally:
        store.close()


# -- version 3: the history, a row a message ----------------------------------------------------

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(100)]


def history_rows(store: SqliteStore, session_id: str = "s1") -> list[tuple[int, str]]:
    return store._conn.execute(  # type: ignore[union-attr]
        "SELECT seq, body FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)
    ).fetchall()


def changes_made(store: SqliteStore, save: SessionRecord) -> int:
    """How many rows ``save`` wrote (inserted, replaced or deleted)."""
    before = store._conn.total_changes  # type: ignore[union-attr]
    store.save(save)
    return store._conn.total_changes - before  # type: ignore[union-attr]


def test_a_save_that_kept_the_history_writes_only_what_was_added(opened: SqliteStore, db_path: Path) -> None:
    assert changes_made(opened, session(state=HISTORY)) >= 101
    longer = [*HISTORY, MESSAGE, REPLY]
    # The sessions row and the two new messages: not the hundred already stored.
    assert changes_made(opened, session(state=longer, kept=len(HISTORY))) == 3
    assert [r.state for r in reopen(opened)] == [longer]


def test_a_kept_the_rows_do_not_bear_out_writes_the_history_whole(opened: SqliteStore, caplog: pytest.LogCaptureFixture) -> None:
    """The caller says 80 messages are stored; only 10 are (say a save between was lost)."""
    opened.save(session(state=HISTORY[:10]))
    opened.save(session(state=HISTORY, kept=80))
    assert "writing the whole history" in caplog.text
    assert [r.state for r in reopen(opened)] == [HISTORY]


_VERSION_2_HISTORIES = [
    [],
    [MESSAGE, REPLY],
    [{"role": "user", "content": "h\u00e9llo \ud800 \x00 \u4e16"}, {"role": "assistant", "content": None, "name": "x"}],
]


def test_a_version_2_file_has_its_histories_moved_to_rows_once(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(_VERSION_1)
        conn.execute("ALTER TABLE sessions ADD COLUMN grants TEXT")
        conn.execute("UPDATE meta SET value = '2'")
        for i, state in enumerate(_VERSION_2_HISTORIES):
            conn.execute(
                "INSERT INTO sessions VALUES (?, 'idle', ?, NULL, NULL, 0, ?, NULL, NULL)", (f"v2-{i}", json.dumps(state), 1767225601.0 + i)
            )
    conn.close()
    loaded = {r.session_id: r.state for r in reopen_path(db_path)}
    assert loaded == {"old": [], **{f"v2-{i}": state for i, state in enumerate(_VERSION_2_HISTORIES)}}
    with closing(sqlite3.connect(db_path)) as conn:
        assert {row[0] for row in conn.execute("SELECT state FROM sessions")} == {""}
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 4
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    # Opened again, nothing moves twice.
    assert {r.session_id: r.state for r in reopen_path(db_path)} == loaded
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 4


# -- group commit: concurrent writes share a transaction ----------------------------------------


def queued_behind_the_lock(store: SqliteStore, writes: list, then: Callable[[], object] | None = None) -> list[threading.Thread]:
    """Run ``writes`` (callables) on threads while the test holds the store's connection
    lock: the first leads (takes its write and waits for the lock), the others queue up;
    ``then()`` runs once they have, still under the lock. Returns the joined threads."""
    committer = store._committer
    assert committer is not None
    threads = [threading.Thread(target=write) for write in writes]
    with store._lock:
        taken = committer.taken
        threads[0].start()
        wait_until(lambda: committer.taken == taken + 1, what="the first write's thread to lead")
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: len(committer._queue) == len(writes) - 1, what="the other writes to queue up")
        if then is not None:
            then()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    return threads


def test_writes_handed_over_while_a_commit_is_under_way_commit_together(opened: SqliteStore) -> None:
    """Twenty saves from twenty threads: the first commits alone (it was being committed when
    the others came), the nineteen others in one transaction, one fsync; each caller returns
    once its own write is on disk, and its events get seqs in the order the writes ran."""
    committer = opened._committer
    assert committer is not None
    before = committer.batches
    seqs: dict[str, int] = {}

    def save(n: int) -> None:
        seqs[f"s{n}"] = opened.save(session(f"s{n}"), events=[Event(f"s{n}", "status", {"n": n}, at=0.0)])

    queued_behind_the_lock(opened, [lambda n=n: save(n) for n in range(20)])
    assert committer.batches - before == 2
    assert sorted(seqs.values()) == list(range(1, 21))
    assert {r.session_id for r in reopen(opened)} == {f"s{n}" for n in range(20)}


def test_a_write_that_fails_in_a_group_is_rolled_back_alone(opened: SqliteStore) -> None:
    """A failing write shares a transaction with good ones: its caller gets its error, its
    rows and events are not kept, the others' are, and the seqs have no hole."""
    results: dict[str, object] = {}

    def save(name: str) -> None:
        results[name] = opened.save(session(name), events=[Event(name, "status", {}, at=0.0)])

    def bad() -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO sessions (session_id, status, state, turn_id, touched) VALUES ('bad', 'idle', '', 0, 0)")
            db.execute("INSERT INTO no_such_table VALUES (1)")

        try:
            opened._writer().submit(write)
        except sqlite3.OperationalError as exc:
            results["bad"] = exc

    queued_behind_the_lock(opened, [lambda: save("first"), lambda: save("a"), bad, lambda: save("b")])
    assert isinstance(results["bad"], sqlite3.OperationalError) and "no_such_table" in str(results["bad"])
    assert {r.session_id for r in reopen(opened)} == {"first", "a", "b"}
    assert sorted(results[name] for name in ("first", "a", "b")) == [1, 2, 3]  # type: ignore[type-var]


def test_close_commits_what_was_handed_over_and_then_refuses(db_path: Path) -> None:
    """``close`` while five writes wait on a commit: all five are committed before it
    returns, and a later write is refused."""
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.open()
    committer = store._committer
    assert committer is not None
    errors: list[BaseException] = []
    closing = threading.Thread(target=store.close)

    def save(name: str) -> None:
        try:
            store.save(session(name))
        except BaseException as exc:
            errors.append(exc)

    def close_meanwhile() -> None:
        closing.start()
        wait_until(lambda: committer._closing, what="close to begin")

    queued_behind_the_lock(store, [lambda n=n: save(f"s{n}") for n in range(5)], then=close_meanwhile)
    closing.join(10)
    assert not errors and not closing.is_alive() and not committer._leading
    with pytest.raises(StoreError, match="is closed"):
        store.save(session("late"))
    assert {r.session_id for r in reopen(store)} == {f"s{n}" for n in range(5)}


def test_a_writer_interrupted_while_it_waits_does_not_leave_the_store_without_a_leader(opened: SqliteStore) -> None:
    """Ctrl-C (a signal's exception) reaches the main thread while its save waits behind
    another thread's commit: that save raises, and the store goes on: the lead is not handed
    to the write whose thread is gone, later writes commit and ``close`` returns."""
    committer = opened._committer
    assert committer is not None
    release = threading.Event()
    leading = threading.Event()
    main = threading.main_thread()

    def slow(db: sqlite3.Connection) -> None:
        leading.set()
        release.wait(10)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def send() -> None:
        wait_until(lambda: len(committer._queue) == 1, what="the main thread's save to queue up")
        signal.pthread_kill(main.ident or 0, signal.SIGUSR1)

    leader = threading.Thread(target=lambda: committer.submit(slow))
    sender = threading.Thread(target=send)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        leader.start()
        assert leading.wait(10)
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            opened.save(session("interrupted"))
    finally:
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        sender.join(10)
        leader.join(10)
    try:
        wait_until(lambda: not committer._leading, timeout=5, what="the lead to be given up")
        opened.save(session("later"))
        assert "later" in {r.session_id for r in opened.load()}
    finally:
        if committer._leading and committer._queue:
            committer._lead()  # what the interrupted thread was handed: let the fixture close


def test_a_follow_up_interrupted_after_the_commit_does_not_fail_or_hide_the_others(opened: SqliteStore) -> None:
    """A ``KeyboardInterrupt`` (Ctrl-C landing on the leader) while one write's ``after``
    runs: the batch is committed, so the other writes' callers get their results, not the
    interrupt, and their events are published (a stream reading the recent events does not
    skip them)."""
    results: dict[str, object] = {}

    def save(name: str) -> None:
        try:
            results[name] = opened.save(session(name), events=[Event(name, "status", {}, at=0.0)])
        except BaseException as exc:
            results[name] = exc

    def interrupted() -> None:
        def after(_result: object) -> None:
            raise KeyboardInterrupt

        try:
            results["interrupted"] = opened._writer().submit(lambda db: None, after)
        except BaseException as exc:
            results["interrupted"] = exc

    queued_behind_the_lock(opened, [lambda: save("first"), interrupted, lambda: save("a"), lambda: save("b")])
    assert results["a"] == 2 and results["b"] == 3, results
    assert [e.session_id for e in opened.events_after(1)] == ["a", "b"]
    assert {r.session_id for r in reopen(opened)} == {"first", "a", "b"}


def test_a_second_close_meanwhile_does_not_close_the_connection_under_writes_handed_over(db_path: Path) -> None:
    """Two threads close the store while five writes wait on a commit (a shutdown and a
    signal handler, say): neither closes the connection before every write handed over is
    committed, so all five commit and are there after a reopen."""
    store = SqliteStore(f"sqlite:///{db_path}", str(db_path))
    store.open()
    committer = store._committer
    assert committer is not None
    errors: list[BaseException] = []
    closers = [threading.Thread(target=store.close) for _ in range(2)]

    def save(name: str) -> None:
        try:
            store.save(session(name))
        except BaseException as exc:
            errors.append(exc)

    def in_close(thread: threading.Thread) -> bool:
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None and frame.f_code is not SqliteStore.close.__code__:
            frame = frame.f_back
        return frame is not None

    def close_twice_meanwhile() -> None:
        closers[0].start()
        wait_until(lambda: committer._closing, what="the first close to begin")
        closers[1].start()
        wait_until(lambda: in_close(closers[1]), what="the second close to wait for the connection")

    queued_behind_the_lock(store, [lambda n=n: save(f"s{n}") for n in range(5)], then=close_twice_meanwhile)
    for closer in closers:
        closer.join(10)
        assert not closer.is_alive()
    assert not errors, errors
    assert {r.session_id for r in reopen(store)} == {f"s{n}" for n in range(5)}
