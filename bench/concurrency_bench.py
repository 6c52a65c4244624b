"""Many clients at once: gated cycles a second against each store, side by side (issue 27).

A *gated cycle* is what one person approving a tool call costs the server: send a message,
long-poll until the turn is ``interrupted``, approve, long-poll until it is ``idle``. Each
client runs cycles back to back on a session of its own. The agent is
``bench.agents:approve_once`` (one interrupt a turn).

Run from the repository root on an otherwise idle machine::

    python bench/concurrency_bench.py                            # sqlite vs memory, 1/8/32 clients
    python bench/concurrency_bench.py --clients 8 --seconds 6 --slices 4
    python bench/concurrency_bench.py --root /tmp/before:before --root .:after --stores sqlite
    python bench/concurrency_bench.py --stores sqlite,postgres       # two instances on PostgreSQL
    python bench/concurrency_bench.py --only store --root /tmp/before:before --root .:after

``--only approvals`` (issue 27, item 3): per checkout, a server with the default options
(SQLite, ``--workers`` the CPU count, no ``--park-after`` or ``--max-live-turns``); 500
sessions each sent a message to ``approve_once`` by 16 client threads; once all 500 wait
(live or parked) and the server has settled, the memory of its tree (USS) over what it was
idle, per pending approval; then all 500 approved, timed until every turn ended. Then 100
pending, ``kill -9`` of the whole server, a new one on the same file, all 100 approved,
timed from the first resume until every turn ended.

``--only store`` measures the SQLite store alone, no server: 1, 8 and 32 threads saving an
interrupted session with its journal entry and event (what a turn's transition writes) for
``--seconds`` each, the checkouts taking turns; per checkout and thread count, saves a
second, CPU per save and, where the store commits in groups, writes per commit.

Every configuration (a checkout and a store) gets its own server (``--workers 2``, the
default options otherwise; SQLite in a file of its own with the default ``synchronous=full``);
``postgres`` is two instances on one database of a throwaway cluster
(``tests.support.pg``), each client sending its requests to them in turn (no sticky
routing).
For each number of clients the configurations take turns in slices of ``--seconds`` (the
order flips every slice), so all of them see the same machine: this VM's speed drifts by a
third within minutes. Per configuration and client count: cycles a second, the median and
90th percentile of each phase (send, until interrupted, approve, until idle), and the CPU
of the server tree per cycle, counted over its own slices only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Http, Served, checkouts, kill_all, report_log, table  # noqa: E402
from bench.serve_bench import ms, pct, tree_cpu  # noqa: E402

AGENT = "bench.agents:approve_once"
PHASES = ("send", "interrupted", "approve", "idle")


@dataclass
class Tally:
    """What one configuration did at one client count, over all of its slices."""

    cycles: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})


def cycle(http: Http, sid: str, out: dict[str, list[float]], message: str = "go") -> None:
    """One gated cycle on ``sid``; appends each phase's seconds to ``out``."""
    t0 = time.perf_counter()
    http.call("POST", f"/sessions/{sid}/messages", {"content": message})
    t1 = time.perf_counter()
    body = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
    if body["status"] != "interrupted":
        raise RuntimeError(f"expected interrupted, got {body['status']}: {body}")
    t2 = time.perf_counter()
    http.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": body["interrupts"][0]["interrupt_id"], "value": {"approved": True}})
    t3 = time.perf_counter()
    done = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
    if done["status"] != "idle":
        raise RuntimeError(f"expected idle, got {done['status']}: {done}")
    t4 = time.perf_counter()
    for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        out[name].append(seconds)


class Rotating:
    """A client of several instances of one store (no sticky routing): each call goes to the
    next instance in turn, so a cycle's four requests land on both of two."""

    def __init__(self, instances: list[Served]) -> None:
        self.https = [Http(served.port) for served in instances]
        self.next = 0

    def call(self, method: str, path: str, body: object = None) -> object:
        http = self.https[self.next % len(self.https)]
        self.next += 1
        return http.call(method, path, body)

    def close(self) -> None:
        for http in self.https:
            http.close()


def run_for(threads: list[threading.Thread], seconds: float, stop: threading.Event, instances: list[Served]) -> tuple[float, float]:
    """Start ``threads``, let them run ``seconds``, set ``stop`` and wait for them (each
    finishes what it started); returns the wall time and the servers' trees' CPU seconds."""
    cpu0 = sum(tree_cpu(served.process.pid) for served in instances)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(180)
    return time.perf_counter() - started, sum(tree_cpu(served.process.pid) for served in instances) - cpu0


def run_slice(instances: list[Served], sessions: list[str], seconds: float, tally: Tally, message: str = "go") -> None:
    """Every client runs cycles on its own session until ``seconds`` have passed; a cycle
    started before the end is finished and counted."""
    stop = threading.Event()
    errors: list[BaseException] = []
    results: list[dict[str, list[float]]] = [{p: [] for p in PHASES} for _ in sessions]

    def client(index: int) -> None:
        http = Rotating(instances)
        try:
            while not stop.is_set():
                cycle(http, sessions[index], results[index], message)  # type: ignore[arg-type]
        except BaseException as exc:  # reported after the slice: a bench must not hide failures
            errors.append(exc)
        finally:
            http.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(sessions))]
    wall, cpu = run_for(threads, seconds, stop, instances)
    tally.seconds += wall
    tally.cpu += cpu
    if errors:
        raise RuntimeError(f"{instances[0].name}: {len(errors)} clients failed; first: {errors[0]!r}")
    for result in results:
        tally.cycles += len(result["idle"])
        for name in PHASES:
            tally.phases[name].extend(result[name])


_STORE_SCRIPT = r"""
import json, resource, sys, tempfile, threading, time
from motus.serve.store import Event
from motus.serve.store.sqlite import SqliteStore
from tests.unit.serve.store.records import PENDING, live_turn, session
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
with tempfile.TemporaryDirectory() as folder:
    store = SqliteStore(f"sqlite:///{folder}/bench.db", f"{folder}/bench.db")
    store.open()
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    def run(index):
        start.wait()
        while time.perf_counter() < stop:
            store.save(session(f"s{index}", turn=live_turn(), state=None), entries=[PENDING],
                       events=[Event(f"s{index}", "status", {"status": "interrupted"}, at=0.0)])
            counts[index] += 1
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    stop = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    committer = getattr(store, "_committer", None)
    print(json.dumps({"saves": sum(counts), "seconds": elapsed,
                      "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                      "batches": committer.batches if committer else None, "writes": committer.writes if committer else None}))
    store.close()
"""


def bench_store(roots: list[tuple[Path, str]], counts: list[int], seconds: float, slices: int) -> None:
    """Saves a second from ``counts`` threads on one SQLite store, each checkout in turn."""
    import json
    import subprocess

    totals: dict[tuple[str, int], dict[str, float]] = {}
    for n in counts:
        for index in range(slices):
            for root, label in roots if index % 2 == 0 else roots[::-1]:
                env = dict(os.environ, PYTHONPATH=str(root))
                out = subprocess.run([sys.executable, "-c", _STORE_SCRIPT, str(n), str(seconds)], cwd=root, env=env,
                                     capture_output=True, text=True, check=True).stdout
                got = json.loads(out.strip().splitlines()[-1])
                total = totals.setdefault((label, n), {"saves": 0, "seconds": 0.0, "cpu": 0.0, "batches": 0, "writes": 0})
                for key in ("saves", "seconds", "cpu"):
                    total[key] += got[key]
                if got["batches"] is not None:
                    total["batches"] += got["batches"]
                    total["writes"] += got["writes"]
    rows = []
    for n in counts:
        for _root, label in roots:
            t = totals[(label, n)]
            grouped = f"{t['writes'] / t['batches']:.1f}" if t["batches"] else "(one each)"
            rows.append((n, label, f"{t['saves'] / t['seconds']:.0f}", f"{t['cpu'] / t['saves'] * 1000:.3f} ms", grouped))
    print()
    table(("threads", "checkout", "saves/s", "CPU a save", "writes a commit"), rows)


def bench_approvals(roots: list[tuple[Path, str]], pending: int = 500, after_kill: int = 100) -> None:
    """A burst of approvals against the default options, per checkout (see the docstring)."""
    from bench.durable_bench import APPROVE, Clients, interrupt_ids, mib
    from bench.durable_bench import wait_until as wait_health

    rows = []
    for root, label in roots:
        with tempfile.TemporaryDirectory(prefix="motus-approvals-") as tmp:
            store = ("--store", f"sqlite:///{tmp}/approvals.db")
            served = Served(f"{label}-approvals", *store, agent=AGENT, root=root, log="concurrency", settle=1.0)
            clients = Clients(served.port)
            try:
                idle = served.memory()["uss"]
                sids = clients.map(lambda h, _: h.call("POST", "/sessions", {})["session_id"], range(pending))
                clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/messages", {"content": "go"}), sids)
                wait_health(served, lambda h: h["live_turns"] - h["running_workers"] + h["parked_turns"] >= pending and h["running_workers"] == 0,
                            f"{pending} turns waiting")
                time.sleep(2.0)  # parking over budget takes a settle of 0.1 s a turn, and reaping
                health = served.health()
                waiting = served.memory()["uss"]
                ids = interrupt_ids(clients, sids)
                t0 = time.perf_counter()
                clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": ids[sid], "value": APPROVE}), sids)
                t1 = wait_health(served, lambda h: h["live_turns"] == 0 and h["parked_turns"] == 0, "every approved turn to end")
                rows.append((label, f"{pending} pending", f"live {health['live_turns']}, parked {health['parked_turns']}",
                             mib(waiting - idle), f"{(waiting - idle) / pending / 1024:.0f} KiB", f"{t1 - t0:.2f} s"))
                clients.close()
                served.stop()

                served = Served(f"{label}-killed", *store, agent=AGENT, root=root, log="concurrency", settle=1.0)
                clients = Clients(served.port)
                sids = clients.map(lambda h, _: h.call("POST", "/sessions", {})["session_id"], range(after_kill))
                clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/messages", {"content": "go"}), sids)
                wait_health(served, lambda h: h["live_turns"] - h["running_workers"] + h["parked_turns"] >= after_kill
                            and h["running_workers"] == 0, f"{after_kill} more turns waiting")
                ids = interrupt_ids(clients, sids)
                clients.close()
                served.kill()
                served = Served(f"{label}-restarted", *store, agent=AGENT, root=root, log="concurrency", settle=0)
                clients = Clients(served.port)
                t0 = time.perf_counter()
                clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": ids[sid], "value": APPROVE}), sids)
                t1 = wait_health(served, lambda h: h["live_turns"] == 0 and h["parked_turns"] == 0, "every approved turn to end")
                rows.append((label, f"{after_kill} pending, kill -9, restart", "", "", "", f"{t1 - t0:.2f} s"))
            finally:
                clients.close()
                served.stop()
                report_log(served)
    print()
    table(("checkout", "burst", "/health once settled", "tree USS over idle", "per approval", "approve all, until ended"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32", help="comma-separated client counts (default 1,8,32)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one slice (default 5)")
    parser.add_argument("--slices", type=int, default=4, help="slices per configuration and client count (default 4)")
    parser.add_argument("--stores", default="sqlite,memory",
                        help="comma-separated: sqlite, memory, postgres (two instances on one throwaway cluster) (default sqlite,memory)")
    parser.add_argument("--root", action="append", default=[], metavar="PATH[:LABEL]",
                        help="a checkout to serve from (repeatable; default this one)")
    parser.add_argument("--arg", action="append", default=[], help="an extra server option (repeatable)")
    parser.add_argument("--agent", default=AGENT, help=f"the agent served (default {AGENT}); it must interrupt once a turn")
    parser.add_argument("--message", default="go", help="what each cycle sends (default: go)")
    parser.add_argument("--only", choices=["cycles", "store", "approvals"], default="cycles",
                        help="gated cycles over HTTP (default), the SQLite store alone, or a burst of approvals")
    opts = parser.parse_args()
    counts = [int(n) for n in opts.clients.split(",")]
    roots = checkouts(opts.root)
    stores = opts.stores.split(",")
    if opts.only == "approvals":
        print(f"concurrency_bench --only approvals: {os.cpu_count()} CPUs, 500 pending, then 100 across a kill -9")
        try:
            bench_approvals(roots)
        finally:
            kill_all()
        return
    if opts.only == "store":
        print(f"concurrency_bench --only store: {os.cpu_count()} CPUs, threads {counts}, {opts.slices} runs of {opts.seconds:g} s each")
        bench_store(roots, counts, opts.seconds, opts.slices)
        return

    print(f"concurrency_bench: {os.cpu_count()} CPUs, clients {counts}, {opts.slices} slices of {opts.seconds:g} s each")
    with tempfile.TemporaryDirectory(prefix="motus-concurrency-") as tmp, contextlib.ExitStack() as stack:
        servers: dict[str, list[Served]] = {}
        cluster = None
        try:
            for root, label in roots:
                for store in stores:
                    name = f"{label}-{store}" if len(roots) > 1 else store
                    if store == "postgres":
                        if cluster is None:
                            from tests.support import pg

                            cluster = stack.enter_context(pg.Cluster(pg.find_pg_bin()))
                        url = cluster.create_database()
                        servers[name] = [
                            Served(f"{name}-{i}", "--workers", "2", "--store", url, *opts.arg, agent=opts.agent, root=root, log="concurrency")
                            for i in "AB"
                        ]
                        continue
                    url = f"sqlite:///{tmp}/{name}.db" if store == "sqlite" else "memory"
                    servers[name] = [Served(name, "--workers", "2", "--store", url, *opts.arg, agent=opts.agent, root=root, log="concurrency")]
            names = list(servers)
            tallies = {(name, n): Tally() for name in names for n in counts}
            for n in counts:
                sessions = {name: [servers[name][0].http.call("POST", "/sessions", {})["session_id"] for _ in range(n)] for name in names}
                for name in names:  # one untimed cycle each: first-time costs out of the figures
                    run_slice(servers[name], sessions[name][:1], 0.0, Tally(), opts.message)
                for index in range(opts.slices):
                    order = names if index % 2 == 0 else names[::-1]
                    for name in order:
                        run_slice(servers[name], sessions[name], opts.seconds, tallies[(name, n)], opts.message)
                print(f"  {n} clients done")
            rows = []
            for n in counts:
                for name in names:
                    t = tallies[(name, n)]
                    rate = t.cycles / t.seconds if t.seconds else 0.0
                    rows.append((
                        n, name, f"{rate:.1f}",
                        *(f"{ms(pct(t.phases[p], 0.5))} / {ms(pct(t.phases[p], 0.9))}" for p in PHASES),
                        f"{t.cpu / t.cycles * 1000:.1f} ms" if t.cycles else "-",
                    ))
            print()
            table(("clients", "server", "cycles/s", *(f"{p} p50/p90" for p in PHASES), "server CPU/cycle"), rows)
            for n in counts[1:]:
                for name in names:
                    one = tallies[(name, counts[0])]
                    many = tallies[(name, n)]
                    if one.cycles and many.cycles:
                        print(f"  {name}: {n} clients / {counts[0]} = {(many.cycles / many.seconds) / (one.cycles / one.seconds):.2f}x")
            if "sqlite" in stores and "memory" in stores:
                for root, label in roots:
                    prefix = f"{label}-" if len(roots) > 1 else ""
                    for n in counts:
                        s, m = tallies[(prefix + "sqlite", n)], tallies[(prefix + "memory", n)]
                        if s.cycles and m.cycles:
                            print(f"  {prefix}sqlite / {prefix}memory at {n} clients: {(s.cycles / s.seconds) / (m.cycles / m.seconds):.2f}")
        finally:
            for instances in servers.values():
                for served in instances:
                    served.stop()
                    report_log(served)
            kill_all()


if __name__ == "__main__":
    main()
