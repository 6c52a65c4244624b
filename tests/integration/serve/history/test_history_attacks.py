"""Attacks on "a worker sends back only what changed" (``protocol.Result.kept``) and on the
SQLite store's history as a row a message (schema 3).

The one property: the stored history (``GET /sessions/{id}/messages``, and after any
restart) is exactly the list the agent returned in the last turn that ended: never a mix,
never another session's messages, nothing lost across ``kill -9``.

Histories are compared as canonical JSON (``json.dumps(..., sort_keys=True)``), not with
``==``: Python's ``==`` says ``1 == 1.0 == True`` and ``0.0 == -0.0``, which JSON does not.
The agents are ``tests/agents/history_attack.py``; every expected history is worked out
here, from the JSON last read, independently of the server and of the agent's code.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from motus.serve.store import SCHEMA_VERSION
from tests.conftest import Server, free_port, launch, wait_until
from tests.integration.serve.durability.test_durability import kill_server

TRICKY = "tests.agents.history_attack:tricky"
HOSTILE = "tests.agents.history_attack:hostile"
PARKER = "tests.agents.history_attack:parker"
GATED = "tests.agents.history_attack:gated"

Message = dict[str, Any]


def canon(messages: list[Message]) -> list[str]:
    """One JSON text a message, types exact (``true`` is not ``1``), key order ignored."""
    return [json.dumps(m, sort_keys=True) for m in messages]


def history(server: Server, sid: str) -> list[Message]:
    response = server.get(f"/sessions/{sid}/messages")
    assert response.status_code == 200, response.text
    return response.json()


def turn(server: Server, sid: str, content: str, status: str = "idle") -> dict:
    server.send(sid, content)
    body = server.wait_for_status(sid, status)
    return body


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def done(content: str) -> Message:
    return {"role": "assistant", "content": f"done: {content}"}


def expected_after(before: list[Message], content: str) -> list[Message]:
    """What ``tests.agents.history_attack:tricky`` returns for ``content`` given ``before``
    (worked out on JSON, the way the agent's docstring says, not with its code)."""
    words = content.split(" ")
    command = words[0]
    state = copy.deepcopy(before)
    tail = [user(content), done(content)]
    if command == "reorder":
        return [*reversed(state), *tail]
    if command == "double":
        return [*state, *copy.deepcopy(state), *tail]
    if command == "toolargs":
        state[int(words[1])]["tool_calls"][0]["function"]["arguments"] = " ".join(words[2:])
    elif command == "nested":
        state[int(words[1])]["user_params"]["tags"].append(" ".join(words[2:]))
    elif command == "param":
        state[int(words[1])]["user_params"]["top"] = " ".join(words[2:])
    elif command == "twice":
        return [*state, user(content), user(content), done(content)]
    elif command == "shorter":
        state = state[: int(words[1])]
    elif command == "empty":
        return []
    elif command == "last":
        state[-1]["content"] = " ".join(words[1:])
        return state
    elif command == "many":
        state += [user(f"m{i}") for i in range(int(words[1]))]
    elif command == "weird":
        state.append(user("h\u00e9llo \ud800 \x00 \u4e16 \U0001f600"))
    elif command == "retype":
        params = state[int(words[1])]["user_params"]
        key, kind = words[2], words[3]
        params[key] = {"bool": bool, "float": float, "negzero": lambda v: -0.0, "int": int}[kind](params[key])
        return state
    elif command == "keyorder":
        message = state[int(words[1])]
        message["user_params"] = dict(reversed(list(message["user_params"].items())))
    return [*state, *tail]


PRELOAD: list[Message] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "look it up", "user_params": {"n": 1, "z": 0, "f": 0.0, "b": True, "tags": ["a"]}},
    {
        "role": "assistant",
        "content": "calling",
        "tool_calls": [{"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}],
    },
    {"role": "tool", "content": "42", "tool_call_id": "call-1", "name": "lookup"},
    {"role": "assistant", "content": "it is 42"},
]


def create(server: Server, state: list[Message]) -> str:
    response = server.post("/sessions", json={"state": state})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def sqlite_url(path: Path) -> str:
    assert path.is_absolute()
    return f"sqlite:///{path}"


# -- tricky agents: what they return is what is stored ----------------------------------------

# Each step's change is one the value comparison (``unchanged_prefix``) must see as a change.
SAFE_STEPS = [
    "append one",
    "toolargs 2 {\"q\":2}",
    "param 1 set",
    "reorder",
    "double",
    "twice",
    "last the last message, rewritten",
    "shorter 4",
    "weird",
    "many 300",
    "last rewritten again, same length",
    "empty",
    "append after empty",
    "append again",
]


def run(server: Server, sid: str, steps: list[str], start: list[Message]) -> list[Message]:
    expected = start
    for step in steps:
        body = turn(server, sid, step)
        assert body["response"]["content"] == f"done: {step}", body
        expected = expected_after(expected, step)
        assert canon(history(server, sid)) == canon(expected), step
    return expected


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_reordered_doubled_shortened_emptied_and_rewritten_histories_are_stored_as_returned(
    start_server: Callable[..., Server], tmp_path: Path, store: str
) -> None:
    url = "memory" if store == "memory" else sqlite_url(tmp_path / "s.db")
    server = start_server(TRICKY, "--workers", "1", "--store", url)
    sid = create(server, PRELOAD)
    assert canon(history(server, sid)) == canon(PRELOAD)
    expected = run(server, sid, SAFE_STEPS, PRELOAD)
    if store == "sqlite":
        assert server.stop() == 0
        again = start_server(TRICKY, "--workers", "1", "--store", url)
        assert canon(history(again, sid)) == canon(expected)


def test_ten_thousand_messages_then_a_short_state_leave_no_stale_rows(start_server: Callable[..., Server], tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    server = start_server(TRICKY, "--workers", "1", "--store", sqlite_url(path))
    sid = create(server, PRELOAD)
    expected = run(server, sid, ["many 10000", "append after many", "shorter 3", "append short again"], PRELOAD)
    assert server.stop() == 0
    with closing(sqlite3.connect(path)) as db:
        seqs = [row[0] for row in db.execute("SELECT seq FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
    assert seqs == list(range(len(expected)))
    again = start_server(TRICKY, "--workers", "1", "--store", sqlite_url(path))
    assert canon(history(again, sid)) == canon(expected)


def test_a_list_nested_in_user_params_edited_in_place_is_stored(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """The agent appends to a list inside a message's ``user_params``, in place. Pydantic
    keeps ``Any`` values by reference, so that list is also the job's own (``job.state``):
    the worker's value comparison (``unchanged_prefix``) then sees the message as unchanged,
    the server keeps its old copy, and the agent's edit is lost, live and across a restart."""
    url = sqlite_url(tmp_path / "s.db")
    server = start_server(TRICKY, "--workers", "1", "--store", url)
    sid = create(server, PRELOAD)
    turn(server, sid, "nested 1 added")
    expected = expected_after(PRELOAD, "nested 1 added")
    assert expected[1]["user_params"]["tags"] == ["a", "added"]
    assert canon(history(server, sid)) == canon(expected)
    assert server.stop() == 0
    again = start_server(TRICKY, "--workers", "1", "--store", url)
    assert canon(history(again, sid)) == canon(expected)


RETYPES = {
    "1 becomes true": "retype 1 n bool",
    "0 becomes false": "retype 1 z bool",
    "1 becomes 1.0": "retype 1 n float",
    "0.0 becomes -0.0": "retype 1 f negzero",
    "true becomes 1": "retype 1 b int",
}


def test_a_value_whose_json_type_changes_is_stored_with_its_new_type(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """``1 == 1.0 == True``, ``0 == False`` and ``0.0 == -0.0`` in Python, not in JSON: a
    turn that changes only such a value in ``user_params`` (and so returns a history of the
    same length) has the message counted as unchanged by ``unchanged_prefix``, and the
    stored history keeps the old value, live and across a restart."""
    url = sqlite_url(tmp_path / "s.db")
    server = start_server(TRICKY, "--workers", "1", "--store", url)
    expected = {}
    for name, step in RETYPES.items():
        sid = create(server, PRELOAD)
        turn(server, sid, step)
        expected[sid] = (name, expected_after(PRELOAD, step))
    live = [name for sid, (name, want) in expected.items() if canon(history(server, sid)) != canon(want)]
    assert server.stop() == 0
    again = start_server(TRICKY, "--workers", "1", "--store", url)
    restarted = [name for sid, (name, want) in expected.items() if canon(history(again, sid)) != canon(want)]
    assert (live, restarted) == ([], []), "edits lost"


def test_user_params_keys_put_in_another_order_are_stored_in_that_order(start_server: Callable[..., Server]) -> None:
    """Minor (JSON objects are unordered), but a change from before: dicts equal in any key
    order, so a message whose ``user_params`` the agent rebuilt in another order counts as
    unchanged and is served, and stored, in the old order."""
    server = start_server(TRICKY, "--workers", "1", "--store", "memory")
    sid = create(server, PRELOAD)
    turn(server, sid, "keyorder 1")
    served = json.loads(server.get(f"/sessions/{sid}/messages").text)
    assert list(served[1]["user_params"]) == list(reversed(list(PRELOAD[1]["user_params"])))


# -- a hostile agent writes its own Result to the worker's pipe -------------------------------

SMALL = [user("p0"), {"role": "assistant", "content": "p1"}, user("p2")]


@contextmanager
def killed_if_failing(server: Server) -> Iterator[None]:
    """A failure here can leave a turn that never ends, and then SIGTERM does not stop the
    server either: kill it at once so the failure is reported quickly and nothing leaks."""
    try:
        yield
    except BaseException:
        kill_server(server)
        raise


def settled(server: Server, sid: str, timeout: float = 6.0) -> dict:
    """The session once it is no longer ``running`` (fails after ``timeout``)."""

    def check() -> dict | None:
        body = server.wait(sid, timeout=1)
        return body if body["status"] != "running" else None

    return wait_until(check, timeout=timeout, what=f"session {sid} to leave running")  # a turn of milliseconds  # type: ignore[return-value]


def test_a_forged_result_with_a_bogus_kept_keeps_nothing_of_the_old_history(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """``kept`` negative, past the job's state, a bool, a float, a string: none of them is
    trusted, so the history is exactly the two messages the forged ``Result`` carried, and
    another session is untouched; later turns and a restart see the same."""
    url = sqlite_url(tmp_path / "s.db")
    server = start_server(HOSTILE, "--workers", "1", "--store", url)
    bystander = create(server, SMALL)
    sessions = {}
    for kind in ["neg", "huge", "bool", "float", "str", "past"]:
        sid = create(server, SMALL)
        server.send(sid, f"hostile {kind}")
        body = settled(server, sid)
        assert body["status"] == "idle", (kind, body)
        content = f"hostile {kind}"
        assert canon(history(server, sid)) == canon([user(content), done(content)]), kind
        turn(server, sid, "append")
        sessions[sid] = [user(content), done(content), user("append"), done("append")]
        assert canon(history(server, sid)) == canon(sessions[sid]), kind
    assert canon(history(server, bystander)) == canon(SMALL)
    assert server.stop() == 0
    again = start_server(HOSTILE, "--workers", "1", "--store", url)
    for sid, expected in sessions.items():
        assert canon(history(again, sid)) == canon(expected)
    assert canon(history(again, bystander)) == canon(SMALL)


def assert_clean_after_forged_state(server: Server, sid: str, bystander: str) -> None:
    """The forged turn ended in error with a one-line message and the history as it was,
    no request about the session fails with a 500, it can be deleted, and another session's
    turn runs on the only compute slot."""
    body = settled(server, sid)
    assert body["status"] == "error", body
    assert body["error"].startswith("Worker sent a malformed result: ") and "\n" not in body["error"], body
    assert canon(history(server, sid)) == canon(SMALL)
    for path in (f"/sessions/{sid}", f"/sessions/{sid}/messages", "/sessions", "/health"):
        response = server.get(path)
        assert response.status_code == 200, (path, response.text)
    response = server.post(f"/sessions/{sid}/messages", json={"content": "append"})
    assert response.status_code == 202, response.text
    assert settled(server, sid)["status"] in ("idle", "error")
    assert server.get(f"/sessions/{sid}/messages").status_code == 200
    assert canon(history(server, bystander)) == canon(SMALL)
    turn(server, bystander, "append")
    assert canon(history(server, bystander)) == canon([*SMALL, user("append"), done("append")])
    assert server.delete(f"/sessions/{sid}").status_code == 204


@pytest.mark.parametrize("kind", ["none", "int"])
def test_a_forged_result_whose_state_is_not_iterable_ends_the_turn(start_server: Callable[..., Server], tmp_path: Path, kind: str) -> None:
    """``Result(state=None)`` (and ``state=5``). Found by this attack: ``resulting_state``
    raised ``TypeError`` in the manager thread, the pool logged "pool listener failed", and
    the turn never ended: the session stayed ``running`` for ever (409 to every new message),
    its compute slot was never given back, so with ``--workers 1`` no other session's turn
    ran again, and SIGTERM no longer stopped the server. ``state=5`` was stuck before the
    history change too. A malformed result now ends the turn in error."""
    server = start_server(HOSTILE, "--workers", "1", "--store", sqlite_url(tmp_path / "s.db"))
    bystander = create(server, SMALL)
    sid = create(server, SMALL)
    server.send(sid, f"hostile {kind}")
    with killed_if_failing(server):
        assert_clean_after_forged_state(server, sid, bystander)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_forged_result_whose_state_is_not_a_list_of_messages_ends_the_turn(start_server: Callable[..., Server], tmp_path: Path, store: str) -> None:
    """A dict, a string, a list of ints, a message that is not JSON, a response that is
    None, a list or not JSON: the turn ends in error with the history as it was, and nothing
    answers 500. (Before, the history became whatever ``list()`` made of it and later turns
    failed; a message that was not JSON made ``GET /messages`` a 500 on the memory store.)"""
    server = start_server(HOSTILE, "--workers", "1", "--store", "memory" if store == "memory" else sqlite_url(tmp_path / "s.db"))
    bystander = create(server, SMALL)
    for kind in ["dict", "str-state", "ints", "not-json", "response-none", "response-list", "response-not-json"]:
        sid = create(server, SMALL)
        server.send(sid, f"hostile {kind}")
        assert_clean_after_forged_state(server, sid, bystander)
        bystander_history = history(server, bystander)
        turn(server, bystander, "append")  # keeps the bystander's expected history simple below
        assert canon(history(server, bystander)) == canon([*bystander_history, user("append"), done("append")])
        server.delete(f"/sessions/{bystander}")
        bystander = create(server, SMALL)


# -- kill -9 while turns with long histories end -----------------------------------------------

KILL_CYCLE = ["append a", "many 40", "reorder", "last y", "shorter 600", "double", "shorter 900"]


class Client(threading.Thread):
    """Runs one session's turns one after another until the server goes away. ``known`` is
    the history last read with the session idle; ``pending`` the message of a turn that may
    have started since (sent, or being sent, and its outcome not read)."""

    def __init__(self, server: Server, sid: str, known: list[Message], start: int, counter: list[int], lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.server, self.sid, self.known, self.step = server, sid, known, start
        self.pending: str | None = None
        self.counter, self.lock = counter, lock
        self.mismatch: str | None = None

    def run(self) -> None:
        try:
            while self.mismatch is None:
                content = KILL_CYCLE[self.step % len(KILL_CYCLE)]
                self.pending = content
                response = self.server.post(f"/sessions/{self.sid}/messages", json={"content": content}, timeout=10)
                if response.status_code != 202:
                    self.mismatch = f"send answered {response.status_code}: {response.text}"
                    return
                body = self.server.wait_for_status(self.sid, "idle", timeout=30)
                seen = history(self.server, self.sid)
                expected = expected_after(self.known, content)
                if canon(seen) != canon(expected):
                    self.mismatch = f"after {content!r}: {len(seen)} messages, expected {len(expected)}; {body}"
                    return
                self.known, self.pending = seen, None
                self.step += 1
                with self.lock:
                    self.counter[0] += 1
        except (requests.RequestException, AssertionError):
            return  # the server was killed under us


def stored_rows(path: Path) -> dict[str, list[Message]]:
    """Each session's history as the file holds it (read with no server running), with the
    rows checked to be numbered 0..n-1 and none left for a session that is gone."""
    with closing(sqlite3.connect(path)) as db:
        sessions = {row[0] for row in db.execute("SELECT session_id FROM sessions")}
        rows: dict[str, list[tuple[int, str]]] = {}
        for sid, seq, body in db.execute("SELECT session_id, seq, body FROM messages ORDER BY session_id, seq"):
            rows.setdefault(sid, []).append((seq, body))
    assert set(rows) <= sessions, f"rows of deleted sessions: {set(rows) - sessions}"
    for sid, items in rows.items():
        assert [seq for seq, _ in items] == list(range(len(items))), f"session {sid}: rows numbered {[s for s, _ in items][:20]}..."
    return {sid: [json.loads(body) for _, body in rows.get(sid, [])] for sid in sessions}


def all_settled(server: Server, sids: list[str], timeout: float = 30.0) -> dict[str, dict]:
    return {sid: settled(server, sid, timeout) for sid in sids}


def test_kill_9_while_long_histories_are_rewritten_never_leaves_a_partial_history(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Four sessions of 600 messages (and up to 1,200), turns that append, add 40, reverse
    the whole history, rewrite the last message, cut it, double it, on two workers; the
    whole server process group is killed after 1, 2, 4, 7 and 11 more turns have ended.
    After each kill the file itself, and the server restarted on it once any replayed turn
    ended, hold for every session either the history last read idle before the kill or,
    if a turn was in flight, that turn's result on it: never anything else."""
    path = tmp_path / "s.db"
    url = sqlite_url(path)
    server = start_server(TRICKY, "--workers", "2", "--store", url)
    preload = [user(f"{i:04d} " + "x" * 200) if i % 2 == 0 else {"role": "assistant", "content": f"{i:04d} " + "y" * 200} for i in range(600)]
    sids = [create(server, preload) for _ in range(4)]
    known = {sid: preload for sid in sids}
    steps = {sid: n for n, sid in enumerate(sids)}  # the sessions start at different commands
    for round_, after in enumerate([1, 3, 6, 10]):
        counter, lock = [0], threading.Lock()
        clients = [Client(server, sid, known[sid], steps[sid], counter, lock) for sid in sids]
        for client in clients:
            client.start()
        wait_until(lambda: counter[0] >= after or any(c.mismatch or not c.is_alive() for c in clients), timeout=60,
                   what=f"{after} turns to end")
        kill_server(server)
        for client in clients:
            client.join(30)
            assert not client.is_alive()
            assert client.mismatch is None, (round_, client.sid, client.mismatch)
        allowed = {}
        for client in clients:
            options = [canon(client.known)]
            if client.pending is not None:
                options.append(canon(expected_after(client.known, client.pending)))
            allowed[client.sid] = options
        on_disk = stored_rows(path)
        for sid in sids:
            assert canon(on_disk[sid]) in allowed[sid], (round_, sid, len(on_disk[sid]))
        server = start_server(TRICKY, "--workers", "2", "--store", url)
        bodies = all_settled(server, sids)
        for client in clients:
            seen = history(server, client.sid)
            assert canon(seen) in allowed[client.sid], (round_, client.sid, len(seen), bodies[client.sid])
            if bodies[client.sid]["status"] == "error":
                assert canon(seen) == canon(client.known)  # a turn that ended in error changed nothing
            else:
                assert bodies[client.sid]["status"] == "idle", bodies[client.sid]
            if canon(seen) != canon(client.known):
                client.step += 1  # its turn ended, replayed or committed before the kill
            known[client.sid], steps[client.sid] = seen, client.step


# -- kill -9 while a version 2 file is converted ----------------------------------------------

#: The schema version a file is converted to (3 moved the histories into rows; later ones add columns).
CURRENT = str(SCHEMA_VERSION)

#: The schema motus wrote before version 3 (no ``messages`` table: a history is a JSON array
#: in ``sessions.state``), as ``motus/serve/store/sqlite.py`` had it at schema version 2.
_VERSION_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, state TEXT NOT NULL, response TEXT,
    error TEXT, turn_id INTEGER NOT NULL, touched REAL NOT NULL, turn TEXT, grants TEXT);
CREATE TABLE journal (session_id TEXT NOT NULL, turn_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
    key TEXT NOT NULL, label TEXT NOT NULL, done INTEGER NOT NULL, value BLOB, ref TEXT, payload TEXT,
    answered_at REAL, answered_by TEXT, parent INTEGER, created_at REAL, expires_at REAL, default_value BLOB,
    PRIMARY KEY (session_id, turn_id, seq));
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, kind TEXT NOT NULL,
    data TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX events_by_session ON events (session_id, seq);
CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, kind TEXT NOT NULL,
    at REAL NOT NULL, by TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX audit_by_session ON audit (session_id, id);
INSERT INTO meta VALUES ('schema_version', '2');
"""


def v2_histories(count: int) -> dict[str, list[Message]]:
    histories = {}
    for i in range(count):
        messages = [user(f"{i}-{j} " + "z" * 60) if j % 2 == 0 else {"role": "assistant", "content": f"{i}-{j} \u00e9\ud800\x00"}
                    for j in range(20 + i % 13)]
        if i % 500 == 0:
            messages = []  # an empty history: '[]', not ''
        histories[f"v2-{i:05d}"] = messages
    return histories


def write_v2_file(path: Path, histories: dict[str, list[Message]]) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")  # as motus left it
        db.executescript(_VERSION_2)
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO sessions VALUES (?, 'idle', ?, NULL, NULL, 0, ?, NULL, NULL)",
            [(sid, json.dumps(state), 1767225600.0 + n) for n, (sid, state) in enumerate(histories.items())],
        )
        db.execute("COMMIT")


def file_histories(path: Path) -> tuple[str, dict[str, list[Message]]]:
    """The file's schema version and every session's history, read the way that version
    keeps it; a converted file's rows are checked to be numbered 0..n-1, with none left
    over, and no version 2 column still holding a history. Read from a copy of the file and
    its WAL, so the next server opens them exactly as the kill left them."""
    copy_dir = path.parent / f"copy-{uuid.uuid4().hex}"
    copy_dir.mkdir()
    for suffix in ("", "-wal"):
        if Path(f"{path}{suffix}").exists():
            shutil.copyfile(f"{path}{suffix}", copy_dir / f"db{suffix}")
    with closing(sqlite3.connect(copy_dir / "db")) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        has_rows = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages'").fetchone() is not None
        states = dict(db.execute("SELECT session_id, state FROM sessions"))
        rows = db.execute("SELECT session_id, seq, body FROM messages ORDER BY session_id, seq").fetchall() if has_rows else []
    shutil.rmtree(copy_dir)
    if version == "2":
        assert not rows, f"a version 2 file with {len(rows)} rows in messages"
        return version, {sid: json.loads(state) for sid, state in states.items()}
    assert version == CURRENT, version
    assert set(states.values()) == {""}, "a converted file still holding a history in sessions.state"
    found: dict[str, list[tuple[int, str]]] = {sid: [] for sid in states}
    for sid, seq, body in rows:
        assert sid in found, f"rows for unknown session {sid}"
        found[sid].append((seq, body))
    for sid, items in found.items():
        assert [seq for seq, _ in items] == list(range(len(items))), sid
    return version, {sid: [json.loads(body) for _, body in items] for sid, items in found.items()}


def test_kill_9_while_a_version_2_file_is_converted_loses_and_duplicates_nothing(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """3,000 version 2 sessions (about 78,000 messages): ``motus serve start`` is killed
    (the whole process group) as soon as it has claimed the file, then once its WAL holds
    megabytes of the conversion not yet committed, then with the open finished and the
    server answering. After each kill the file is wholly version 2 or wholly the current version, with
    every history as it was; a last start serves them, each message once."""
    path = tmp_path / "v2.db"
    histories = v2_histories(3000)
    write_v2_file(path, histories)
    wal = Path(f"{path}-wal")
    pid_file = Path(f"{path}.pid")
    versions = []
    for n, kill_when in enumerate(["claimed", "wal-2mb", "wal-8mb", "serving"]):
        port = free_port()
        pid_file.unlink(missing_ok=True)
        process = launch(["serve", "start", TRICKY, "--port", str(port), "--workers", "1", "--store", sqlite_url(path)],
                         tmp_path / f"open-{n}.log")
        wal_at_start = wal.stat().st_size if wal.exists() else 0

        def reached() -> bool:
            if process.poll() is not None:
                raise AssertionError((tmp_path / f"open-{n}.log").read_text())
            if kill_when == "claimed":
                return pid_file.exists()
            if kill_when == "serving":
                try:
                    return requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
                except requests.RequestException:
                    return False
            # the round before left the WAL as it was: count from its size then
            grown = (wal.stat().st_size if wal.exists() else 0) - wal_at_start
            return grown >= (2 if kill_when == "wal-2mb" else 8) * 2**20

        wait_until(reached, timeout=60, interval=0.002, what=f"the open to reach {kill_when}")
        descendants = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        wait_until(lambda: not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], timeout=15,
                   what="the killed server's processes to end")
        version, found = file_histories(path)
        versions.append((kill_when, version))
        assert found == histories, (kill_when, version)
    assert versions[-1] == ("serving", CURRENT), versions
    server = start_server(TRICKY, "--workers", "1", "--store", sqlite_url(path))
    for sid in list(histories)[::600]:
        assert canon(history(server, sid)) == canon(histories[sid])
    assert server.stop() == 0
    assert file_histories(path) == (CURRENT, histories)


# -- parking and replay --------------------------------------------------------------------------


def parker_after(before: list[Message], content: str, answer: object) -> list[Message]:
    """What ``tests.agents.history_attack:parker`` returns: the last message edited, then
    ``before``, the answer, the message and the reply."""
    state = copy.deepcopy(before)
    if state:
        state[-1]["content"] = f"{state[-1]['content']} +edited"
    return [*state, user("before"), user(f"answer {answer}"), user(content), done(content)]


def parked(server: Server, sid: str) -> dict:
    """The session interrupted with its turn parked (no worker: ``/health`` says so)."""

    def check() -> dict | None:
        body = server.wait(sid, timeout=2)
        if body["status"] != "interrupted" or len(body["interrupts"]) != 1:
            return None
        health = server.get("/health").json()
        return body if health["parked_turns"] >= 1 and health["live_turns"] == 0 else None

    return wait_until(check, timeout=20, what=f"session {sid}'s turn to be parked")  # type: ignore[return-value]


def resume_ok(server: Server, sid: str, interrupt_id: str, value: object) -> None:
    response = server.post(f"/sessions/{sid}/resume", json={"interrupt_id": interrupt_id, "value": value})
    assert response.status_code == 200, response.text


def test_a_parked_turn_replayed_after_kill_9_stores_exactly_what_the_replay_returned(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """``--park-after 0``: the agent edits the last of 300 messages in place, appends, then
    asks; its process ends. The replay (after a resume, and after a ``kill -9`` and restart)
    starts again from the stored history, so its result differs from the job's in the last
    message only: the rows before it are kept, the rest rewritten, and the history is
    exactly the replay's list, once."""
    path = tmp_path / "s.db"
    args = ["--workers", "2", "--store", sqlite_url(path), "--park-after", "0"]
    server = start_server(PARKER, *args)
    preload = [user(f"{i:03d} " + "p" * 100) for i in range(300)]
    sid = create(server, preload)
    other = create(server, preload[:5])

    # A replay in a fresh process of the same server.
    server.send(sid, "first")
    item = parked(server, sid)["interrupts"][0]
    assert canon(history(server, sid)) == canon(preload)  # nothing of the turn is stored yet
    resume_ok(server, sid, item["interrupt_id"], "yes")
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "done: first"
    expected = parker_after(preload, "first", "yes")
    assert canon(history(server, sid)) == canon(expected)

    # Parked, killed, restarted, resumed: replayed from the rows.
    server.send(sid, "second")
    item = parked(server, sid)["interrupts"][0]
    server.send(other, "append")
    server.wait_for_status(other, "idle")
    kill_server(server)
    server = start_server(PARKER, *args)
    body = server.wait(sid, timeout=1)
    assert body["status"] == "interrupted", body
    assert canon(history(server, sid)) == canon(expected)
    resume_ok(server, sid, body["interrupts"][0]["interrupt_id"], {"n": 2})
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "done: second"
    expected = parker_after(expected, "second", {"n": 2})
    assert canon(history(server, sid)) == canon(expected)
    assert canon(history(server, other)) == canon([*preload[:5], user("append"), done("append")])
    assert server.stop() == 0
    assert canon(stored_rows(path)[sid]) == canon(expected)


# -- a session deleted (or swept) and made again under the same id -------------------------------


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_session_deleted_mid_turn_and_made_again_under_its_id_holds_none_of_the_old_messages(
    start_server: Callable[..., Server], tmp_path: Path, sandbox: Path
) -> None:
    """The old turn is held inside its agent while the session is deleted and made again
    (``PUT``) with another history of the same length, whose next turn starts; then the old
    agent is let go and returns its ``[*old, message, reply]``. The new session's history
    is its own preload and its own turn only, live, in the rows, and after a restart."""
    path = tmp_path / "s.db"
    args = ["--workers", "2", "--store", sqlite_url(path), "--allow-custom-ids"]
    server = start_server(GATED, *args, env={"MOTUS_EXAMPLE_DIR": str(sandbox)})
    sid = str(uuid.uuid4())
    old = [user(f"old {i}") for i in range(50)]
    new = [user(f"new {i}") for i in range(50)]
    assert server.put(f"/sessions/{sid}", json={"state": old}).status_code == 201
    turn(server, sid, "append")
    server.send(sid, "gate g1")
    wait_until(lambda: (sandbox / "started-g1").exists(), what="the old turn's agent to start")
    old_pid = int((sandbox / "started-g1").read_text())
    assert server.delete(f"/sessions/{sid}").status_code == 204
    assert server.put(f"/sessions/{sid}", json={"state": new}).status_code == 201
    assert canon(history(server, sid)) == canon(new)
    server.send(sid, "gate g2")
    wait_until(lambda: (sandbox / "started-g2").exists(), what="the new turn's agent to start")
    (sandbox / "release-g1").write_text("")
    wait_until(lambda: pid_gone(old_pid), timeout=20, what="the old turn's process to end")
    (sandbox / "release-g2").write_text("")
    assert server.wait_for_status(sid, "idle")["response"]["content"] == "done: gate g2"
    expected = [*new, user("gate g2"), done("gate g2")]
    assert canon(history(server, sid)) == canon(expected)
    turn(server, sid, "append")
    expected = [*expected, user("append"), done("append")]
    assert canon(history(server, sid)) == canon(expected)
    assert server.stop() == 0
    assert canon(stored_rows(path)[sid]) == canon(expected)
    again = start_server(GATED, *args, env={"MOTUS_EXAMPLE_DIR": str(sandbox)})
    assert canon(history(again, sid)) == canon(expected)


def test_a_session_swept_by_the_ttl_and_made_again_under_its_id_starts_from_its_new_history(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The sweep takes the session's rows with it; the session made again under its id (on
    a server without ``--ttl``, so nothing can sweep it while it is checked) keeps all but
    the last message in its next turn, and those are its own."""
    path = tmp_path / "s.db"
    server = start_server(TRICKY, "--workers", "1", "--store", sqlite_url(path), "--allow-custom-ids", "--ttl", "0.5")
    sid = str(uuid.uuid4())
    assert server.put(f"/sessions/{sid}", json={"state": [user(f"old {i}") for i in range(40)]}).status_code == 201
    turn(server, sid, "many 100")
    wait_until(lambda: server.get(f"/sessions/{sid}").status_code == 404, timeout=20, what="the sweep")
    assert server.stop() == 0
    assert sid not in stored_rows(path)  # and no rows left behind (checked there)
    again = start_server(TRICKY, "--workers", "1", "--store", sqlite_url(path), "--allow-custom-ids")
    new = [user(f"new {i}") for i in range(3)]
    assert again.put(f"/sessions/{sid}", json={"state": new}).status_code == 201
    turn(again, sid, "last rewritten")  # keeps all but the last: the rows before it must be the new ones
    expected = expected_after(new, "last rewritten")
    assert canon(history(again, sid)) == canon(expected)
    assert again.stop() == 0
    assert canon(stored_rows(path)[sid]) == canon(expected)


# -- many sessions, turns interleaved --------------------------------------------------------------

CONCURRENT_CYCLE = ["append a", "many 30", "last z", "reorder", "shorter 20", "twice", "double", "param 1 q", "weird", "empty"]


def test_sixteen_sessions_ten_interleaved_turns_each_keep_exactly_their_own_histories(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Sixteen sessions with histories that share their first messages (equal by value,
    never the same objects), ten turns each at once on two workers; every history read
    after every turn is exactly that session's, and so is every stored one after a stop."""
    path = tmp_path / "s.db"
    url = sqlite_url(path)
    server = start_server(TRICKY, "--workers", "2", "--store", url)
    common = [{"role": "user", "content": "shared", "user_params": {"top": "x"}}, {"role": "assistant", "content": "same"}]
    sids = [create(server, [*common, user(f"own {n}")]) for n in range(16)]
    final: dict[str, list[Message]] = {}
    errors: list[str] = []

    def drive(n: int, sid: str) -> None:
        expected = [*common, user(f"own {n}")]
        try:
            for k in range(10):
                content = CONCURRENT_CYCLE[(n + k) % len(CONCURRENT_CYCLE)]
                if content.startswith("param") and len(expected) < 2:
                    content = "append p"
                if content.startswith("param") and "user_params" not in expected[1]:
                    content = "append q"
                content = f"{content} s{n}" if content.split(" ")[0] in ("append", "last") else content
                body = turn(server, sid, content)
                assert body["response"]["content"] == f"done: {content}", body
                expected = expected_after(expected, content)
                seen = history(server, sid)
                if canon(seen) != canon(expected):
                    errors.append(f"session {n} after {content!r}: {len(seen)} messages, expected {len(expected)}")
                    return
        except AssertionError as exc:
            errors.append(f"session {n}: {exc}")
            return
        final[sid] = expected

    threads = [threading.Thread(target=drive, args=(n, sid)) for n, sid in enumerate(sids)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert set(final) == set(sids)
    assert server.stop() == 0
    rows = stored_rows(path)
    for sid in sids:
        assert canon(rows[sid]) == canon(final[sid]), sid


def test_a_forged_failure_whose_error_is_not_text_ends_the_turn_in_error(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """``Failure(error=5)`` written to the pipe by the agent's own process: the server used
    to save it, then raise on ``error.strip()`` in the manager thread, leaving the turn
    running for ever with its compute slot (the same hang as a malformed result)."""
    server = start_server(HOSTILE, "--workers", "1", "--store", sqlite_url(tmp_path / "s.db"))
    bystander = create(server, SMALL)
    sid = create(server, SMALL)
    server.send(sid, "hostile failure-int")
    with killed_if_failing(server):
        body = settled(server, sid)
        assert body["status"] == "error", body
        assert body["error"] == "Worker sent a malformed failure: its error is not a str (int)", body
        assert canon(history(server, sid)) == canon(SMALL)
        turn(server, bystander, "append")  # the only compute slot was given back
        assert canon(history(server, bystander)) == canon([*SMALL, user("append"), done("append")])
    assert server.stop() == 0
