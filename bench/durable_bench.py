"""Benchmark of durable turns: parked turns, replay, the SQLite store and restarts.

Run from the repository root::

    python bench/durable_bench.py                  # N = 10,000 sessions, 200 samples
    python bench/durable_bench.py --quick          # N = 500, 50 samples, 200 for the restart
    python bench/durable_bench.py --sessions 2000  # another N
    python bench/durable_bench.py --only capacity  # one part: capacity, latency or restart

What it measures (real server subprocesses, ``python -m motus serve start``, real SQLite files
in a temporary folder, loopback HTTP; timed calls use ``http.client`` with keep-alive, as in
``bench/serve_bench.py``). The targets are those of issue 9, "Speed and capacity".

1. Capacity, ``--store sqlite --park-after 0 --workers 2 --max-sessions 0``: N sessions are
   created and each is sent a message to ``bench.agents:approve_once`` (one ``interrupt()``
   with a fixed payload) by 16 client threads; the clock runs until ``/health`` shows all N
   parked. Then the memory of the server's whole process tree (the sum of each process' USS
   over the gunicorn arbiter and all its descendants) and its process count. Then all N are
   resumed by 16 client threads; the clock runs until ``/health`` shows no live or parked
   turn, and ``GET /sessions`` is checked to show every session ``idle``. Targets: tree under
   400 MiB, all resumed to idle within 90 s. Also where the CPU went in each phase, by
   process (exited agent workers count through the fork server that reaped them), and how
   much went to anything else on the machine: a concurrent test run slows every figure.
2. Latency, one sample at a time with 50 ms between samples (a person): resume of a parked
   turn (``--park-after 0``, replayed in a fresh process) until a long poll sees ``idle``;
   resume of a live turn (``--park-after never``): the ``POST /resume`` round trip, the
   value reaching the agent (the agent stamps ``time.time()`` when ``interrupt()`` returns)
   and the long poll seeing ``idle``; echo turns with ``--store memory`` and with SQLite.
   Targets: parked resume to idle p50 < 25 ms; live resume < 5 ms; echo with SQLite within
   1 ms of memory.
3. Restart: a SQLite store with 1,000 sessions parked on an interrupt; SIGTERM, then a new
   server on the same file; from ``Popen`` to the first 200 of ``/health`` (target < 2 s),
   and to the first 200 of ``GET /sessions/{id}`` showing the same interrupt id.

A warning is printed when the machine is busy with other processes before the start.
Every server is started in its own session; on exit (also Ctrl-C or an exception) each is
stopped and anything left of its process tree (workers run in process groups of their own)
is killed. Server logs are kept in ``bench/.durable-<name>.log``; warnings and errors in them
are printed.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_bench import free_port, is_fork_server, ms, pct  # noqa: E402

AGENT = "bench.agents:approve_once"
CLIENT_THREADS = 16
APPROVE = {"approved": True}


# -- HTTP ------------------------------------------------------------------------------------


class Http:
    """A keep-alive JSON client on http.client. gunicorn closes a connection idle for 5 s,
    so a request that finds its connection closed before sending is sent again once on a
    new one (``reconnects`` counts those)."""

    def __init__(self, port: int, timeout: float = 60) -> None:
        self.port = port
        self.timeout = timeout
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.reconnects = 0

    def request(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt:
                    raise
                self.reconnects += 1
        return response.status, (json.loads(raw) if raw else {})

    def call(self, method: str, path: str, body: object = None) -> Any:
        status, payload = self.request(method, path, body)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {payload!r}")
        return payload

    def close(self) -> None:
        self.conn.close()


class Clients:
    """A bounded pool of client threads, each with its own keep-alive connection."""

    def __init__(self, port: int, threads: int = CLIENT_THREADS) -> None:
        self.port = port
        self.local = threading.local()
        self.all: list[Http] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="bench-client")

    def http(self) -> Http:
        client = getattr(self.local, "http", None)
        if client is None:
            client = self.local.http = Http(self.port)
            with self.lock:
                self.all.append(client)
        return client

    def map(self, fn: Callable[[Http, Any], Any], items: Iterable[Any]) -> list[Any]:
        return list(self.pool.map(lambda item: fn(self.http(), item), items))

    def close(self) -> None:
        # Never wait for queued work (Ctrl-C): cancel it and let the servers be killed.
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for client in self.all:
                client.close()

    @property
    def reconnects(self) -> int:
        return sum(client.reconnects for client in self.all)


# -- servers ---------------------------------------------------------------------------------

_SERVERS: list[Served] = []


class Served:
    """One ``python -m motus serve start`` subprocess, in a session of its own, running the
    motus of ``root`` (this checkout unless another is given: ``ab_bench.py``)."""

    def __init__(
        self, name: str, *args: str, agent: str = AGENT, port: int | None = None, settle: float = 0.5, log: str = "durable",
        root: Path = ROOT,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.args = args
        self.log_path = ROOT / "bench" / f".{log}-{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=str(root))
        self.launched = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "motus", "serve", "start", agent, "--port", str(self.port),
             "--log-level", "warning", "--no-ui", *args],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        _SERVERS.append(self)
        self.seen: dict[int, psutil.Process] = {}  # every descendant ever seen, for the clean-up
        self.health_at = self.wait_health() - self.launched
        self.http = Http(self.port)
        if settle:
            time.sleep(settle)  # let the warm workers come up before measuring

    def wait_health(self, timeout: float = 60) -> float:
        """Poll ``/health`` every 5 ms; returns the perf_counter of the first 200."""
        deadline = time.monotonic() + timeout
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    return time.perf_counter()
            except OSError:
                pass
            finally:
                conn.close()
            if self.process.poll() is not None:
                raise SystemExit(f"server {self.name} exited with {self.process.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise SystemExit(f"server {self.name} did not answer /health in {timeout} s; see {self.log_path}")
            time.sleep(0.005)

    def health(self) -> dict[str, Any]:
        return self.http.call("GET", "/health")

    def tree(self) -> list[psutil.Process]:
        """The arbiter and all its live descendants (also remembered for the clean-up)."""
        try:
            root = psutil.Process(self.process.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for proc in procs:
            self.seen.setdefault(proc.pid, proc)
        return [p for p in procs if _alive(p)]

    def memory(self) -> dict[str, Any]:
        """USS (RSS where USS cannot be read) of every process of the tree."""
        rows = []
        for proc in self.tree():
            try:
                info = proc.memory_full_info()
                uss, rss, exact = info.uss, info.rss, True
            except psutil.AccessDenied:
                info = proc.memory_info()
                uss, rss, exact = info.rss, info.rss, False
            except psutil.NoSuchProcess:
                continue
            rows.append({"pid": proc.pid, "role": _role(proc, self.process.pid), "uss": uss, "rss": rss, "exact": exact})
        return {
            "processes": len(rows),
            "uss": sum(r["uss"] for r in rows),
            "rss": sum(r["rss"] for r in rows),
            "all_uss": all(r["exact"] for r in rows),
            "rows": rows,
        }

    def stop(self, timeout: float = 90) -> float:
        """SIGTERM and wait; SIGKILL what is left of the tree. Returns the seconds it took.
        Our keep-alive connection is closed first: gunicorn waits about 2 s for an idle one."""
        self.http.close()
        self.tree()
        start = time.perf_counter()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  [warn] server {self.name} still running {timeout} s after SIGTERM: killed")
        took = time.perf_counter() - start
        self.kill(graceful=True)
        return took

    def kill(self, graceful: bool = False) -> None:
        """SIGKILL the server's process group and every descendant ever seen (workers run in
        process groups of their own). psutil checks a pid still names the same process."""
        self.tree()
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        leftovers = [p for p in self.seen.values() if p.pid != self.process.pid and _alive(p)]
        for proc in leftovers:
            try:
                proc.kill()
            except psutil.Error:
                pass
        if leftovers and graceful:  # after a SIGKILL of the group, workers (own groups) are expected
            print(f"  [warn] server {self.name}: {len(leftovers)} processes outlived its SIGTERM stop and were killed: "
                  + ", ".join(f"{p.pid} {_cmd(p)}" for p in leftovers))
        if hasattr(self, "http"):
            self.http.close()
        if not self.log.closed:
            self.log.close()
        if self in _SERVERS:
            _SERVERS.remove(self)

    def log_problems(self) -> list[str]:
        if not self.log.closed:
            self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        keys = ("ERROR", "CRITICAL", "WARNING", "Traceback", "[error]", "[critical]", "[warning]", "Exception")
        return [line for line in lines if any(key in line for key in keys)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:80]
    except psutil.Error:
        return "?"


def _role(proc: psutil.Process, arbiter: int) -> str:
    if proc.pid == arbiter:
        return "gunicorn arbiter"
    try:
        cmd = " ".join(proc.cmdline())
        parent = proc.parent()
        parent_cmd = " ".join(parent.cmdline()) if parent else ""
    except psutil.Error:
        return "?"
    if is_fork_server(parent_cmd):
        return "agent worker (warm or live)"
    if is_fork_server(cmd):
        return "forkserver"
    if "resource_tracker" in cmd:
        return "resource tracker"
    if parent is not None and parent.pid == arbiter:
        return "server (gunicorn worker)"
    return cmd[:40]


def checkouts(given: list[str], this: str = "this") -> list[tuple[Path, str]]:
    """The ``--root PATH[:LABEL]`` options of a bench that compares checkouts: each a folder
    and its label (the folder's name when none is given), or this checkout alone, labelled
    ``this``, when none is given."""
    roots = []
    for value in given:
        path, sep, label = value.rpartition(":")
        if not sep:
            path, label = value, Path(value).resolve().name
        roots.append((Path(path).resolve(), label))
    return roots or [(ROOT, this)]


def kill_all() -> None:
    for served in list(_SERVERS):
        try:
            served.kill()
        except Exception as exc:  # keep killing the others
            print(f"  [warn] could not kill server {served.name}: {exc}")


def report_log(served: Served) -> None:
    problems = served.log_problems()
    if problems:
        print(f"\n**Server log {served.log_path.relative_to(ROOT)}: {len(problems)} warning/error lines** (first 20):\n")
        print("```")
        for line in problems[:20]:
            print(line)
        print("```")


# -- helpers ---------------------------------------------------------------------------------


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print()


def wait_until(served: Served, done: Callable[[dict[str, Any]], bool], what: str, stall: float = 120) -> float:
    """Poll ``/health`` every 50 ms until ``done(health)``; returns the perf_counter then.
    Gives up when nothing changes for ``stall`` seconds (the server is stuck: say so)."""
    last, changed = None, time.monotonic()
    while True:
        health = served.health()
        if done(health):
            return time.perf_counter()
        key = (health["live_turns"], health["parked_turns"], health["running_workers"], health["total_sessions"])
        if key != last:
            last, changed = key, time.monotonic()
        elif time.monotonic() - changed > stall:
            raise RuntimeError(f"stuck waiting for {what}: /health unchanged for {stall:.0f} s: {health}")
        if served.process.poll() is not None:
            raise RuntimeError(f"server {served.name} exited with {served.process.returncode} waiting for {what}")
        time.sleep(0.05)


class Sampler(threading.Thread):
    """Samples the tree's process count and RSS every 0.5 s (peaks while turns churn)."""

    def __init__(self, served: Served) -> None:
        super().__init__(daemon=True, name="bench-sampler")
        self.served = served
        self.halt = threading.Event()
        self.peak_procs = 0
        self.peak_rss = 0

    def run(self) -> None:
        while not self.halt.wait(0.5):
            procs = self.served.tree()
            rss = 0
            for proc in procs:
                try:
                    rss += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_procs = max(self.peak_procs, len(procs))
            self.peak_rss = max(self.peak_rss, rss)

    def stop(self) -> None:
        self.halt.set()
        self.join()


class CpuMeter:
    """CPU seconds spent by each part of the server's tree (and by this benchmark) between
    ``start()`` and ``stop()``: where the time of a phase goes. Agent workers that exited
    count in their reaper's ``children`` times, so they are added to "agent workers"."""

    def __init__(self, served: Served) -> None:
        self.served = served

    def snapshot(self) -> tuple[Counter[str], Any]:
        by_role: Counter[str] = Counter()
        for proc in self.served.tree():
            try:
                times = proc.cpu_times()
                role = _role(proc, self.served.process.pid)
            except psutil.Error:
                continue
            role = "agent workers" if role.startswith("agent worker") else role
            by_role[role] += times.user + times.system
            by_role["agent workers"] += times.children_user + times.children_system if role == "forkserver" else 0
        me = psutil.Process().cpu_times()
        by_role["this benchmark (clients)"] += me.user + me.system
        return by_role, psutil.cpu_times()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.before, self.machine0 = self.snapshot()

    def stop(self) -> list[tuple[str, str]]:
        wall = time.perf_counter() - self.t0
        after, machine1 = self.snapshot()
        cores = os.cpu_count() or 1
        rows = []
        for role in sorted(set(after) | set(self.before), key=lambda r: -(after[r] - self.before[r])):
            spent = after[role] - self.before[role]
            rows.append((role, f"{spent:.1f} s ({spent / wall:.0%} of one core)"))

        def delta(name: str) -> float:
            return getattr(machine1, name, 0.0) - getattr(self.machine0, name, 0.0)

        idle = delta("idle") + delta("iowait")
        steal = delta("steal")
        busy = wall * cores - idle - steal
        others = busy - sum(after[r] - self.before[r] for r in after)
        rows.append(("anything else (other processes, kernel threads, interrupts)", f"{others:.1f} s ({others / wall:.0%} of one core)"))
        rows.append(("stolen by the hypervisor", f"{steal:.1f} s"))
        rows.append(("machine idle", f"{idle:.1f} s ({idle / (wall * cores):.0%} of {cores} cores over {wall:.1f} s)"))
        return rows


def interrupt_many(served: Served, clients: Clients, n: int) -> dict[str, Any]:
    """Create n sessions, send each a message, wait until all n are parked."""
    t0 = time.perf_counter()
    sids = clients.map(lambda h, _: h.call("POST", "/sessions", {})["session_id"], range(n))
    t1 = time.perf_counter()
    clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/messages", {"content": "go"}), sids)
    t2 = time.perf_counter()
    t3 = wait_until(served, lambda h: h["parked_turns"] >= n, f"{n} parked turns")
    return {"sids": sids, "create": t1 - t0, "send": t2 - t1, "parked_after_send": t3 - t1, "parked_total": t3 - t0}


def interrupt_ids(clients: Clients, sids: list[str]) -> dict[str, str]:
    def one(h: Http, sid: str) -> tuple[str, str]:
        body = h.call("GET", f"/sessions/{sid}")
        assert body["status"] == "interrupted" and len(body["interrupts"]) == 1, body
        return sid, body["interrupts"][0]["interrupt_id"]

    return dict(clients.map(one, sids))


# -- 1. capacity -----------------------------------------------------------------------------


def bench_capacity(n: int, tmp: Path) -> None:
    print(f"## 1. Capacity: {n} sessions interrupted at once\n")
    args = ("--store", f"sqlite:///{tmp}/bench.db", "--park-after", "0", "--workers", "2", "--max-sessions", "0")
    print(f"Server: `python -m motus serve start {AGENT} {' '.join(args)}`; {CLIENT_THREADS} client threads.\n")
    served = Served("capacity", *args)
    clients = Clients(served.port)
    sampler = Sampler(served)
    sampler.start()
    meter = CpuMeter(served)
    try:
        meter.start()
        r = interrupt_many(served, clients, n)
        cpu_interrupt = meter.stop()
        sids = r["sids"]
        peak_procs_interrupting, peak_rss_interrupting = sampler.peak_procs, sampler.peak_rss
        mem = served.memory()
        health = served.health()
        statuses = Counter(item["status"] for item in served.http.call("GET", "/sessions"))

        t0 = time.perf_counter()
        ids = interrupt_ids(clients, sids)
        fetch_ids = time.perf_counter() - t0

        sampler.peak_procs = sampler.peak_rss = 0
        meter.start()
        t0 = time.perf_counter()
        clients.map(lambda h, sid: h.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": ids[sid], "value": APPROVE}), sids)
        t1 = time.perf_counter()
        t2 = wait_until(served, lambda h: h["live_turns"] == 0 and h["parked_turns"] == 0, "every resumed turn to end")
        cpu_resume = meter.stop()
        after = Counter(item["status"] for item in served.http.call("GET", "/sessions"))
        health_after = served.health()
        mem_after = served.memory()
        sampler.stop()

        table(("What", "Figure", "Target"), [
            (f"create {n} sessions (`POST /sessions`)", f"{r['create']:.2f} s ({n / r['create']:.0f}/s)", ""),
            (f"send {n} messages (`POST /messages` accepted)", f"{r['send']:.2f} s ({n / r['send']:.0f}/s)", ""),
            (f"**all {n} interrupted and parked**, from the first message", f"**{r['parked_after_send']:.2f} s** ({n / r['parked_after_send']:.0f} turns/s)", ""),
            (f"all {n} interrupted and parked, from the first `POST /sessions`", f"{r['parked_total']:.2f} s", ""),
            ("statuses then (`GET /sessions`)", dict(statuses), f"{n} interrupted"),
            ("`/health` then", f"parked {health['parked_turns']}, live {health['live_turns']}, running_workers {health['running_workers']}", ""),
            (f"**server process tree with {n} parked** ({'USS' if mem['all_uss'] else 'USS, RSS where USS unreadable'})",
             f"**{mib(mem['uss'])}** ({mem['processes']} processes; RSS {mib(mem['rss'])})", "< 400 MiB"),
            ("peak while interrupting (sampled every 0.5 s)", f"{peak_procs_interrupting} processes, RSS {mib(peak_rss_interrupting)}", ""),
            (f"read the {n} interrupt ids (`GET /sessions/{{id}}`, untimed below)", f"{fetch_ids:.2f} s", ""),
            (f"resume {n} (`POST /resume` accepted)", f"{t1 - t0:.2f} s ({n / (t1 - t0):.0f}/s)", ""),
            (f"**all {n} resumed to idle**, from the first resume", f"**{t2 - t0:.2f} s** ({n / (t2 - t0):.0f} turns/s)", "< 90 s"),
            ("statuses then (`GET /sessions`)", dict(after), f"{n} idle"),
            ("`/health` then", f"parked {health_after['parked_turns']}, live {health_after['live_turns']}, running_workers {health_after['running_workers']}", ""),
            ("peak while resuming (sampled every 0.5 s)", f"{sampler.peak_procs} processes, RSS {mib(sampler.peak_rss)}", ""),
            ("server process tree after", f"{mib(mem_after['uss'])} USS ({mem_after['processes']} processes)", ""),
        ])
        print(f"Process tree with {n} parked:\n")
        table(("pid", "role", "USS", "RSS"), [(row["pid"], row["role"], mib(row["uss"]), mib(row["rss"])) for row in mem["rows"]])
        print("CPU time by process, while interrupting (first message → all parked) and while resuming "
              "(first resume → all idle):\n")
        resume_cpu = dict(cpu_resume)
        table(("Process", "Interrupting", "Resuming"), [(role, spent, resume_cpu.get(role, "")) for role, spent in cpu_interrupt])
        reconnects = clients.reconnects
        clients.close()
        stop = served.stop()
        print(f"SIGTERM to exit with {n} idle sessions: {stop:.2f} s; client reconnects: {reconnects}\n")
        report_log(served)
    finally:
        sampler.halt.set()
        clients.close()
        served.kill()


# -- 2. latency ------------------------------------------------------------------------------


def wait_parked(served: Served, count: int) -> None:
    deadline = time.monotonic() + 30
    while served.health()["parked_turns"] < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"turn not parked after 30 s: {served.health()}")
        time.sleep(0.005)


def bench_resume(served: Served, samples: int, parked: bool) -> dict[str, list[float]]:
    """One session per sample: send, see the interrupt, (wait until parked,) wait 50 ms as a
    person would, then resume: the POST round trip, the value reaching the agent, idle."""
    client = Http(served.port)
    post, reached, idle = [], [], []
    warmup = min(10, samples // 10)
    try:
        for i in range(samples + warmup):
            sid = client.call("POST", "/sessions", {})["session_id"]
            client.call("POST", f"/sessions/{sid}/messages", {"content": "go"})
            body = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            assert body["status"] == "interrupted", body
            [item] = body["interrupts"]
            if parked:
                wait_parked(served, 1)
            time.sleep(0.05)  # a person reading the question
            sent = time.time()
            t0 = time.perf_counter()
            client.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": item["interrupt_id"], "value": APPROVE})
            t1 = time.perf_counter()
            done = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            t2 = time.perf_counter()
            assert done["status"] == "idle", done
            if i >= warmup:
                post.append(t1 - t0)
                reached.append(float(done["response"]["content"]) - sent)
                idle.append(t2 - t0)
            if parked:  # the session is idle now: no parked turn is left
                assert served.health()["parked_turns"] == 0
    finally:
        client.close()
    return {"post": post, "reached": reached, "idle": idle}


def bench_echo(served: Served, turns: int) -> list[float]:
    client = Http(served.port)
    latencies = []
    warmup = min(20, turns // 10)
    try:
        sid = client.call("POST", "/sessions", {})["session_id"]
        for i in range(turns + warmup):
            time.sleep(0.05)  # a person reading the reply before typing the next message
            start = time.perf_counter()
            client.call("POST", f"/sessions/{sid}/messages", {"content": f"m{i}"})
            body = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            elapsed = time.perf_counter() - start
            assert body["status"] == "idle", body
            if i >= warmup:
                latencies.append(elapsed)
            if i % 50 == 49:  # keep the state short
                sid = client.call("POST", "/sessions", {})["session_id"]
    finally:
        client.close()
    return latencies


def bench_latency(samples: int, tmp: Path) -> None:
    print(f"## 2. Latency ({samples} samples each, 50 ms between samples, one at a time)\n")
    rows = []

    def row(what: str, values: list[float], target: str = "") -> None:
        rows.append((what, ms(pct(values, 0.5)), ms(pct(values, 0.9)), ms(pct(values, 0.99)), len(values), target))

    def run(name: str, args: tuple[str, ...], fn: Callable[[Served], None], agent: str = AGENT) -> None:
        print(f"- {name}: `python -m motus serve start {agent} {' '.join(args)}`")
        served = Served(name, *args, agent=agent)
        try:
            fn(served)
            served.stop()
            report_log(served)
        finally:
            served.kill()

    common = ("--workers", "2")

    def parked(served: Served) -> None:
        r = bench_resume(served, samples, parked=True)
        row("(a) parked turn (`--park-after 0`, SQLite): `POST /resume` → long poll sees idle", r["idle"], "p50 < 25 ms")
        row("(a) parked turn: `POST /resume` round trip alone", r["post"])
        row("(a) parked turn: `POST /resume` → the value reaches the agent (replayed in a fresh process)", r["reached"])

    def live(store: str) -> Callable[[Served], None]:
        def fn(served: Served) -> None:
            r = bench_resume(served, samples, parked=False)
            row(f"(b) live turn (`--park-after never`, {store}): `POST /resume` → the value reaches the agent", r["reached"], "< 5 ms")
            row(f"(b) live turn ({store}): `POST /resume` round trip alone", r["post"])
            row(f"(b) live turn ({store}): `POST /resume` → long poll sees idle", r["idle"])
        return fn

    def echo(store: str) -> Callable[[Served], None]:
        def fn(served: Served) -> None:
            row(f"(c) echo turn, `--store {store}`: `POST /messages` → long poll sees idle", bench_echo(served, samples),
                "SQLite p50 within 1 ms of memory")
        return fn

    run("parked-resume", ("--store", f"sqlite:///{tmp}/parked.db", "--park-after", "0", *common), parked)
    run("live-resume-sqlite", ("--store", f"sqlite:///{tmp}/live.db", "--park-after", "never", *common), live("SQLite"))
    run("live-resume-memory", ("--store", "memory", "--park-after", "never", *common), live("memory"))
    run("echo-memory", ("--store", "memory", *common), echo("memory"), agent="bench.agents:echo")
    run("echo-sqlite", ("--store", f"sqlite:///{tmp}/echo.db", *common), echo("sqlite"), agent="bench.agents:echo")
    print()
    table(("What", "p50", "p90", "p99", "n", "Target"), rows)


# -- 3. restart ------------------------------------------------------------------------------


def bench_restart(n: int, tmp: Path) -> None:
    print(f"## 3. Restart with {n} interrupted sessions in the SQLite store\n")
    args = ("--store", f"sqlite:///{tmp}/restart.db", "--park-after", "0", "--workers", "2", "--max-sessions", "0")
    print(f"Server: `python -m motus serve start {AGENT} {' '.join(args)}`, SIGTERM, then the same command again.\n")
    served = Served("restart-1", *args)
    clients = Clients(served.port)
    try:
        r = interrupt_many(served, clients, n)
        sids = r["sids"]
        before = interrupt_ids(clients, sids)
        clients.close()
        stop = served.stop()
        report_log(served)
    finally:
        clients.close()
        served.kill()

    probe = sids[len(sids) // 2]
    second = Served("restart-2", *args, settle=0)
    clients = Clients(second.port)
    try:
        health_at = second.health_at
        client = Http(second.port)
        while True:
            status, body = client.request("GET", f"/sessions/{probe}")
            if status == 200 and body["status"] == "interrupted":
                break
            if time.perf_counter() - second.launched > 60:
                raise RuntimeError(f"session {probe} not interrupted 60 s after the restart: {status} {body}")
            time.sleep(0.005)
        session_at = time.perf_counter() - second.launched
        client.close()
        same_probe = body["interrupts"][0]["interrupt_id"] == before[probe]
        health = second.health()
        after = interrupt_ids(clients, sids)
        same = sum(after[sid] == before[sid] for sid in sids)
        # And one of them still resumes (replayed from the journal in a fresh process).
        client = Http(second.port)
        t0 = time.perf_counter()
        client.call("POST", f"/sessions/{probe}/resume", {"interrupt_id": after[probe], "value": APPROVE})
        done = client.call("GET", f"/sessions/{probe}?wait=true&timeout=30")
        resume_idle = time.perf_counter() - t0
        client.close()
        table(("What", "Figure", "Target"), [
            (f"create {n} sessions and get all interrupted and parked", f"{r['parked_total']:.2f} s", ""),
            (f"SIGTERM → exit, {n} parked", f"{stop:.2f} s", ""),
            ("**launch (`Popen`) → first 200 from `/health`**", f"**{health_at * 1000:.0f} ms**", "< 2 s"),
            ("launch → first 200 from `GET /sessions/{id}` showing `interrupted` with the same interrupt id",
             f"{session_at * 1000:.0f} ms (same id: {same_probe})", ""),
            ("`/health` after the restart", f"sessions {health['total_sessions']}, parked {health['parked_turns']}, live {health['live_turns']}", f"{n} parked"),
            ("sessions showing the same interrupt id after the restart", f"{same} of {n}", f"{n}"),
            ("resume one right after the restart → idle (the first turn: warm workers may still be starting)", f"{resume_idle * 1000:.1f} ms ({done['status']})", "idle"),
        ])
        second.stop()
        report_log(second)
    finally:
        clients.close()
        second.kill()


def machine_busy(seconds: float = 1.0) -> float:
    """The share of all cores busy over ``seconds`` (other processes: nothing of ours runs)."""
    return psutil.cpu_percent(interval=seconds) / 100


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, help="N for the capacity part (default 10,000; 500 with --quick)")
    parser.add_argument("--quick", action="store_true", help="N = 500, 50 samples, 200 sessions for the restart")
    parser.add_argument("--only", choices=["capacity", "latency", "restart"])
    args = parser.parse_args()
    n = args.sessions or (500 if args.quick else 10_000)
    samples = 50 if args.quick else 200
    restart_n = 200 if args.quick else 1_000

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress shows when redirected
    # Ctrl-C stops the servers even when started in the background (where SIGINT is ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # and so does SIGTERM
    atexit.register(kill_all)

    busy = machine_busy()
    tmp = Path(tempfile.mkdtemp(prefix="motus-durable-bench-"))
    print(f"# motus durable turns benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM)\n")
    print(f"Command: `python {' '.join(sys.argv)}`; stores in {tmp}\n")
    if busy > 0.1:
        print(f"**[warn] the machine was {busy:.0%} busy (other processes) in the second before the benchmark "
              "started: the figures below share the CPU with them.**\n")
    started = time.perf_counter()
    try:
        if args.only in (None, "capacity"):
            bench_capacity(n, tmp)
        if args.only in (None, "latency"):
            bench_latency(samples, tmp)
        if args.only in (None, "restart"):
            bench_restart(restart_n, tmp)
    except KeyboardInterrupt:
        kill_all()
        raise SystemExit("\ninterrupted: every server of the benchmark was stopped") from None
    finally:
        kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
