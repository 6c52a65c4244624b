"""``--store postgresql://...``: several server instances on one PostgreSQL database.

Guarantees (the contract is "Several instances" in the durability spec):

- Every ``save`` is one transaction. A change to an existing session is written only if
  the row still has the version the writer read (``UPDATE ... WHERE version = %s``);
  otherwise nothing is written and ``StaleSession`` is raised, so two instances can never
  both act on one state (two resumes of one interrupt: one commits, the other reads the
  session again and finds the interrupt answered). A session being created that exists is
  ``StaleSession`` too.
- Journal records of a live turn (``save_entries``) are written only while this instance
  owns the turn: an instance that lost its turn (its lease lapsed, another took over) can
  never add to the journal the new owner replays.
- Events get their seqs from one counter row, locked until the transaction commits, so
  seqs are assigned in commit order: a reader that has seen seq N has seen every event
  below it (``Last-Event-ID`` misses nothing across instances).
- Every committed change sends ``NOTIFY motus, 'session_id version'`` in its transaction.
  One listening connection per instance (``listen``) turns them into calls, and pulls the
  new events into memory once for all the streams of the instance.
- Leases: each instance keeps a row in ``motus_leases`` whose expiry it pushes forward
  (``renew_lease``); ``claim_orphans`` takes the live turns of instances whose lease
  lapsed, with ``FOR UPDATE SKIP LOCKED``, so each is taken by exactly one instance.
  Times are the database's own clock, the one clock every instance shares.
- The schema has a version in ``motus_meta``; a database written by a newer motus is refused,
  and one from version 2 is moved to version 3 as the store opens
  (``motus.serve.store.postgres_schema``).
- A save with a history writes only the rows past ``SessionRecord.kept``, after checking in
  the same transaction that the rows before it are there (otherwise ``StaleSession``: the
  caller reads the session again and writes it whole).

Threads: a ``psycopg_pool.ConnectionPool`` serves every thread (one connection per call,
returned at once); the listener thread has its own connection. ``_recent`` and ``_pulled``
are guarded by ``_lock``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from motus.serve.protocol import JournalEntry
from motus.serve.store.base import (
    EVENTS_KEPT,
    JOURNAL_COLUMNS,
    JOURNAL_COLUMNS_OF_J,
    RECENT_EVENTS,
    AuditRecord,
    Event,
    InboxContext,
    LiveTurn,
    RecentEvents,
    SessionRecord,
    SessionSummary,
    SharedStore,
    StaleSession,
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
from motus.serve.store.postgres_schema import create_schema

log = logging.getLogger(__name__)

CHANNEL = "motus"
#: Versions a session row may use before the next row of the same id starts (2**32 writes).
_INCARNATION = 2**32
#: Events are pruned (down to ``EVENTS_KEPT``) once every this many.
_PRUNE_EVERY = 1000
#: How long a request waits for a connection of the pool before it is a 503.
POOL_TIMEOUT = 5.0
#: A listener that lost its connection tries again this often.
RECONNECT_SECONDS = 0.5
#: Every connection's settings. The server ends a statement that waits on a lock or runs
#: too long, and the transaction of a connection that went quiet inside one (an instance
#: frozen mid-write would otherwise hold the event counter's lock, and every instance's
#: writes with it): a 503 for one request instead of a cluster that hangs. TCP keepalives
#: notice a database host that vanished from the network.
CONNECTION_SETTINGS: dict[str, Any] = {
    "connect_timeout": 5,
    "options": "-c lock_timeout=5000 -c statement_timeout=15000 -c idle_in_transaction_session_timeout=10000",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "application_name": "motus",
}

_SESSION_COLUMNS = "session_id, status, state, response, error, turn_id, touched, turn, grants, version, owner, title, senders"


def where(url: str) -> str:
    """``host:port/database`` of a URL, for messages (never its password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"


class PostgresStore(SharedStore):
    kind = "postgresql"
    durable = True

    def __init__(self, url: str, lease_seconds: float = 15.0, events_kept: int = EVENTS_KEPT, pool_size: int = 10) -> None:
        self.dsn = url  # with its password: for connecting only
        self.url = f"postgresql://{where(url)}"  # for logs and messages
        self.lease_seconds = lease_seconds
        self.events_kept = events_kept
        self.pool_size = pool_size
        self.instance_id = uuid.uuid4().hex[:12]
        self._pool: Any = None
        self._lock = threading.Lock()
        self._recent = RecentEvents(min(events_kept, RECENT_EVENTS))
        self._pulled = 0  # the newest seq in _recent: every event up to it has been pulled
        self._listener: threading.Thread | None = None
        self._closing = threading.Event()

    # -- opening ---------------------------------------------------------------------

    def open(self) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise StoreError("PostgreSQL stores need psycopg 3: pip install 'motus[postgres]'") from None
        try:
            with psycopg.connect(self.dsn, autocommit=True, **CONNECTION_SETTINGS) as conn:
                create_schema(conn, self.url, self._put_history)
        except psycopg.Error as exc:
            raise StoreError(f"Cannot open store postgresql://{where(self.dsn)}: {_one_line(exc)}") from None
        self._closing.clear()
        self._pool = ConnectionPool(
            self.dsn, min_size=1, max_size=self.pool_size, timeout=POOL_TIMEOUT, open=True,
            # autocommit: a lone read is one round trip; every write opens its transaction.
            kwargs={**self._settings(), "autocommit": True}, name=f"motus-{self.instance_id}",
        )
        with self._lock:
            self._pulled = self._newest_seq()
        self.renew_lease()

    def close(self) -> None:
        self._closing.set()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                with pool.connection(timeout=2) as conn:
                    conn.execute("DELETE FROM motus_leases WHERE instance_id = %s", (self.instance_id,))
            except Exception as exc:  # the database is gone: the lease lapses by itself
                log.warning("could not give up this instance's lease: %s", _one_line(exc))
            pool.close()
        if self._listener is not None and self._listener is not threading.current_thread():
            self._listener.join(timeout=5)
            self._listener = None

    def _settings(self) -> dict[str, Any]:
        """Connection settings, named after this instance (see ``_GONE``)."""
        return {**CONNECTION_SETTINGS, "application_name": f"motus-{self.instance_id}"}

    def _conn(self) -> Any:
        if self._pool is None:
            raise StoreError(f"Store postgresql://{where(self.dsn)} is closed")
        return self._pool.connection()

    # -- reading ---------------------------------------------------------------------

    def load(self) -> Iterator[SessionRecord]:
        """Every session, read in one snapshot: a history committed between two of the reads
        would otherwise be paired with a row of another version, and served as current."""
        with self._conn() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            journals: dict[str, list[JournalEntry]] = {}
            for row in conn.execute(
                f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J}" +
                " FROM motus_journal j JOIN motus_sessions s ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
                "ORDER BY j.session_id, j.seq"
            ):
                journals.setdefault(row[0], []).append(stored_entry(row[1:]))
            histories: dict[str, list[str]] = {}
            for session_id, body in conn.execute("SELECT session_id, body FROM motus_messages ORDER BY session_id, seq"):
                histories.setdefault(session_id, []).append(body)
            rows = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM motus_sessions ORDER BY touched").fetchall()
        for row in rows:
            yield _session(row, journals.get(row[0], []), histories.get(row[0], []))

    def load_one(self, session_id: str) -> SessionRecord | None:
        with self._conn() as conn:
            with conn.transaction():  # one snapshot: the row and its journal agree
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM motus_sessions WHERE session_id = %s", (session_id,)).fetchone()
                if row is None:
                    return None
                entries = conn.execute(
                    f"SELECT {JOURNAL_COLUMNS} FROM motus_journal WHERE session_id = %s AND turn_id = %s ORDER BY seq",
                    (session_id, row[5]),
                ).fetchall()
                history = conn.execute(
                    "SELECT body FROM motus_messages WHERE session_id = %s ORDER BY seq", (session_id,)
                ).fetchall()
        return _session(row, [stored_entry(e) for e in entries], [body for (body,) in history])

    def summaries(self) -> list[SessionSummary]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.status, (SELECT count(*) FROM motus_messages m WHERE m.session_id = s.session_id), "
                "s.title FROM motus_sessions s ORDER BY s.touched"
            ).fetchall()
        return [SessionSummary(session_id, status, int(count), title) for session_id, status, count, title in rows]

    def count(self) -> int:
        with self._conn() as conn:
            return int(conn.execute("SELECT count(*) FROM motus_sessions").fetchone()[0])

    def pending_counts(self) -> tuple[int, int]:
        with self._conn() as conn:
            (sessions,) = conn.execute("SELECT count(*) FROM motus_sessions WHERE status = 'interrupted'").fetchone()
            (interrupts,) = conn.execute(
                "SELECT count(*) FROM motus_journal j JOIN motus_sessions s ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
                "WHERE s.status = 'interrupted' AND j.kind = 'interrupt' AND NOT j.done"
            ).fetchone()
        return int(sessions), int(interrupts)

    def pending_interrupts(self) -> list[tuple[str, JournalEntry]]:
        with self._conn() as conn:
            return _pending_interrupts(conn)

    def inbox(
        self, session_ids: Collection[str] | None = None
    ) -> tuple[list[tuple[str, JournalEntry]], dict[str, InboxContext]]:
        only, ids = ("", None) if session_ids is None else (" AND s.session_id = ANY(%s)", (sorted(session_ids),))
        with self._conn() as conn:
            with conn.transaction():  # one snapshot: the items, their sessions and replies agree
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pending = _pending_interrupts(conn, only, ids)
                rows = conn.execute(
                    f"SELECT session_id, turn_id, turn, title FROM motus_sessions s WHERE status = 'interrupted'{only}", ids
                ).fetchall()
                replies = conn.execute(
                    f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J}" +
                    " FROM motus_journal j JOIN motus_sessions s ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
                    f"WHERE s.status = 'interrupted' AND j.kind = 'model' AND j.done{only} ORDER BY j.session_id, j.seq", ids
                ).fetchall()
        return pending, inbox_contexts(rows, [(row[0], stored_entry(row[1:])) for row in replies])

    def live_turns(self) -> list[LiveTurn]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.status, s.turn, EXISTS (SELECT 1 FROM motus_journal j WHERE j.session_id = s.session_id "
                "AND j.turn_id = s.turn_id AND j.kind = 'interrupt' AND NOT j.done AND j.expires_at IS NOT NULL) "
                "FROM motus_sessions s WHERE s.turn IS NOT NULL ORDER BY s.touched"
            ).fetchall()
        return [LiveTurn(session_id, status, bool(expiring) or has_deadline(turn)) for session_id, status, turn, expiring in rows]

    def expired_ids(self, cutoff: float, limit: int | None = None) -> list[str]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT session_id FROM motus_sessions WHERE status IN ('idle', 'error') AND touched <= %s ORDER BY touched LIMIT %s",
                (cutoff, limit),  # LIMIT NULL: no limit
            ).fetchall()
        return [session_id for (session_id,) in rows]

    def version_of(self, session_id: str) -> int | None:
        with self._conn() as conn:
            row = conn.execute("SELECT version FROM motus_sessions WHERE session_id = %s", (session_id,)).fetchone()
        return None if row is None else int(row[0])

    # -- writing ---------------------------------------------------------------------

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
        new_version = record.version + 1
        if record.version == 0:
            write = (
                # A new row's versions start past any an earlier session of the same id used
                # (deleted, then created again): a copy of that one never looks current.
                f"INSERT INTO motus_sessions ({_SESSION_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                f"nextval('motus_incarnations') * {_INCARNATION} + 1, %s, %s, %s) ON CONFLICT (session_id) DO NOTHING RETURNING version",
                (record.session_id, record.status, "", dump_json(record.response), record.error,
                 record.turn_id, record.touched, turn_text, grants, record.owner, record.title, senders_json(record.senders)),
            )
        elif record.state is None:  # the senders change only with the history (SessionRecord.senders)
            write = (
                "UPDATE motus_sessions SET status = %s, response = %s, error = %s, turn_id = %s, touched = %s, "
                "turn = %s, grants = %s, version = %s, owner = %s, title = %s WHERE session_id = %s "
                "AND version = %s RETURNING version",
                (record.status, dump_json(record.response), record.error, record.turn_id, record.touched, turn_text,
                 grants, new_version, record.owner, record.title, record.session_id, record.version),
            )
        else:
            write = (
                "UPDATE motus_sessions SET status = %s, state = %s, response = %s, error = %s, turn_id = %s, "
                "touched = %s, turn = %s, grants = %s, version = %s, owner = %s, title = %s, senders = %s "
                "WHERE session_id = %s AND version = %s RETURNING version",
                (record.status, "", dump_json(record.response), record.error, record.turn_id,
                 record.touched, turn_text, grants, new_version, record.owner, record.title,
                 senders_json(record.senders), record.session_id, record.version),
            )
        with self._conn() as conn:
            try:
                # One round trip for the whole transaction (pipeline mode, COMMIT included).
                # The version check must stop the commit without a round trip of its own, so
                # a write that matched no row divides by zero, which aborts the transaction:
                # everything after it, events and notice included, is rolled back.
                with conn.pipeline(), conn.transaction():
                    written = conn.execute(f"WITH written AS ({write[0]}) SELECT 1 / count(*), max(version) FROM written", write[1])
                    if record.state is not None or record.version == 0:
                        self._put_history(conn, record.session_id, record.state or [], record.kept if record.version else 0)
                    if turn is None:
                        conn.execute("DELETE FROM motus_journal WHERE session_id = %s", (record.session_id,))
                    else:
                        # The previous turn's records went when it ended; any left by a turn
                        # that could not be saved at its end are never loaded (the row's turn_id
                        # differs) and go at this one's end.
                        self._put_entries(conn, record.session_id, turn.turn_id, entries)
                    if audit:
                        with conn.cursor() as cur:
                            cur.executemany(
                                "INSERT INTO motus_audit (session_id, kind, at, by, data) VALUES (%s, %s, %s, %s, %s)",
                                [(a.session_id, a.kind, a.at, a.by, dump_json(a.data)) for a in audit],
                            )
                    numbered = self._put_events(conn, events)
                    self._notify(conn, record.session_id)
            except _division_by_zero():
                raise StaleSession(record.session_id) from None
            new_version = int(written.fetchone()[1])
            last = self._numbered(conn, events, numbered)
        record.version = new_version
        self._remember(events)
        return last

    @staticmethod
    def _put_history(conn: Any, session_id: str, state: list[Any], kept: int) -> None:
        """Make the session's ``motus_messages`` rows ``state``, writing only those past
        ``kept``, in one statement of the caller's pipelined transaction (each statement
        costs the database a little CPU, and this is once a turn). It first counts the rows
        before ``kept``: if they are not all there, the count divides by zero, which aborts
        the transaction (``StaleSession``: the caller reads the session again and writes
        it whole). Rows past the new end are deleted; the others are written or replaced."""
        if not 0 < kept <= len(state):
            kept = 0
        conn.execute(
            "WITH gone AS (DELETE FROM motus_messages WHERE session_id = %(session)s AND seq >= %(end)s), "
            "put AS (INSERT INTO motus_messages (session_id, seq, body) "
            "SELECT %(session)s, %(kept)s + m.ord - 1, m.body FROM unnest(%(bodies)s::text[]) WITH ORDINALITY AS m(body, ord) "
            "ON CONFLICT (session_id, seq) DO UPDATE SET body = EXCLUDED.body) "
            "SELECT 1 / (count(*) = %(kept)s)::int FROM motus_messages WHERE session_id = %(session)s AND seq < %(kept)s",
            {"session": session_id, "kept": kept, "end": len(state), "bodies": [dump_json(m) for m in state[kept:]]},
        )

    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                "SELECT 1 FROM motus_sessions WHERE session_id = %s AND turn_id = %s AND owner = %s FOR SHARE",
                (session_id, turn_id, self.instance_id),
            ).fetchone()
            if row is None:
                raise StaleSession(session_id)  # no longer ours to write
            self._put_entries(conn, session_id, turn_id, entries)

    @staticmethod
    def _put_entries(conn: Any, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        if not entries:
            return
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO motus_journal (session_id, turn_id, {JOURNAL_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (session_id, turn_id, seq) DO UPDATE SET kind = EXCLUDED.kind, key = EXCLUDED.key, "
                "label = EXCLUDED.label, done = EXCLUDED.done, value = EXCLUDED.value, ref = EXCLUDED.ref, "
                "payload = EXCLUDED.payload, answered_at = EXCLUDED.answered_at, answered_by = EXCLUDED.answered_by, "
                "parent = EXCLUDED.parent, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, "
                "default_value = EXCLUDED.default_value",
                [
                    (session_id, turn_id, e.seq, e.kind, e.key, e.label, bool(e.done), e.value, e.ref, dump_json(e.payload),
                     e.answered_at, e.answered_by, e.parent, e.created_at, e.expires_at, e.default)
                    for e in entries
                ],
            )

    @staticmethod
    def _put_events(conn: Any, events: Sequence[Event]) -> Any:
        """Number ``events`` from the counter row (locked until commit: seqs in commit
        order) and insert them, in one statement; returns its cursor (read by ``_numbered``
        once the pipeline has run), or None without events."""
        if not events:
            return None
        data = [dump_json(e.data) for e in events]
        for event, text in zip(events, data):
            event.size = len(text or "")  # what RecentEvents counts
        return conn.execute(
            "WITH c AS (UPDATE motus_event_counter SET seq = seq + %(n)s WHERE id = 1 RETURNING seq) "
            "INSERT INTO motus_events (seq, session_id, kind, data, at) "
            "SELECT c.seq - %(n)s + e.ord, e.session_id, e.kind, e.data, e.at FROM c, "
            "unnest(%(sessions)s::text[], %(kinds)s::text[], %(data)s::text[], %(at)s::float8[]) "
            "WITH ORDINALITY AS e(session_id, kind, data, at, ord) RETURNING seq",
            {"n": len(events), "sessions": [e.session_id for e in events], "kinds": [e.kind for e in events],
             "data": data, "at": [e.at for e in events]},
        )

    def _numbered(self, conn: Any, events: Sequence[Event], cursor: Any) -> int:
        """Give ``events`` the seqs the database assigned; prune now and then. Returns the
        newest seq (0 without events)."""
        if cursor is None:
            return 0
        seqs = sorted(row[0] for row in cursor.fetchall())
        for event, seq in zip(events, seqs):
            event.seq = seq
        first, last = seqs[0], seqs[-1]
        if first // _PRUNE_EVERY != (last + 1) // _PRUNE_EVERY:
            conn.execute("DELETE FROM motus_events WHERE seq <= %s", (last - self.events_kept,))
        return last

    @staticmethod
    def _notify(conn: Any, session_id: str, version: int | None = None) -> None:
        """``NOTIFY motus, 'session_id version newest-event-seq'`` (sent at commit); the
        version is the row's as written (``version`` None), 0 for a delete, -1 for "changed";
        the seq lets a listener skip pulling events it has already (its own instance's)."""
        conn.execute(
            "SELECT pg_notify(%(channel)s, %(session)s || ' ' || "
            "coalesce(%(version)s::bigint, (SELECT version FROM motus_sessions WHERE session_id = %(session)s), 0) || ' ' || "
            "(SELECT seq FROM motus_event_counter WHERE id = 1))",
            {"channel": CHANNEL, "session": session_id, "version": version},
        )

    def _remember(self, events: Sequence[Event]) -> None:
        """Committed events of this instance go straight to memory when they are the next
        ones (no other instance's events in between); otherwise the listener pulls them."""
        if not events:
            return
        with self._lock:
            if events[0].seq == self._pulled + 1:
                self._recent.extend(events)
                self._pulled = events[-1].seq

    def delete(self, session_id: str, events: Sequence[Event] = (), version: int | None = None) -> int:
        with self._conn() as conn, conn.transaction():
            if version is None:
                cursor = conn.execute("DELETE FROM motus_sessions WHERE session_id = %s", (session_id,))
            else:
                cursor = conn.execute("DELETE FROM motus_sessions WHERE session_id = %s AND version = %s", (session_id, version))
            if cursor.rowcount != 1:
                raise StaleSession(session_id)
            conn.execute("DELETE FROM motus_journal WHERE session_id = %s", (session_id,))
            conn.execute("DELETE FROM motus_messages WHERE session_id = %s", (session_id,))
            conn.execute("DELETE FROM motus_audit WHERE session_id = %s", (session_id,))
            last = self._numbered(conn, events, self._put_events(conn, events))
            self._notify(conn, session_id, 0)
        self._remember(events)
        return last

    # -- events and audit --------------------------------------------------------------

    def _newest_seq(self) -> int:
        with self._conn() as conn:
            return int(conn.execute("SELECT seq FROM motus_event_counter WHERE id = 1").fetchone()[0])

    def pull_events(self) -> set[str]:
        """Fetch the events committed since the newest one here; returns their sessions."""
        with self._lock:
            after = self._pulled
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT seq, session_id, kind, data, at FROM motus_events WHERE seq > %s ORDER BY seq LIMIT 5000", (after,)
            ).fetchall()
        with self._lock:
            fresh = [_event(row) for row in rows if row[0] > self._pulled]
            if fresh:
                self._recent.extend(fresh)
                self._pulled = fresh[-1].seq
        return {event.session_id for event in fresh}

    def events_after(self, after: int, session_id: str | None = None, limit: int = 500) -> list[Event]:
        with self._lock:
            behind = after > self._pulled
        if behind:  # a client that saw newer events on another instance: catch up first
            self.pull_events()
        with self._lock:
            if self._recent.covers(after) or after >= self._pulled:
                return self._recent.after(after, session_id, limit)  # up to what the listener pulled
        with self._conn() as conn:
            if session_id is None:
                rows = conn.execute(
                    "SELECT seq, session_id, kind, data, at FROM motus_events WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
                    (after, self._pulled, limit),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT seq, session_id, kind, data, at FROM motus_events WHERE session_id = %s AND seq > %s AND seq <= %s "
                    "ORDER BY seq LIMIT %s",
                    (session_id, after, self._pulled, limit),
                ).fetchall()
        return [_event(row) for row in rows]

    def changed_since(self, seq: int) -> tuple[int, set[str] | None]:
        with self._conn() as conn:
            with conn.transaction():  # one snapshot: the newest seq and the sessions up to it
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                newest = int(conn.execute("SELECT seq FROM motus_event_counter WHERE id = 1").fetchone()[0])
                if seq < 0 or seq > newest:
                    return newest, None
                if seq == newest:
                    return newest, set()
                low = conn.execute("SELECT min(seq) FROM motus_events").fetchone()[0]
                if low is None or low > seq + 1:
                    return newest, None  # pruned: what changed since is not known
                rows = conn.execute(
                    "SELECT DISTINCT session_id FROM motus_events WHERE seq > %s AND seq <= %s", (seq, newest)
                ).fetchall()
        return newest, {row[0] for row in rows}

    def event_bounds(self) -> tuple[int, int]:
        self.pull_events()  # "newest" is the database's, not how far this instance's listener got
        with self._conn() as conn:
            low = conn.execute("SELECT min(seq) FROM motus_events").fetchone()[0]
        with self._lock:
            high = self._pulled
        if low is None or low > high:
            return (high + 1, high) if high else (0, 0)
        return int(low), high

    def audit(self, session_id: str) -> list[AuditRecord]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT kind, at, by, data FROM motus_audit WHERE session_id = %s ORDER BY id", (session_id,)
            ).fetchall()
        return [AuditRecord(session_id=session_id, kind=row[0], at=row[1], by=row[2], data=load_json(row[3])) for row in rows]

    # -- several instances -------------------------------------------------------------

    _RENEW = (
        "INSERT INTO motus_leases (instance_id, expires) VALUES (%s, now() + make_interval(secs => %s)) "
        "ON CONFLICT (instance_id) DO UPDATE SET expires = EXCLUDED.expires"
    )

    def renew_lease(self, fresh: bool = False) -> None:
        """``fresh``: on a connection of its own, not one from the pool. After an outage the
        pool reconnects on a backoff schedule with jitter (seconds apart after a short outage,
        tens of seconds after a long one), so instances whose pools came back at different
        times would otherwise renew that far apart, and the first would take the live turns
        of the others for a lapsed lease. A fresh connection renews as soon as the database
        answers, within the housekeeping period (a third of a lease)."""
        params = (self.instance_id, self.lease_seconds)
        if not fresh:
            with self._conn() as conn:
                conn.execute(self._RENEW, params)
            return
        import psycopg

        timeout = max(1, round(self.lease_seconds / 3))
        with psycopg.connect(self.dsn, autocommit=True, **{**self._settings(), "connect_timeout": timeout}) as conn:
            conn.execute(self._RENEW, params)

    #: An instance is gone when its lease lapsed, or sooner when it has no connection to the
    #: database left (each connection carries ``application_name = motus-<instance id>``;
    #: PostgreSQL drops those of a process that died at once) and it missed a renewal (so a
    #: database restart, which drops everyone's connections for a moment, takes nothing over).
    _GONE = (
        "(NOT EXISTS (SELECT 1 FROM motus_leases l WHERE l.instance_id = {owner} AND l.expires > now()) "
        "OR (NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = 'motus-' || {owner}) "
        "AND NOT EXISTS (SELECT 1 FROM motus_leases l WHERE l.instance_id = {owner} "
        "AND l.expires > now() + make_interval(secs => %(renewed_within)s))))"
    )

    def _renewed_within(self) -> float:
        """``expires - now()`` of a lease renewed within a third of a lease and a second."""
        return self.lease_seconds - (self.lease_seconds / 3 + 1.0)

    def owner_alive(self, owner: str) -> bool:
        """For a resume: a live lease and a connection. Without the renewal clause of
        ``_GONE``, a resume reaching one instance just after another died takes the turn
        over at once (at worst, right after a database restart, it takes a turn from an
        instance that has not reconnected yet: that one stops its worker, this one replays)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM motus_leases WHERE instance_id = %(owner)s AND expires > now()) "
                "AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'motus-' || %(owner)s)",
                {"owner": owner},
            ).fetchone()
        return bool(row and row[0])

    def claim_orphans(self, limit: int = 100) -> list[str]:
        with self._conn() as conn, conn.transaction():
            rows = conn.execute(
                "SELECT session_id FROM motus_sessions s WHERE s.turn IS NOT NULL AND (s.owner IS NULL OR "
                "(s.owner <> %(me)s AND " + self._GONE.format(owner="s.owner") + ")) "
                "ORDER BY touched LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
                {"me": self.instance_id, "limit": limit, "renewed_within": self._renewed_within()},
            ).fetchall()
            claimed = [row[0] for row in rows]
            if claimed:
                conn.execute(
                    "UPDATE motus_sessions SET owner = %s, version = version + 1 WHERE session_id = ANY(%s)",
                    (self.instance_id, claimed),
                )
                for session_id in claimed:
                    self._notify(conn, session_id, -1)
            conn.execute("DELETE FROM motus_leases WHERE expires < now() - interval '1 hour'")
        return claimed

    def listen(self, on_change: Callable[[str, int, bool], None], on_reconnect: Callable[[], None]) -> None:
        self._listener = threading.Thread(
            target=self._listen, args=(on_change, on_reconnect), name="motus-pg-listener", daemon=True
        )
        self._listener.start()

    def _listen(self, on_change: Callable[[str, int, bool], None], on_reconnect: Callable[[], None]) -> None:
        """One connection, ``LISTEN motus``: pull the new events, then tell the server which
        sessions changed. After a lost connection, everything is assumed changed."""
        import psycopg

        first = True
        while not self._closing.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, **self._settings()) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if not first:
                        log.info("the store's listener is connected again")
                    self.pull_events()
                    on_reconnect()  # what changed while nobody listened
                    first = False
                    while not self._closing.is_set():
                        changed: dict[str, int] = {}
                        newest = 0
                        for note in conn.notifies(timeout=0.5, stop_after=1):
                            newest = max(newest, _note(note.payload, changed))
                        if not changed:
                            continue
                        for note in conn.notifies(timeout=0, stop_after=500):  # the rest of a burst
                            newest = max(newest, _note(note.payload, changed))
                        with self._lock:
                            behind = newest > self._pulled
                        pulled = self.pull_events() if behind else set()
                        for session_id, version in changed.items():
                            try:
                                on_change(session_id, version, session_id in pulled)
                            except Exception:
                                if self._closing.is_set():
                                    return  # the instance is shutting down: its store is closed under it
                                log.exception("handling a change of session %s failed", session_id)
            except Exception as exc:
                if self._closing.is_set():
                    return
                log.warning("the store's listener lost its connection (%s); trying again", _one_line(exc))
                self._closing.wait(RECONNECT_SECONDS)


def _division_by_zero() -> type[BaseException]:
    from psycopg import errors

    return errors.DivisionByZero


def _pending_interrupts(conn: Any, only: str = "", ids: tuple[Any, ...] | None = None) -> list[tuple[str, JournalEntry]]:
    rows = conn.execute(
        f"SELECT j.session_id, {JOURNAL_COLUMNS_OF_J}" +
        " FROM motus_journal j JOIN motus_sessions s ON s.session_id = j.session_id AND s.turn_id = j.turn_id "
        f"WHERE s.status = 'interrupted' AND j.kind = 'interrupt' AND NOT j.done{only} ORDER BY coalesce(j.created_at, 0), j.ref",
        ids,
    ).fetchall()
    return [(row[0], stored_entry(row[1:])) for row in rows]


def _note(payload: str, changed: dict[str, int]) -> int:
    """Read ``'session_id version seq'`` into ``changed``; returns the seq."""
    session_id, version, seq = (payload.split(" ") + ["0", "0"])[:3]
    changed[session_id] = int(version or 0)
    return int(seq or 0)


def _session(row: Sequence[Any], journal: list[JournalEntry], history: list[str]) -> SessionRecord:
    """A ``motus_sessions`` row (``_SESSION_COLUMNS``; its ``state`` column is unused since
    version 3) with its journal and history."""
    return stored_session((row[0], row[1], *row[3:9], row[11], row[12]), journal, history, version=row[9], owner=row[10])


def _event(row: Sequence[Any]) -> Event:
    return Event(session_id=row[1], kind=row[2], data=load_json(row[3]), at=row[4], seq=row[0], size=len(row[3] or ""))


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
