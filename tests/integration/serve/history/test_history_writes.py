"""A turn sends back and stores only the part of the history its agent changed (issue 15).

The worker returns ``job.state[:kept] + state`` (``protocol.Result``), and the SQLite store
writes only the messages past ``kept``. These tests check the one thing that must never
change: the stored history is exactly the list the agent returned, whatever the agent did
to it (appended, edited a message in place, dropped, inserted, replaced, returned it as it
came) and across a restart. The agent is ``tests/agents/state.py``; each step's expected
history is worked out here, independently of the server.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import Server

AGENT = "tests.agents.state:agent"
PRELOAD = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "earlier question"},
    {"role": "assistant", "content": "earlier answer"},
]


def history(server: Server, sid: str) -> list[tuple[str, str | None]]:
    response = server.get(f"/sessions/{sid}/messages")
    assert response.status_code == 200, response.text
    return [(m["role"], m.get("content")) for m in response.json()]


def turn(server: Server, sid: str, content: str) -> None:
    server.send(sid, content)
    body = server.wait_for_status(sid, "idle")
    assert body["response"]["content"] == f"done: {content}", body


def expected_after(before: list[tuple[str, str | None]], content: str) -> list[tuple[str, str | None]]:
    """What ``tests.agents.state:agent`` returns for ``content`` given ``before``."""
    words = content.split(" ", 2)
    state = list(before)
    if words[0] == "same":
        return state
    if words[0] == "edit":
        state[int(words[1])] = (state[int(words[1])][0], words[2])
    elif words[0] == "drop":
        state = state[: len(state) - int(words[1])]
    elif words[0] == "insert":
        state.insert(int(words[1]), ("user", words[2]))
    elif words[0] == "replace":
        state = []
    elif words[0] == "unicode":
        state.append(("user", "h\u00e9llo \ud800 \x00 \u4e16"))
    return [*state, ("user", content), ("assistant", f"done: {content}")]


STEPS = [
    "append one",
    "append two",
    "edit 1 the question, edited in place",
    "same",
    "edit 6 a message the last turn added",
    "drop 3",
    "insert 2 slipped in",
    "unicode",
    "same",
    "replace",
    "append after the replace",
]


def run_steps(server: Server, sid: str, steps: list[str], start: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    expected = start
    for step in steps:
        turn(server, sid, step)
        expected = expected_after(expected, step)
        assert history(server, sid) == expected, step
    return expected


@pytest.mark.parametrize("store", ["memory", "sqlite", "postgresql"])
def test_the_stored_history_is_what_the_agent_returned_whatever_it_did_to_it(
    start_server: Callable[..., Server], tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    if store == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = "memory" if store == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    server = start_server(AGENT, "--workers", "1", "--store", url)
    response = server.post("/sessions", json={"state": PRELOAD})
    assert response.status_code == 201, response.text
    sid = response.json()["session_id"]
    start = [(m["role"], m["content"]) for m in PRELOAD]
    assert history(server, sid) == start

    expected = run_steps(server, sid, STEPS, start)
    # A second session's turns, interleaved, touch nothing of the first's.
    other = server.create_session()
    run_steps(server, other, ["append x", "edit 0 y", "drop 1"], [])
    assert history(server, sid) == expected

    if store != "memory":
        assert server.stop() == 0
        again = start_server(AGENT, "--workers", "1", "--store", url)
        assert history(again, sid) == expected
        expected = run_steps(again, sid, ["append after the restart", "edit 0 system, edited", "same"], expected)
        assert again.stop() == 0
        third = start_server(AGENT, "--workers", "1", "--store", url)
        assert history(third, sid) == expected


def test_a_long_history_survives_appends_edits_and_a_restart(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """Two hundred preloaded messages of 2 KB: the case the change is for."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    server = start_server(AGENT, "--workers", "1", "--store", url)
    preload = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i:04d}" + "x" * 2000} for i in range(200)]
    sid = server.post("/sessions", json={"state": preload}).json()["session_id"]
    start = [(m["role"], m["content"]) for m in preload]
    expected = run_steps(server, sid, ["append a", "append b", "edit 150 changed", "drop 5", "append c"], start)
    assert server.stop() == 0
    again = start_server(AGENT, "--workers", "1", "--store", url)
    assert history(again, sid) == expected
    assert again.stop() == 0
    # A row a message, numbered from 0, and the history column of earlier versions empty.
    with closing(sqlite3.connect(tmp_path / "s.db")) as db:
        seqs = [row[0] for row in db.execute("SELECT seq FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
        assert seqs == list(range(len(expected)))
        assert db.execute("SELECT state FROM sessions WHERE session_id = ?", (sid,)).fetchone() == ("",)
