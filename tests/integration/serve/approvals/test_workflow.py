"""Approvals as a workflow (issue 13): server-sent events, the inbox, expiry, remembered
grants, named and read-only keys, the audit, and signed webhooks.

Real ``motus serve`` processes; agents in ``tests/agents/approval.py`` record each gated tool
body run in ``ran-<tool>`` in the sandbox, so what ran is counted on disk. Event streams are
read with ``requests`` (``stream=True``) and parsed here, independently of ``motus.client``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import Instances, Server, server_factory, wait_until
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls
from tests.integration.serve.approvals.test_hitl import WebhookSink

CALLS = "tests.agents.approval:calls"
EXPIRING = "tests.agents.approval:expiring"
TWO = "tests.agents.approval:two_questions"
OPS, VIEWER = "ops-secret-1", "viewer-secret-2"

#: For a test whose subject is one server's own handling (a refusal that names the problem,
#: a key's name, a webhook's signature, an option's cap), not state the instances share:
#: ``start_server`` / ``shared`` narrowed to their one-server parameter, so it runs once.
#: Everything an instance may see of another's work (streams, the inbox, grants, approvals
#: and quorums, expiry, the live turn) still runs on both.
ONE_SERVER = pytest.mark.parametrize("start_server", ["one-server"], indirect=True)
ONE_SHARED_SERVER = pytest.mark.parametrize("shared", ["one-server"], indirect=True)


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture(params=["one-server", "two-instances-on-postgresql"])
def start_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Every test runs twice: against one server, and against two instances on one
    PostgreSQL database, each request going to the next instance in turn (event streams
    are read from the first, so they show what the other did). A test that names its own
    ``--store`` (a restart on a SQLite file) uses ``one_server`` instead; one marked
    ``ONE_SERVER`` runs on the first parameter only."""
    with server_factory(tmp_path) as start:
        if request.param == "one-server":
            yield start
            return

        def start_instances(agent: str, *args: str, env: dict[str, str] | None = None) -> Server:
            assert "--store" not in args, "a test with its own --store runs once: use one_server"
            url = request.getfixturevalue("pg_cluster").create_database()
            first, second = (start(agent, *args, "--store", url, env=env) for _ in range(2))
            return Instances.of(first, second)

        yield start_instances


@pytest.fixture
def one_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Servers of one process each, for a test that names its own ``--store`` (a restart on
    a SQLite file): run once, not once per ``start_server`` parameter (where it would run on
    one server both times)."""
    with server_factory(tmp_path) as start:
        yield start


@pytest.fixture(scope="module", params=["one-server", "two-instances-on-postgresql"])
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Like ``start_server`` (one server, or two instances on one PostgreSQL database), but
    one per (agent, arguments, environment) for the whole module, as ``shared_server`` is:
    for tests that work on their own sessions and assert nothing about the server as a whole."""
    servers: dict[tuple[object, ...], Server] = {}
    with server_factory(tmp_path_factory.mktemp("shared"), shared=True) as start:

        def get(agent: str, *args: str, env: dict[str, str] | None = None) -> Server:
            key = (agent, args, tuple(sorted((env or {}).items())))
            if key not in servers:
                if request.param == "one-server":
                    servers[key] = start(agent, *args, env=env)
                else:
                    url = request.getfixturevalue("pg_cluster").create_database()
                    servers[key] = Instances.of(*(start(agent, *args, "--store", url, env=env) for _ in range(2)))
            for server in (servers[key], *getattr(servers[key], "others", [])):
                assert server.process.poll() is None, f"a shared server exited:\n{server.log()}"
            return servers[key]

        yield get


@pytest.fixture(scope="module")
def shared_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox of the shared servers: a test that counts what ran there names its own paths."""
    return tmp_path_factory.mktemp("sandbox")


class Stream:
    """One open ``text/event-stream`` response, parsed event by event."""

    def __init__(self, server: Server, path: str, last_id: int | None = None, read_timeout: float = 20) -> None:
        headers = dict(server.headers)
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        self.response = requests.get(server.url + path, headers=headers, stream=True, timeout=(5, read_timeout))
        self.status = self.response.status_code
        self._lines = self.response.iter_lines(decode_unicode=True) if self.status == 200 else iter(())

    def next(self) -> dict:
        """The next event (comments and ``retry:`` skipped): ``{"id", "event", "data"}``."""
        event: dict = {}
        for line in self._lines:
            if line == "":
                if "event" in event:
                    return event
                event = {}
            elif line.startswith(":") or line.startswith("retry:"):
                continue
            else:
                name, _, value = line.partition(": ")
                event[name] = json.loads(value) if name == "data" else int(value) if name == "id" else value
        raise EOFError("stream ended")

    def until(self, kind: str, **match: object) -> list[dict]:
        """Events up to and including the first ``kind`` whose data has ``match``."""
        seen = []
        while True:
            event = self.next()
            seen.append(event)
            if event["event"] == kind and all(event["data"].get(k) == v for k, v in match.items()):
                return seen

    def close(self) -> None:
        self.response.close()


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def open_(server: Server, path: str = "/events", last_id: int | None = None) -> Stream:
        stream = Stream(server, path, last_id)
        opened.append(stream)
        return stream

    yield open_
    for stream in opened:
        stream.close()


def ran(sandbox: Path, tool: str) -> list[str]:
    path = sandbox / f"ran-{tool}"
    return path.read_text().splitlines() if path.exists() else []


def start(server: Server, content: str) -> str:
    session_id = server.create_session()
    server.send(session_id, content)
    return session_id


def pending(server: Server, session_id: str) -> list[dict]:
    body = server.wait_for_status(session_id, "interrupted")
    return body["interrupts"]


def resume(server: Server, session_id: str, interrupt_id: str, value: object) -> requests.Response:
    return server.post(f"/sessions/{session_id}/resume", json={"interrupt_id": interrupt_id, "value": value})


def approve(server: Server, session_id: str, **extra: object) -> dict:
    [item] = pending(server, session_id)
    response = resume(server, session_id, item["interrupt_id"], {"approved": True, **extra})
    assert response.status_code == 200, response.text
    return item


def env(sandbox: Path, **extra: str) -> dict[str, str]:
    return {"MOTUS_EXAMPLE_DIR": str(sandbox), **extra}


def calls_server(shared: Callable[..., Server], sandbox: Path) -> Server:
    """The module's shared ``calls`` server (an unanswered ``send_money`` waits 30 s)."""
    return shared(CALLS, env=env(sandbox, MOTUS_TEST_APPROVAL_TIMEOUT="30"))


# -- server-sent events --------------------------------------------------------------------


def test_a_session_stream_shows_each_change_once_in_order(shared: Callable[..., Server], shared_sandbox: Path, streams) -> None:
    server = calls_server(shared, shared_sandbox)
    session_id = server.create_session()
    stream = streams(server, f"/sessions/{session_id}/events")
    ready = stream.next()
    assert ready["event"] == "ready" and ready["data"]["last_event_id"] == ready["id"]
    server.send(session_id, "delete_file a")
    seen = stream.until("interrupt")
    assert [e["event"] for e in seen] == ["status", "interrupt"]
    assert seen[0]["data"]["status"] == "running"
    interrupt = seen[1]["data"]
    assert interrupt["session_id"] == session_id and interrupt["type"] == "tool_approval"
    assert interrupt["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "a"}}
    assert resume(server, session_id, interrupt["interrupt_id"], {"approved": True}).status_code == 200
    rest = stream.until("status", status="idle")
    kinds = [e["event"] for e in rest]
    assert kinds == ["status", "resolved", "status", "message", "status"], kinds
    assert rest[1]["data"]["by"] == "anonymous" and rest[1]["data"]["reason"] == "resume"
    assert rest[3]["data"]["response"]["content"] == "deleted a"
    ids = [e["id"] for e in [ready, *seen, *rest]]
    assert ids == sorted(set(ids)), ids


def test_a_client_that_reconnects_with_last_event_id_misses_nothing_and_sees_nothing_twice(
    shared: Callable[..., Server], shared_sandbox: Path, streams
) -> None:
    server = calls_server(shared, shared_sandbox)
    first = streams(server, "/events")
    start_id = first.next()["id"]
    collected: list[dict] = []
    sessions = [start(server, "delete_file x; delete_file y") for _ in range(3)]
    collected += first.until("interrupt")
    first.close()  # dropped mid-way: changes keep happening while nobody listens
    for session_id in sessions:
        for _ in range(2):
            approve(server, session_id)
    for session_id in sessions:
        assert server.wait_for_status(session_id, "idle")["response"]["content"] == "deleted x | deleted y"
    second = streams(server, "/events", last_id=collected[-1]["id"])
    while sum(1 for e in collected if e["event"] == "message") < 3 or collected[-1]["event"] != "status":
        collected.append(second.next())  # up to the status that follows the third turn's message
    everything = streams(server, f"/events?after={start_id}")
    full = [everything.next() for _ in range(len(collected))]
    assert [e["id"] for e in collected] == [e["id"] for e in full]
    assert len({e["id"] for e in collected}) == len(collected)
    assert [e["event"] for e in collected].count("resolved") == 6


def test_events_survive_a_restart_with_a_durable_store(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path, streams) -> None:
    store = f"sqlite:///{tmp_path / 'events.db'}"
    first = one_server(CALLS, "--store", store, env=env(sandbox))
    session_id = start(first, "delete_file a")
    [item] = pending(first, session_id)
    stream = streams(first, f"/sessions/{session_id}/events", last_id=0)
    before = stream.until("interrupt")
    last_id = before[-1]["id"]
    stream.close()
    assert first.stop() == 0
    second = one_server(CALLS, "--store", store, env=env(sandbox))
    again = streams(second, f"/sessions/{session_id}/events", last_id=last_id)
    assert resume(second, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    after = again.until("status", status="idle")
    assert after[0]["id"] > last_id
    assert [e["event"] for e in after] == ["status", "resolved", "status", "message", "status"]
    assert ran(sandbox, "delete_file") == ["a"]
    replay = streams(second, f"/sessions/{session_id}/events", last_id=0)
    replayed = [replay.next() for _ in range(len(before) + len(after))]
    assert [e["id"] for e in replayed] == [e["id"] for e in before] + [e["id"] for e in after]


def test_a_deleted_session_ends_its_stream(shared: Callable[..., Server], shared_sandbox: Path, streams) -> None:
    server = calls_server(shared, shared_sandbox)
    session_id = server.create_session()
    stream = streams(server, f"/sessions/{session_id}/events")
    stream.next()
    assert server.delete(f"/sessions/{session_id}").status_code == 204
    assert stream.next()["data"]["status"] == "deleted"
    with pytest.raises(EOFError):
        stream.next()


@ONE_SERVER
def test_max_streams_holds_and_resumes_still_get_through(start_server: Callable[..., Server], sandbox: Path, streams) -> None:
    """Streams that wait on threads (``--max-waiting 0``: none held without one) stop at
    ``--max-streams``. (Held streams: ``tests/integration/serve/http/test_held_waits.py``.)"""
    server = start_server(CALLS, "--max-streams", "3", "--max-waiting", "0", env=env(sandbox))
    session_id = start(server, "delete_file a")
    [item] = pending(server, session_id)
    held = [streams(server, "/events") for _ in range(3)]
    assert all(s.status == 200 and s.next()["event"] == "ready" for s in held)
    refused = streams(server, "/events")
    assert refused.status == 503 and "--max-streams" in refused.response.json()["detail"]
    assert server.get("/health").json()["open_streams"] == 3
    assert resume(server, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == "deleted a"
    held[0].close()
    wait_until(lambda: server.get("/health").json()["open_streams"] == 2, what="the closed stream's slot to be given back")
    assert streams(server, "/events").status == 200


@pytest.mark.parametrize("query", ["after=abc", "after=-1", "after=1e3"])
@ONE_SHARED_SERVER
def test_a_bad_event_cursor_is_a_400_naming_it(shared: Callable[..., Server], query: str) -> None:
    server = shared(CALLS)  # its own: no other test opens a stream on it
    response = server.get(f"/events?{query}")
    assert response.status_code == 400 and "'after'" in response.json()["detail"]
    response = requests.get(server.url + "/events", headers={"Last-Event-ID": "nope"}, timeout=10)
    assert response.status_code == 400 and "Last-Event-ID" in response.json()["detail"]
    assert server.get("/health").json()["open_streams"] == 0


# -- the inbox -----------------------------------------------------------------------------


def test_the_inbox_lists_pending_interrupts_of_every_session_oldest_first(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(CALLS, env=env(sandbox))
    assert server.get("/interrupts").json() == []
    first = start(server, "delete_file one")
    pending(server, first)
    second = start(server, "send_money 7")
    pending(server, second)
    items = server.get("/interrupts", params={"status": "pending"}).json()
    assert [(i["session_id"], i["payload"]["tool_name"]) for i in items] == [(first, "delete_file"), (second, "send_money")]
    assert items[0]["created_at"] <= items[1]["created_at"] and items[0]["expires_at"] is None
    assert items[1]["expires_at"] is None or items[1]["expires_at"] > items[1]["created_at"]
    assert [i["session_id"] for i in server.get("/interrupts", params={"type": "tool_approval"}).json()] == [first, second]
    assert server.get("/interrupts", params={"type": "confirm"}).json() == []
    bad = server.get("/interrupts", params={"status": "resolved"})
    assert bad.status_code == 400 and "'status'" in bad.json()["detail"]


def test_an_inbox_long_poll_returns_when_an_interrupt_appears(start_server: Callable[..., Server], sandbox: Path) -> None:
    import threading

    server = start_server(CALLS, env=env(sandbox))
    got: dict = {}

    def poll() -> None:
        got["response"] = server.get("/interrupts", params={"wait": "true", "timeout": 20}, timeout=30)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        session_id = start(server, "delete_file late")
    finally:
        thread.join(30)
    items = got["response"].json()
    assert [i["session_id"] for i in items] == [session_id]


# -- expiry --------------------------------------------------------------------------------


def test_an_interrupt_with_a_timeout_resolves_itself_with_its_default(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(EXPIRING, env=env(sandbox))
    session_id = start(server, "0.5")
    [item] = pending(server, session_id)
    assert item["expires_at"] > item["created_at"]
    body = server.wait_for_status(session_id, "idle")
    assert body["response"]["content"] == "got {'choice': 'default'}"
    [record] = server.get(f"/sessions/{session_id}/audit").json()
    assert (record["kind"], record["by"], record["reason"], record["value"]) == ("resolved", "timeout", "timeout", {"choice": "default"})
    late = resume(server, session_id, item["interrupt_id"], {"choice": "mine"})
    assert late.status_code == 404 and "expired" in late.json()["detail"]


@ONE_SERVER
def test_an_unanswered_approval_times_out_as_a_rejection_and_the_tool_never_runs(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(CALLS, env=env(sandbox, MOTUS_TEST_APPROVAL_TIMEOUT="0.5"))
    session_id = start(server, "send_money 100")
    pending(server, session_id)
    body = server.wait_for_status(session_id, "idle")
    assert "User rejected send_money: Approval timed out after 0.5 s" in body["response"]["content"]
    assert ran(sandbox, "send_money") == []


def test_expiry_holds_across_a_restart_and_for_a_parked_turn(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'expiry.db'}"
    first = one_server(EXPIRING, "--store", store, "--park-after", "0", env=env(sandbox))
    session_id = start(first, "3")
    [item] = pending(first, session_id)
    wait_until(lambda: first.get("/health").json()["parked_turns"] == 1, what="the turn to park")
    assert first.stop() == 0
    wait_until(lambda: time.time() > _epoch(item["expires_at"]) + 0.2, timeout=10, what="the deadline to pass while stopped")
    second = one_server(EXPIRING, "--store", store, env=env(sandbox))
    body = second.wait_for_status(session_id, "idle")
    assert body["response"]["content"] == "got {'choice': 'default'}"
    assert [r["by"] for r in second.get(f"/sessions/{session_id}/audit").json()] == ["timeout"]


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# -- remembered grants ---------------------------------------------------------------------


def test_a_grant_skips_later_gates_and_its_revocation_brings_them_back(shared: Callable[..., Server], shared_sandbox: Path) -> None:
    server = calls_server(shared, shared_sandbox)
    tag = uuid.uuid4().hex[:8]  # the shared sandbox records other tests' runs too: this test's paths are its own
    a, b, c, d = (f"{tag}-{name}" for name in "abcd")
    session_id = start(server, f"delete_file {a}; delete_file {b}")
    approve(server, session_id, remember="session")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == f"deleted {a} | deleted {b}"
    [grant] = server.get(f"/sessions/{session_id}/grants").json()
    assert grant["tool_name"] == "delete_file" and grant["granted_by"] == "anonymous"
    server.send(session_id, f"delete_file {c}")
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == f"deleted {c}"
    assert server.delete(f"/sessions/{session_id}/grants/delete_file").status_code == 204
    assert server.get(f"/sessions/{session_id}/grants").json() == []
    again = server.delete(f"/sessions/{session_id}/grants/delete_file")
    assert again.status_code == 404 and "delete_file" in again.json()["detail"]
    server.send(session_id, f"delete_file {d}")
    approve(server, session_id)
    assert server.wait_for_status(session_id, "idle")["response"]["content"] == f"deleted {d}"
    assert [path for path in ran(shared_sandbox, "delete_file") if path.startswith(tag)] == [a, b, c, d]
    kinds = [(r["kind"], r.get("tool_name")) for r in server.get(f"/sessions/{session_id}/audit").json()]
    assert kinds == [("resolved", None), ("grant", "delete_file"), ("revoke", "delete_file"), ("resolved", None)]


def test_a_grant_is_per_tool_and_per_session(shared: Callable[..., Server], shared_sandbox: Path) -> None:
    server = calls_server(shared, shared_sandbox)
    session_id = start(server, "delete_file a; send_money 1")
    approve(server, session_id, remember="session")
    item = approve(server, session_id)  # another tool: still asked
    assert item["payload"]["tool_name"] == "send_money"
    server.wait_for_status(session_id, "idle")
    other = start(server, "delete_file z")  # another session: still asked
    assert pending(server, other)[0]["payload"]["tool_name"] == "delete_file"


def test_a_grant_survives_a_restart(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'grants.db'}"
    first = one_server(CALLS, "--store", store, env=env(sandbox))
    session_id = start(first, "delete_file a")
    approve(first, session_id, remember="session")
    first.wait_for_status(session_id, "idle")
    assert first.stop() == 0
    second = one_server(CALLS, "--store", store, env=env(sandbox))
    assert [g["tool_name"] for g in second.get(f"/sessions/{session_id}/grants").json()] == ["delete_file"]
    second.send(session_id, "delete_file b")
    assert second.wait_for_status(session_id, "idle")["response"]["content"] == "deleted b"
    assert [r["kind"] for r in second.get(f"/sessions/{session_id}/audit").json()] == ["resolved", "grant"]


# -- named keys, read-only keys, the audit --------------------------------------------------


@ONE_SERVER
def test_named_keys_are_recorded_and_a_read_only_key_may_only_watch(start_server: Callable[..., Server], sandbox: Path, streams) -> None:
    plain = start_server(CALLS, "--api-key", f"ops={OPS}", "--api-key", f"viewer={VIEWER}:read", env=env(sandbox))
    ops = plain.with_headers({"Authorization": f"Bearer {OPS}"})
    viewer = plain.with_headers({"Authorization": f"Bearer {VIEWER}"})
    session_id = start(ops, "delete_file a")
    [item] = pending(ops, session_id)
    # The viewer may list and watch...
    assert viewer.get("/sessions").status_code == 200
    assert viewer.get(f"/sessions/{session_id}").json()["status"] == "interrupted"
    assert [i["interrupt_id"] for i in viewer.get("/interrupts").json()] == [item["interrupt_id"]]
    assert streams(viewer, f"/sessions/{session_id}/events").next()["event"] == "ready"
    # ...and gets 403 on everything that writes, which changes nothing.
    writes = [
        viewer.post("/sessions", json={}),
        viewer.post(f"/sessions/{session_id}/messages", json={"content": "hi"}),
        viewer.post(f"/sessions/{session_id}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}}),
        viewer.delete(f"/sessions/{session_id}/grants/delete_file"),
        viewer.delete(f"/sessions/{session_id}"),
    ]
    for response in writes:
        assert response.status_code == 403, response.text
        assert "'viewer' is read-only" in response.json()["detail"]
    assert len(ops.get("/sessions").json()) == 1
    assert ops.get(f"/sessions/{session_id}").json()["interrupts"][0]["interrupt_id"] == item["interrupt_id"]
    assert resume(ops, session_id, item["interrupt_id"], {"approved": True, "reason": "checked"}).status_code == 200
    ops.wait_for_status(session_id, "idle")
    [record] = viewer.get(f"/sessions/{session_id}/audit").json()
    assert record["by"] == "ops" and record["value"] == {"approved": True, "reason": "checked"}
    assert record["payload"]["tool_args"] == {"path": "a"} and record["at"].endswith("Z") and record["turn_id"] == 1
    assert plain.get(f"/sessions/{session_id}/audit").status_code == 401
    assert ops.get("/sessions/00000000-0000-0000-0000-000000000000/audit").status_code == 404


@ONE_SERVER
def test_a_bare_key_is_named_default(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(CALLS, "--api-key", OPS, env=env(sandbox)).with_headers({"Authorization": f"Bearer {OPS}"})
    session_id = start(server, "delete_file a")
    approve(server, session_id)
    server.wait_for_status(session_id, "idle")
    assert [r["by"] for r in server.get(f"/sessions/{session_id}/audit").json()] == ["default"]


# -- who may approve: roles and the sender (issue 29) ---------------------------------------

#: Keys with roles: alice none, bob finance, carol ops and finance, dave ops.
ROLE_SECRETS = {"alice": "alice-secret-3", "bob": "bob-secret-4", "carol": "carol-secret-5", "dave": "dave-secret-6"}
KEYS_WITH_ROLES = ("--api-key", f"alice={ROLE_SECRETS['alice']}", "--api-key", f"bob={ROLE_SECRETS['bob']}:finance",
                   "--api-key", f"carol={ROLE_SECRETS['carol']}:ops,finance", "--api-key", f"dave={ROLE_SECRETS['dave']}:ops")


def as_keys(server: Server) -> dict[str, Server]:
    secrets = ROLE_SECRETS
    return {name: server.with_headers({"Authorization": f"Bearer {secret}"}) for name, secret in secrets.items()}


def unchanged(server: Server, session_id: str, interrupt_id: str, sandbox: Path, amount: str) -> None:
    """A refused answer changed nothing: the interrupt waits, nothing is in the audit, the tool did not run."""
    body = server.get(f"/sessions/{session_id}").json()
    assert body["status"] == "interrupted" and [i["interrupt_id"] for i in body["interrupts"]] == [interrupt_id], body
    assert server.get(f"/sessions/{session_id}/audit").json() == []
    assert amount not in ran(sandbox, "wire_money")


def test_an_approval_needs_a_key_with_a_role_its_tool_names_and_a_refusal_changes_nothing(
    shared: Callable[..., Server], shared_sandbox: Path
) -> None:
    """``wire_money`` names ``approvers=["finance"]``: dave (role ops) is refused, approving
    or rejecting, with a 403 naming the role; bob (finance) approves. The inbox shows who may."""
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox)))
    amount = str(uuid.uuid4().int % 10**9)  # the sandbox is the module's: this call's own amount
    session_id = start(keys["alice"], f"wire_money {amount}")
    [item] = pending(keys["alice"], session_id)
    assert item["payload"]["approvers"] == ["finance"] and item["payload"]["self_approval"] is False
    [listed] = [i for i in keys["bob"].get("/interrupts").json() if i["session_id"] == session_id]
    assert listed["payload"]["approvers"] == ["finance"]
    for value in ({"approved": True}, {"approved": False, "reason": "no"}, {"approved": True, "remember": "session"}):
        refused = resume(keys["dave"], session_id, item["interrupt_id"], value)
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == (
            "Forbidden: the approval of wire_money needs a key with the role 'finance'; API key 'dave' has none of them"
        )
        unchanged(keys["bob"], session_id, item["interrupt_id"], shared_sandbox, amount)
    # A grant would let later calls through with nobody asked, whoever sent them: never for
    # a tool that names its approvers, even from one of them.
    remembered = resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True, "remember": "session"})
    assert remembered.status_code == 422, remembered.text
    assert "cannot be remembered for the session" in remembered.json()["detail"]
    unchanged(keys["bob"], session_id, item["interrupt_id"], shared_sandbox, amount)
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["bob"].wait_for_status(session_id, "idle")["response"]["content"] == f"wired {amount}"
    assert ran(shared_sandbox, "wire_money").count(amount) == 1
    assert keys["bob"].get(f"/sessions/{session_id}/grants").json() == []
    assert [(r["kind"], r["by"]) for r in keys["alice"].get(f"/sessions/{session_id}/audit").json()] == [("resolved", "bob")]


def test_the_key_that_sent_the_message_may_not_answer_where_the_tool_forbids_it(
    shared: Callable[..., Server], shared_sandbox: Path
) -> None:
    """``self_approval=False``: bob has the role but sent the message, so his answer (yes or
    no) is refused; carol, with the role, approves."""
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox)))
    amount = str(uuid.uuid4().int % 10**9)  # the sandbox is the module's: this call's own amount
    session_id = start(keys["bob"], f"wire_money {amount}")
    [item] = pending(keys["bob"], session_id)
    for value in ({"approved": True}, {"approved": False}):
        refused = resume(keys["bob"], session_id, item["interrupt_id"], value)
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == (
            "Forbidden: the approval of wire_money may not be answered by the key that sent the turn's message ('bob')"
        )
        unchanged(keys["carol"], session_id, item["interrupt_id"], shared_sandbox, amount)
    assert resume(keys["carol"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["carol"].wait_for_status(session_id, "idle")["response"]["content"] == f"wired {amount}"
    assert [r["by"] for r in keys["carol"].get(f"/sessions/{session_id}/audit").json()] == ["carol"]


@ONE_SHARED_SERVER
def test_a_server_without_keys_refuses_answers_a_policy_restricts(shared: Callable[..., Server], shared_sandbox: Path) -> None:
    """Without API keys everyone is ``anonymous`` with no role: nobody can be told apart, so
    a restricted approval is refused (403 naming why) rather than open to all."""
    server = calls_server(shared, shared_sandbox)
    amount = str(uuid.uuid4().int % 10**9)
    session_id = start(server, f"wire_money {amount}")
    [item] = pending(server, session_id)
    refused = resume(server, session_id, item["interrupt_id"], {"approved": True})
    assert refused.status_code == 403 and "this server has no API keys" in refused.json()["detail"], refused.text
    unchanged(server, session_id, item["interrupt_id"], shared_sandbox, amount)
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_the_policy_holds_after_kill_9_for_the_parked_turn(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    """The policy is part of the stored interrupt: after the server is killed (-9) and started
    again, the replayed turn's approval still refuses dave and the sender, and bob's runs the
    tool once."""
    from tests.integration.serve.durability.test_durability import kill_server

    store = f"sqlite:///{tmp_path / 'approvers.db'}"
    keys = as_keys(one_server(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox)))
    log = keys["carol"].log()
    assert "API keys: alice, bob (finance), carol (finance, ops), dave (ops)" in log  # names and roles...
    assert not [secret for secret in ROLE_SECRETS.values() if secret in log]  # ...never a secret
    session_id = start(keys["carol"], "wire_money 104")
    [item] = pending(keys["carol"], session_id)
    kill_server(keys["carol"])
    keys = as_keys(one_server(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox)))
    for name in ("dave", "carol"):
        refused = resume(keys[name], session_id, item["interrupt_id"], {"approved": True})
        assert refused.status_code == 403, refused.text
        unchanged(keys["bob"], session_id, item["interrupt_id"], sandbox, "104")
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["bob"].wait_for_status(session_id, "idle")["response"]["content"] == "wired 104"
    assert ran(sandbox, "wire_money") == ["104"]


def test_a_two_person_rule_records_the_first_approval_and_runs_the_call_on_a_second_keys(
    shared: Callable[..., Server], shared_sandbox: Path, streams
) -> None:
    """``release_funds`` needs two approvals from keys with the role finance (``quorum=2``).
    bob's approval is recorded and the interrupt stays pending ("1 of 2 approvals: bob") in
    the session, the inbox, the live turn and the event stream; bob again, dave (no role)
    and an edited call are refused and change nothing; carol's approval runs the call once,
    and the audit lists both approvals. On two instances the requests alternate, so the two
    approvals are taken by different instances."""
    server = shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox))
    keys = as_keys(server)
    amount = str(uuid.uuid4().int % 10**9)
    stream = streams(keys["alice"])
    session_id = start(keys["alice"], f"release_funds {amount}")
    [item] = pending(keys["alice"], session_id)
    interrupt_id = item["interrupt_id"]
    assert item["payload"]["quorum"] == 2 and item["approvals"] == [] and item["approvals_needed"] == 2, item
    first = resume(keys["bob"], session_id, interrupt_id, {"approved": True})
    assert first.status_code == 200, first.text
    assert first.json() == {"session_id": session_id, "status": "interrupted", "approvals_needed": 1,
                            "detail": "1 of 2 approvals: bob; the call waits for 1 more from another key"}
    assert stream.until("approval", interrupt_id=interrupt_id)[-1]["data"]["progress"] == "1 of 2 approvals: bob"
    for reader in ("alice", "dave"):  # each instance, in turn, says where the quorum stands
        body = keys[reader].get(f"/sessions/{session_id}").json()
        [waiting] = body["interrupts"]
        assert body["status"] == "interrupted" and [a["by"] for a in waiting["approvals"]] == ["bob"], body
        assert waiting["approvals_needed"] == 1 and waiting["approvals"][0]["at"].endswith("Z"), waiting
        [step] = [s for s in body["turn"]["steps"] if s["kind"] == "interrupt"]
        assert [a["by"] for a in step["approvals"]] == ["bob"] and step["approvals_needed"] == 1, step
        [listed] = [i for i in keys[reader].get("/interrupts").json() if i["session_id"] == session_id]
        assert [a["by"] for a in listed["approvals"]] == ["bob"] and listed["approvals_needed"] == 1, listed
    for name, value, status, why in (
        ("bob", {"approved": True}, 403, "needs approvals from 2 different keys, and API key 'bob' has approved it already; "
                                          "1 of 2 approvals: bob"),
        ("dave", {"approved": True}, 403, "needs a key with the role 'finance'; API key 'dave' has none of them"),
        ("carol", {"approved": True, "tool_args": {"amount": 1}}, 422, "an approval cannot edit its arguments"),
        ("carol", {"approved": True, "remember": "session"}, 422, "cannot be remembered for the session"),
        # Read by the gate as a rejection: under a quorum, one person's veto sent by mistake.
        ("carol", {"approved": "true"}, 422, "an answer must be an object whose \"approved\" is true or false"),
        ("carol", True, 422, "an answer must be an object whose \"approved\" is true or false"),
    ):
        refused = resume(keys[name], session_id, interrupt_id, value)
        assert refused.status_code == status and why in refused.json()["detail"], refused.text
        body = keys["alice"].get(f"/sessions/{session_id}").json()
        assert body["status"] == "interrupted" and [a["by"] for a in body["interrupts"][0]["approvals"]] == ["bob"], body
        assert amount not in ran(shared_sandbox, "release_funds")
    # What a client asks to offer each key only what it may do (never the secret):
    assert keys["carol"].get("/whoami").json() == {"name": "carol", "roles": ["finance", "ops"], "read_only": False}
    assert keys["alice"].get("/whoami").json() == {"name": "alice", "roles": [], "read_only": False}
    second = resume(keys["carol"], session_id, interrupt_id, {"approved": True})
    assert second.status_code == 200 and second.json() == {"session_id": session_id, "status": "running"}, second.text
    assert keys["alice"].wait_for_status(session_id, "idle")["response"]["content"] == f"released {amount}"
    assert ran(shared_sandbox, "release_funds").count(amount) == 1
    audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
    assert [(r["kind"], r["by"]) for r in audit] == [("approval", "bob"), ("resolved", "carol")], audit
    assert [a["by"] for a in audit[0]["approvals"]] == ["bob"] and audit[0]["quorum"] == 2 and audit[0]["interrupt_id"] == interrupt_id
    assert [a["by"] for a in audit[1]["approvals"]] == ["bob", "carol"], audit[1]


def test_two_approvals_given_at_the_same_moment_both_count_and_run_the_call_once(
    shared: Callable[..., Server], shared_sandbox: Path
) -> None:
    """bob and carol approve at the same moment, on two instances of one PostgreSQL database
    (or one server): one answer records the first approval, the other completes the quorum
    (neither approval is lost to the other's write), and the call runs once; five times."""
    server = shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox))
    keys = as_keys(server)
    urls = [server.url, *(other.url for other in getattr(server, "others", []))]
    for _ in range(5):
        amount = str(uuid.uuid4().int % 10**9)
        session_id = start(keys["alice"], f"release_funds {amount}")
        [item] = pending(keys["alice"], session_id)
        gate = threading.Barrier(2)
        answers: dict[str, requests.Response] = {}

        def approve_as(name: str, url: str) -> None:
            gate.wait(timeout=10)
            answers[name] = requests.post(f"{url}/sessions/{session_id}/resume", timeout=30,
                                          headers={"Authorization": f"Bearer {ROLE_SECRETS[name]}"},
                                          json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}})

        threads = [threading.Thread(target=approve_as, args=(name, url)) for name, url in (("bob", urls[0]), ("carol", urls[-1]))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(answer.json()["status"] for answer in answers.values()) == ["interrupted", "running"], {
            name: answer.text for name, answer in answers.items()}
        assert keys["alice"].wait_for_status(session_id, "idle")["response"]["content"] == f"released {amount}"
        assert ran(shared_sandbox, "release_funds").count(amount) == 1
        audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
        assert sorted(a["by"] for a in audit[-1]["approvals"]) == ["bob", "carol"], audit


def test_one_rejection_resolves_a_two_person_approval_as_rejected(shared: Callable[..., Server], shared_sandbox: Path) -> None:
    """After bob's approval, carol's rejection resolves the interrupt: the call never runs,
    and the audit's record of the rejection still lists bob's approval."""
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox)))
    amount = str(uuid.uuid4().int % 10**9)
    session_id = start(keys["alice"], f"release_funds {amount}")
    [item] = pending(keys["alice"], session_id)
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    rejected = resume(keys["carol"], session_id, item["interrupt_id"], {"approved": False, "reason": "not today"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "running", rejected.text
    reply = keys["alice"].wait_for_status(session_id, "idle")["response"]["content"]
    assert "not today" in reply and "released" not in reply, reply
    assert amount not in ran(shared_sandbox, "release_funds")
    audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
    assert [(r["kind"], r["by"]) for r in audit] == [("approval", "bob"), ("resolved", "carol")], audit
    assert [a["by"] for a in audit[1]["approvals"]] == ["bob"] and audit[1]["value"]["approved"] is False


@pytest.mark.parametrize("where", ["sqlite", "two-instances-on-postgresql"])
def test_a_two_person_approval_keeps_its_first_approval_through_kill_9(request: pytest.FixtureRequest, where: str, tmp_path: Path) -> None:
    """bob approves, then the server running the turn is killed (-9): on SQLite it is started
    again; on PostgreSQL the other instance answers, taking the turn over. Either way the
    session still shows bob's approval and needs one more, bob cannot approve again, and
    carol's approval runs the call once."""
    from tests.integration.serve.durability.test_durability import kill_server

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    with server_factory(tmp_path) as start_one:
        if where == "sqlite":
            store = f"sqlite:///{tmp_path / 'quorum.db'}"
            runner = answerer = start_one(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox))
        else:
            store = request.getfixturevalue("pg_cluster").create_database()
            runner, answerer = (start_one(CALLS, *KEYS_WITH_ROLES, "--store", store, "--lease-seconds", "2", env=env(sandbox))
                                for _ in range(2))
        keys = as_keys(runner)
        session_id = start(keys["alice"], "release_funds 205")
        [item] = pending(keys["alice"], session_id)
        assert resume(as_keys(answerer)["bob"], session_id, item["interrupt_id"], {"approved": True}).json()["approvals_needed"] == 1
        kill_server(runner)
        if where == "sqlite":
            answerer = start_one(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox))
        keys = as_keys(answerer)
        [waiting] = pending(keys["alice"], session_id)
        assert [a["by"] for a in waiting["approvals"]] == ["bob"] and waiting["approvals_needed"] == 1, waiting
        assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 403
        assert ran(sandbox, "release_funds") == []
        assert resume(keys["carol"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
        assert keys["carol"].wait_for_status(session_id, "idle")["response"]["content"] == "released 205"
        assert ran(sandbox, "release_funds") == ["205"]
        audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
        assert [(r["kind"], r["by"]) for r in audit] == [("approval", "bob"), ("resolved", "carol")], audit


def test_an_approval_from_a_key_removed_since_no_longer_counts(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    """bob approves, then the server is started again without bob's key (erin, finance,
    joins): bob's approval no longer counts, so carol's is the first again, and erin's
    completes the quorum. The audit's record lists the two that counted."""
    store = f"sqlite:///{tmp_path / 'revoked.db'}"
    keys = as_keys(one_server(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox)))
    session_id = start(keys["alice"], "release_funds 306")
    [item] = pending(keys["alice"], session_id)
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).json()["approvals_needed"] == 1
    assert keys["alice"].stop() == 0
    keys_then = [KEYS_WITH_ROLES[index:index + 2] for index in range(0, len(KEYS_WITH_ROLES), 2)]
    without_bob = [arg for pair in keys_then if not pair[1].startswith("bob=") for arg in pair]
    server = one_server(CALLS, *without_bob, "--api-key", "erin=erin-secret-7:finance", "--store", store, env=env(sandbox))
    keys = as_keys(server)
    erin = server.with_headers({"Authorization": "Bearer erin-secret-7"})
    [waiting] = pending(keys["alice"], session_id)
    assert waiting["approvals"] == [] and waiting["approvals_needed"] == 2, waiting
    body = keys["alice"].get(f"/sessions/{session_id}").json()
    [step] = [s for s in body["turn"]["steps"] if s["kind"] == "interrupt"]
    assert step["approvals"] == [] and step["approvals_needed"] == 2, step  # the live turn says the same
    first = resume(keys["carol"], session_id, item["interrupt_id"], {"approved": True})
    assert first.status_code == 200 and first.json()["approvals_needed"] == 1, first.text
    assert ran(sandbox, "release_funds") == []
    assert resume(erin, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert erin.wait_for_status(session_id, "idle")["response"]["content"] == "released 306"
    audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
    assert [(r["kind"], r["by"]) for r in audit] == [("approval", "bob"), ("approval", "carol"), ("resolved", "erin")], audit
    assert [a["by"] for a in audit[-1]["approvals"]] == ["carol", "erin"], audit
    assert [a["by"] for a in audit[-1]["not_counted"]] == ["bob"], audit  # given, then taken back with the key


POLICY_FILE = """
# wire_money's code says finance; the operator says ops.
[tool.wire_money]
approvers = ["ops"]

# delete_file says nothing in code.
[tool.delete_file]
approvers = ["finance"]
self_approval = false
"""


@ONE_SHARED_SERVER
def test_the_operators_policy_file_wins_over_the_tools_code_and_is_what_clients_see(
    shared: Callable[..., Server], shared_sandbox: Path
) -> None:
    """``--approval-policy``: the file's table for a tool replaces what its code declares
    (wire_money: ops, not finance) and restricts a tool that declares nothing (delete_file:
    finance, not the sender). The session and the inbox show the file's policy."""
    pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")
    path = shared_sandbox / "policy.toml"
    path.write_text(POLICY_FILE)
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, "--approval-policy", str(path), env=env(shared_sandbox)))
    amount = str(uuid.uuid4().int % 10**9)
    session_id = start(keys["alice"], f"wire_money {amount}")
    [item] = pending(keys["alice"], session_id)
    # The file's approvers replace the code's; the code's self_approval, which the file leaves alone, stays.
    assert item["payload"]["approvers"] == ["ops"] and item["payload"]["self_approval"] is False, item
    [listed] = [i for i in keys["bob"].get("/interrupts").json() if i["session_id"] == session_id]
    assert listed["payload"]["approvers"] == ["ops"]
    refused = resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True})  # finance: the code's role
    assert refused.status_code == 403 and "needs a key with the role 'ops'; API key 'bob'" in refused.json()["detail"], refused.text
    unchanged(keys["bob"], session_id, item["interrupt_id"], shared_sandbox, amount)
    assert resume(keys["dave"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["dave"].wait_for_status(session_id, "idle")["response"]["content"] == f"wired {amount}"

    path_name = f"p{amount}"
    session_id = start(keys["bob"], f"delete_file {path_name}")
    [item] = pending(keys["bob"], session_id)
    assert item["payload"]["approvers"] == ["finance"] and item["payload"]["self_approval"] is False
    for name, why in (("dave", "needs a key with the role 'finance'"), ("bob", "sent the turn's message ('bob')")):
        refused = resume(keys[name], session_id, item["interrupt_id"], {"approved": True})
        assert refused.status_code == 403 and why in refused.json()["detail"], refused.text
    assert path_name not in ran(shared_sandbox, "delete_file")
    assert resume(keys["carol"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["carol"].wait_for_status(session_id, "idle")["response"]["content"] == f"deleted {path_name}"


def test_a_grant_given_before_the_policy_file_does_not_run_a_tool_it_covers_after_a_restart(
    one_server: Callable[..., Server], sandbox: Path, tmp_path: Path
) -> None:
    """alice remembers ``delete_file`` for the session; a turn waits on ``wire_money`` with a
    ``delete_file`` after it; the server is restarted with a file saying only ops approves
    ``delete_file``. Once bob approves the wire, the replayed turn asks for the delete
    instead of running it on the old grant."""
    pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")
    store = f"sqlite:///{tmp_path / 'grants.db'}"
    keys = as_keys(one_server(CALLS, *KEYS_WITH_ROLES, "--store", store, env=env(sandbox)))
    session_id = start(keys["alice"], "delete_file a")
    approve(keys["alice"], session_id, remember="session")
    keys["alice"].wait_for_status(session_id, "idle")
    keys["alice"].send(session_id, "wire_money 1; delete_file b")
    [item] = pending(keys["alice"], session_id)
    assert item["payload"]["tool_name"] == "wire_money"
    assert keys["alice"].stop() == 0
    policy = tmp_path / "policy.toml"
    policy.write_text('[tool.delete_file]\napprovers = ["ops"]\n')
    keys = as_keys(one_server(CALLS, *KEYS_WITH_ROLES, "--store", store, "--approval-policy", str(policy), env=env(sandbox)))
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    [asked] = pending(keys["bob"], session_id)  # the grant no longer answers for delete_file
    assert asked["payload"]["tool_name"] == "delete_file" and asked["payload"]["approvers"] == ["ops"], asked
    assert ran(sandbox, "delete_file") == ["a"]
    assert resume(keys["dave"], session_id, asked["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["dave"].wait_for_status(session_id, "idle")["response"]["content"] == "wired 1 | deleted b"


@ONE_SHARED_SERVER
def test_a_quorum_from_the_policy_file_given_in_the_environment_covers_a_tool_that_declares_none(
    shared: Callable[..., Server], shared_sandbox: Path, sink: WebhookSink
) -> None:
    """``MOTUS_APPROVAL_POLICY`` (read by ``motus serve start`` as by the WSGI entry point)
    gives ``delete_file``, which declares nothing, a quorum of two finance keys: the
    ``interrupted`` webhook shows that policy, the first approval is recorded, the second
    runs it."""
    pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")
    path = shared_sandbox / "quorum-policy.toml"
    path.write_text('[tool.delete_file]\napprovers = ["finance"]\nquorum = 2\n')
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, env=env(shared_sandbox, MOTUS_APPROVAL_POLICY=str(path))))
    name = f"q{uuid.uuid4().int % 10**9}"
    session_id = keys["alice"].create_session()
    keys["alice"].send(session_id, f"delete_file {name}", webhook={"url": sink.url, "events": ["interrupted"]})
    [delivered] = sink.wait_for(1)
    [told] = delivered["body"]["interrupts"]
    assert told["payload"]["approvers"] == ["finance"] and told["payload"]["quorum"] == 2, told
    [item] = pending(keys["alice"], session_id)
    assert item["payload"]["quorum"] == 2 and item["payload"]["approvers"] == ["finance"] and item["approvals_needed"] == 2, item
    first = resume(keys["carol"], session_id, item["interrupt_id"], {"approved": True})
    assert first.status_code == 200 and first.json()["approvals_needed"] == 1, first.text
    assert name not in ran(shared_sandbox, "delete_file")
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    assert keys["bob"].wait_for_status(session_id, "idle")["response"]["content"] == f"deleted {name}"


def test_an_expiry_still_resolves_a_two_person_approval_that_has_one_approval(
    shared: Callable[..., Server], shared_sandbox: Path
) -> None:
    """A policy file gives ``send_money`` (which expires after 3 s) a quorum of two: bob's
    approval is recorded, nobody gives the second, and the expiry resolves it with its
    default, a rejection; the call never runs and the audit's timeout record lists bob."""
    pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")
    path = shared_sandbox / "expiring-quorum.toml"
    path.write_text('[tool.send_money]\nquorum = 2\n')
    keys = as_keys(shared(CALLS, *KEYS_WITH_ROLES, "--approval-policy", str(path),
                          env=env(shared_sandbox, MOTUS_TEST_APPROVAL_TIMEOUT="3")))
    amount = str(uuid.uuid4().int % 10**9)
    session_id = start(keys["alice"], f"send_money {amount}")
    [item] = pending(keys["alice"], session_id)
    assert resume(keys["bob"], session_id, item["interrupt_id"], {"approved": True}).json()["approvals_needed"] == 1
    reply = keys["alice"].wait_for_status(session_id, "idle")["response"]["content"]
    assert "Approval timed out after 3 s" in reply, reply
    assert amount not in ran(shared_sandbox, "send_money")
    audit = keys["alice"].get(f"/sessions/{session_id}/audit").json()
    assert [(r["kind"], r["by"]) for r in audit] == [("approval", "bob"), ("resolved", "timeout")], audit
    assert [a["by"] for a in audit[1]["approvals"]] == ["bob"], audit


def test_a_policy_file_nobody_could_satisfy_stops_the_start_with_one_line(tmp_path: Path) -> None:
    from tests.integration.serve.durability.test_durability import refused_start

    pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")
    path = tmp_path / "policy.toml"
    path.write_text('[tool.wire_money]\napprovers = ["treasury"]\n')
    code, output = refused_start([CALLS, *KEYS_WITH_ROLES, "--approval-policy", str(path)], tmp_path)
    assert code == 2, output
    assert "names the role 'treasury', which no API key that may write has" in output, output
    assert len(output.strip().splitlines()) == 1, output  # one line, no usage text
    code, output = refused_start([CALLS, "--approval-policy", str(path)], tmp_path, name="keyless")
    assert code == 2 and "needs API keys with roles" in output, output


# -- webhooks ------------------------------------------------------------------------------


def verify(secret: str, raw: bytes, headers: dict[str, str], tolerance: float = 300) -> bool:
    """The README's verification snippet, as a receiver writes it."""
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), headers.get("x-motus-signature", "").encode("utf-8", "replace")):
        return False
    sent = int(headers.get("x-motus-timestamp", "0"))
    return abs(time.time() - sent) <= tolerance and json.loads(raw).get("timestamp") == sent


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    sink = WebhookSink()
    yield sink
    sink.close()


@ONE_SERVER
def test_signed_webhooks_for_interrupts_verify_and_a_tampered_body_does_not(
    start_server: Callable[..., Server], sandbox: Path, sink: WebhookSink
) -> None:
    secret = "whsec-" + "x" * 24
    server = start_server(CALLS, env=env(sandbox, MOTUS_WEBHOOK_SECRET=secret))
    session_id = server.create_session()
    server.send(session_id, "delete_file a", webhook={"url": sink.url, "events": ["interrupted", "idle"]})
    [first] = sink.wait_for(1)
    assert first["body"]["status"] == "interrupted"
    [shown] = first["body"]["interrupts"]
    assert shown["payload"]["tool_name"] == "delete_file"
    approve(server, session_id)
    calls = sink.wait_for(2)
    assert calls[1]["body"]["status"] == "idle" and calls[1]["body"]["response"]["content"] == "deleted a"
    for call in calls:
        assert verify(secret, call["raw"], call["headers"])
        assert not verify("another secret", call["raw"], call["headers"])
        tampered = call["raw"].replace(b"delete_file" if b"delete_file" in call["raw"] else b"idle", b"XXXXX")
        assert tampered != call["raw"] and not verify(secret, tampered, call["headers"])
    assert secret not in server.log()


def test_the_default_webhook_events_stay_the_guides(shared: Callable[..., Server], shared_sandbox: Path, sink: WebhookSink) -> None:
    server = calls_server(shared, shared_sandbox)
    session_id = server.create_session()
    server.send(session_id, "delete_file a", webhook={"url": sink.url})
    approve(server, session_id)
    [call] = sink.wait_for(1)
    assert call["body"]["status"] == "idle" and "interrupts" not in call["body"]
    assert "x-motus-signature" not in call["headers"]
    bad = server.post(f"/sessions/{session_id}/messages", json={"content": "x", "webhook": {"url": sink.url, "events": ["sometimes"]}})
    assert bad.status_code in (400, 422) and "events" in bad.json()["detail"]


# -- the live turn -------------------------------------------------------------------------


def test_a_waiting_session_shows_the_message_and_what_the_turn_did(
    start_server: Callable[..., Server], sandbox: Path, fake_provider: FakeProvider
) -> None:
    fake_provider.script(
        openai_tool_calls(("call_1", "touch", {"path": "old_logs.txt"}), content="I will remove the old logs."),
        openai_text("Done."),
    )
    server = start_server(
        "tests.agents.durable:files", env=env(sandbox, MOTUS_TEST_PROVIDER_URL=fake_provider.url, OPENROUTER_API_KEY="")
    )
    session_id = start(server, "please delete old_logs.txt")
    [item] = pending(server, session_id)
    turn = server.get(f"/sessions/{session_id}").json()["turn"]
    assert turn["message"]["content"] == "please delete old_logs.txt" and turn["started_at"].endswith("Z")
    model, interrupt = turn["steps"]  # the gate asks before the tool's body starts
    assert model["kind"] == "model" and model["text"] == "I will remove the old logs."
    assert model["tool_calls"] == [{"name": "touch", "arguments": {"path": "old_logs.txt"}}]
    assert (interrupt["interrupt_id"], interrupt["status"]) == (item["interrupt_id"], "pending")
    assert interrupt["payload"]["tool_args"] == {"path": "old_logs.txt"}
    assert resume(server, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    done = server.wait_for_status(session_id, "idle")
    assert "turn" not in done and done["response"]["content"] == "Done."


# -- the approver's view: titles and the inbox's context (issue 28, item 1) -----------------

ALICE, BOB = "alice-secret-1", "bob-secret-2"


def test_each_inbox_item_says_what_its_turn_asked_and_who_asked(
    start_server: Callable[..., Server], sandbox: Path, fake_provider: FakeProvider
) -> None:
    """``bob``, who did not write the message, decides from the inbox alone: each item
    carries the session's title, the message that started the turn, who sent it and when,
    and what the agent said before it asked; items are numbered within their session."""
    fake_provider.script(
        openai_tool_calls(("call_1", "touch", {"path": "old_logs.txt"}), content="I will remove the old logs."),
        openai_text("Done."),
    )
    server = start_server(
        "tests.agents.durable:files", "--api-key", f"alice={ALICE}", "--api-key", f"bob={BOB}",
        env=env(sandbox, MOTUS_TEST_PROVIDER_URL=fake_provider.url, OPENROUTER_API_KEY=""),
    )
    alice = server.with_headers({"Authorization": f"Bearer {ALICE}"})
    session_id = start(alice, "please delete old_logs.txt\nand nothing else")
    [pending_item] = pending(alice, session_id)
    [item] = server.with_headers({"Authorization": f"Bearer {BOB}"}).get("/interrupts").json()
    assert item["interrupt_id"] == pending_item["interrupt_id"] and item["payload"]["tool_args"] == {"path": "old_logs.txt"}
    context = item["context"]
    assert context["session_title"] == "please delete old_logs.txt and nothing else"
    assert context["message"] == "please delete old_logs.txt\nand nothing else"
    assert context["sent_by"] == "alice" and context["sent_at"].endswith("Z") and context["sent_at"] <= item["created_at"]
    assert context["agent_text"] == "I will remove the old logs."
    assert (item["position"], item["of"]) == (1, 1)
    # Renamed while it waits: the inbox (kept until it changes) says the new title.
    assert alice.patch(f"/sessions/{session_id}", json={"title": "Clean the logs"}).status_code == 200
    [item] = server.with_headers({"Authorization": f"Bearer {BOB}"}).get("/interrupts").json()
    assert item["context"]["session_title"] == "Clean the logs"


@ONE_SERVER
def test_inbox_items_are_numbered_within_their_session_and_the_oldest_can_be_asked_for(start_server: Callable[..., Server], sandbox: Path) -> None:
    server = start_server(TWO, env=env(sandbox))
    first = start(server, "two at once")
    assert len(pending(server, first)) == 2
    second = start(server, "two more")
    assert len(pending(server, second)) == 2
    items = server.get("/interrupts").json()
    assert [(i["session_id"], i["position"], i["of"]) for i in items] == [(first, 1, 2), (first, 2, 2), (second, 1, 2), (second, 2, 2)]
    assert [i["context"]["session_title"] for i in items] == ["two at once"] * 2 + ["two more"] * 2
    assert all(i["context"]["sent_by"] == "anonymous" and i["context"]["agent_text"] is None for i in items)
    assert server.get("/interrupts", params={"type": "tool_approval"}).json() == []
    # ?limit: the oldest N, each numbered among all its session's; the header says how many wait.
    for limit in (1, 3, 4, 99):
        listed = server.get("/interrupts", params={"limit": limit})
        assert listed.status_code == 200 and listed.json() == items[:limit]
        assert listed.headers["X-Total-Count"] == "4"
    assert {i["type"] for i in items} == {"confirm"}
    assert server.get("/interrupts", params={"type": "confirm", "limit": 1}).headers["X-Total-Count"] == "4"
    assert server.get("/interrupts", params={"type": "tool_approval", "limit": 1}).headers["X-Total-Count"] == "0"
    for bad in ("0", "-1", "2.5", "two", "", "٣"):
        refused = server.get("/interrupts", params={"limit": bad})
        assert refused.status_code == 400 and "'limit' must be a whole number >= 1" in refused.json()["detail"], bad
    twice = server.get("/interrupts?limit=1&limit=2")
    assert twice.status_code == 400 and "'limit' given 2 times" in twice.json()["detail"]


def test_a_session_is_titled_by_its_first_message_or_by_its_client(shared: Callable[..., Server], shared_sandbox: Path) -> None:
    server = calls_server(shared, shared_sandbox)
    named = server.post("/sessions", json={"title": "Quarterly invoices"}).json()["session_id"]
    preloaded = server.post("/sessions", json={"state": [{"role": "system", "content": "be brief"},
                                                        {"role": "user", "content": "  hello\tthere  "}]}).json()["session_id"]
    untitled = server.create_session()
    sent = start(server, "x" * 100)  # (names no tool of the agent's: the turn fails, the title stays)
    server.wait_for_status(sent, "error")
    rows = {row["session_id"]: row for row in server.get("/sessions", params={"titles": "true"}).json()}
    assert rows[named]["title"] == "Quarterly invoices" and rows[preloaded]["title"] == "hello there"
    assert rows[untitled]["title"] is None and rows[sent]["title"] == "x" * 59 + "…"
    # The guide's list is unchanged without the flag.
    assert {tuple(sorted(row)) for row in server.get("/sessions").json()} == {("session_id", "status", "total_messages")}
    # A client renames a session; a later message does not take the title back.
    renamed = server.patch(f"/sessions/{sent}", json={"title": "Long x"})
    assert renamed.status_code == 200 and renamed.json() == {"session_id": sent, "total_messages": 0, "status": "error", "title": "Long x"}
    server.send(sent, "another message")
    server.wait_for_status(sent, "error")
    assert {row["session_id"]: row["title"] for row in server.get("/sessions", params={"titles": "1"}).json()}[sent] == "Long x"


@pytest.mark.parametrize("body, problem", [
    ({"title": ""}, "must not be empty"),
    ({"title": "   "}, "must not be empty"),
    ({"title": "x" * 201}, "at most 200 characters"),
    ({"title": "a\x1b[31mred"}, "U+001B"),
    ({"title": 7}, "title"),
    ({}, "title"),
])
@ONE_SHARED_SERVER
def test_a_bad_title_is_refused_naming_the_problem_and_changes_nothing(
    shared: Callable[..., Server], shared_sandbox: Path, body: dict, problem: str
) -> None:
    server = calls_server(shared, shared_sandbox)
    session_id = server.post("/sessions", json={"title": "kept"}).json()["session_id"]
    patched = server.patch(f"/sessions/{session_id}", json=body)
    assert patched.status_code == 422 and problem in patched.json()["detail"], patched.text
    if body:
        created = server.post("/sessions", json=body)
        assert created.status_code == 422 and problem in created.json()["detail"], created.text
    rows = {row["session_id"]: row["title"] for row in server.get("/sessions", params={"titles": "true"}).json()}
    assert rows[session_id] == "kept"
    assert server.patch(f"/sessions/{uuid.uuid4()}", json={"title": "x"}).status_code == 404
    assert server.get("/sessions", params={"titles": "maybe"}).status_code == 400


def test_a_title_survives_a_restart(one_server: Callable[..., Server], sandbox: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'titles.db'}"
    server = one_server(CALLS, "--store", store, env=env(sandbox))
    session_id = server.post("/sessions", json={"title": "before"}).json()["session_id"]
    assert server.patch(f"/sessions/{session_id}", json={"title": "after"}).status_code == 200
    server.stop()
    again = one_server(CALLS, "--store", store, env=env(sandbox))
    assert [row["title"] for row in again.get("/sessions", params={"titles": "true"}).json()] == ["after"]


@ONE_SERVER
def test_the_history_says_who_sent_each_message_when_asked(start_server: Callable[..., Server], sandbox: Path) -> None:
    """``GET /sessions/{id}/messages?senders=true``: each user message that started a turn
    names the key that sent it and when (for the web chat's "alice", not "You"); without the
    flag the history is the guide's, exactly."""
    server = start_server(CALLS, "--api-key", f"alice={ALICE}", "--api-key", f"bob={BOB}", env=env(sandbox))
    alice = server.with_headers({"Authorization": f"Bearer {ALICE}"})
    bob = server.with_headers({"Authorization": f"Bearer {BOB}"})
    session_id = start(alice, "delete_file a")
    [item] = pending(alice, session_id)
    started = alice.get(f"/sessions/{session_id}").json()["turn"]
    assert started["sent_by"] == "alice"
    assert resume(bob, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    alice.wait_for_status(session_id, "idle")
    bob.send(session_id, "delete_file b")
    [item] = pending(bob, session_id)
    assert resume(alice, session_id, item["interrupt_id"], {"approved": True}).status_code == 200
    bob.wait_for_status(session_id, "idle")

    plain = bob.get(f"/sessions/{session_id}/messages").json()
    assert all("sent_by" not in message and "sent_at" not in message for message in plain)
    told = bob.get(f"/sessions/{session_id}/messages", params={"senders": "true"}).json()
    users = [(m["content"], m.get("sent_by"), m.get("sent_at")) for m in told if m["role"] == "user"]
    assert [(content, by) for content, by, _ in users] == [("delete_file a", "alice"), ("delete_file b", "bob")]
    assert users[0][2] == started["started_at"] and users[0][2] < users[1][2]
    assert [{k: v for k, v in m.items() if k not in ("sent_by", "sent_at")} for m in told] == plain


def test_the_inbox_shows_what_the_agent_said_after_its_question(start_server: Callable[..., Server], sandbox: Path) -> None:
    """A model reply finished while the question waits is the item's agent_text at once, on
    every instance, and still once the inbox changes for another session. The kept inbox
    kept the old text: the reply published no inbox change, and on PostgreSQL (where the
    store says what changed) it was written with no event; it now comes with a "said" one."""
    server = start_server("tests.agents.approval:asks_while_thinking", env=env(sandbox))
    first = start(server, "think")
    [asked] = pending(server, first)
    for _ in range(2):  # each instance (with two) keeps the inbox as it is now
        [item] = server.get("/interrupts").json()
        assert item["interrupt_id"] == asked["interrupt_id"] and item["context"]["agent_text"] is None
    (sandbox / "release-thinking").touch()

    def said() -> bool:
        steps = server.get(f"/sessions/{first}").json()["turn"]["steps"]
        return any(step.get("text") == "Meanwhile I looked it up." for step in steps)

    wait_until(said, what="the model reply committed")
    shown = [server.get("/interrupts").json()[0]["context"]["agent_text"] for _ in range(2)]  # read at once, each instance
    assert shown == ["Meanwhile I looked it up."] * 2
    second = start(server, "think")  # another session's question: the inbox changes
    assert len(pending(server, second)) == 1
    for _ in range(2):
        shown_now = {i["session_id"]: i["context"]["agent_text"] for i in server.get("/interrupts").json()}
        assert shown_now[first] == "Meanwhile I looked it up."
