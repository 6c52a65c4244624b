"""The PostgreSQL store on its own (``motus.serve.store.postgres``), against a real
throwaway cluster: what only this backend does (its schema version, its migration, its
connection errors). What every shared store guarantees (versions, journal ownership, event
order across instances, leases and claims, the listener) is the store contract,
``tests/unit/serve/store/test_contract.py``. The server-level behaviour is in
``tests/integration/serve/instances/test_several_instances.py``."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from motus.serve.store import SCHEMA_VERSION, SessionRecord, StoreError, TurnRecord, store_from_url
from motus.serve.store.postgres import PostgresStore
from tests.conftest import free_port

MESSAGE = {"role": "user", "content": "hi \u0000 there \ud800 \u202e"}  # a NUL, a lone surrogate, a bidi override


def record(session_id: str = "s1", version: int = 0, turn: TurnRecord | None = None, **changes: object) -> SessionRecord:
    fields: dict[str, object] = {
        "session_id": session_id, "status": "interrupted" if turn else "idle", "state": [MESSAGE], "response": None,
        "error": None, "turn_id": turn.turn_id if turn else 0, "touched": 1.0, "turn": turn, "version": version,
    }
    fields.update(changes)
    return SessionRecord(**fields)  # type: ignore[arg-type]


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
