"""HTTP attacks on the session cache (``--session-cache``): many clients on a cache of one
session, so nearly every request reads its session back from the store and forgets another;
on SQLite and on two PostgreSQL instances. No request may fail, no approval may be lost or
count twice, every history and list must be exact."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import requests

from tests.conftest import Instances, Server, Starter

AGENT = "bench.agents:approve_once"
CYCLES = 6


def test_many_clients_with_a_cache_of_one(start_server: Callable[..., Server], tmp_path: Path) -> None:
    server = start_server(AGENT, "--store", f"sqlite:///{tmp_path}/s.sqlite3", "--session-cache", "1",
                          "--park-after", "0", "--workers", "2")
    cycles(server)


def test_two_postgres_instances_with_a_cache_of_one(start_server: Starter, pg_url: str) -> None:
    with start_server.together():
        a, b = (start_server(AGENT, "--store", pg_url, "--session-cache", "1", "--workers", "2", "--lease-seconds", "2")
                for _ in range(2))
    cycles(Instances.of(a, b))


def cycles(server: Server) -> None:
    sessions = [server.create_session() for _ in range(20)]
    statuses: Counter[tuple[str, int]] = Counter()
    problems: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def note(what: str, response: requests.Response, ok: tuple[int, ...]) -> None:
        with lock:
            statuses[(what, response.status_code)] += 1
            if response.status_code not in ok:
                problems.append(f"{what}: {response.status_code} {response.text[:300]}")

    def client(sid: str) -> None:
        try:
            for n in range(CYCLES):
                note("message", server.post(f"/sessions/{sid}/messages", json={"content": f"m{n}"}), (202,))
                body = server.wait_for_status(sid, "interrupted", timeout=60)
                item = body["interrupts"][0]
                note("resume", server.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": n}), (200,))
                again = server.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": n})
                note("late resume", again, (404,))
                if "already resumed" not in again.text:
                    with lock:
                        problems.append(f"late resume of {sid}: {again.text[:200]}")
                body = server.wait_for_status(sid, "idle", timeout=60)
        except Exception as exc:  # noqa: BLE001
            with lock:
                problems.append(f"client {sid}: {exc!r}")

    def noise(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            sid = rng.choice(sessions)
            note("get", server.get(f"/sessions/{sid}"), (200,))
            note("messages", server.get(f"/sessions/{sid}/messages"), (200,))
            note("inbox", server.get("/interrupts"), (200,))
            note("health", server.get("/health"), (200,))
            note("list", server.get("/sessions"), (200,))

    def churn() -> None:
        # create, read and delete throwaway sessions while others read them
        while not stop.is_set():
            sid = server.create_session()
            reader = threading.Thread(target=lambda: server.get(f"/sessions/{sid}"))
            reader.start()
            note("delete", server.delete(f"/sessions/{sid}"), (204,))
            reader.join()
            gone = server.get(f"/sessions/{sid}")
            note("deleted get", gone, (404,))

    workers = [threading.Thread(target=client, args=(sid,)) for sid in sessions]
    others = [threading.Thread(target=noise, args=(n,)) for n in range(4)] + [threading.Thread(target=churn) for _ in range(2)]
    for thread in workers + others:
        thread.start()
    for thread in workers:
        thread.join(300)
    stop.set()
    for thread in others:
        thread.join(60)
    for sid in sessions:
        messages = server.get(f"/sessions/{sid}/messages").json()
        if len(messages) != 2 * CYCLES:
            problems.append(f"{sid}: {len(messages)} messages, wanted {2 * CYCLES}")
        values = [m.get("user_params", {}).get("value") for m in messages if m.get("role") == "assistant"]
        if values != list(range(CYCLES)):
            problems.append(f"{sid}: approvals seen {values}")
    listed = {s["session_id"] for s in server.get("/sessions").json()}
    assert listed == set(sessions), f"listed {len(listed)}: extra {listed - set(sessions)}"
    assert server.get("/interrupts").json() in ([], {"interrupts": []}) or not server.get("/interrupts").json()
    assert not problems, f"{len(problems)} problems, e.g. {problems[:8]}; statuses {dict(statuses)}"


def test_a_get_racing_a_delete_of_a_forgotten_session_with_a_long_history(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """Reading a long history back from the store takes a while; GETs of a forgotten session
    sent around its DELETE: once the DELETE has answered, the session is gone everywhere (a
    copy read before the delete must never be held again)."""
    server = start_server("tests.agents:echo", "--store", f"sqlite:///{tmp_path}/s.sqlite3", "--session-cache", "1")
    history = [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y" * 200}] * 5000
    ghosts = []
    for attempt in range(8):
        response = server.post("/sessions", json={"state": history})
        assert response.status_code == 201, response.text
        sid = response.json()["session_id"]
        server.create_session()  # the cache holds one: sid is forgotten
        results: dict[str, object] = {"get": []}
        deleter = threading.Thread(target=lambda: results.__setitem__("delete", server.delete(f"/sessions/{sid}").status_code))
        readers = [threading.Thread(target=lambda: results["get"].append(server.get(f"/sessions/{sid}").status_code)) for _ in range(6)]
        for reader in readers[:3]:  # one after another: some read the row while the delete is under way
            reader.start()
        deleter.start()
        for reader in readers[3:]:
            reader.start()
        deleter.join(60)
        for reader in readers:
            reader.join(60)
        assert results["delete"] == 204
        after = server.get(f"/sessions/{sid}")
        listed = sid in {s["session_id"] for s in server.get("/sessions").json()}
        if after.status_code != 404:
            ghosts.append((attempt, results, after.status_code, listed))
    assert not ghosts, f"deleted sessions still answered (attempt, first results, GET after, listed): {ghosts}"
