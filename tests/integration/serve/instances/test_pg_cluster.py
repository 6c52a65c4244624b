"""The ``pg_cluster`` / ``pg_url`` fixtures: a real, throwaway PostgreSQL server."""

from __future__ import annotations

import psycopg

from tests.support.pg import Cluster


def test_pg_url_is_a_database_one_can_write_to(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL)")
        conn.execute("INSERT INTO items (name) VALUES (%s)", ("first",))
        conn.commit()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT name FROM items").fetchall() == [("first",)]


def test_each_database_is_separate(pg_cluster: Cluster, pg_url: str) -> None:
    other_url = pg_cluster.create_database()
    assert other_url != pg_url
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE only_here (x int)")
        conn.commit()
        first = conn.execute("SELECT current_database()").fetchone()
    with psycopg.connect(other_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() != first
        assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
