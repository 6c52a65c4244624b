"""Attacks on several instances sharing one PostgreSQL database (issue 14; "Several
instances" in ``shared/spec/durability.md``).

Each test runs real ``motus serve`` processes on the throwaway cluster of ``tests/support/pg.py``.
Where a test needs a race to go one way, it arranges it (an instance with a long
``--lease-seconds`` renews and takes over only rarely; the database's own lease table
says when an instance is gone) rather than waiting on a clock.

Agents used only here are defined at the bottom of this module and served as
``tests.integration.serve.instances.test_instances_attacks:NAME``.
"""

from __future__ import annotations

import asyncio
import socket
import json
import os
import signal
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server, Starter, server_factory, wait_until
from tests.support.processes import alive
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, Reply, openai_text, openai_tool_calls
from tests.integration.serve.durability.test_durability import FILES, agent_env, kill_server, lines, resume_ok, wait_idle, wait_settled
from tests.integration.serve.approvals.test_hitl import interrupted, resume, start_turn

HERE = "tests.integration.serve.instances.test_instances_attacks"
LEASE = "2"
#: An instance that, in a test's time, neither lets its lease lapse nor looks for orphans
#: after its start (it does both every third of its lease).
NEVER = "600"


def serve(start_server: Starter, agent: str, url: str, *args: str, lease: str = LEASE, env: dict | None = None,
          health_timeout: float = 30.0) -> Server:
    return start_server(agent, "--workers", "2", "--store", url, "--lease-seconds", lease, "--shutdown-timeout", "3", *args,
                        env=env, health_timeout=health_timeout)


# -- the database, read directly ---------------------------------------------------------


def sql(url: str, query: str, *params: Any) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def owner_of(url: str, session_id: str) -> str | None:
    rows = sql(url, "SELECT owner FROM motus_sessions WHERE session_id = %s", session_id)
    return rows[0][0] if rows else None


def lease_lapsed(url: str, instance: str) -> bool:
    rows = sql(url, "SELECT expires < now() FROM motus_leases WHERE instance_id = %s", instance)
    return not rows or bool(rows[0][0])


def wait_lapsed(url: str, instance: str, timeout: float = 20.0) -> None:
    wait_until(lambda: lease_lapsed(url, instance), timeout=timeout, interval=0.05, what=f"the lease of {instance} to lapse")


# -- 1. a resume that lands on another instance after the owner died ------------------------


def test_a_resume_of_the_last_interrupt_after_the_owner_died_takes_the_turn_over_and_answers_200(
    start_server: Starter, pg_url: str
) -> None:
    """A is kill -9'd with an interrupted turn; its lease lapses; before any instance's
    periodic takeover runs, the resume reaches B: B takes the turn (``take=``) and replays
    it. The client must get 200 (the answer is committed and the turn runs)."""
    with start_server.together():
        a = serve(start_server, "tests.agents:approval", pg_url)
        b = serve(start_server, "tests.agents:approval", pg_url, lease=NEVER)
    sid = start_turn(a, "keep-me")
    [item] = interrupted(b, sid)["interrupts"]
    owner = owner_of(pg_url, sid)
    kill_server(a)
    wait_lapsed(pg_url, owner)

    answered = resume(b, sid, item["interrupt_id"], {"approved": True})
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "running"
    body = wait_idle(b, sid, timeout=20)
    assert body["response"]["content"].startswith("approved=True"), body


def test_a_turn_taken_over_by_a_resume_is_replayed_from_the_whole_stored_journal(
    start_server: Starter, pg_url: str, tmp_path: Path
) -> None:
    """Journal records written after the last version change (a step that ran while the
    turn waited on a person) do not change the row's version. B's copy of the turn was read
    before them; when a resume makes B take the turn over, B must replay it from the store's
    journal, not from its copy: the step's recorded result is returned, its body does not
    run again."""
    sandbox = tmp_path / "sandbox"
    env = agent_env(sandbox)
    with start_server.together():
        a = serve(start_server, f"{HERE}:interrupts_and_a_step", pg_url, env=env)
        b = serve(start_server, f"{HERE}:interrupts_and_a_step", pg_url, lease=NEVER, env=env)
    sid = start_turn(a, "go")
    first, second = interrupted(b, sid, count=2)["interrupts"]  # B's copy: two interrupts, no step yet
    (sandbox / "go").touch()  # now the step runs on A, while both interrupts wait
    wait_until(lambda: step_done(pg_url, sid), timeout=15, what="the step's record")
    [token] = lines(sandbox / "step-token")
    owner = owner_of(pg_url, sid)
    kill_server(a)
    wait_lapsed(pg_url, owner)

    assert resume_ok(b, sid, first["interrupt_id"], "one")["status"] == "interrupted"  # B takes the turn
    assert resume_ok(b, sid, second["interrupt_id"], "two")["status"] == "running"  # B replays it
    body = wait_idle(b, sid, timeout=20)
    assert lines(sandbox / "step-token") == [token], "the step's body ran again on replay"
    assert body["response"]["content"] == f"a='one' b='two' token={token}", body


def step_done(url: str, session_id: str) -> bool:
    rows = sql(url, "SELECT count(*) FROM motus_journal WHERE session_id = %s AND kind = 'step' AND done", session_id)
    return rows[0][0] == 1


# -- 2. the cache of a session deleted on another instance ------------------------------------


def test_a_session_deleted_elsewhere_can_be_created_again_with_its_id_on_any_instance(
    start_server: Starter, pg_url: str
) -> None:
    with start_server.together():
        a = serve(start_server, "tests.agents:echo", pg_url, "--allow-custom-ids")
        b = serve(start_server, "tests.agents:echo", pg_url, "--allow-custom-ids")
    sid = str(uuid.uuid4())
    assert a.put(f"/sessions/{sid}", json={}).status_code == 201
    assert b.delete(f"/sessions/{sid}").status_code == 204
    assert b.get(f"/sessions/{sid}").status_code == 404
    assert sql(pg_url, "SELECT count(*) FROM motus_sessions WHERE session_id = %s", sid) == [(0,)]

    again = a.put(f"/sessions/{sid}", json={})
    assert again.status_code == 201, again.text


def test_sessions_deleted_elsewhere_do_not_count_against_max_sessions(start_server: Starter, pg_url: str) -> None:
    with start_server.together():
        a = serve(start_server, "tests.agents:echo", pg_url, "--max-sessions", "2")
        b = serve(start_server, "tests.agents:echo", pg_url, "--max-sessions", "2")
    sessions = [a.create_session() for _ in range(2)]
    for sid in sessions:
        assert b.delete(f"/sessions/{sid}").status_code == 204
    assert sql(pg_url, "SELECT count(*) FROM motus_sessions") == [(0,)]
    wait_until(lambda: b.get("/health").json()["total_sessions"] == 0, timeout=10, what="B to forget them")

    created = a.post("/sessions", json={})
    assert created.status_code == 201, created.text
    assert a.get("/health").json()["total_sessions"] == 1


def test_a_session_deleted_and_created_again_elsewhere_is_not_served_from_the_old_copy(
    start_server: Starter, pg_url: str
) -> None:
    """Delete, then create again with the same id, on B: the new row has version 1, as the
    old one had. A must serve the new session, not its copy of the old one."""
    with start_server.together():
        a = serve(start_server, "tests.agents:echo", pg_url, "--allow-custom-ids")
        b = serve(start_server, "tests.agents:echo", pg_url, "--allow-custom-ids")
    sid = str(uuid.uuid4())
    old = [{"role": "user", "content": "the old session"}]
    new = [{"role": "user", "content": "the new session"}]
    assert a.put(f"/sessions/{sid}", json={"state": old}).status_code == 201
    assert a.get(f"/sessions/{sid}/messages").json() == old
    assert b.delete(f"/sessions/{sid}").status_code == 204
    assert b.put(f"/sessions/{sid}", json={"state": new}).status_code == 201
    assert b.get(f"/sessions/{sid}/messages").json() == new

    assert a.get(f"/sessions/{sid}/messages").json() == new


def test_sessions_the_ttl_sweep_removed_on_another_instance_are_forgotten_everywhere(
    start_server: Starter, pg_url: str
) -> None:
    """Every instance sweeps; one deletes each expired session, the others' deletes find the
    row gone (``StaleSession``). Those must forget it too, not keep it (and count it in
    ``total_sessions`` and against ``--max-sessions``) until someone happens to read it."""
    with start_server.together():
        a = serve(start_server, "tests.agents:echo", pg_url, "--ttl", "1")
        b = serve(start_server, "tests.agents:echo", pg_url, "--ttl", "1")
    for _ in range(4):
        a.create_session()
    wait_until(lambda: sql(pg_url, "SELECT count(*) FROM motus_sessions") == [(0,)], timeout=20, what="the sweep")
    for server in (a, b):
        wait_until(lambda: server.get("/health").json()["total_sessions"] == 0, timeout=10, what="the instance to forget them")


# -- 3. hostile input through the PostgreSQL path ---------------------------------------------

@pytest.fixture(scope="module")
def pair(pg_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Server, Server]]]:
    """``pair(agent, *args)``: two instances on one database of their own, for the whole
    module, one pair per agent and arguments. For the hostile-input tests below: each works
    on sessions of its own and reads nothing server-wide, so they need not pay for two
    starts each (they were 21 tests and 40 starts)."""
    made: dict[tuple[str, tuple[str, ...]], tuple[Server, Server]] = {}
    with server_factory(tmp_path_factory.mktemp("pairs"), shared=True) as start:

        def get(agent: str, *args: str) -> tuple[Server, Server]:
            key = (agent, args)
            if key not in made:
                url = pg_cluster.create_database()
                with start.together():
                    made[key] = (serve(start, agent, url, *args), serve(start, agent, url, *args))
            for server in made[key]:
                assert server.process.poll() is None, f"a shared instance exited:\n{server.log()}"
            return made[key]

        yield get


ODD = ["\u0000", "a\u0000b", "\ud800", "x\udfff\ud800y", "\U0001F600\u2028", "'; DROP TABLE motus_sessions; --", "é" * 100_000]
ODD_IDS = ["nul", "inner-nul", "lone-surrogate", "reversed-pair", "emoji-and-separator", "sql", "long"]


@pytest.mark.parametrize("path", ["%00", "a%00b", "%ED%A0%80", "x" * 2000, "%F0%9F%98%80"], ids=["nul", "inner-nul", "encoded-surrogate", "long", "emoji"])
def test_odd_session_ids_in_the_path_are_404_on_every_instance(pair: Callable[..., tuple[Server, Server]], path: str) -> None:
    a, b = pair("tests.agents:approval")
    for server in (a, b):
        for method, route, body in [
            ("GET", "", None), ("DELETE", "", None), ("GET", "/messages", None), ("GET", "/events", None),
            ("POST", "/messages", {"content": "hi"}), ("POST", "/resume", {"interrupt_id": "x", "value": 1}),
            ("GET", "/grants", None), ("GET", "/audit", None),
        ]:
            response = requests.request(method, f"{server.url}/sessions/{path}{route}", json=body, timeout=30)
            assert response.status_code == 404, (method, route, response.status_code, response.text)
    assert a.get("/health").status_code == 200


@pytest.mark.parametrize("text", ODD, ids=ODD_IDS)
def test_odd_strings_in_a_message_and_its_user_params_round_trip_on_every_instance(
    pair: Callable[..., tuple[Server, Server]], text: str
) -> None:
    a, b = pair("tests.agents:echo")
    sid = a.create_session()
    params = {"k": text, "nested": [text, {"k": text}]}  # odd keys: see the next test
    assert b.post(f"/sessions/{sid}/messages", json={"content": text, "user_params": params}).status_code == 202
    body = wait_idle(a, sid)
    assert body["response"]["content"] == f"echo: {text}"
    on_a = a.get(f"/sessions/{sid}/messages").json()
    assert on_a == b.get(f"/sessions/{sid}/messages").json()
    assert on_a[0]["content"] == text and on_a[0]["user_params"] == params


@pytest.mark.parametrize("text", ["a\u0000b", "\ud800"], ids=["nul", "lone-surrogate"])
def test_odd_strings_in_an_interrupt_payload_are_stored_and_shown_on_every_instance(
    pair: Callable[..., tuple[Server, Server]], text: str
) -> None:
    """The approval agent puts the message's content in its interrupt's payload
    (``tool_args.path``). The interrupt must be stored (or the turn fail at once), not leave
    the session ``running`` while its worker's message is retried for a minute."""
    a, b = pair("tests.agents:approval", "--shutdown-timeout", "2")
    sid = a.create_session()
    a.send(sid, text)
    body = wait_settled(b, sid, timeout=10)
    assert body["status"] == "interrupted", body
    [item] = body["interrupts"]
    assert item["payload"]["tool_args"] == {"path": text}
    assert a.get(f"/sessions/{sid}").json()["interrupts"] == body["interrupts"]
    resume_ok(a, sid, item["interrupt_id"], {"approved": True, "note": text})
    assert wait_idle(b, sid)["response"]["content"].startswith("approved=True")


@pytest.mark.parametrize(
    "params", [{"\ud800": 1}, {"nested": {"\ud800": 1}}], ids=["top-level-key", "nested-key"]
)
def test_user_params_with_a_lone_surrogate_in_a_key_are_refused_at_the_door(pair: Callable[..., tuple[Server, Server]], params: dict) -> None:
    """Found by attacking (not PostgreSQL's: memory and SQLite alike): the worker dumps the
    new history as JSON, which cannot keep half a surrogate pair in a dict *key* (values are
    kept, escaped). A top-level key came back as three U+FFFD; a nested one killed the worker
    ("Worker process exited unexpectedly"). Such a key is now a 422 naming it, and nothing
    changes; a lone surrogate in a value still round-trips."""
    a, _ = pair("tests.agents:echo")
    sid = a.create_session()
    refused = a.post(f"/sessions/{sid}/messages", json={"content": "hi", "user_params": params})
    assert refused.status_code == 422 and "lone surrogate" in refused.json()["detail"], refused.text
    assert a.get(f"/sessions/{sid}").json()["status"] == "idle"
    assert a.post(f"/sessions/{sid}/messages", json={"content": "hi", "user_params": {"k": "\ud800"}}).status_code == 202
    assert wait_idle(a, sid)["response"]["content"] == "echo: hi"
    assert a.get(f"/sessions/{sid}/messages").json()[0]["user_params"] == {"k": "\ud800"}


# -- 4. races between delete, resume, expiry and takeover -------------------------------------


def test_a_delete_on_another_instance_stops_the_owner_s_worker_mid_model_call_and_nothing_comes_back(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    held = threading.Event()
    fake.script(Reply(openai_text("from a deleted session"), hold=held), openai_text("never asked for"))
    env = agent_env(sandbox, fake)
    with start_server.together():
        a, b, c = (serve(start_server, FILES, pg_url, env=env) for _ in range(3))
    sid = start_turn(a, "hello")
    wait_until(lambda: len(fake.requests) == 1, timeout=10, what="the model call")
    [worker] = [int(pid) for pid in lines(sandbox / "pids")]
    assert b.delete(f"/sessions/{sid}").status_code == 204
    wait_until(lambda: not alive(worker), timeout=15, what="A to stop the deleted session's worker")
    held.set()

    for server in (a, b, c):
        assert server.get(f"/sessions/{sid}").status_code == 404
        assert sid not in [s["session_id"] for s in server.get("/sessions").json()]
        wait_until(lambda: server.get("/health").json()["live_turns"] == 0, timeout=10, what="no live turn")
    assert sql(pg_url, "SELECT count(*) FROM motus_sessions WHERE session_id = %s", sid) == [(0,)]
    assert sql(pg_url, "SELECT count(*) FROM motus_journal WHERE session_id = %s", sid) == [(0,)]
    assert len(fake.requests) == 1 and len(lines(sandbox / "pids")) == 1  # not replayed anywhere


def test_resume_on_one_instance_and_delete_on_another_at_once(start_server: Starter, pg_url: str) -> None:
    with start_server.together():
        a, b, c = (serve(start_server, "tests.agents:approval", pg_url) for _ in range(3))
    sessions = [start_turn(a, f"file-{n}") for n in range(12)]
    pending = {sid: interrupted(c, sid)["interrupts"][0]["interrupt_id"] for sid in sessions}
    outcomes: dict[str, dict[str, int]] = {sid: {} for sid in sessions}

    def race(sid: str, barrier: threading.Barrier, what: str) -> None:
        barrier.wait(timeout=10)
        if what == "resume":
            outcomes[sid][what] = resume(b, sid, pending[sid], {"approved": True}).status_code
        else:
            outcomes[sid][what] = c.delete(f"/sessions/{sid}").status_code

    for sid in sessions:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=race, args=(sid, barrier, what)) for what in ("resume", "delete")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    for sid, codes in outcomes.items():
        assert codes["delete"] == 204, codes
        assert codes["resume"] in (200, 404), codes
    for server in (a, b, c):
        for sid in sessions:
            assert server.get(f"/sessions/{sid}").status_code == 404
        wait_until(lambda: server.get("/health").json()["live_turns"] == 0, timeout=15, what="no live turn")
        wait_until(lambda: server.get("/health").json()["running_workers"] == 0, timeout=15, what="no busy slot")
    assert sql(pg_url, "SELECT count(*) FROM motus_sessions") == [(0,)]


def test_an_interrupt_expiring_on_its_owner_while_another_instance_resumes_it_is_resolved_once(
    start_server: Starter, pg_url: str
) -> None:
    with start_server.together():
        a = serve(start_server, "tests.agents.approval:expiring", pg_url, "--workers", "12")
        b = serve(start_server, "tests.agents.approval:expiring", pg_url)
    sessions = [start_turn(a, "1.5") for _ in range(10)]
    items = {sid: interrupted(b, sid)["interrupts"][0] for sid in sessions}
    codes: dict[str, int] = {}

    def race(sid: str) -> None:
        expires = datetime.fromisoformat(items[sid]["expires_at"].replace("Z", "+00:00")).timestamp()
        wait_until(lambda: time.time() >= expires - 0.002, timeout=10, interval=0.0005, what="the expiry")
        codes[sid] = resume(b, sid, items[sid]["interrupt_id"], {"choice": "person"}).status_code

    threads = [threading.Thread(target=race, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for sid in sessions:
        body = wait_idle(a, sid, timeout=20)
        resolved = [r for r in b.get(f"/sessions/{sid}/audit").json() if r["kind"] == "resolved"]
        assert len(resolved) == 1, resolved
        if codes[sid] == 200:
            assert resolved[0]["by"] == "anonymous" and body["response"]["content"] == "got {'choice': 'person'}", body
        else:
            assert codes[sid] == 404, codes
            assert resolved[0]["by"] == "timeout" and body["response"]["content"] == "got {'choice': 'default'}", body


@pytest.mark.parametrize("killed", [1, 2], ids=["one-of-three", "two-of-three"])
def test_turns_of_killed_instances_are_each_replayed_exactly_once(
    start_server: Starter, pg_url: str, tmp_path: Path, killed: int
) -> None:
    """Ten running turns on each instance to be killed, all waiting on a gate; kill -9; the
    survivors race to take them over. Each turn runs twice in all: its first run and one
    replay."""
    sandbox = tmp_path / "sandbox"
    env = agent_env(sandbox)
    with start_server.together():
        servers = [serve(start_server, f"{HERE}:gated_turn", pg_url, "--workers", "20", env=env) for _ in range(3)]
    doomed, survivors = servers[:killed], servers[killed:]
    names = {start_turn(server, f"t{index}-{n}"): f"t{index}-{n}" for index, server in enumerate(doomed) for n in range(10)}
    wait_until(lambda: all(len(lines(sandbox / f"runs-{name}")) == 1 for name in names.values()), timeout=20, what="every first run")
    kill_server(*doomed)  # together: a doomed one left alive past the lease would take the others' turns
    wait_until(lambda: all(len(lines(sandbox / f"runs-{name}")) == 2 for name in names.values()), timeout=30, what="every replay")
    (sandbox / "go").touch()
    for sid, name in names.items():
        assert wait_idle(survivors[-1], sid, timeout=30)["response"]["content"] == f"done {name}"
    assert {name: len(lines(sandbox / f"runs-{name}")) for name in names.values()} == {name: 2 for name in names.values()}


def test_the_paused_instance_does_not_go_on_with_a_turn_taken_over_while_it_was_stopped(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    """Split brain: A is SIGSTOPped while the body of an approved gated tool runs in its
    worker (a process of its own, which goes on). A's lease lapses; B takes the turn over
    and replays it (the tool's outcome is unknown: it is not run again) to its end. A is
    SIGCONTed: nothing it does may show: the tool ran once, one webhook, one ``message``
    event, and every instance shows B's result."""
    from tests.unit.serve.test_webhooks import Receiver

    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    env = agent_env(sandbox, fake)
    fake.script(openai_tool_calls(("call_h", "hold", {"name": "x"})))
    with start_server.together():
        a = serve(start_server, FILES, pg_url, env=env)
        b = serve(start_server, FILES, pg_url, env=env)
    receiver = Receiver()
    try:
        sid = a.create_session()
        hook = {"url": f"http://127.0.0.1:{receiver.port}/hook"}
        assert a.post(f"/sessions/{sid}/messages", json={"content": "hold x", "webhook": hook}).status_code == 202
        [item] = interrupted(a, sid)["interrupts"]
        owner = owner_of(pg_url, sid)
        resume_ok(a, sid, item["interrupt_id"], {"approved": True})
        wait_until(lambda: lines(sandbox / "started-x"), timeout=15, what="the tool body to start")

        fake.script(openai_text("B could not confirm it ran."), openai_text("A's worker goes on."))
        os.killpg(a.process.pid, signal.SIGSTOP)
        try:
            wait_lapsed(pg_url, owner)
            body = wait_idle(b, sid, timeout=30)
            assert body["response"]["content"] == "B could not confirm it ran."
            (sandbox / "release-x").touch()  # A's worker finishes the body, and goes on
            wait_until(lambda: lines(sandbox / "done-x"), timeout=15, what="the body in A's worker to finish")
        finally:
            os.killpg(a.process.pid, signal.SIGCONT)
        wait_until(lambda: a.get("/health").status_code == 200, timeout=15, what="A to answer again")
        wait_until(lambda: a.get("/health").json()["live_turns"] == 0, timeout=15, what="A to drop the turn")

        expected = b.get(f"/sessions/{sid}/messages").json()
        assert expected[-1]["content"] == "B could not confirm it ran."
        for server in (a, b):
            view = server.get(f"/sessions/{sid}").json()
            assert view["status"] == "idle" and view["response"]["content"] == "B could not confirm it ran.", view
            assert server.get(f"/sessions/{sid}/messages").json() == expected
        assert len(lines(sandbox / "started-x")) == 1  # never run again
        kinds = [row[0] for row in sql(pg_url, "SELECT kind FROM motus_events WHERE session_id = %s ORDER BY seq", sid)]
        assert kinds.count("message") == 1, kinds
        wait_until(lambda: len(receiver.requests) >= 1, timeout=15, what="B's webhook")
        again = b.post(f"/sessions/{sid}/messages", json={"content": "hello again"})  # the session is usable
        assert again.status_code == 202, again.text
        fake.script(openai_text("again"))
        assert wait_idle(a, sid, timeout=20)["response"]["content"] in ("again", "A's worker goes on.")
        assert len(receiver.requests) == 1, [r.path for r in receiver.requests]
    finally:
        receiver.close()


# -- 5. the database going away ----------------------------------------------------------------


def test_a_database_restart_with_resumes_on_every_instance_loses_nothing_acknowledged(
    start_server: Starter, tmp_path: Path
) -> None:
    from tests.support.pg import Cluster

    with Cluster() as cluster:
        url = cluster.create_database()
        with start_server.together():
            a, b = (serve(start_server, "tests.agents:approval", url) for _ in range(2))
        sessions = [start_turn(a if n % 2 else b, f"keep-{n}") for n in range(6)]
        pending = {sid: interrupted(a, sid)["interrupts"][0]["interrupt_id"] for sid in sessions}
        cluster.kill()
        for n, sid in enumerate(sessions[:3]):
            refused = resume(a if n % 2 else b, sid, pending[sid], {"approved": False})
            assert refused.status_code == 503, refused.text
        cluster.restart()
        for server in (a, b):
            wait_until(lambda: server.post("/sessions", json={}).status_code == 201, timeout=30, what="the instance to recover")
        for n, sid in enumerate(sessions):
            assert resume_ok(b if n % 2 else a, sid, pending[sid], {"approved": True})["status"] == "running"
        for sid in sessions:
            body = wait_idle(a, sid, timeout=30)
            assert body["response"]["content"].startswith("approved=True"), body
            assert [r["value"] for r in b.get(f"/sessions/{sid}/audit").json() if r["kind"] == "resolved"] == [{"approved": True}]
        for server in (a, b):
            server.stop()


def test_after_a_database_outage_longer_than_the_lease_no_live_turn_changes_instance(
    start_server: Starter, tmp_path: Path
) -> None:
    """No instance died: the database did, for longer than ``--lease-seconds``, so every
    lease lapsed. When it is back, the first instance to look for orphans must not take the
    live turns of the others (whose workers are running fine): that stops them and runs each
    turn again (an approved gated tool inside its body would become "outcome unknown")."""
    from tests.support.pg import Cluster

    sandbox = tmp_path / "sandbox"
    env = agent_env(sandbox)
    with Cluster() as cluster:
        url = cluster.create_database()
        with start_server.together():
            a, b = (serve(start_server, f"{HERE}:gated_turn", url, env=env) for _ in range(2))
        names = {start_turn(server, f"{tag}{n}"): f"{tag}{n}" for server, tag in ((a, "a"), (b, "b")) for n in range(2)}
        wait_until(lambda: all(len(lines(sandbox / f"runs-{name}")) == 1 for name in names.values()), timeout=20, what="first runs")
        cluster.kill()
        for server in (a, b):  # four renewals (a third of a lease apart) failed on each: every lease has lapsed
            wait_until(lambda: server.log().count("could not renew this instance's lease") >= 4, timeout=60, what="failed renewals")
        cluster.restart()
        for server in (a, b):
            wait_until(lambda: server.post("/sessions", json={}).status_code == 201, timeout=30, what="the instance to recover")
        (sandbox / "go").touch()
        for sid, name in names.items():
            assert wait_idle(a, sid, timeout=30)["response"]["content"] == f"done {name}"
        runs = {name: len(lines(sandbox / f"runs-{name}")) for name in names.values()}
        for server in (a, b):
            server.stop()
    assert runs == {name: 1 for name in names.values()}, runs


# -- 6. event streams across instances ---------------------------------------------------------


class Stream:
    """``GET /events`` read in a thread: every (id, event, data) in order."""

    def __init__(self, server: Server, after: int | None = None) -> None:
        headers = {} if after is None else {"Last-Event-ID": str(after)}
        self.response = requests.get(f"{server.url}/events", headers=headers, stream=True, timeout=60)
        assert self.response.status_code == 200, self.response.text
        self.events: list[tuple[int, str, dict]] = []
        self._thread = threading.Thread(target=self._read, name="sse-reader")
        self._thread.start()

    def _read(self) -> None:
        seq, kind, data = None, None, None
        try:
            for raw in self.response.iter_lines(decode_unicode=True):
                if raw.startswith("id: "):
                    seq = int(raw[4:])
                elif raw.startswith("event: "):
                    kind = raw[7:]
                elif raw.startswith("data: "):
                    data = json.loads(raw[6:])
                elif raw == "" and kind is not None:
                    self.events.append((seq, kind, data))
                    seq, kind, data = None, None, None
        except (requests.RequestException, AttributeError, ValueError, OSError):
            pass  # closed by the test

    def seqs(self) -> list[int]:
        return [seq for seq, kind, _ in self.events if kind not in ("ready", "reset")]

    def close(self) -> None:
        try:  # unblocks the reader's recv (closing the response from here would not)
            self.response.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
        except (AttributeError, OSError):
            pass
        self._thread.join(timeout=10)
        self.response.close()
        assert not self._thread.is_alive()


def test_streams_on_every_instance_see_every_event_once_in_order_while_all_instances_write(
    start_server: Starter, pg_url: str
) -> None:
    with start_server.together():
        servers = [serve(start_server, "tests.agents:echo", pg_url, "--workers", "4") for _ in range(3)]
    streams = [Stream(server, after=0) for server in servers]
    try:
        def work(server: Server, n: int) -> None:
            for index in range(n):
                sid = server.create_session()
                server.send(sid, f"m{index}")
                if index % 3 == 0:
                    assert server.delete(f"/sessions/{sid}").status_code in (204, 409)

        threads = [threading.Thread(target=work, args=(server, 25)) for server in servers for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for server in servers:
            for view in server.get("/sessions").json():
                if view["status"] == "running":
                    wait_settled(server, view["session_id"], timeout=20)
        stored = [row[0] for row in sql(pg_url, "SELECT seq FROM motus_events ORDER BY seq")]
        assert stored == list(range(1, len(stored) + 1))  # no hole in the counter
        for stream in streams:
            wait_until(lambda: stream.seqs()[-1:] == stored[-1:], timeout=20, what="the stream to catch up")
            assert stream.seqs() == stored
    finally:
        for stream in streams:
            stream.close()


def test_reconnecting_to_another_instance_with_the_last_event_id_just_seen_is_neither_a_reset_nor_a_repeat(
    start_server: Starter, pg_url: str
) -> None:
    """A client has seen event N (from B, or any instance that has it), then its connection
    moves to C (no sticky routing) and resumes with ``Last-Event-ID: N``. C's listener may
    not have pulled N yet: C answers ``reset`` ("event N was never issued by this server")
    and then sends again the events up to N the client already had. A race, made likely by
    keeping C's listener busy."""
    with start_server.together():
        b = serve(start_server, "tests.agents:echo", pg_url)
        c = serve(start_server, "tests.agents:echo", pg_url)
    problems = []
    # Sessions created on B in bursts keep C's listener busy reading them in while the client
    # reconnects; the bursts go on until the last attempt (up to 150 sessions each).
    attempts_done = threading.Event()

    def keep_creating() -> None:
        for _ in range(150):
            if attempts_done.is_set():
                return
            b.create_session()

    burst = [threading.Thread(target=keep_creating) for _ in range(8)]
    for thread in burst:
        thread.start()
    try:
        for attempt in range(40):
            b.create_session()
            [(newest,)] = sql(pg_url, "SELECT max(seq) FROM motus_events")
            stream = Stream(c, after=newest)
            try:
                b.create_session()  # one more event, after the id the client gave
                wait_until(lambda: stream.events, timeout=10, what="the first event")
                seq, kind, _ = stream.events[0]
                if kind == "reset" or seq <= newest:
                    problems.append((attempt, newest, stream.events[:2]))
            finally:
                stream.close()
    finally:
        attempts_done.set()
        for thread in burst:
            thread.join(timeout=120)
    assert not problems, problems


# -- agents served by these tests --------------------------------------------------------------


async def interrupts_and_a_step(message: Any, state: list) -> Any:
    """Two interrupts and, gathered with them, a step that runs once ``$MOTUS_EXAMPLE_DIR/go``
    exists (while both interrupts wait)."""
    import motus
    from motus.models import ChatMessage
    from motus.serve.interrupt import interrupt
    from tests.agents.durable import issue_token, record_pid, sandbox

    record_pid()

    async def later() -> str:
        while not (sandbox() / "go").exists():
            await asyncio.sleep(0.01)
        return await motus.step("issue token", issue_token, "step-token")

    a, b, token = await asyncio.gather(interrupt({"type": "a"}), interrupt({"type": "b"}), later())
    response = ChatMessage.assistant_message(content=f"a={a!r} b={b!r} token={token}")
    return response, state + [message, response]


async def gated_turn(message: Any, state: list) -> Any:
    """Writes its pid to ``runs-<content>`` each time the turn (re)starts, then waits until
    ``$MOTUS_EXAMPLE_DIR/go`` exists."""
    from motus.models import ChatMessage
    from tests.agents.durable import _append, sandbox

    _append(f"runs-{message.content}", str(os.getpid()))
    while not (sandbox() / "go").exists():
        await asyncio.sleep(0.01)
    response = ChatMessage.assistant_message(content=f"done {message.content}")
    return response, state + [message, response]


def test_after_a_database_restart_a_lost_lease_is_renewed_at_once_not_when_the_pool_reconnects() -> None:
    """Why the outage test above could fail under load: after a restart, the connection pool
    comes back on its own backoff schedule (measured: 1.0 and 2.8 s for two pools after the
    same 12 s outage, while a new connection worked after 0.01 s), so two instances renewed
    their leases seconds apart and the first took the other's live turns. A lost lease is
    renewed on a connection of its own."""
    import psycopg

    from motus.serve.store.postgres import PostgresStore
    from tests.support.pg import Cluster

    with Cluster() as cluster:
        url = cluster.create_database()
        store = PostgresStore(url, lease_seconds=2)
        store.open()
        try:
            cluster.kill()
            with pytest.raises(Exception):
                store.renew_lease()  # the pooled connection is dead
            cluster.restart()
            store._pool.close()  # a pool still waiting out its backoff: it gives no connection
            with pytest.raises(Exception):
                store.renew_lease()
            store.renew_lease(fresh=True)  # does not need the pool
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                [(left,)] = conn.execute(
                    "SELECT extract(epoch FROM expires - now()) FROM motus_leases WHERE instance_id = %s", (store.instance_id,)
                ).fetchall()
            assert 1.0 < float(left) <= 2.0, left  # renewed just now, for a whole lease
        finally:
            store.close()
