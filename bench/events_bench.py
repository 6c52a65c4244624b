"""Benchmark of event streams (issue 13): how fast an interrupt reaches an SSE client, and
what 1,000 open streams cost a resume.

Run from the repository root::

    python bench/events_bench.py                 # 200 samples, 1,000 streams
    python bench/events_bench.py --quick         # 50 samples, 200 streams
    python bench/events_bench.py --store memory  # the default is a SQLite file in a temp folder

What it measures (real ``python -m motus serve start`` subprocesses, loopback HTTP, the
``bench.agents:timed_interrupt`` agent, which stamps ``time.time()`` into its interrupt
payload just before ``interrupt()`` and into its reply just after the value arrives):

1. Interrupt to SSE client: one client holds ``GET /events`` open; for each sample a turn is
   started, and the latency is from the agent's stamp to the moment the client has parsed
   the ``interrupt`` event. The turn is then resumed and its ``idle`` status awaited on the
   same stream before the next sample. Target: p50 under 5 ms.
2. Resume with N streams open: the server runs with ``--threads N+64 --max-streams N``; N
   clients hold ``GET /events`` (every session's events, the costliest kind: each change is
   written to every stream) and one selector thread reads and discards what they are sent.
   For each sample a turn is started and awaited interrupted (long poll), then resumed; the
   figure is ``POST /resume`` to the agent's stamp that the value arrived, first with no
   streams open, then with N. Target: p50 under 10 ms with 1,000 streams.

Timestamps compare ``time.time()`` of two processes on one machine: they share the clock.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_bench import free_port, ms, pct  # noqa: E402

AGENT = "bench.agents:timed_interrupt"


class Served:
    def __init__(self, store: str, *args: str) -> None:
        self.port = free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT), MOTUS_STORE=store)
        self.log = open(ROOT / "bench" / ".events-bench.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "motus", "serve", "start", AGENT, "--port", str(self.port), "--log-level", "warning", *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.call("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("server did not start; see bench/.events-bench.log")
            time.sleep(0.05)
        self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def call(self, method: str, path: str, body: object = None, conn: http.client.HTTPConnection | None = None) -> tuple[int, Any]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
        finally:
            if own:
                conn.close()

    def api(self, method: str, path: str, body: object = None) -> Any:
        status, payload = self.call(method, path, body, self.http)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {payload}")
        return payload

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


class EventReader:
    """One ``GET /events`` stream, parsed line by line on a raw socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        self.file = self.sock.makefile("rb")
        while self.file.readline() not in (b"\r\n", b""):
            pass  # the response head

    def next_event(self) -> tuple[str, dict[str, Any]]:
        kind, data = "", None
        while True:
            line = self.file.readline()
            if not line:
                raise EOFError
            text = line.decode().rstrip("\r\n")
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: "):
                data = json.loads(text[6:])
                if kind:
                    return kind, data

    def close(self) -> None:
        self.sock.close()


def interrupt_to_stream(served: Served, samples: int) -> list[float]:
    reader = EventReader(served.port)
    latencies = []
    try:
        for _ in range(samples):
            sid = served.api("POST", "/sessions", {})["session_id"]
            served.api("POST", f"/sessions/{sid}/messages", {"content": "go"})
            while True:
                kind, data = reader.next_event()
                if kind == "interrupt" and data["session_id"] == sid:
                    latencies.append(time.time() - data["payload"]["called_at"])
                    break
            served.api("POST", f"/sessions/{sid}/resume", {"interrupt_id": data["interrupt_id"], "value": True})
            while not (kind == "status" and data.get("status") == "idle" and data["session_id"] == sid):
                kind, data = reader.next_event()
            served.api("DELETE", f"/sessions/{sid}")
            time.sleep(0.02)
    finally:
        reader.close()
    return latencies


def resume_latency(served: Served, samples: int) -> list[float]:
    latencies = []
    for _ in range(samples):
        sid = served.api("POST", "/sessions", {})["session_id"]
        served.api("POST", f"/sessions/{sid}/messages", {"content": "go"})
        body = served.api("GET", f"/sessions/{sid}?wait=true&timeout=30")
        assert body["status"] == "interrupted", body
        sent = time.time()
        served.api("POST", f"/sessions/{sid}/resume", {"interrupt_id": body["interrupts"][0]["interrupt_id"], "value": True})
        done = served.api("GET", f"/sessions/{sid}?wait=true&timeout=30")
        latencies.append(float(done["response"]["content"]) - sent)
        served.api("DELETE", f"/sessions/{sid}")
        time.sleep(0.02)
    return latencies


class Drain:
    """N open streams, their bytes read and thrown away by one selector thread."""

    def __init__(self, port: int, n: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.socks = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.socks.append(sock)
        self.bytes = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            for key, _ in self.selector.select(0.2):
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                self.bytes += len(data)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        for sock in self.socks:
            sock.close()


def summary(name: str, values: list[float]) -> None:
    print(f"  {name:<44} p50 {ms(pct(values, 0.5))}  p90 {ms(pct(values, 0.9))}  p99 {ms(pct(values, 0.99))}  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--store", default=None, help="memory, or a store URL (default: SQLite in a temp folder)")
    args = parser.parse_args()
    samples = args.samples or (50 if args.quick else 200)
    n = args.streams or (200 if args.quick else 1000)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or f"sqlite:///{Path(tmp) / 'events.db'}"
        print(f"store {store.split('///')[0]}, {samples} samples, {n} streams")
        served = Served(store, "--threads", str(n + 64), "--max-streams", str(n), "--park-after", "never", "--max-sessions", "0")
        try:
            print("1. interrupt to an SSE client")
            summary("agent's interrupt() -> event parsed", interrupt_to_stream(served, samples))
            print(f"2. resume -> value in the agent, with 0 and {n} streams open")
            summary("0 streams", resume_latency(served, samples))
            started = time.monotonic()
            drain = Drain(served.port, n)
            while served.api("GET", "/health")["open_streams"] < n:
                if time.monotonic() - started > 120:
                    raise RuntimeError(f"only {served.api('GET', '/health')['open_streams']} of {n} streams opened")
                time.sleep(0.1)
            print(f"  ({n} streams open after {time.monotonic() - started:.1f} s)")
            try:
                summary(f"{n} streams", resume_latency(served, samples))
            finally:
                drain.close()
        finally:
            served.stop()


if __name__ == "__main__":
    main()
