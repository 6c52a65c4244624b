"""The PostgreSQL store's schema: its tables, created and brought to ``SCHEMA_VERSION``.

``PostgresStore.open`` (``motus.serve.store.postgres``) calls :func:`create_schema` once, on
a connection of its own, before it serves anything; this module owns what the tables are
and how a database of an earlier version is moved forward.

Guarantees:

- One transaction: the tables, the move of the histories and the recorded version are
  committed together, or none of them is.
- One instance at a time: instances starting together wait on a transaction-level advisory
  lock (``SCHEMA_LOCK``) for the first to finish, however long that takes; the connection's
  lock and statement timeouts are lifted for this transaction only.
- A database written by a newer motus (a higher version in ``motus_meta``), or with an
  unreadable version, is refused with a ``StoreError`` and left unchanged.
- A database from version 2 has each session's history moved to ``motus_messages`` (a row
  a message) by the first instance of version 3 to start, one history in memory at a time:
  stop every instance of the earlier version first, since they read and write the history
  whole (in ``motus_sessions.state``).
- Version 4 adds ``motus_sessions.title`` and ``senders`` (NULL in older rows), each only
  where it is missing: an ``ALTER TABLE`` takes the table's strongest lock, so an instance
  that started on an up-to-date database would otherwise stop every other instance's
  reads and writes of the sessions while it starts. Stop the instances of version 3
  first: their writes would not keep the new columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from motus.serve.store.base import SCHEMA_VERSION, StoreError, load_json

#: The key of the advisory lock held while the schema is created or moved.
SCHEMA_LOCK = 7231

SCHEMA = """
CREATE TABLE IF NOT EXISTS motus_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS motus_sessions (
    session_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    response TEXT,
    error TEXT,
    turn_id BIGINT NOT NULL,
    touched DOUBLE PRECISION NOT NULL,
    turn TEXT,
    grants TEXT,
    version BIGINT NOT NULL,
    owner TEXT,
    title TEXT,
    senders TEXT
);
CREATE INDEX IF NOT EXISTS motus_sessions_by_owner ON motus_sessions (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS motus_journal (
    session_id TEXT NOT NULL,
    turn_id BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    label TEXT NOT NULL,
    done BOOLEAN NOT NULL,
    value BYTEA,
    ref TEXT,
    payload TEXT,
    answered_at DOUBLE PRECISION,
    answered_by TEXT,
    parent BIGINT,
    created_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION,
    default_value BYTEA,
    PRIMARY KEY (session_id, turn_id, seq)
);
CREATE TABLE IF NOT EXISTS motus_events (
    seq BIGINT PRIMARY KEY,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS motus_events_by_session ON motus_events (session_id, seq);
CREATE SEQUENCE IF NOT EXISTS motus_incarnations;
CREATE TABLE IF NOT EXISTS motus_event_counter (id INT PRIMARY KEY, seq BIGINT NOT NULL);
INSERT INTO motus_event_counter (id, seq) VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS motus_audit (
    id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    by TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS motus_audit_by_session ON motus_audit (session_id, id);
CREATE TABLE IF NOT EXISTS motus_messages (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS motus_leases (
    instance_id TEXT PRIMARY KEY,
    expires TIMESTAMPTZ NOT NULL,
    started TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""


#: Writes a session's ``motus_messages`` rows: ``(conn, session_id, history, kept)``, as a save does.
PutHistory = Callable[[Any, str, list[Any], int], None]


def create_schema(conn: Any, url: str, put_history: PutHistory) -> None:
    """Create the tables that are missing and bring the database to ``SCHEMA_VERSION``, in
    one transaction on ``conn`` (an autocommit connection). ``url`` names the store in
    messages (no password); ``put_history`` writes the histories moved from version 2."""
    with conn.transaction():
        # Instances starting together wait here for the first, however long it takes to
        # move a large version 2 database's histories (the connection's timeouts would
        # give up after 5 s of waiting for the lock, or 15 s of a statement).
        conn.execute("SET LOCAL lock_timeout = 0")
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
        exists = conn.execute("SELECT to_regclass('motus_meta') IS NOT NULL").fetchone()[0]
        version = None
        if exists:
            row = conn.execute("SELECT value FROM motus_meta WHERE key = 'schema_version'").fetchone()
            if row is not None:
                try:
                    version = int(row[0])
                except ValueError:
                    raise StoreError(f"Store {url} has an unreadable schema version {row[0]!r}") from None
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"Store {url} has schema version {version}, newer than this motus "
                        f"understands ({SCHEMA_VERSION}); upgrade motus. The database was not changed."
                    )
        conn.execute(SCHEMA)
        _add_missing_columns(conn)
        if version != SCHEMA_VERSION:
            _move_histories(conn, put_history)
        conn.execute(
            "INSERT INTO motus_meta (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (str(SCHEMA_VERSION),),
        )


#: Columns later versions added to tables an earlier one created: table -> ((name, type), ...).
ADDED_COLUMNS = {"motus_sessions": (("title", "TEXT"), ("senders", "TEXT"))}


def _add_missing_columns(conn: Any) -> None:
    """Add the columns of ``ADDED_COLUMNS`` a table lacks (in the caller's transaction)."""
    for table, columns in ADDED_COLUMNS.items():
        have = {name for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s",
            (table,),
        ).fetchall()}
        for name, kind in columns:
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def _move_histories(conn: Any, put_history: PutHistory) -> None:
    """Version 3: move each history kept whole in ``motus_sessions.state`` into
    ``motus_messages``, one history in memory at a time (in the caller's transaction)."""
    for (session_id,) in conn.execute("SELECT session_id FROM motus_sessions WHERE state <> ''").fetchall():
        (state,) = conn.execute("SELECT state FROM motus_sessions WHERE session_id = %s", (session_id,)).fetchone()
        put_history(conn, session_id, load_json(state), 0)
        conn.execute("UPDATE motus_sessions SET state = '' WHERE session_id = %s", (session_id,))
