"""Benchmark of ``motus serve``: turn latency, interrupt latency, and capacity.

Run from the repository root::

    python bench/serve_bench.py            # all three, prints a markdown report
    python bench/serve_bench.py --quick    # fewer iterations

What it measures (a real server subprocess, real HTTP over loopback). Timed requests use
``http.client`` with keep-alive: ``requests`` itself costs about 2 ms a call on a small
machine, which would measure the client library rather than the server.

1. Echo turn: ``POST /messages`` then a long poll that sees ``idle``; p50/p90/p99 over N
   turns, sent as a person would (50 ms between turns), and back to back.
2. Interrupt: the agent stamps ``time.time()`` into the payload just before calling
   ``interrupt()``; the long poll sent right after ``POST /messages`` (so it is waiting
   when the interrupt happens) reports when it saw it. Then the resume is posted: the agent
   stamps when its future resolved, and a long poll reports when the turn is ``idle``.
3. Capacity with ``--workers 2``: 200 sessions interrupted at once, echo turns of other
   sessions meanwhile, then all 200 resumed; and the unique set size (USS) of the worker
   processes that hold the interrupted turns.
4. Throughput with ``--workers 2``: 8 client threads running echo turns back to back for
   10 s (5 s with ``--quick``), each on its own session: turns a second, and the turn's p50
   under that load.

Beside every latency figure: the CPU the server's whole tree spent (gunicorn's arbiter and
worker, the fork server, every agent worker, those that exited included), read from
``/proc`` before and after, divided by the turns measured. Where the figure has pauses in
it (a person's 50 ms), the CPU the idle server spent meanwhile is in it too.
"""

from __future__ import annotations

import argparse
import http.client
import threading
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent



def is_fork_server(cmd: str) -> bool:
    """motus' zygote, or multiprocessing's forkserver (``MOTUS_WORKER_START=multiprocessing``)."""
    return "forkserver" in cmd or "motus-zygote" in cmd

def tree_cpu(root_pid: int) -> float:
    """CPU seconds the server's tree has spent so far: every live process under ``root_pid``
    (the arbiter), and the agent workers that exited, through the fork server's children
    times (it reaped them)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
            if is_fork_server(" ".join(proc.cmdline())):
                total += times.children_user + times.children_system
        except psutil.Error:
            continue  # a worker that exited meanwhile: its reaper's children times have it
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Http:
    """A keep-alive JSON client on http.client (cheap enough not to dominate the timings)."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("/", 1)[-1].split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def call(self, method: str, path: str, body: object = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 400:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:200]!r}")
        return json.loads(raw) if raw else {}

    def close(self) -> None:
        self.conn.close()


class Served:
    def __init__(self, agent: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The store is memory unless $MOTUS_STORE says otherwise (bench/durable_bench.py
        # compares stores); the default SQLite file would be shared by every run.
        env = dict(os.environ, PYTHONPATH=str(ROOT), MOTUS_STORE=os.environ.get("MOTUS_STORE", "memory"))
        self.log = open(ROOT / "bench" / ".server.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "motus", "serve", "start", agent, "--port", str(self.port), "--log-level", "warning", *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.http = requests.Session()
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.http.get(self.url + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("server did not start; see bench/.server.log")
            time.sleep(0.05)
        # Let the warm workers come up before measuring.
        time.sleep(1.0)

    def cpu(self) -> float:
        return tree_cpu(self.process.pid)

    def session(self) -> str:
        return self.http.post(self.url + "/sessions", json={}, timeout=10).json()["session_id"]

    def send(self, sid: str, content: str, http: requests.Session | None = None) -> None:
        r = (http or self.http).post(f"{self.url}/sessions/{sid}/messages", json={"content": content}, timeout=10)
        r.raise_for_status()

    def wait(self, sid: str, http: requests.Session | None = None, timeout: float = 30) -> dict:
        r = (http or self.http).get(f"{self.url}/sessions/{sid}", params={"wait": "true", "timeout": timeout}, timeout=timeout + 10)
        r.raise_for_status()
        return r.json()

    def workers(self) -> list[psutil.Process]:
        """Worker processes: children of the fork server (which is excluded itself)."""
        found = []
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and is_fork_server(" ".join(proc.parent().cmdline())):
                    found.append(proc)
            except psutil.Error:
                pass
        return found

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def per_turn(cpu_seconds: float, turns: int) -> str:
    return f"server tree CPU {cpu_seconds / max(turns, 1) * 1000:.2f} ms a turn"


def bench_echo(turns: int, pause: float) -> dict[str, float]:
    served = Served("bench.agents:echo", "--workers", "2")
    client = Http(served.url)
    try:
        sid = served.session()
        latencies = []
        cpu = 0.0
        for i in range(turns + 20):
            if i == 20:
                cpu = served.cpu()
            if pause:
                time.sleep(pause)  # a person reading the reply before typing the next message
            start = time.perf_counter()
            client.call("POST", f"/sessions/{sid}/messages", {"content": f"m{i}"})
            body = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            elapsed = time.perf_counter() - start
            assert body["status"] == "idle", body
            if i >= 20:  # warm-up
                latencies.append(elapsed)
            if i % 50 == 49:  # keep the state short: the echo agent appends to it
                sid = served.session()
        cpu = served.cpu() - cpu
        return {"p50": pct(latencies, 0.5), "p90": pct(latencies, 0.9), "p99": pct(latencies, 0.99), "n": len(latencies),
                "cpu": cpu}
    finally:
        client.close()
        served.stop()


def long_history(messages: int, size: int = 2000) -> list[dict[str, str]]:
    """``messages`` alternating user and assistant messages of ``size`` characters each: the
    history a session preloads for the long-history runs (a conversation with tool output)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i:05d} " + "x" * size} for i in range(messages)]


def echo_load(url: str, seconds: float, clients: int = 8, history: list[dict[str, str]] | None = None) -> dict[str, float]:
    """``clients`` threads, each running echo turns back to back on its own session (a new
    one every 50 turns, so the history stays short; each new one preloaded with ``history``)
    for ``seconds``: how many turns, and each one's latency."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(index: int) -> None:
        http = Http(url)
        try:
            preload = {"state": history} if history else {}
            sid = http.call("POST", "/sessions", preload)["session_id"]
            while time.monotonic() < stop:
                started = time.perf_counter()
                http.call("POST", f"/sessions/{sid}/messages", {"content": "hi"})
                body = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
                assert body["status"] == "idle", body
                with lock:
                    latencies.append(time.perf_counter() - started)
                counts[index] += 1
                if counts[index] % 50 == 0:
                    http.call("DELETE", f"/sessions/{sid}")
                    sid = http.call("POST", "/sessions", preload)["session_id"]
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)
        finally:
            http.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return {"turns": sum(counts), "wall": wall, "p50": pct(latencies, 0.5), "p90": pct(latencies, 0.9)}


def bench_throughput(seconds: float) -> dict[str, float]:
    served = Served("bench.agents:echo", "--workers", "2", "--max-sessions", "0")
    try:
        cpu = served.cpu()
        result = echo_load(served.url, seconds)
        result["cpu"] = served.cpu() - cpu
        return result
    finally:
        served.stop()


def bench_interrupt(rounds: int) -> dict[str, float]:
    served = Served("bench.agents:timed_interrupt", "--workers", "2")
    client = Http(served.url)
    try:
        visible, reached, completed = [], [], []
        cpu = 0.0
        for i in range(rounds + 10):
            if i == 10:
                cpu = served.cpu()
            time.sleep(0.05)  # a person between turns
            sid = served.session()
            client.call("POST", f"/sessions/{sid}/messages", {"content": "go"})
            body = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            seen = time.time()
            assert body["status"] == "interrupted", body
            [item] = body["interrupts"]
            called_at = item["payload"]["called_at"]
            time.sleep(0.05)  # a person reading the question
            sent = time.time()
            client.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": item["interrupt_id"], "value": {"approved": True}})
            done = client.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            finished = time.time()
            assert done["status"] == "idle", done
            if i >= 10:
                visible.append(seen - called_at)
                reached.append(float(done["response"]["content"]) - sent)
                completed.append(finished - sent)
        return {
            "visible_p50": pct(visible, 0.5), "visible_p90": pct(visible, 0.9),
            "reached_p50": pct(reached, 0.5), "reached_p90": pct(reached, 0.9),
            "completed_p50": pct(completed, 0.5), "completed_p90": pct(completed, 0.9),
            "n": len(visible), "cpu": served.cpu() - cpu,
        }
    finally:
        client.close()
        served.stop()


def bench_capacity(sessions: int) -> dict[str, float]:
    served = Served("bench.agents:mixed", "--workers", "2", "--threads", "64")
    try:
        cpu_start = served.cpu()
        start = time.perf_counter()
        sids = [served.session() for _ in range(sessions)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda sid: served.send(sid, "wait", requests.Session()), sids))
        pending: dict[str, str] = {}
        deadline = time.monotonic() + 300
        while len(pending) < sessions and time.monotonic() < deadline:
            for sid in sids:
                if sid in pending:
                    continue
                body = served.http.get(f"{served.url}/sessions/{sid}", timeout=10).json()
                if body["status"] == "interrupted":
                    pending[sid] = body["interrupts"][0]["interrupt_id"]
            time.sleep(0.05)
        all_interrupted = time.perf_counter() - start
        assert len(pending) == sessions, f"only {len(pending)} of {sessions} interrupted"

        # Other sessions still complete turns while 200 wait on a human.
        other = served.session()
        echo_latencies = []
        cpu_echo = served.cpu()
        for i in range(50):
            t0 = time.perf_counter()
            served.send(other, f"x{i}")
            assert served.wait(other)["status"] == "idle"
            echo_latencies.append(time.perf_counter() - t0)
        cpu_echo = served.cpu() - cpu_echo

        workers = served.workers()
        uss = []
        for proc in workers:
            try:
                uss.append(proc.memory_full_info().uss)
            except psutil.NoSuchProcess:
                pass
        server_proc = psutil.Process(served.process.pid).children()[0]
        server_threads = server_proc.num_threads()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: requests.post(
                f"{served.url}/sessions/{item[0]}/resume", json={"interrupt_id": item[1], "value": True}, timeout=30
            ).raise_for_status(), pending.items()))
        for sid in sids:
            body = served.wait(sid)
            while body["status"] == "running":
                body = served.wait(sid)
            assert body["status"] == "idle", body
        all_finished = time.perf_counter() - t0
        return {
            "sessions": sessions,
            "time_to_interrupt_all": all_interrupted,
            "echo_p50_while_waiting": pct(echo_latencies, 0.5),
            "echo_p90_while_waiting": pct(echo_latencies, 0.9),
            "worker_processes": len(workers),
            "uss_median_mib": statistics.median(uss) / 2**20 if uss else float("nan"),
            "uss_total_mib": sum(uss) / 2**20,
            "server_threads": server_threads,
            "time_to_finish_all_after_resume": all_finished,
            "cpu_echo": cpu_echo, "echo_turns": len(echo_latencies),
            "cpu_total": served.cpu() - cpu_start,
        }
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--only", choices=["echo", "interrupt", "capacity", "throughput"])
    args = parser.parse_args()
    turns, rounds, sessions, seconds = (100, 30, 50, 5.0) if args.quick else (500, 100, 200, 10.0)
    print(f"# motus serve benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]})\n")
    if args.only in (None, "echo"):
        r = bench_echo(turns, pause=0.05)
        print(f"Echo turn (POST message + long poll sees idle), 50 ms between turns, n={r['n']}: p50 {ms(r['p50'])}, p90 {ms(r['p90'])}, p99 {ms(r['p99'])}; {per_turn(r['cpu'], r['n'])}")
        r = bench_echo(turns, pause=0)
        print(f"Echo turn, back to back (a process started per turn), n={r['n']}: p50 {ms(r['p50'])}, p90 {ms(r['p90'])}, p99 {ms(r['p99'])}; {per_turn(r['cpu'], r['n'])}")
    if args.only in (None, "interrupt"):
        r = bench_interrupt(rounds)
        print(f"interrupt() called -> the long poll (sent right after POST) returns it, n={r['n']}: p50 {ms(r['visible_p50'])}, p90 {ms(r['visible_p90'])}")
        print(f"Resume reaches the agent: p50 {ms(r['reached_p50'])}, p90 {ms(r['reached_p90'])}")
        print(f"Resume to turn complete (long poll sees idle): p50 {ms(r['completed_p50'])}, p90 {ms(r['completed_p90'])}")
        print(f"  {per_turn(r['cpu'], r['n'])} (a turn here: a session, an interrupt, a resume)")
    if args.only in (None, "capacity"):
        r = bench_capacity(sessions)
        print(f"Capacity, --workers 2: {r['sessions']} sessions interrupted at once in {r['time_to_interrupt_all']:.2f} s")
        print(f"  echo turns of another session meanwhile: p50 {ms(r['echo_p50_while_waiting'])}, p90 {ms(r['echo_p90_while_waiting'])}; {per_turn(r['cpu_echo'], r['echo_turns'])}")
        print(f"  worker processes: {r['worker_processes']}, USS median {r['uss_median_mib']:.1f} MiB each, {r['uss_total_mib']:.0f} MiB in all")
        print(f"  server threads while {r['sessions']} wait: {r['server_threads']}")
        print(f"  all {r['sessions']} resumed and idle in {r['time_to_finish_all_after_resume']:.2f} s")
        print(f"  {per_turn(r['cpu_total'], r['sessions'])} over the whole run (a turn here: interrupted, waited, resumed)")
    if args.only in (None, "throughput"):
        r = bench_throughput(seconds)
        print(f"Throughput, --workers 2, 8 clients back to back for {seconds:.0f} s: {r['turns'] / r['wall']:.0f} turns a second, "
              f"p50 {ms(r['p50'])}, p90 {ms(r['p90'])}; {per_turn(r['cpu'], int(r['turns']))}")


if __name__ == "__main__":
    main()
