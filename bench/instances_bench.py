"""Several instances on one PostgreSQL database: cross-instance long-poll wake, echo turn on
PostgreSQL against SQLite, and 1,000 interrupted sessions spread over three instances.

Run from the repository root::

    python bench/instances_bench.py            # 200 wake samples a mode, 300 echo turns a store, 1,000 sessions
    python bench/instances_bench.py --quick    # 50, 100, 200
    python bench/instances_bench.py --only wake   # one part: wake, echo or spread
    python bench/instances_bench.py --fsync    # PostgreSQL with fsync=on throughout

The benchmark starts its own throwaway PostgreSQL cluster (``tests.support.pg.Cluster``: 127.0.0.1,
a free port, ``fsync=off`` as the test suite runs it unless ``--fsync``), one new database
per part, and real ``python -m motus serve start ... --store postgresql://...
--lease-seconds 15`` subprocesses (loopback HTTP, ``http.client`` keep-alive clients as in
``bench/durable_bench.py``). Every server and the cluster are stopped on the way out, also
on an error or Ctrl-C.

1. Cross-instance wake. Instances A and B, both ``bench.agents:approve_once`` (the approval
   agent with a fixed payload, whose reply is the ``time.time()`` at which the resumed value
   reached it), ``--workers 2 --park-after 0``. The benchmark also holds a connection of its
   own with ``LISTEN motus``, and stamps ``time.time()`` on each notice as it arrives: every
   commit of a session change sends one (``'session_id version event-seq'``) in its transaction, so
   the notice's arrival is the commit as any listener (B's included) first learns of it.

   A sample: a session is created on A and sent a message; a long poll on A waits until it
   is interrupted, then ``/health`` on A until the turn is parked (its process ended). The
   interrupt is resumed on A (``POST /resume``), so A commits ``running`` and replays the turn
   in a fresh process; at once a long poll is sent (the *poller*). The replayed turn ends on
   A: A commits ``idle`` (version v). The poller returns. Then the benchmark reads v from the
   row and finds the notice of (session, v).

   The figure (**wake**) is: notice of A's ``idle`` commit arrives at the benchmark's
   listener -> the poller's response is read. In ``cross`` mode the poller is on B: what it
   includes is B's listener receiving the notice, pulling new events, marking the session
   changed and waking its waiters, the poll re-reading the row (two queries: its version,
   then the row), building the response, and loopback HTTP. It does not include PostgreSQL's
   delivery of the notice (the same to the benchmark's listener as to B's), so it
   understates "commit -> B answers" by that delivery, a fraction of a millisecond on
   loopback. In ``local`` mode the poller is on A, the instance that committed (woken
   directly, not through the listener): the same interval on one instance, for comparison.
   Modes alternate sample by sample on the same two instances and database.

   Reported next to it: the agent's stamp (value reached the replayed agent on A) -> poller
   returns, which adds the end of the turn on A (the agent returns, the result reaches the
   server, the commit); and the turn's own run time, ``POST /resume`` sent -> stamp (replay
   in a fresh process) and ``POST /resume`` sent -> poller returns. A sample whose poll was
   sent only after the notice had arrived (the poll was not waiting when the change was
   committed) is counted and left out of the wake figures.

2. Echo turn, one instance of ``tests.agents:echo --workers 2``, on PostgreSQL and on SQLite
   (a file in a temp folder; ``synchronous=FULL``, the default), both servers up at once and
   turns alternating between them, 50 ms between turns, sequential: ``POST /sessions``
   (timed apart), then the turn: ``POST /messages`` -> a long poll that sees ``idle``. 20
   warm-up turns each are not counted; the ``POST /messages`` round trip alone is shown
   too. Without ``--fsync`` the PostgreSQL run is repeated with ``fsync=on`` (``ALTER
   SYSTEM``, reload): SQLite syncs each commit, the test cluster does not. Then, untimed,
   20 more turns with ``log_statement = all``: the statements PostgreSQL ran per
   ``POST /sessions`` + turn, by kind (each is a round trip from the instance).

3. Spread: three instances of ``tests.agents:approval --workers 2 --park-after 0``; N
   sessions (1,000), each created and sent a message on instance i mod 3 by 16 client
   threads; wait (the database's statuses, every 50 ms) until all N are interrupted, and
   (``/health`` of each) until no turn holds a process; read each interrupt id from a
   randomly chosen instance; resume each through a randomly chosen instance; wait until all
   N are ``idle`` and no instance has a live or parked turn. Then every session is read
   (``GET /sessions/{id}`` on a random instance): ``idle`` with ``approved=True`` in its
   response; and ``GET /sessions`` on each instance lists N, all ``idle``. Any session not
   so is lost, and the benchmark fails. HTTP statuses are tallied; where the CPU went in
   each phase (instances, PostgreSQL, this benchmark, anything else) is printed.

Server logs are kept in ``bench/.instances-<name>.log``; warnings and errors are printed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import resource
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import _SERVERS, Http, Served, kill_all, machine_busy, table  # noqa: E402
from bench.serve_bench import ms, pct  # noqa: E402
from tests.support.pg import Cluster  # noqa: E402

WAKE_AGENT = "bench.agents:approve_once"
ECHO_AGENT = "tests.agents:echo"
APPROVAL_AGENT = "tests.agents:approval"
CLIENT_THREADS = 16
LEASE = ("--lease-seconds", "15")


# -- servers ---------------------------------------------------------------------------------


class Instance(Served):
    """``durable_bench.Served`` (same stop, kill and clean-up of the whole tree), with its
    log in ``bench/.instances-<name>.log``."""

    def __init__(self, name: str, agent: str, *args: str, settle: float = 0.5) -> None:  # noqa: D107
        super().__init__(name, "--host", "127.0.0.1", *args, agent=agent, settle=settle, log="instances")


def start_instances(names: Iterable[str], agent: str, *args: str) -> list[Instance]:
    return [Instance(name, agent, *args) for name in names]


def stop_all(instances: list[Instance]) -> None:
    """SIGTERM each, then report its log's warnings and errors (kill_all() cleans up the rest)."""
    for inst in instances:
        try:
            took = inst.stop(timeout=60)
            if took > 10:
                print(f"  [warn] instance {inst.name} took {took:.1f} s to stop")
        except Exception as exc:  # noqa: BLE001 - keep stopping the others
            print(f"  [warn] stopping {inst.name}: {exc}")
    for inst in instances:
        problems = inst.log_problems()
        if problems:
            print(f"\n**Log of instance {inst.name} ({inst.log_path.relative_to(ROOT)}): "
                  f"{len(problems)} warning/error lines** (first 15):\n\n```")
            for line in problems[:15]:
                print(line[:300])
            print("```\n")


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(sql, params).fetchall()


def set_setting(cluster: Cluster, name: str, value: str) -> None:
    """ALTER SYSTEM SET a reloadable setting, pg_reload_conf(), then wait until a new
    connection sees the value."""
    with psycopg.connect(cluster.url(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while pg_query(cluster.url(), f"SHOW {name}")[0][0] != value:
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL did not take {name}={value}")
        time.sleep(0.05)
    time.sleep(0.3)  # every backend reloads at its next command; give the background ones a moment


def set_fsync(cluster: Cluster, on: bool) -> None:
    set_setting(cluster, "fsync", "on" if on else "off")


def count_statements(cluster: Cluster, http: Http, turns: int = 20) -> tuple[float, list[tuple[float, str]]]:
    """Statements PostgreSQL runs for one ``POST /sessions`` + echo turn, from its log with
    ``log_statement = all`` over ``turns`` turns (untimed; anything the instance does in the
    background meanwhile, such as renewing its lease, counts too)."""
    set_setting(cluster, "log_statement", "all")
    try:
        mark = len(cluster.log())
        for _ in range(turns):
            sid = http.call("POST", "/sessions", {})["session_id"]
            http.call("POST", f"/sessions/{sid}/messages", {"content": "hi"})
            http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            time.sleep(0.05)
        time.sleep(0.5)
        lines = [line for line in cluster.log()[mark:].splitlines() if "statement: " in line or "LOG:  execute " in line]
    finally:
        set_setting(cluster, "log_statement", "none")
    kinds: Counter[str] = Counter()
    for line in lines:
        text = re.split(r"statement: |execute [^:]*: ", line, maxsplit=1)[1]
        kinds[" ".join(text.split()[:4])] += 1
    return len(lines) / turns, [(count / turns, kind) for kind, count in kinds.most_common()]


class Notices(threading.Thread):
    """``LISTEN motus`` on a connection of its own; ``time.time()`` of each notice's arrival."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="bench-listener")
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        self.conn.execute("LISTEN motus")
        self.seen: dict[tuple[str, int], float] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for note in self.conn.notifies(timeout=0.2):
                    at = time.time()
                    session_id, version = (note.payload.split(" ") + ["0"])[:2]  # 'session_id version event-seq'
                    with self.lock:
                        self.seen.setdefault((session_id, int(version or 0)), at)
        except BaseException as exc:  # noqa: BLE001 - reported by at()
            self.error = exc

    def at(self, session_id: str, version: int, timeout: float = 5.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = self.seen.get((session_id, version))
            if found is not None:
                return found
            if self.error is not None:
                raise RuntimeError(f"the benchmark's listener failed: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no notice of {session_id} version {version} within {timeout} s")
            time.sleep(0.001)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.conn.close()


# -- CPU -------------------------------------------------------------------------------------


class Meter:
    """CPU seconds of each instance's process tree, of PostgreSQL (the postmaster and its
    backends), of this benchmark and of anything else on the machine between two snapshots.
    A live process counts its own time and that of the children it reaped (agent workers
    through the fork server, ended backends through the postmaster)."""

    def __init__(self, instances: list[Instance], cluster: Cluster) -> None:
        self.instances = instances
        self.cluster = cluster

    @staticmethod
    def _tree_cpu(procs: Iterable[psutil.Process]) -> float:
        total = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def snapshot(self) -> tuple[dict[str, float], Any, float]:
        cpu: dict[str, float] = {}
        for inst in self.instances:
            cpu[f"instance {inst.name}"] = self._tree_cpu(inst.tree())
        pg: list[psutil.Process] = []
        if self.cluster.pid is not None:
            try:
                root = psutil.Process(self.cluster.pid)
                pg = [root, *root.children(recursive=True)]
            except psutil.Error:
                pass
        cpu["PostgreSQL"] = self._tree_cpu(pg)
        me = psutil.Process().cpu_times()
        cpu["this benchmark (clients)"] = me.user + me.system
        return cpu, psutil.cpu_times(), time.perf_counter()

    def rows(self, before: tuple[dict[str, float], Any, float], after: tuple[dict[str, float], Any, float]) -> list[tuple[str, ...]]:
        (c0, m0, t0), (c1, m1, t1) = before, after
        wall = t1 - t0
        cores = os.cpu_count() or 1
        out = []
        ours = 0.0
        for key in c1:
            spent = c1[key] - c0.get(key, 0.0)
            ours += spent
            out.append((key, f"{spent:.1f} s", f"{spent / wall:.0%}"))

        def delta(name: str) -> float:
            return getattr(m1, name, 0.0) - getattr(m0, name, 0.0)

        idle = delta("idle") + delta("iowait")
        busy = wall * cores - idle - delta("steal")
        out.append(("anything else", f"{busy - ours:.1f} s", f"{(busy - ours) / wall:.0%}"))
        out.append(("idle", f"{idle:.1f} s", f"{idle / wall:.0%}"))
        return out


# -- HTTP helpers ----------------------------------------------------------------------------


class Tally:
    """HTTP statuses seen, and the first few failures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []

    def call(self, http: Http, method: str, path: str, body: object = None) -> Any:
        try:
            status, payload = http.request(method, path, body)
        except Exception as exc:
            with self.lock:
                self.statuses[0] += 1
                self.failures.append(f"{method} {path} on :{http.port}: {type(exc).__name__}: {exc}")
            raise
        with self.lock:
            self.statuses[status] += 1
            if status >= 400:
                self.failures.append(f"{method} {path} on :{http.port}: {status} {json.dumps(payload)[:200]}")
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {payload!r}")
        return payload

    def summary(self) -> str:
        return ", ".join(f"{code or 'no response'}: {count}" for code, count in sorted(self.statuses.items()))


class Pool:
    """Client threads, each with one keep-alive connection to each instance."""

    def __init__(self, instances: list[Instance], threads: int = CLIENT_THREADS) -> None:
        self.instances = instances
        self.local = threading.local()
        self.all: list[Http] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="bench-client")

    def http(self, index: int) -> Http:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        if index not in conns:
            conns[index] = Http(self.instances[index].port)
            with self.lock:
                self.all.append(conns[index])
        return conns[index]

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[tuple[Any, BaseException | None]]:
        """``fn(item)`` for each; (result, None) or (None, the exception), in order."""

        def guarded(item: Any) -> tuple[Any, BaseException | None]:
            try:
                return fn(item), None
            except Exception as exc:  # noqa: BLE001 - counted by the caller
                return None, exc

        return list(self.pool.map(guarded, items))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for conn in self.all:
                conn.close()


def wait_for(what: str, probe: Callable[[], Any], done: Callable[[Any], bool], stall: float = 60, limit: float = 600) -> tuple[float, Any]:
    """Call ``probe()`` every 50 ms until ``done(value)``; returns (perf_counter then, value).
    Gives up when the value has not changed for ``stall`` s, or after ``limit`` s."""
    start = time.monotonic()
    last, changed = None, start
    while True:
        value = probe()
        if done(value):
            return time.perf_counter(), value
        if value != last:
            last, changed = value, time.monotonic()
        now = time.monotonic()
        if now - changed > stall:
            raise RuntimeError(f"stuck waiting for {what}: unchanged for {stall:.0f} s: {value}")
        if now - start > limit:
            raise RuntimeError(f"gave up waiting for {what} after {limit:.0f} s: {value}")
        for inst in _SERVERS:
            if inst.process.poll() is not None:
                raise RuntimeError(f"instance {inst.name} exited with {inst.process.returncode} waiting for {what}")
        time.sleep(0.05)


def stats_row(what: str, values: list[float]) -> tuple[Any, ...]:
    if not values:
        return (what, "-", "-", "-", 0)
    return (what, ms(pct(values, 0.5)), ms(pct(values, 0.9)), ms(pct(values, 0.99)), len(values))


# -- 1. cross-instance wake ------------------------------------------------------------------


def bench_wake(cluster: Cluster, samples: int) -> None:
    print(f"## 1. Cross-instance long-poll wake ({samples} samples a mode, modes alternating)\n")
    url = cluster.create_database()
    args = ("--store", url, *LEASE, "--workers", "2", "--park-after", "0", "--max-sessions", "0")
    print(f"Instances A and B: `python -m motus serve start {WAKE_AGENT} --store postgresql://... "
          f"{' '.join(args[2:])}`\n")
    instances = start_instances(("wake-A", "wake-B"), WAKE_AGENT, *args)
    a, b = instances
    notices = Notices(url)
    notices.start()
    tally = Tally()
    http_a = Http(a.port)
    pollers = {"cross": Http(b.port), "local": Http(a.port)}
    meter = Meter(instances, cluster)
    db = psycopg.connect(url, autocommit=True, connect_timeout=10)
    results: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in pollers}
    late: Counter[str] = Counter()
    try:
        cpu0 = meter.snapshot()
        for i in range(samples * 2 + 10):
            mode = "cross" if i % 2 == 0 else "local"
            warm = i < 10
            sid = tally.call(http_a, "POST", "/sessions", {})["session_id"]
            tally.call(http_a, "POST", f"/sessions/{sid}/messages", {"content": "go"})
            body = tally.call(http_a, "GET", f"/sessions/{sid}?wait=true&timeout=30")
            assert body["status"] == "interrupted", body
            interrupt_id = body["interrupts"][0]["interrupt_id"]
            wait_for("the turn to park on A", lambda: tally.call(http_a, "GET", "/health"),
                     lambda h: h["parked_turns"] >= 1 and h["live_turns"] == 0, stall=10)
            time.sleep(0.02)
            poller = pollers[mode]
            sent = time.time()
            tally.call(http_a, "POST", f"/sessions/{sid}/resume", {"interrupt_id": interrupt_id, "value": {"approved": True}})
            poll_sent = time.time()
            done = tally.call(poller, "GET", f"/sessions/{sid}?wait=true&timeout=30")
            returned = time.time()
            assert done["status"] == "idle", done
            stamp = float(done["response"]["content"])
            [(version, status)] = db.execute("SELECT version, status FROM motus_sessions WHERE session_id = %s", (sid,)).fetchall()
            assert status == "idle", status
            noticed = notices.at(sid, version)
            tally.call(http_a, "DELETE", f"/sessions/{sid}")
            if warm:
                continue
            r = results[mode]
            r["resume_to_stamp"].append(stamp - sent)
            r["resume_to_return"].append(returned - sent)
            if poll_sent >= noticed:
                late[mode] += 1
                continue
            r["wake"].append(returned - noticed)
            r["stamp_to_return"].append(returned - stamp)
            r["stamp_to_notice"].append(noticed - stamp)
            time.sleep(0.02)
        cpu1 = meter.snapshot()
    finally:
        notices.stop()
        db.close()
        for conn in (http_a, *pollers.values()):
            conn.close()
        stop_all(instances)
    cross, local = results["cross"], results["local"]
    table(("Interval", "p50", "p90", "p99", "n"), [
        stats_row("**wake, cross**: notice of A's `idle` commit → long poll **on B** returns", cross["wake"]),
        stats_row("wake, local: notice of A's `idle` commit → long poll on A returns", local["wake"]),
        stats_row("agent has the value (A) → A's commit noticed (cross samples)", cross["stamp_to_notice"]),
        stats_row("agent has the value (A) → long poll on B returns", cross["stamp_to_return"]),
        stats_row("agent has the value (A) → long poll on A returns", local["stamp_to_return"]),
        stats_row("turn run time: `POST /resume` on A → agent has the value (replay in a fresh process), cross", cross["resume_to_stamp"]),
        stats_row("turn run time, local", local["resume_to_stamp"]),
        stats_row("`POST /resume` on A → long poll on B returns", cross["resume_to_return"]),
        stats_row("`POST /resume` on A → long poll on A returns", local["resume_to_return"]),
    ])
    if cross["wake"] and local["wake"]:
        print(f"Cross-instance wake costs {ms(pct(cross['wake'], 0.5) - pct(local['wake'], 0.5))} more than a local "
              f"wake at p50 ({ms(pct(cross['wake'], 0.9) - pct(local['wake'], 0.9))} at p90).")
    print(f"Polls sent only after the commit was noticed (left out of the wake rows): cross {late['cross']}, "
          f"local {late['local']}. HTTP statuses: {tally.summary()}.\n")
    for line in tally.failures[:10]:
        print(f"  [error] {line}")
    print("CPU over the part:\n")
    table(("Where", "CPU", "of one core"), meter.rows(cpu0, cpu1))


# -- 2. echo turn: PostgreSQL against SQLite ------------------------------------------------


def bench_echo(cluster: Cluster, turns: int, tmp: Path, fsync_rounds: list[bool]) -> None:
    print(f"## 2. Echo turn, one instance, PostgreSQL against SQLite ({turns} turns a store after 20 warm-up, "
          "50 ms apart, alternating)\n")
    url = cluster.create_database()
    common = ("--workers", "2", "--max-sessions", "0")
    print(f"`python -m motus serve start {ECHO_AGENT} {' '.join(common)}` with `--store postgresql://...` "
          f"and with `--store sqlite:///{tmp}/echo.db`\n")
    pg = Instance("echo-pg", ECHO_AGENT, "--store", url, *LEASE, *common)
    lite = Instance("echo-sqlite", ECHO_AGENT, "--store", f"sqlite:///{tmp}/echo.db", *common)
    tally = Tally()
    rows = []
    p50: dict[str, float] = {}
    try:
        for fsync in fsync_rounds:
            set_fsync(cluster, fsync)
            runs = {"PostgreSQL": (pg, Http(pg.port)), "SQLite": (lite, Http(lite.port))}
            turn: dict[str, list[float]] = defaultdict(list)
            create: dict[str, list[float]] = defaultdict(list)
            post: dict[str, list[float]] = defaultdict(list)
            try:
                for i in range(turns + 20):
                    for name, (_, http) in runs.items():
                        time.sleep(0.05)
                        t0 = time.perf_counter()
                        sid = tally.call(http, "POST", "/sessions", {})["session_id"]
                        t1 = time.perf_counter()
                        tally.call(http, "POST", f"/sessions/{sid}/messages", {"content": "hi"})
                        t2 = time.perf_counter()
                        body = tally.call(http, "GET", f"/sessions/{sid}?wait=true&timeout=30")
                        t3 = time.perf_counter()
                        assert body["status"] == "idle" and body["response"]["content"] == "echo: hi", body
                        if i >= 20:
                            create[name].append(t1 - t0)
                            post[name].append(t2 - t1)
                            turn[name].append(t3 - t1)
            finally:
                for _, http in runs.values():
                    http.close()
            label = f"fsync={'on' if fsync else 'off'}"
            p50[label] = pct(turn["PostgreSQL"], 0.5) - pct(turn["SQLite"], 0.5)
            rows += [
                stats_row(f"turn (`POST /messages` → long poll sees idle), **PostgreSQL, {label}**", turn["PostgreSQL"]),
                stats_row("turn, SQLite (alternating with the row above)", turn["SQLite"]),
                stats_row(f"`POST /messages` round trip alone, PostgreSQL, {label}", post["PostgreSQL"]),
                stats_row("`POST /messages` round trip alone, SQLite", post["SQLite"]),
                stats_row(f"`POST /sessions`, PostgreSQL, {label}", create["PostgreSQL"]),
                stats_row("`POST /sessions`, SQLite", create["SQLite"]),
            ]
            print(f"- PostgreSQL {label}: turn p50 {ms(pct(turn['PostgreSQL'], 0.5))} p90 {ms(pct(turn['PostgreSQL'], 0.9))}; "
                  f"SQLite p50 {ms(pct(turn['SQLite'], 0.5))} p90 {ms(pct(turn['SQLite'], 0.9))}; "
                  f"difference p50 {ms(p50[label])}, p90 {ms(pct(turn['PostgreSQL'], 0.9) - pct(turn['SQLite'], 0.9))}")
        http = Http(pg.port)
        try:
            per_turn, kinds = count_statements(cluster, http)
        finally:
            http.close()
    finally:
        stop_all([pg, lite])
    print()
    table(("Interval", "p50", "p90", "p99", "n"), rows)
    print(f"PostgreSQL statements for one `POST /sessions` + echo turn (`log_statement = all`, 20 turns, untimed): "
          f"**{per_turn:.1f}**, each a round trip:\n")
    table(("Per turn", "Statement"), [(f"{count:.1f}", f"`{kind}`") for count, kind in kinds[:12]])
    print(f"HTTP statuses: {tally.summary()}.\n")
    for line in tally.failures[:10]:
        print(f"  [error] {line}")


# -- 3. spread over three instances ---------------------------------------------------------


def bench_spread(cluster: Cluster, n: int) -> None:
    print(f"## 3. {n} interrupted sessions over three instances, each resumed through a random one\n")
    url = cluster.create_database()
    args = ("--store", url, *LEASE, "--workers", "2", "--park-after", "0", "--max-sessions", "0")
    print(f"Three instances: `python -m motus serve start {APPROVAL_AGENT} --store postgresql://... "
          f"{' '.join(args[2:])}`; {CLIENT_THREADS} client threads.\n")
    instances = start_instances(("spread-1", "spread-2", "spread-3"), APPROVAL_AGENT, *args)
    pool = Pool(instances)
    tally = Tally()
    meter = Meter(instances, cluster)
    rng = random.Random(14)
    phases: list[tuple[str, float, str]] = []
    cpu: list[tuple[str, list[tuple[str, ...]]]] = []
    failed: list[str] = []

    def statuses() -> dict[str, int]:
        return dict(pg_query(url, "SELECT status, count(*) FROM motus_sessions GROUP BY status"))

    def healths() -> list[dict[str, Any]]:
        return [tally.call(inst.http, "GET", "/health") for inst in instances]

    def quiet(hs: list[dict[str, Any]]) -> bool:
        return all(h["live_turns"] == 0 and h["running_workers"] == 0 for h in hs)

    def collect(what: str, results: list[tuple[Any, BaseException | None]]) -> list[Any]:
        errors = [exc for _, exc in results if exc is not None]
        if errors:
            failed.append(f"{what}: {len(errors)} failed, first: {errors[0]!r}")
        return [value for value, exc in results if exc is None]

    try:
        # create + send
        def create_send(i: int) -> tuple[str, int]:
            http = pool.http(i % 3)
            sid = tally.call(http, "POST", "/sessions", {})["session_id"]
            tally.call(http, "POST", f"/sessions/{sid}/messages", {"content": f"/tmp/file-{i}"})
            return sid, i % 3

        c0 = meter.snapshot()
        t0 = time.perf_counter()
        created = collect("create+send", pool.map(create_send, range(n)))
        t1 = time.perf_counter()
        phases.append((f"create + send {n} (`POST /sessions`, `POST /messages` on instance i mod 3)", t1 - t0, f"{n / (t1 - t0):.0f}/s"))
        t2, seen = wait_for(f"{n} interrupted", statuses, lambda s: s.get("interrupted", 0) >= len(created))
        phases.append((f"all {len(created)} interrupted in the database, after the last send", t2 - t1, str(seen)))
        t3, hs = wait_for("no turn holding a process", healths, quiet)
        phases.append(("no turn holding a process (all parked), after that", t3 - t2,
                       "parked " + "/".join(str(h["parked_turns"]) for h in hs)))
        c1 = meter.snapshot()
        cpu.append(("create, send, interrupt, park", meter.rows(c0, c1)))
        owners = Counter(owner for (owner,) in pg_query(url, "SELECT owner FROM motus_sessions"))

        # interrupt ids, from a random instance each
        def read_id(item: tuple[str, int]) -> tuple[str, str, int]:
            sid, creator = item
            body = tally.call(pool.http(rng.randrange(3)), "GET", f"/sessions/{sid}")
            assert body["status"] == "interrupted" and len(body["interrupts"]) == 1, body
            return sid, body["interrupts"][0]["interrupt_id"], creator

        t4 = time.perf_counter()
        ids = collect("read interrupt ids", pool.map(read_id, created))
        t5 = time.perf_counter()
        phases.append((f"read {len(ids)} interrupt ids (`GET /sessions/{{id}}`, random instance; not in the total)", t5 - t4, ""))

        # resume, each through a random instance
        via = [rng.randrange(3) for _ in ids]
        other = sum(1 for (_, _, creator), v in zip(ids, via) if creator != v)

        def resume(item: tuple[tuple[str, str, int], int]) -> None:
            (sid, interrupt_id, _), index = item
            tally.call(pool.http(index), "POST", f"/sessions/{sid}/resume", {"interrupt_id": interrupt_id, "value": {"approved": True}})

        c2 = meter.snapshot()
        t6 = time.perf_counter()
        collect("resume", pool.map(resume, list(zip(ids, via))))
        t7 = time.perf_counter()
        phases.append((f"resume {len(ids)} (`POST /resume` accepted), random instance ({other} not the one that took the message)",
                       t7 - t6, f"{len(ids) / (t7 - t6):.0f}/s"))
        t8, seen = wait_for(f"{n} idle", statuses, lambda s: s.get("idle", 0) >= len(ids))
        phases.append(("all idle in the database, after the last resume", t8 - t7, str(seen)))
        t9, hs = wait_for("no live or parked turn", healths, lambda hs: quiet(hs) and all(h["parked_turns"] == 0 for h in hs))
        phases.append(("no live or parked turn on any instance, after that", t9 - t8, ""))
        c3 = meter.snapshot()
        cpu.append(("resume to idle", meter.rows(c2, c3)))
        phases.append(("**total**: first create → all idle, without reading the ids", (t3 - t0) + (t9 - t6), f"{n / ((t3 - t0) + (t9 - t6)):.0f} sessions/s"))
        phases.append(("first resume → all idle", t8 - t6, f"{len(ids) / (t8 - t6):.0f} turns/s"))

        # verification
        def verify(sid: str) -> str:
            body = tally.call(pool.http(rng.randrange(3)), "GET", f"/sessions/{sid}")
            content = (body.get("response") or {}).get("content") or ""
            return "ok" if body["status"] == "idle" and content.startswith("approved=True") else f"{body['status']}: {content[:60]}"

        t10 = time.perf_counter()
        checks = Counter(collect("verify", pool.map(verify, [sid for sid, _ in created])))
        t11 = time.perf_counter()
        listings = []
        for inst in instances:
            items = tally.call(inst.http, "GET", "/sessions")
            listings.append((inst.name, len(items), dict(Counter(item["status"] for item in items))))
    finally:
        pool.close()
        stop_all(instances)

    table(("Phase", "Time", "Figure"), [(what, f"{secs:.2f} s", figure) for what, secs, figure in phases])
    print(f"Turn owners in the database when all were interrupted: {sorted(owners.values(), reverse=True)}.")
    print(f"Read back (`GET /sessions/{{id}}`, random instance, {t11 - t10:.1f} s): {dict(checks)}.")
    for name, count, by_status in listings:
        print(f"`GET /sessions` on {name}: {count} sessions, {by_status}.")
    print(f"HTTP statuses over the part: {tally.summary()}.\n")
    for line in tally.failures[:10]:
        print(f"  [error] {line}")
    for what, rows in cpu:
        print(f"CPU, {what}:\n")
        table(("Where", "CPU", "of one core"), rows)
    lost = n - checks.get("ok", 0)
    bad_listing = [name for name, count, by_status in listings if count != n or by_status != {"idle": n}]
    if failed or lost or bad_listing:
        for line in failed:
            print(f"  [error] {line}")
        raise SystemExit(f"FAILED: {lost} of {n} sessions not idle with approved=True; listings off on {bad_listing}")
    print(f"None lost: all {n} idle with approved=True, and listed {n} times idle on each instance.\n")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 wake samples, 100 echo turns, 200 sessions")
    parser.add_argument("--samples", type=int, help="wake samples a mode (default 200)")
    parser.add_argument("--turns", type=int, help="echo turns a store (default 300)")
    parser.add_argument("--sessions", type=int, help="sessions over three instances (default 1,000)")
    parser.add_argument("--only", choices=["wake", "echo", "spread"])
    parser.add_argument("--fsync", action="store_true", help="PostgreSQL with fsync=on throughout (default: off, as the tests run it)")
    args = parser.parse_args()
    samples = args.samples or (50 if args.quick else 200)
    turns = args.turns or (100 if args.quick else 300)
    n = args.sessions or (200 if args.quick else 1000)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(kill_all)

    busy = machine_busy()
    print(f"# motus several-instances benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]})\n")
    print(f"Command: `python {' '.join(sys.argv)}`\n")
    if busy > 0.1:
        print(f"**[warn] the machine was {busy:.0%} busy (other processes) in the second before the benchmark "
              "started: the figures below share the CPU with them.**\n")
    started = time.perf_counter()
    cluster = Cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="motus-instances-bench-") as tmp:
            cluster.start()
            version = pg_query(cluster.url(), "SHOW server_version")[0][0]
            set_fsync(cluster, args.fsync)
            print(f"PostgreSQL {version} on 127.0.0.1:{cluster.port} (tests.support.pg.Cluster), fsync={'on' if args.fsync else 'off'}\n")
            if args.only in (None, "wake"):
                bench_wake(cluster, samples)
            if args.only in (None, "echo"):
                bench_echo(cluster, turns, Path(tmp), [True] if args.fsync else [False, True])
                set_fsync(cluster, args.fsync)
            if args.only in (None, "spread"):
                bench_spread(cluster, n)
    except KeyboardInterrupt:
        raise SystemExit("\ninterrupted: every server of the benchmark was stopped") from None
    finally:
        kill_all()
        cluster.stop()
    print(f"Whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
