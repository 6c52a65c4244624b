"""``motus.client``'s approvals calls against real servers: ``events()`` (with reconnects
across a restart), the inbox, grants and the audit, and ``motus serve inbox``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from motus.client import Client, Event, NotFound
from tests.conftest import ROOT, Server, server_env

CALLS = "tests.agents.approval:calls"


def _env(tmp_path: Path) -> dict[str, str]:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    return {"MOTUS_EXAMPLE_DIR": str(sandbox)}


def _next(events, kind: str, **match: object) -> Event:
    for event in events:
        if event.kind == kind and all(event.data.get(k) == v for k, v in match.items()):
            return event
    raise AssertionError(f"the stream ended before a {kind} event")


def test_events_follow_a_turn_and_reconnect_across_a_restart(start_server: Callable[..., Server], tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'client.db'}"
    first = start_server(CALLS, "--store", store, env=_env(tmp_path))
    with Client(first.url) as client:
        session_id = client.create_session().session_id
        stream = client.events(session_id)
        ready = next(stream)
        assert ready.kind == "ready" and ready.id is not None
        client.send_message(session_id, "delete_file a")
        interrupt = _next(stream, "interrupt")
        assert interrupt.session_id == session_id and interrupt.data["payload"]["tool_name"] == "delete_file"
        last_seen = interrupt.id
        stream.close()
    assert first.stop() == 0
    second = start_server(CALLS, "--store", store, env=_env(tmp_path))
    with Client(second.url) as client:
        stream = client.events(session_id, last_event_id=last_seen)
        client.resume(session_id, interrupt.data["interrupt_id"], {"approved": True})
        kinds = []
        for event in stream:
            assert event.id is not None and event.id > last_seen
            kinds.append(event.kind)
            if event.kind == "status" and event.data["status"] == "idle":
                break
        assert kinds == ["status", "resolved", "status", "message", "status"]
        client.delete_session(session_id)
        deleted = _next(stream, "status", status="deleted")
        assert list(stream) == []  # the iterator ends after the session's deletion
        assert deleted.session_id == session_id
        with pytest.raises(NotFound):  # reconnecting to a deleted session: it is gone
            next(client.events(session_id, last_event_id=0))


def test_inbox_grants_and_audit(start_server: Callable[..., Server], tmp_path: Path) -> None:
    server = start_server(CALLS, "--api-key", "alice=a-secret-key", env=_env(tmp_path))
    with Client(server.url, api_key="a-secret-key") as client:
        assert client.inbox() == []
        session_id = client.create_session().session_id
        client.send_message(session_id, "delete_file a; delete_file b")
        [item] = client.inbox(wait=True, timeout=20)
        assert item.session_id == session_id and item.payload["tool_name"] == "delete_file"
        assert client.inbox(type="ask_user_question") == []
        client.resume(session_id, item.interrupt_id, {"approved": True, "remember": "session"})
        assert client.wait(session_id).response.content == "deleted a | deleted b"
        [grant] = client.grants(session_id)
        assert (grant.tool_name, grant.granted_by) == ("delete_file", "alice")
        client.revoke_grant(session_id, "delete_file")
        assert client.grants(session_id) == []
        with pytest.raises(NotFound):
            client.revoke_grant(session_id, "delete_file")
        records = client.audit(session_id)
        assert [(r.kind, r.by) for r in records] == [("resolved", "alice"), ("grant", "alice"), ("revoke", "alice")]


def test_the_inbox_command_lists_what_waits(start_server: Callable[..., Server], tmp_path: Path) -> None:
    server = start_server(CALLS, env=_env(tmp_path))
    command = [sys.executable, "-m", "motus", "serve", "inbox", server.url]
    empty = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60)
    assert empty.returncode == 0 and "Nothing is waiting" in empty.stdout
    session_id = server.create_session()
    server.send(session_id, "delete_file /tmp/\x1b[31mred")
    server.wait_for_status(session_id, "interrupted")
    shown = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "[tool_approval] approve delete_file" in shown.stdout and session_id in shown.stdout
    assert "\x1b" not in shown.stdout  # a control character in the arguments is shown escaped
