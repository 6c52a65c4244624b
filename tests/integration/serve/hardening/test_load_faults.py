"""Load and faults against one server for about 20 seconds (issue 10).

Many clients at once drive sessions through every kind of turn the ``dispatch`` agent has
(echo, approvals, two gathered gates, crashes, hard exits, hangs cut by ``--timeout``),
while others delete sessions at random, resume interrupts that may be gone, and resume the
same interrupt twice. With a durable store and ``--park-after 0.2`` the turns also park and
replay under that churn. Afterwards: no 5xx was ever answered, every session settles (none
is stuck ``running``), ``/health`` shows no compute slot taken and no live turn left, and
the server stops with no process left behind (the fixture checks that).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from tests.conftest import Server, wait_until
from tests.support import http

DURATION = 20.0
CLIENTS = 8
KINDS = ["echo hi", "approval a.txt", "two", "crash", "exit", "hang", "question"]


def client_loop(server: Server, seed: int, stop: threading.Event, seen: Counter, errors: list[str], sessions: list[str], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    client = requests.Session()
    url = server.url

    def call(method: str, path: str, one_shot: bool = False, **kwargs: object) -> requests.Response | None:
        # The racing second resume goes on a connection of its own, closed after it. On the
        # session's pool it would leave a second connection idle until the next race, and one
        # idle for the server's keep-alive (5 s) can be closed just as a POST is sent on it: a
        # reset no client avoids without retrying the POST (seen once in CI).
        try:
            via = http.request if one_shot else client.request  # http: a connection a request
            response = via(method, url + path, timeout=30, **kwargs)  # type: ignore[arg-type, operator]
        except requests.RequestException as exc:
            errors.append(f"{method} {path}: {type(exc).__name__}: {exc}")
            return None
        with lock:
            seen[response.status_code] += 1
        if response.status_code >= 500:
            errors.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
        return response

    racers: list[threading.Thread] = []
    while not stop.is_set():
        created = call("POST", "/sessions", json={})
        if created is None or created.status_code != 201:
            continue
        sid = created.json()["session_id"]
        with lock:
            sessions.append(sid)
        for _ in range(rng.randint(1, 3)):
            if stop.is_set():
                break
            call("POST", f"/sessions/{sid}/messages", json={"content": rng.choice(KINDS)})
            body = call("GET", f"/sessions/{sid}", params={"wait": "true", "timeout": 2})
            if body is None or body.status_code != 200:
                break
            state = body.json()
            for pending in state.get("interrupts") or []:
                value = rng.choice([{"approved": True}, {"approved": False}, {"answers": {}}, "odd", None])
                if rng.random() < 0.15:  # a second resume of the same id, racing the first
                    racer = threading.Thread(
                        target=call, args=("POST", f"/sessions/{sid}/resume", True),
                        kwargs={"json": {"interrupt_id": pending["interrupt_id"], "value": value}}, daemon=True,
                    )
                    racer.start()
                    racers.append(racer)
                call("POST", f"/sessions/{sid}/resume", json={"interrupt_id": pending["interrupt_id"], "value": value})
            if rng.random() < 0.2:
                with lock:
                    victim = rng.choice(sessions)
                call("DELETE", f"/sessions/{victim}")
            if rng.random() < 0.1:
                call("POST", f"/sessions/{sid}/resume", json={"interrupt_id": "no-such-interrupt", "value": 1})
    for racer in racers:
        racer.join(60)
    client.close()


@pytest.mark.slow
def test_load_with_faults_leaves_nothing_stuck(start_server, tmp_path: Path) -> None:
    server = start_server(
        "tests.agents:dispatch", "--workers", "2", "--timeout", "3", "--store", f"sqlite:///{tmp_path}/s.db",
        "--park-after", "0.2", "--shutdown-timeout", "5",
    )
    stop = threading.Event()
    seen: Counter = Counter()
    errors: list[str] = []
    sessions: list[str] = []
    lock = threading.Lock()
    clients = [
        threading.Thread(target=client_loop, args=(server, seed, stop, seen, errors, sessions, lock), name=f"load-{seed}")
        for seed in range(CLIENTS)
    ]
    for thread in clients:
        thread.start()
    deadline = time.monotonic() + DURATION
    while time.monotonic() < deadline and not errors:
        stop.wait(0.5)
    stop.set()
    for thread in clients:
        thread.join(60)
    assert not errors, errors[:10]
    assert seen[202] > 20 and seen[200] > 50, seen  # it really did run turns

    def settled() -> bool:
        listed = requests.get(server.url + "/sessions", timeout=10).json()
        return all(item["status"] != "running" for item in listed)

    # Hung turns end by --timeout (3 s); everything else ends on its own or waits on a person.
    wait_until(settled, timeout=30, interval=0.2, what="every session to leave running")
    for item in requests.get(server.url + "/sessions", timeout=10).json():
        if item["status"] == "interrupted":
            requests.delete(f"{server.url}/sessions/{item['session_id']}", timeout=10)
    wait_until(
        lambda: (lambda h: h["running_workers"] == 0 and h["live_turns"] == 0 and h["parked_turns"] == 0)(
            requests.get(server.url + "/health", timeout=10).json()
        ),
        timeout=20, interval=0.1, what="no slot or live turn left",
    )
    log = server.log()
    for symptom in ("unexpected error serving", "pool manager pass failed", "pool listener failed", "store write failed", "InvalidTransition"):
        assert symptom not in log, f"{symptom!r} in the server log:\n{log[-3000:]}"
