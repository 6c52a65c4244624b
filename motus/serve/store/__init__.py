"""Stores: where sessions and turn journals live. ``store_from_url`` picks the backend.

| URL | backend |
|---|---|
| ``memory`` | nothing survives the process |
| ``sqlite:///rel/path.db``, ``sqlite:////abs/path.db`` | one file, one server process |
| ``...?synchronous=normal`` | the same, without an fsync per commit: survives a killed process, not power loss |
| ``postgresql://user:password@host:port/db`` | several server instances on one database (``pip install 'motus[postgres]'``) |

The default is ``sqlite:///.motus/<module>.<attr>.sqlite3`` in the working directory, named
after the served agent, so two agents served from one folder never share sessions.
"""

from __future__ import annotations

import re

from motus.serve.store.base import EVENTS_KEPT, SCHEMA_VERSION, AuditRecord, DurableStore, Event, SessionRecord, SessionSummary, SharedStore, StaleSession, Store, StoreError, TurnRecord
from motus.serve.store.memory import MemoryStore

__all__ = ["EVENTS_KEPT", "AuditRecord", "DurableStore", "Event", "SessionSummary", "SCHEMA_VERSION", "SessionRecord", "SharedStore", "StaleSession", "Store", "StoreError", "TurnRecord", "MemoryStore", "default_store_url", "store_from_url"]


def default_store_url(agent_path: str | None) -> str:
    """``sqlite:///.motus/<module>.<attr>.sqlite3``; an agent given as an object (no import
    path) has no stable name, so it is served from memory."""
    if not agent_path:
        return "memory"
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", agent_path.replace(":", "."))
    return f"sqlite:///.motus/{name}.sqlite3"


def _without_password(url: str) -> str:
    """``url`` with the password of its user info, if any, masked: a misspelt
    ``postgresql://user:password@...`` must not put the password in a message or a log."""
    return re.sub(r"^([^/?#]*//[^/?#@:]*:)[^/?#@]*@", r"\1***@", url)


def store_from_url(url: str) -> Store:
    """The backend for ``url``; a malformed URL is a ``StoreError`` saying what is accepted."""
    url = url.strip()
    if url == "memory":
        return MemoryStore()
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path == ":memory:" or path.startswith(":memory:"):
            raise StoreError("Store URL sqlite:///:memory: would not survive the process; use --store memory for that")
        path, _, query = path.partition("?")
        synchronous = "full"
        if query:
            name, _, value = query.partition("=")
            if name != "synchronous" or value.lower() not in ("full", "normal"):
                raise StoreError(
                    f"Store URL {url!r}: the only option is ?synchronous=full (the default) or ?synchronous=normal"
                )
            synchronous = value.lower()
        if not path or path.endswith("/"):
            raise StoreError(f"Store URL {url!r} names no file; use sqlite:///relative/path.db or sqlite:////absolute/path.db")
        from motus.serve.store.sqlite import SqliteStore

        return SqliteStore(url, path, synchronous=synchronous)
    if url.startswith(("postgresql://", "postgres://")):
        from motus.serve.store.postgres import PostgresStore

        try:
            return PostgresStore(url)
        except ValueError as exc:  # urllib's reading of it: a port that is not a number
            raise StoreError(f"Store URL {_without_password(url)!r}: {exc}") from None
    raise StoreError(
        f"Unsupported store URL {_without_password(url)!r}: use memory, sqlite:///relative/path.db, sqlite:////absolute/path.db "
        "or postgresql://user@host:port/database"
    )
