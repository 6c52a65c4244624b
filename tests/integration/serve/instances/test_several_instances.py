"""Several server instances on one PostgreSQL database (issue 14, "Several instances" in
``shared/spec/durability.md``).

Every test runs real ``motus serve`` processes on a real, throwaway PostgreSQL cluster
(``tests/support/pg.py``; a fresh database per test). Nothing is routed by session: each request
goes to whichever instance the test picks. What ran is counted on disk by the agents of
``tests/agents/durable.py``; model calls go to the scripted loopback provider. A short
``--lease-seconds`` makes takeovers quick; nothing waits on a fixed sleep.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, Server, Starter, free_port, server_env, wait_until
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, Reply, openai_text, openai_tool_calls
from tests.integration.serve.durability.test_durability import FILES, agent_env, kill_server, lines, resume_ok, wait_idle
from tests.integration.serve.approvals.test_hitl import interrupted, resume, start_turn
from tests.support.pg import Cluster

LEASE = "2"


def instances(start_server: Starter, agent: str, url: str, count: int = 3, env: dict | None = None) -> list[Server]:
    """``count`` instances on ``url``, booted at once."""
    with start_server.together():
        return [start_server(agent, "--workers", "2", "--store", url, "--lease-seconds", LEASE, env=env) for _ in range(count)]


def test_any_instance_takes_any_request_and_a_long_poll_wakes_on_a_change_made_elsewhere(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    held = threading.Event()
    fake.script(Reply(openai_tool_calls(("call_1", "touch", {"path": "f1.txt"})), hold=held), openai_text("Done."))
    a, b, c = instances(start_server, FILES, pg_url, env=agent_env(sandbox, fake))
    assert a.get("/health").json()["store"] == "postgresql"

    created = a.post("/sessions", json={})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    assert b.post(f"/sessions/{sid}/messages", json={"content": "touch f1"}).status_code == 202

    # A long poll on C, begun while the turn (on B) waits on the model, wakes when B records
    # the interrupt.
    polled: dict = {}
    poll = threading.Thread(target=lambda: polled.update(c.wait(sid, timeout=20)))
    poll.start()
    wait_until(lambda: len(fake.requests) == 1, timeout=10, what="the model call")
    assert c.get(f"/sessions/{sid}").json()["status"] == "running"
    held.set()
    poll.join(timeout=25)
    assert not poll.is_alive()
    assert polled["status"] == "interrupted", polled
    [item] = polled["interrupts"]
    assert item["payload"] == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "f1.txt"}}

    # Resumed on A: B's worker gets the answer, the tool runs once, C sees the end.
    assert resume_ok(a, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
    body = wait_idle(c, sid, timeout=20)
    assert body["response"]["content"] == "Done."
    assert len(lines(sandbox / "ran-f1.txt")) == 1
    assert len(lines(sandbox / "pids")) == 1  # one run, no replay: the live worker got the value
    for server in (a, b, c):
        assert server.get(f"/sessions/{sid}/messages").json() == a.get(f"/sessions/{sid}/messages").json()
        assert [s["session_id"] for s in server.get("/sessions").json()] == [sid]
    assert [r["by"] for r in a.get(f"/sessions/{sid}/audit").json() if r["kind"] == "resolved"] == ["anonymous"]

    assert c.delete(f"/sessions/{sid}").status_code == 204
    for server in (a, b):
        assert server.get(f"/sessions/{sid}").status_code == 404


def test_kill_9_of_the_instance_holding_an_interrupted_turn_then_a_resume_elsewhere_completes_it(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    fake.script(*(openai_tool_calls((f"call_{n}", "touch", {"path": f"f{n}.txt"})) for n in range(3)))
    a, b, c = instances(start_server, FILES, pg_url, env=agent_env(sandbox, fake))
    sessions = [start_turn(a, f"touch ({n})") for n in range(3)]
    items = {sid: interrupted(a, sid)["interrupts"][0] for sid in sessions}
    kill_server(a)

    fake.script(*(openai_text("Done.") for _ in range(3)))
    for sid in sessions:  # at once, while A's lease may not have lapsed yet, and later
        assert resume_ok(b if sid != sessions[1] else c, sid, items[sid]["interrupt_id"], {"approved": True})["status"] == "running"
    for sid in sessions:
        assert wait_idle(c, sid, timeout=30)["response"]["content"] == "Done."
    for sid in sessions:
        path = items[sid]["payload"]["tool_args"]["path"]
        assert len(lines(sandbox / f"ran-{path}")) == 1, path  # each approved tool ran once


def test_kill_9_mid_model_call_another_instance_takes_the_turn_over_and_finishes_it_once(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    never = threading.Event()
    fake.script(Reply(openai_text("lost with its instance"), hold=never), openai_text("Finished elsewhere."))
    a, b, c = instances(start_server, FILES, pg_url, env=agent_env(sandbox, fake))
    sid = start_turn(a, "hello")
    wait_until(lambda: len(fake.requests) == 1, timeout=10, what="the model call")
    kill_server(a)
    never.set()

    body = wait_idle(b, sid, timeout=30)  # taken over within the lease, replayed, finished
    assert body["response"]["content"] == "Finished elsewhere."
    assert len(lines(sandbox / "pids")) == 2  # the first run, and exactly one takeover
    assert len(fake.requests) == 2
    assert c.get(f"/sessions/{sid}/messages").json()[-1]["content"] == "Finished elsewhere."


def test_two_resumes_of_one_interrupt_racing_on_two_instances_one_200_one_404(
    start_server: Starter, pg_url: str
) -> None:
    a, b = instances(start_server, "tests.agents:approval", pg_url, count=2)
    sessions = [start_turn(a if n % 2 else b, f"file-{n}") for n in range(50)]
    pending = {sid: interrupted(a, sid)["interrupts"][0]["interrupt_id"] for sid in sessions}
    outcomes: dict[str, list[int]] = {sid: [] for sid in sessions}
    lock = threading.Lock()

    def race(server: Server, sid: str, barrier: threading.Barrier) -> None:
        barrier.wait(timeout=10)
        response = resume(server, sid, pending[sid], {"approved": True})
        with lock:
            outcomes[sid].append(response.status_code)
        if response.status_code == 404:
            assert "not pending" in response.json()["detail"] or "not actively waiting" in response.json()["detail"], response.text

    for sid in sessions:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=race, args=(server, sid, barrier)) for server in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    assert all(sorted(codes) == [200, 404] for codes in outcomes.values()), outcomes
    for sid in sessions:
        body = wait_idle(b, sid, timeout=20)
        assert body["response"]["content"].startswith("approved=True"), body


def test_an_unreachable_database_at_start_is_one_line_and_exit_2() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "motus", "serve", "start", "tests.agents:echo", "--port", str(free_port()),
         "--store", f"postgresql://motus:secret-password@127.0.0.1:{port}/app"],
        cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1, error
    assert f"127.0.0.1:{port}" in error and "secret-password" not in error, error


def test_the_database_going_away_is_503_loses_nothing_and_the_instance_recovers(
    start_server: Starter, tmp_path: Path
) -> None:
    with Cluster() as cluster:
        url = cluster.create_database()
        [a] = instances(start_server, "tests.agents:approval", url, count=1)
        sid = start_turn(a, "keep-me")
        [item] = interrupted(a, sid)["interrupts"]

        cluster.kill()
        refused = a.post("/sessions", json={})
        assert refused.status_code == 503, refused.text
        assert "store" in refused.json()["detail"].lower()
        away = [a.get(f"/sessions/{sid}"), resume(a, sid, item["interrupt_id"], {"approved": True})]
        assert [r.status_code for r in away] == [503, 503]
        # A passing condition: each refusal says when to ask again, so clients back off on it.
        assert [r.headers.get("Retry-After") for r in [refused, *away]] == ["1", "1", "1"]

        cluster.restart()
        wait_until(lambda: a.post("/sessions", json={}).status_code == 201, timeout=30, what="the instance to recover")
        assert resume_ok(a, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
        assert wait_idle(a, sid, timeout=20)["response"]["content"].startswith("approved=True")
        a.stop()


def test_agents_do_not_see_the_database_url(start_server: Starter, pg_url: str) -> None:
    """Whoever can write to the database can answer interrupts: a URL given in MOTUS_STORE
    (with its password) is kept from the agents' processes, as the API keys are."""
    server = start_server("tests.agents:environment", "--workers", "1", env={"MOTUS_STORE": pg_url})
    assert server.get("/health").json()["store"] == "postgresql"
    sid = start_turn(server, "MOTUS_STORE")
    assert wait_idle(server, sid)["response"]["content"] == "MOTUS_STORE=None"


def test_a_resume_for_a_turn_whose_instance_died_replays_it_where_it_landed_without_waiting_for_the_lease(
    start_server: Starter, fake_provider: FakeProvider, pg_url: str, tmp_path: Path
) -> None:
    """With a lease of 120 s, only noticing that the dead instance has no connection to the
    database left can let the turn finish within the wait below: the resume takes it over."""
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    fake.script(openai_tool_calls(("call_1", "touch", {"path": "now.txt"})), openai_text("Done at once."))
    with start_server.together():
        a, b = (start_server(FILES, "--workers", "1", "--store", pg_url, "--lease-seconds", "120", env=agent_env(sandbox, fake))
                for _ in range(2))
    sid = start_turn(a, "touch now")
    [item] = interrupted(a, sid)["interrupts"]
    kill_server(a)
    assert resume_ok(b, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
    assert wait_idle(b, sid, timeout=20)["response"]["content"] == "Done at once."
    assert len(lines(sandbox / "ran-now.txt")) == 1
