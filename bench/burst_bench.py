"""A burst of people at once (issue 27): N clients, each sending one message and long-polling
for its answer, all at the same moment.

Run from the repository root on an otherwise idle machine::

    python bench/burst_bench.py                          # 10,000 clients, this checkout
    python bench/burst_bench.py --clients 2000           # quicker
    python bench/burst_bench.py --root /tmp/before:before --root .:after

Per checkout (``--root PATH:LABEL``, one after the other), a server with the default options
and a SQLite file of its own serves ``bench.agents:approve_once`` (one ``interrupt()``, then
a reply). ``--clients`` sessions are created first (16 threads, not timed). Then every client
is started at once, each on its own keep-alive connection (asyncio streams in one thread of
this process: no thread per client), and does what a simple client written against the API
does:

1. ``POST /sessions/{id}/messages``; a 503 is waited out for its ``Retry-After`` and sent
   again;
2. ``GET /sessions/{id}?wait=true&timeout=60`` until the status is not ``running`` (a 503 is
   waited out for its ``Retry-After``, as ``motus.client`` does);
3. with every client at ``interrupted``: ``POST /sessions/{id}/resume`` with an approval,
   then long polls until ``idle`` (phase two, ``--no-approve`` skips it).

Reported per phase: how many clients got there, when the last did (from the phase's start),
p50/p99 of each client's time, the requests sent (a client that spins sends many), the 503s,
anything else that went wrong, and the server tree's peak memory (sum of USS, sampled every
0.5 s) with ``/health``'s live and parked turns at the end of the phase, and the sessions
held in memory (``motus_sessions_in_memory``; after the approvals, how long until they are
back to the server's ``--session-cache``, 2,000 by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Clients, Served, checkouts, kill_all, report_log, table  # noqa: E402
from bench.serve_bench import pct  # noqa: E402

AGENT = "bench.agents:approve_once"


@dataclass
class Tally:
    """What one phase's clients did, counted by the one asyncio thread."""

    took: list[float] = field(default_factory=list)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    said: dict[str, str] = field(default_factory=dict)  # the first answer of each kind of refusal


class Connection:
    """One client's keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reconnects = 0

    async def request(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, str], Any]:
        """One request; a kept connection the server closed while it sat idle is opened again
        and the request sent on the new one (what ``requests`` does with a stale pooled one)."""
        if self.reader is not None and self.reader.at_eof():
            await self.close()
        fresh = self.writer is None
        try:
            return await self._request(method, path, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            if fresh:
                raise
            await self.close()
            self.reconnects += 1
            return await self._request(method, path, body)

    async def _request(self, method: str, path: str, body: object) -> tuple[int, dict[str, str], Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(data)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + data)
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            await self.close()
            raise ConnectionError("closed by the server")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, json.loads(payload) if payload else None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def until(conn: Connection, tally: Tally, method: str, path: str, body: object, want: set[int]) -> Any:
    """Send until the answer's status is one of ``want``; a 503 waits for its Retry-After."""
    while True:
        tally.requests += 1
        status, headers, payload = await conn.request(method, path, body)
        tally.statuses[status] += 1
        if status >= 400:
            kind = f"{method} {path.split('?')[0].rsplit('/', 1)[-1] if method == 'POST' else 'long poll'} {status}"
            tally.refusals[kind] += 1
            tally.said.setdefault(kind, str(payload)[:200])
        if status in want:
            return payload
        if status == 503:
            await asyncio.sleep(float(headers.get("retry-after", "1")))
            continue
        raise RuntimeError(f"{method} {path}: {status} {payload!r}")


async def wait_status(conn: Connection, tally: Tally, sid: str, leaving: str) -> dict[str, Any]:
    while True:
        session = await until(conn, tally, "GET", f"/sessions/{sid}?wait=true&timeout=60", None, {200})
        if session["status"] != leaving:
            return session


async def one_client(conn: Connection, sid: str, phase: str, tally: Tally, t0: float) -> None:
    try:
        if phase == "message":
            await until(conn, tally, "POST", f"/sessions/{sid}/messages", {"content": "go"}, {202})
            session = await wait_status(conn, tally, sid, "running")
            want = "interrupted"
        else:
            listed = await until(conn, tally, "GET", f"/sessions/{sid}", None, {200})
            iid = listed["interrupts"][0]["interrupt_id"]
            await until(conn, tally, "POST", f"/sessions/{sid}/resume", {"interrupt_id": iid, "value": {"approved": True}}, {200})
            session = await wait_status(conn, tally, sid, "running")
            want = "idle"
        if session["status"] != want:
            tally.failures[f"ended {session['status']}"] += 1
            return
        tally.took.append(time.perf_counter() - t0)
    except Exception as exc:  # counted and shown, one line per kind
        tally.failures[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1


async def run_phase(port: int, conns: list[Connection], sids: list[str], phase: str) -> Tally:
    tally = Tally()
    t0 = time.perf_counter()
    await asyncio.gather(*(one_client(conn, sid, phase, tally, t0) for conn, sid in zip(conns, sids)))
    return tally


def cache_size(args: list[str]) -> int:
    """The ``--session-cache`` the server was given (2,000 by default)."""
    for option, value in zip(args, args[1:]):
        if option == "--session-cache":
            return int(value)
    for arg in args:
        if arg.startswith("--session-cache="):
            return int(arg.split("=", 1)[1])
    return 2000


def in_memory(served: Served) -> int:
    """``motus_sessions_in_memory`` from ``/metrics`` (-1 on a server without it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("motus_sessions_in_memory "):
                return int(float(line.split()[1]))
    return -1


class Peak(threading.Thread):
    """The server tree's largest memory (sum of USS) while a phase runs."""

    def __init__(self, served: Served) -> None:
        super().__init__(daemon=True)
        self.served = served
        self.peak = 0
        self.processes = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.peak = max(self.peak, self.served.memory()["uss"])
                self.processes = max(self.processes, len(self.served.tree()))
            except Exception:  # a process left between listing and reading it: the next sample counts
                continue

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        return self.peak


def measure(root: Path, label: str, clients: int, approve: bool, args: list[str]) -> list[dict[str, Any]]:
    folder = tempfile.mkdtemp(prefix="motus-burst-")
    served = Served(f"burst-{label}", "--store", f"sqlite:///{folder}/bench.sqlite3", *args, agent=AGENT, root=root, log="burst", settle=1.0)
    rows = []
    try:
        pool = Clients(served.port, 16)
        sids = pool.map(lambda http, _: http.call("POST", "/sessions", {})["session_id"], range(clients))
        pool.close()
        idle = served.memory()["uss"]
        loop = asyncio.new_event_loop()
        conns = [Connection(served.port) for _ in sids]
        try:
            for phase in ("message", "approve") if approve else ("message",):
                peak = Peak(served)
                peak.start()
                started = time.perf_counter()
                tally = loop.run_until_complete(run_phase(served.port, conns, sids, phase))
                wall = time.perf_counter() - started
                top = peak.stop()
                procs = peak.processes
                health = served.health()
                held = in_memory(served)
                settled = None
                if held > 0 and phase == "approve":  # every turn ended: how soon the cache is back to its size
                    began = time.perf_counter()
                    while held > cache_size(args) and time.perf_counter() - began < 60:
                        time.sleep(0.2)
                        held = in_memory(served)
                    settled = time.perf_counter() - began
                after = served.memory()["uss"]  # what the burst left behind, once settled
                for kind, text in tally.said.items():
                    print(f"  [{label}, {phase}] first {kind}: {text}")
                rows.append({
                    "label": label, "phase": phase, "done": len(tally.took), "wall": wall,
                    "p50": pct(tally.took, 0.5) if tally.took else None, "p99": pct(tally.took, 0.99) if tally.took else None,
                    "requests": tally.requests, "refused": dict(tally.refusals), "failures": dict(tally.failures),
                    "peak MiB": max(top - idle, 0) / 2**20, "processes": procs, "live": health.get("live_turns"), "parked": health.get("parked_turns"),
                    "in memory": held, "settled": settled, "after MiB": max(after - idle, 0) / 2**20,
                })
        finally:
            for conn in conns:
                loop.run_until_complete(conn.close())
            loop.close()
    finally:
        served.stop()
        report_log(served)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--no-approve", action="store_true", help="only the messages, not the approvals")
    parser.add_argument("--root", action="append", default=[], help="PATH:LABEL of a checkout (repeat; default: this one)")
    parser.add_argument("server_args", nargs="*", help="more options for the server, after --")
    opts = parser.parse_args()
    roots = checkouts(opts.root, "this checkout")
    rows = []
    try:
        for root, label in roots:
            rows += measure(root, label, opts.clients, not opts.no_approve, opts.server_args)
    finally:
        kill_all()

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    print(f"\n### {opts.clients:,} clients at once, each one message and long polls for its answer\n")
    table(
        ("checkout", "phase", "clients done", "last done", "p50 / p99", "requests (a client)", "refused",
         "failures", "tree peak over idle (processes)", "tree over idle after", "live / parked after", "sessions in memory after"),
        [(
            r["label"], r["phase"], f"{r['done']:,}", s(r["wall"]), f"{s(r['p50'])} / {s(r['p99'])}",
            f"{r['requests']:,} ({r['requests'] / opts.clients:.1f})", "; ".join(f"{k} x{v}" for k, v in r["refused"].items()) or "none",
            "; ".join(f"{k} x{v}" for k, v in r["failures"].items()) or "none",
            f"{r['peak MiB']:.0f} MiB ({r['processes']})", f"{r['after MiB']:.0f} MiB", f"{r['live']} / {r['parked']}",
            "-" if r["in memory"] < 0 else f"{r['in memory']:,}" + ("" if r["settled"] is None else f" (after {r['settled']:.1f} s)"),
        ) for r in rows],
    )


if __name__ == "__main__":
    main()
