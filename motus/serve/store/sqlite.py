"""``--store sqlite:///PATH``: sessions and turn journals in one SQLite file.

Guarantees:

- Every ``save`` is one transaction, committed (WAL, ``synchronous=FULL``) before it
  returns, so what a client was told survives ``kill -9`` and power loss. The fsync costs
  about 0.5-0.8 ms a commit here; ``?synchronous=normal`` drops it, and then a commit still
  survives the process being killed (the WAL is in the OS' cache), but the last ones can be
  lost if the machine itself loses power.
- One server process per file: the process holds an exclusive ``flock`` on the database
  file for as long as the store is open (its pid is written to ``PATH.pid``). A second server is refused
  with a message naming the file, the holder's pid, and PostgreSQL as the way to run several.
  The kernel drops the lock when the holder dies, however it dies.
- The schema carries a version in ``meta``; a file written by a newer motus is refused,
  never rewritten. A file that is not a SQLite database is refused with a clear message.
- A session's history is one row per message (``messages``), so a turn that appends to a
  long history writes only what it added (``SessionRecord.kept``), not the whole history
  again. A file from an earlier version is converted when it is opened, in one transaction.

- Writes commit in groups (``motus.serve.store.group_commit``): what concurrent requests
  hand the store while a commit is on its way to the disk goes into the next transaction
  together, one fsync for all of them, each write still in its own savepoint (one that
  fails is rolled back alone). A caller returns only once its write is committed.

Threads: one connection, shared, with every use under ``_lock`` (SQLite serialises writers
anyway). A write runs on the thread that leads its group commit (its own, when no other
commit is under way); reads run on the caller's thread. Statements never wait on anything
but the disk.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence

from motus.durable.records import JournalEntry
from motus.serve.store.group_commit import GroupCommitter
from motus.serve.store.base import (
    EVENTS_KEPT,
    JOURNAL_COLUMNS,
    JOURNAL_COLUMNS_OF_J,
    RECENT_EVENTS,
    RecentEvents,
    SCHEMA_VERSION,
    AuditRecord,
    DurableStore,
    Event,
    InboxContext,
    LiveTurn,
    SessionRecord,
    SessionSummary,
    StoreError,
    dump_json,
    has_deadline,
    inbox_contexts,
    load_json,
    senders_json,
    stored_entry,
    stored_session,
    turn_json,
)

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    response TEXT,
    error TEXT,
    turn_id INTEGER NOT NULL,
    touched REAL NOT NULL,
    turn TEXT,
    grants TEXT,
    title TEXT,
    senders TEXT
);
CREATE TABLE IF NOT EXISTS journal (
    session_id TEXT NOT NULL,
    turn_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    label TEXT NOT NULL,
    done INTEGER NOT NULL,
    value BLOB,
    ref TEXT,
    payload TEXT,
    answered_at REAL,
    answered_by TEXT,
    parent INTEGER,
    created_at REAL,
    expires_at REAL,
    default_value BLOB,
    PRIMARY KEY (session_id, turn_id, seq)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_session ON events (session_id, seq);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    by TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_session ON audit (session_id, id);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

# Version 3 keeps the history in ``messages``, a row a message; the ``sessions.state``
# column of versions 1 and 2 stays (a NOT NULL column cannot be dropped without rebuilding
# the table) and holds ''.

#: Columns versions 2 and 4 added to tables earlier versions already had (``ALTER TABLE ...
#: ADD COLUMN``).
_ADDED_COLUMNS = {
    "sessions": (("grants", "TEXT"), ("title", "TEXT"), ("senders", "TEXT")),
    "journal": (("created_at", "REAL"), ("expires_at", "REAL"), ("default_value", "BLOB")),
}

#: Events are pruned (down to ``EVENTS_KEPT``) once every this many inserts.
_PRUNE_EVERY = 1000
#: Events inserted by one statement (four values each; SQLite takes 32,766 at most).
_EVENTS_A_STATEMENT = 500
#: ``INSERT ... RETURNING`` (SQLite 3.35); older libraries insert an event a statement.
_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


class SqliteStore(DurableStore):
    kind = "sqlite"
    durable = True

    def __init__(self, url: str, path: str, synchronous: str = "full", events_kept: int = EVENTS_KEPT) -> None:
        self.url = url
        self.events_kept = events_kept
        #: The newest events, read by streams without a query (see ``RecentEvents``).
        self._recent = RecentEvents(min(events_kept, RECENT_EVENTS))
        self.path = os.path.abspath(path)
        self.synchronous = "NORMAL" if synchronous == "normal" else "FULL"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._committer: GroupCommitter | None = None  # writes, from open() to close()
        self._lock_fd: int | None = None

    # -- opening ---------------------------------------------------------------------

    def open(self) -> None:
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"Cannot create the folder of store {self.url}: {exc.strerror} ({directory})") from None
        self._claim()
        try:
            self._connect()
        except BaseException:
            self._release()
            raise
        assert self._conn is not None
        self._committer = GroupCommitter(self._conn, self._lock)

    def _claim(self) -> None:
        """flock the database file itself (SQLite's own locks are fcntl locks, which flock
        does not touch), so deleting a side file cannot let a second server in; the holder's
        pid is written beside it, in ``PATH.pid``, for the refusal message."""
        pid_path = self.path + ".pid"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"Cannot open store {self.url}: {exc.strerror} ({self.path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                with open(pid_path) as file:
                    holder = file.read(32).strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise StoreError(
                f"Store {self.path} is in use by another motus server (pid {holder}); a SQLite store "
                "serves one server process. Stop that server, choose another --store, or use "
                "PostgreSQL (--store postgresql://...) to run several instances on one store."
            ) from None
        self._lock_fd = fd
        try:
            with open(pid_path, "w") as file:
                file.write(str(os.getpid()))
        except OSError as exc:
            log.warning("could not write %s: %s", pid_path, exc)

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None

    def _connect(self) -> None:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
        except sqlite3.Error as exc:
            raise StoreError(f"Cannot open store {self.url}: {exc}") from None
        try:
            version = self._check_version(conn)  # before anything is written: a refused file stays as it was
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            self._migrate(conn)
            conn.executescript(_SCHEMA)
            if version != SCHEMA_VERSION:
                self._move_histories(conn)  # and records the version
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"Store {self.path} is not a usable SQLite database ({exc}); move it away or choose another --store") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _check_version(self, conn: sqlite3.Connection) -> int | None:
        """The file's schema version (None for a new file); refuses a newer one."""
        has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if has_meta else None
        if row is None:
            return None  # a new file (or one from before versions): created below
        try:
            version = int(row[0])
        except ValueError:
            raise StoreError(f"Store {self.path} has an unreadable schema version {row[0]!r}; it was not written by motus") from None
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"Store {self.path} has schema version {version}, newer than this motus understands "
                f"({SCHEMA_VERSION}); upgrade motus, or use another --store. The file was not changed."
            )
        return version

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Bring a file of an earlier version up to date in place: add the new columns (the
        new tables are created by the schema script). Nothing is removed, so a failure leaves
        a file its own version can still read."""
        for table, columns in _ADDED_COLUMNS.items():
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if not have:
                continue  # a new file: the schema script creates the table whole
            for name, kind in columns:
                if name not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    @staticmethod
    def _move_histories(conn: sqlite3.Connection) -> None:
        """Version 3: move each history kept whole in ``sessions.state`` (versions 1 and 2)
        into ``messages``, and set the version, in one transaction: a crash half-way leaves
        the file as it was, and the next open does it again. A file already at version 3 is
        not looked through again."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            # One history in memory at a time, however large the file.
            for (session_id,) in conn.execute("SELECT session_id FROM sessions WHERE state <> ''").fetchall():
                (state,) = conn.execute("SELECT state FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
                _put_messages(conn, session_id, 0, load_json(state))
                conn.execute("UPDATE sessions SET state = '' WHERE session_id = ?", (session_id,))
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def close(self) -> None:
        committer = self._committer
        if committer is not None:
            committer.close()  # what was handed to it is committed first (a second close waits too)
        with self._lock:
            self._committer = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._release()

    # -- reading and writing ---------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"Store {self.url} is closed")
        return self._conn

    def _writer(self) -> GroupCommitter:
        committer = self._committer
        if committer is None:
            raise StoreError(f"Store {self.url} is closed")
        return committer

    def load(self) -> Iterator[SessionRecord]:
        with self._lock:
            db = self._db()
            journals: dict[str, list[JournalEntry]] = {}
            for row in db.execute(
                f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J} FROM journal j JOIN sessions s "
                "ON s.session_id = j.session_id AND s.turn_id = j.turn_id ORDER BY j.session_id, j.seq"
            ):
                journals.setdefault(row[0], []).append(stored_entry(row[1:]))
            histories: dict[str, list[str]] = {}
            for session_id, body in db.execute("SELECT session_id, body FROM messages ORDER BY session_id, seq"):
                histories.setdefault(session_id, []).append(body)
            rows = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY touched").fetchall()
        for row in rows:
            yield stored_session(row, journals.get(row[0], []), histories.get(row[0], ()))

    def load_one(self, session_id: str) -> SessionRecord | None:
        with self._lock:  # one connection, its reads under the lock: the row and its journal agree
            db = self._db()
            row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            entries = db.execute(
                f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = ? AND turn_id = ? ORDER BY seq", (session_id, row[4])
            ).fetchall()
            history = db.execute("SELECT body FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
        return stored_session(row, [stored_entry(e) for e in entries], [body for (body,) in history])

    def summaries(self) -> list[SessionSummary]:
        with self._lock:
            rows = self._db().execute(
                "SELECT s.session_id, s.status, (SELECT count(*) FROM messages m WHERE m.session_id = s.session_id), "
                "s.title FROM sessions s ORDER BY s.touched"
            ).fetchall()
        return [SessionSummary(session_id, status, count, title) for session_id, status, count, title in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db().execute("SELECT count(*) FROM sessions").fetchone()[0])

    def pending_counts(self) -> tuple[int, int]:
        with self._lock:
            db = self._db()
            (sessions,) = db.execute("SELECT count(*) FROM sessions WHERE status = 'interrupted'").fetchone()
            (interrupts,) = db.execute(
                "SELECT count(*) FROM journal j JOIN sessions s ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
                "WHERE s.status = 'interrupted' AND j.kind = 'interrupt' AND j.done = 0"
            ).fetchone()
        return int(sessions), int(interrupts)

    def pending_interrupts(self) -> list[tuple[str, JournalEntry]]:
        with self._lock:
            return self._pending_interrupts()

    def _pending_interrupts(self, only: str = "", ids: tuple[str, ...] = ()) -> list[tuple[str, JournalEntry]]:
        rows = self._db().execute(
            f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J} FROM journal j JOIN sessions s "
            "ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
            f"WHERE s.status = 'interrupted' AND j.kind = 'interrupt' AND j.done = 0{only} "
            "ORDER BY coalesce(j.created_at, 0), j.ref", ids
        ).fetchall()
        return [(row[0], stored_entry(row[1:])) for row in rows]

    def inbox(
        self, session_ids: Collection[str] | None = None
    ) -> tuple[list[tuple[str, JournalEntry]], dict[str, InboxContext]]:
        # Some sessions: their ids as one JSON array parameter (no limit on how many).
        only, ids = ("", ()) if session_ids is None else (" AND s.session_id IN (SELECT value FROM json_each(?))",
                                                          (dump_json(sorted(session_ids)),))
        with self._lock:  # the one connection, under the lock: no commit between the reads
            pending = self._pending_interrupts(only, ids)
            db = self._db()
            rows = db.execute(
                f"SELECT session_id, turn_id, turn, title FROM sessions s WHERE status = 'interrupted'{only}", ids
            ).fetchall()
            replies = db.execute(
                f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J} FROM journal j JOIN sessions s "
                "ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
                f"WHERE s.status = 'interrupted' AND j.kind = 'model' AND j.done = 1{only} ORDER BY j.session_id, j.seq", ids
            ).fetchall()
        return pending, inbox_contexts(rows, [(row[0], stored_entry(row[1:])) for row in replies])

    def live_turns(self) -> list[LiveTurn]:
        with self._lock:
            rows = self._db().execute(
                "SELECT s.session_id, s.status, s.turn, EXISTS (SELECT 1 FROM journal j WHERE j.session_id = s.session_id "
                "AND j.turn_id = s.turn_id AND j.kind = 'interrupt' AND j.done = 0 AND j.expires_at IS NOT NULL) "
                "FROM sessions s WHERE s.turn IS NOT NULL ORDER BY s.touched"
            ).fetchall()
        return [LiveTurn(session_id, status, bool(expiring) or has_deadline(turn)) for session_id, status, turn, expiring in rows]

    def expired_ids(self, cutoff: float, limit: int | None = None) -> list[str]:
        with self._lock:
            rows = self._db().execute(
                "SELECT session_id FROM sessions WHERE status IN ('idle', 'error') AND touched <= ? ORDER BY touched LIMIT ?",
                (cutoff, -1 if limit is None else limit),  # LIMIT -1: no limit
            ).fetchall()
        return [session_id for (session_id,) in rows]

    def save(
        self,
        record: SessionRecord,
        entries: Sequence[JournalEntry] = (),
        events: Sequence[Event] = (),
        audit: Sequence[AuditRecord] = (),
    ) -> int:
        turn = record.turn
        turn_text = turn_json(turn)
        grants = dump_json(record.grants) if record.grants else None

        def write(db: sqlite3.Connection) -> int:
            if record.state is None:
                db.execute(  # the senders change only with the history (SessionRecord.senders)
                    "UPDATE sessions SET status = ?, response = ?, error = ?, turn_id = ?, touched = ?, turn = ?, "
                    "grants = ?, title = ? WHERE session_id = ?",
                    (record.status, dump_json(record.response), record.error, record.turn_id, record.touched,
                     turn_text, grants, record.title, record.session_id),
                )
            else:
                db.execute(
                    "INSERT OR REPLACE INTO sessions (session_id, status, state, response, error, turn_id, touched, "
                    "turn, grants, title, senders) VALUES (?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.session_id, record.status, dump_json(record.response), record.error,
                     record.turn_id, record.touched, turn_text, grants, record.title, senders_json(record.senders)),
                )
                self._put_history(db, record.session_id, record.state, record.kept)
            if turn is None:
                db.execute("DELETE FROM journal WHERE session_id = ?", (record.session_id,))
            else:
                db.execute("DELETE FROM journal WHERE session_id = ? AND turn_id <> ?", (record.session_id, turn.turn_id))
                if entries:
                    self._put_entries(db, record.session_id, turn.turn_id, entries)
            if audit:
                db.executemany(
                    "INSERT INTO audit (session_id, kind, at, by, data) VALUES (?, ?, ?, ?, ?)",
                    [(a.session_id, a.kind, a.at, a.by, dump_json(a.data)) for a in audit],
                )
            return self._put_events(db, events)

        return self._writer().submit(write, lambda _last: self._recent.extend(events))

    @staticmethod
    def _put_history(db: sqlite3.Connection, session_id: str, state: list, kept: int) -> None:
        """Make the session's ``messages`` rows ``state``, writing only those past ``kept``
        (the caller says the stored ones before it are unchanged). A ``kept`` the rows do
        not bear out (fewer stored) is not trusted: everything is written."""
        if not 0 < kept <= len(state):
            kept = 0
        elif db.execute("SELECT count(*) FROM messages WHERE session_id = ? AND seq < ?", (session_id, kept)).fetchone()[0] != kept:
            log.warning("session %s: %d messages were said to be stored, and are not; writing the whole history", session_id, kept)
            kept = 0
        db.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (session_id, kept))
        _put_messages(db, session_id, kept, state[kept:])

    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        self._writer().submit(lambda db: self._put_entries(db, session_id, turn_id, entries))

    @staticmethod
    def _put_entries(db: sqlite3.Connection, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO journal (session_id, turn_id, seq, kind, key, label, done, value, ref, payload, "
            "answered_at, answered_by, parent, created_at, expires_at, default_value) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (session_id, turn_id, e.seq, e.kind, e.key, e.label, int(e.done), e.value, e.ref, dump_json(e.payload),
                 e.answered_at, e.answered_by, e.parent, e.created_at, e.expires_at, e.default)
                for e in entries
            ],
        )

    def _put_events(self, db: sqlite3.Connection, events: Sequence[Event]) -> int:
        """Insert ``events`` (inside the caller's transaction), set their seqs, prune now and
        then; returns the newest seq (0 when there were none)."""
        # One statement for a transition's events (a status and its interrupt, say): each
        # statement is a round through SQLite's C code that gives up the GIL and waits for it
        # again, which under many request threads costs more than the insert.
        for first in range(0, len(events), _EVENTS_A_STATEMENT):
            chunk = events[first:first + _EVENTS_A_STATEMENT]
            values = []
            for event in chunk:
                data = dump_json(event.data)
                event.size = len(data or "")  # what RecentEvents counts
                values += (event.session_id, event.kind, data, event.at)
            if len(chunk) > 1 and _RETURNING:
                rows = db.execute(
                    "INSERT INTO events (session_id, kind, data, at) VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(chunk)) + " RETURNING seq",
                    values,
                ).fetchall()
                seqs = sorted(int(seq) for (seq,) in rows)  # (RETURNING's order is not promised; the seqs follow the rows')
            else:
                seqs = []
                for index in range(len(chunk)):
                    cursor = db.execute("INSERT INTO events (session_id, kind, data, at) VALUES (?, ?, ?, ?)", values[4 * index:4 * index + 4])
                    seqs.append(int(cursor.lastrowid or 0))
            for event, seq in zip(chunk, seqs):
                event.seq = seq
                if seq % _PRUNE_EVERY == 0:
                    db.execute("DELETE FROM events WHERE seq <= ?", (seq - self.events_kept,))
        return events[-1].seq if events else 0

    def delete(self, session_id: str, events: Sequence[Event] = ()) -> int:
        def write(db: sqlite3.Connection) -> int:
            db.execute("DELETE FROM journal WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM audit WHERE session_id = ?", (session_id,))
            return self._put_events(db, events)

        return self._writer().submit(write, lambda _last: self._recent.extend(events))

    def events_after(self, after: int, session_id: str | None = None, limit: int = 500) -> list[Event]:
        with self._lock:
            if self._recent.covers(after):
                return self._recent.after(after, session_id, limit)  # no query: the common case
            db = self._db()
            if session_id is None:
                rows = db.execute(
                    "SELECT seq, session_id, kind, data, at FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
                ).fetchall()
            else:
                rows = db.execute(
                    "SELECT seq, session_id, kind, data, at FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (session_id, after, limit),
                ).fetchall()
        return [Event(session_id=row[1], kind=row[2], data=load_json(row[3]), at=row[4], seq=row[0]) for row in rows]

    def event_bounds(self) -> tuple[int, int]:
        with self._lock:
            db = self._db()
            low, high = db.execute("SELECT min(seq), max(seq) FROM events").fetchone()
            if high is None:
                row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
                last = int(row[0]) if row else 0
                return (last + 1, last) if last else (0, 0)
        return int(low), int(high)

    def audit(self, session_id: str) -> list[AuditRecord]:
        with self._lock:
            rows = self._db().execute(
                "SELECT kind, at, by, data FROM audit WHERE session_id = ? ORDER BY id", (session_id,)
            ).fetchall()
        return [AuditRecord(session_id=session_id, kind=row[0], at=row[1], by=row[2], data=load_json(row[3])) for row in rows]


_SESSION_COLUMNS = "session_id, status, response, error, turn_id, touched, turn, grants, title, senders"
def _put_messages(db: sqlite3.Connection, session_id: str, first: int, messages: Sequence[object]) -> None:
    # A generator, not a list: each row's JSON is made as it is written, so a long history
    # is never held twice more (as row tuples and as JSON strings) while it is written.
    db.executemany(
        "INSERT OR REPLACE INTO messages (session_id, seq, body) VALUES (?, ?, ?)",
        ((session_id, first + i, dump_json(message)) for i, message in enumerate(messages)),
    )


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.execute("ROLLBACK")
