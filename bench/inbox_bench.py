"""A large inbox watched while people work: what an open Inbox view costs everyone else.

The web chat's Inbox view reads ``GET /interrupts`` again at every change it hears of on the
all-sessions event stream, so while turns come and go it reads the whole inbox back to back.
With thousands of approvals pending, each read is the whole inbox: this bench measures what
that costs the server and the people working beside it.

A SQLite store is filled with ``--sessions`` sessions (half idle, half parked with one
``tool_approval`` pending; ``sessions_bench.fill``). Per checkout (``--root PATH:LABEL``), a
server on a copy of it (default options), then, in turns of ``--seconds`` each:

- ``--clients`` clients run gated cycles on sessions of their own (message, long poll until
  ``interrupted``, approve, long poll until ``idle``: each cycle changes the inbox twice), with
  no one watching the inbox;
- the same, while ``--watchers`` clients each read ``GET /interrupts`` back to back (read
  whole, not parsed; ``?limit=N`` with ``--limit N``, as the web chat's view asks for 200).

It reports cycles a second and their p50, the watchers' reads a second and their p50, and
the server tree's CPU a cycle. Run from the repository root on an otherwise idle machine::

    python bench/inbox_bench.py --sessions 40000
    python bench/inbox_bench.py --root /tmp/before:before --root .:after --sessions 40000
    python bench/inbox_bench.py --store postgres --sessions 40000   # two instances
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Http, Served, checkouts, kill_all, table  # noqa: E402
from bench.concurrency_bench import PHASES, cycle, run_for  # noqa: E402
from bench.sessions_bench import fill, fill_store  # noqa: E402

AGENT = "bench.agents:approve_once"


class Follower(threading.Thread):
    """A watcher's ``GET /events`` stream: sets ``dirty`` at each event that would make the
    web chat's Inbox view read the inbox again. ``follow``: ``every`` status and inbox
    event (the view before it filtered), or ``inbox`` (what ``concernsInbox`` in
    ``inbox.js`` lets through for sessions it does not show: an interrupt, an answer, an
    approval, a session that starts waiting)."""

    def __init__(self, port: int, follow: str, dirty: threading.Event) -> None:
        super().__init__(name="bench-follower", daemon=True)
        self.follow, self.dirty = follow, dirty
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.conn.request("GET", "/events")
        self.response = self.conn.getresponse()
        self.start()

    def run(self) -> None:
        kind = ""
        try:
            for line in self.response:
                if line.startswith(b"event: "):
                    kind = line[7:].strip().decode()
                elif line.startswith(b"data: ") and self.concerns(kind, json.loads(line[6:])):
                    self.dirty.set()
        except (OSError, ValueError, http.client.HTTPException):
            pass  # closed at the end of the phase

    def concerns(self, kind: str, data: dict) -> bool:
        if kind in ("ready", "reset", "interrupt", "resolved", "approval"):
            return True
        if kind in ("status", "title"):
            return self.follow == "every" or data.get("status") == "interrupted"
        return False

    def close(self) -> None:
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        except OSError:
            pass  # already closed by the server
        self.conn.close()
        self.join(10)


def phase(instances: list[Served], sessions: list[str], watchers: int, seconds: float, limit: int | None = None,
          follow: str | None = None) -> dict[str, object]:
    """Each client and watcher speaks to one instance (in turn, when there are several);
    watchers ask for the oldest ``limit`` only when given (as the web chat's view does), and
    read back to back, or when their event stream says so (``follow``: ``Follower``)."""
    path = "/interrupts" if limit is None else f"/interrupts?limit={limit}"
    stop = threading.Event()
    cycles: list[float] = []
    reads: list[float] = []
    sizes: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(sid: str, served: Served) -> None:
        http = Http(served.port)
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                cycle(http, sid, {name: [] for name in PHASES})
                with lock:
                    cycles.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            http.close()

    def watcher(served: Served) -> None:
        # The answer is read whole but not parsed: a browser parses it on its own machine,
        # and parsing megabytes here would take the cores the server runs on.
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        dirty = threading.Event()
        stream = Follower(served.port, follow, dirty) if follow else None
        try:
            while not stop.is_set():
                if stream is not None:  # as the web chat's view: read when an event says so
                    if not dirty.wait(0.1):
                        continue
                    dirty.clear()
                t0 = time.perf_counter()
                conn.request("GET", path)
                response = conn.getresponse()
                raw = response.read()
                if response.status != 200:
                    raise RuntimeError(f"GET /interrupts: {response.status} {raw[:200]!r}")
                with lock:
                    reads.append(time.perf_counter() - t0)
                    sizes.append(raw.count(b'"interrupt_id":'))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            conn.close()
            if stream is not None:
                stream.close()

    threads = [threading.Thread(target=worker, args=(sid, instances[n % len(instances)])) for n, sid in enumerate(sessions)]
    threads += [threading.Thread(target=watcher, args=(instances[n % len(instances)],)) for n in range(watchers)]
    wall, cpu = run_for(threads, seconds, stop, instances)
    if errors:
        raise RuntimeError(f"{len(errors)} client errors, first: {errors[0]}")
    return {"cycles": cycles, "reads": reads, "sizes": sizes, "wall": wall, "cpu": cpu}


_CLUSTER: list[object] = []


def filled_postgres(stack: contextlib.ExitStack, count: int) -> str:
    """A new database of a throwaway cluster (one for the run), filled as ``fill`` fills a
    file. The parked turns are owned by the instance that wrote them, with a lease that
    does not lapse within the run, so the servers leave them parked where they are."""
    from motus.serve.store.postgres import PostgresStore
    from tests.support import pg

    if not _CLUSTER:
        _CLUSTER.append(stack.enter_context(pg.Cluster(pg.find_pg_bin())))
    url = _CLUSTER[0].create_database()  # type: ignore[attr-defined]
    writer = PostgresStore(url, lease_seconds=7 * 24 * 3600)
    writer.open()
    try:
        writer.renew_lease()
        fill_store(writer, count, owner=writer.instance_id)
    finally:
        writer.close()
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=40_000, help="sessions in the store, half with an approval pending")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--watchers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--slices", type=int, default=2, help="turns of (quiet, watched) per checkout")
    parser.add_argument("--limit", type=int, default=None,
                        help="watchers read /interrupts?limit=N (the web chat's view asks for 200; a checkout without ?limit lists all)")
    parser.add_argument("--follow", choices=("every", "inbox"), default=None,
                        help="watchers read when their GET /events says so (every: each status event, as the web chat's "
                             "view did; inbox: only what may change the inbox, as it does now) instead of back to back")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="sqlite: one server; postgres: two instances on a throwaway cluster, each client and watcher on one")
    parser.add_argument("--root", action="append", default=[], help="PATH:LABEL of a checkout (repeatable); default this one")
    args = parser.parse_args()
    roots = checkouts(args.root)
    rows = []
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        tmp = Path(folder)
        filled = tmp / "filled.db"
        if args.store == "sqlite":
            fill(filled, args.sessions)
        servers: dict[str, list[Served]] = {}
        try:
            for root, label in roots:
                if args.store == "sqlite":
                    copy = tmp / f"{label}.db"
                    shutil.copy(filled, copy)
                    servers[label] = [Served(label, "--store", f"sqlite:///{copy}", "--max-sessions", "0", agent=AGENT, log="inbox",
                                             root=root, settle=2.0)]
                else:
                    url = filled_postgres(stack, args.sessions)
                    servers[label] = [Served(f"{label}-{i}", "--store", url, "--max-sessions", "0", agent=AGENT, log="inbox",
                                             root=root, settle=2.0) for i in "AB"]
            own = {label: [instances[0].http.call("POST", "/sessions", {})["session_id"] for _ in range(args.clients)]
                   for label, instances in servers.items()}
            results: dict[tuple[str, int], list[dict[str, object]]] = {}
            for _ in range(args.slices):
                for watchers in (0, args.watchers):
                    for label, instances in servers.items():  # the checkouts take turns
                        results.setdefault((label, watchers), []).append(phase(instances, own[label], watchers, args.seconds, args.limit, args.follow))
        finally:
            for instances in servers.values():
                for served in instances:
                    served.stop()
            kill_all()
    for (label, watchers), runs in results.items():
        cycles = [c for r in runs for c in r["cycles"]]
        reads = [c for r in runs for c in r["reads"]]
        wall = sum(r["wall"] for r in runs)
        cpu = sum(r["cpu"] for r in runs)
        sizes = [s for r in runs for s in r["sizes"]]
        rows.append((
            label, watchers, f"{len(cycles) / wall:.1f} /s", f"{statistics.median(cycles) * 1000:.0f} ms" if cycles else "-",
            f"{cpu / max(len(cycles), 1) * 1000:.1f} ms",
            f"{len(reads) / wall:.2f} /s" if reads else "-",
            f"{statistics.median(reads) * 1000:.0f} ms" if reads else "-",
            f"{statistics.median(sizes):.0f}" if sizes else "-",
        ))
    print()
    table(("checkout", "inbox watchers", "cycles", "cycle p50", "tree CPU a cycle", "inbox reads", "read p50", "items a read"), rows)


if __name__ == "__main__":
    main()
