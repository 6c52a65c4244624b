"""Benchmark of a two-person approval: what recording an approval towards a quorum costs.

Run from the repository root::

    python bench/quorum_bench.py              # 40 of each, SQLite store in a temporary folder
    python bench/quorum_bench.py --rounds 200

One server (``python -m motus serve start tests.agents.approval:calls``, SQLite, three API keys:
alice, and bob and carol with the role finance). Each round alice starts two turns, one after
the other: ``release_funds`` (``@tool(approvers=["finance"], quorum=2)``), which bob approves
(recorded, the interrupt stays pending) and then carol (resolves it); and ``delete_file`` (no
policy), which bob approves once. Timed: each ``POST /resume`` round trip, one at a time,
with keep-alive. Printed: p50 and p90 of each kind, in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import requests

KEYS = {"alice": "bench-alice", "bob": "bench-bob", "carol": "bench-carol"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="motus-quorum-bench-")
    server = subprocess.Popen(
        [sys.executable, "-m", "motus", "serve", "start", "tests.agents.approval:calls", "--port", str(args.port),
         "--store", f"sqlite:///{folder}/bench.db", "--api-key", f"alice={KEYS['alice']}",
         "--api-key", f"bob={KEYS['bob']}:finance", "--api-key", f"carol={KEYS['carol']}:finance"],
        env={**os.environ, "MOTUS_EXAMPLE_DIR": folder}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{args.port}"
    http = {name: requests.Session() for name in KEYS}
    for name, session in http.items():
        session.headers["Authorization"] = f"Bearer {KEYS[name]}"
    try:
        _ready(url)
        timings: dict[str, list[float]] = {"quorum: first approval (recorded, still pending)": [],
                                           "quorum: second approval (resolves it)": [], "no policy: the one approval": []}
        names = list(timings)
        for index in range(args.rounds):
            for tool, kinds, approvers in (("release_funds", names[:2], ("bob", "carol")), ("delete_file", names[2:], ("bob",))):
                session_id = http["alice"].post(url + "/sessions", json={}).json()["session_id"]
                http["alice"].post(f"{url}/sessions/{session_id}/messages", json={"content": f"{tool} {index}"}).raise_for_status()
                interrupt_id = _pending(http["alice"], url, session_id)
                for kind, name in zip(kinds, approvers):
                    started = time.perf_counter()
                    answer = http[name].post(f"{url}/sessions/{session_id}/resume",
                                             json={"interrupt_id": interrupt_id, "value": {"approved": True}})
                    timings[kind].append((time.perf_counter() - started) * 1000)
                    answer.raise_for_status()
                _until(http["alice"], url, session_id, "idle")
        for kind, values in timings.items():
            values.sort()
            print(f"{kind}: p50 {statistics.median(values):.2f} ms, p90 {values[int(len(values) * 0.9)]:.2f} ms ({len(values)})")
    finally:
        server.terminate()
        server.wait(30)


def _ready(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not answer /health within 30 s")


def _until(http: requests.Session, url: str, session_id: str, status: str) -> dict:
    while True:
        body = http.get(f"{url}/sessions/{session_id}", params={"wait": "true", "timeout": 10}).json()
        if body["status"] == status:
            return body


def _pending(http: requests.Session, url: str, session_id: str) -> str:
    return _until(http, url, session_id, "interrupted")["interrupts"][0]["interrupt_id"]


if __name__ == "__main__":
    main()
