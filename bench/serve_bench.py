"""Benchmark of ``motus serve``: turn latency, interrupt latency, and capacity.

Run from the repository root::

    python bench/serve_bench.py            # all three, prints a markdown report
    python bench/serve_bench.py --quick    # fewer iterations

What it measures (a real server subprocess, real HTTP over loopback, one client):

1. Echo turn: ``POST /messages`` then a long poll that sees ``idle``; p50/p90/p99 over N turns.
2. Interrupt: the agent stamps ``time.time()`` into the payload just before calling
   ``interrupt()``; a long poll that is already waiting reports when it saw it. Then the
   resume is posted: the agent stamps when its future resolved, and a long poll reports
   when the turn is ``idle``.
3. Capacity with ``--workers 2``: 200 sessions interrupted at once, echo turns of other
   sessions meanwhile, then all 200 resumed; and the unique set size (USS) of the worker
   processes that hold the interrupted turns.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    def __init__(self, agent: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
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
        """Worker processes: children of the forkserver (which is excluded itself)."""
        found = []
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and "forkserver" in " ".join(proc.parent().cmdline()):
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


def bench_echo(turns: int) -> dict[str, float]:
    served = Served("bench.agents:echo", "--workers", "2")
    try:
        sid = served.session()
        latencies = []
        for i in range(turns + 20):
            start = time.perf_counter()
            served.send(sid, f"m{i}")
            body = served.wait(sid)
            elapsed = time.perf_counter() - start
            assert body["status"] == "idle", body
            if i >= 20:  # warm-up
                latencies.append(elapsed)
            if i % 50 == 49:  # keep the state short: the echo agent appends to it
                sid = served.session()
        return {"p50": pct(latencies, 0.5), "p90": pct(latencies, 0.9), "p99": pct(latencies, 0.99), "n": len(latencies)}
    finally:
        served.stop()


def bench_interrupt(rounds: int) -> dict[str, float]:
    served = Served("bench.agents:timed_interrupt", "--workers", "2")
    try:
        visible, reached, completed = [], [], []
        for i in range(rounds + 10):
            sid = served.session()
            served.send(sid, "go")
            body = served.wait(sid)
            seen = time.time()
            assert body["status"] == "interrupted", body
            [item] = body["interrupts"]
            called_at = item["payload"]["called_at"]
            # The first poll may have started after the interrupt: re-measure with a poll
            # that is already waiting when interrupt() is called, on the next session.
            sent = time.time()
            served.http.post(f"{served.url}/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}}, timeout=10)
            done = served.wait(sid)
            finished = time.time()
            assert done["status"] == "idle", done
            if i >= 10:
                visible.append(seen - called_at)
                reached.append(float(done["response"]["content"]) - sent)
                completed.append(finished - sent)
        # A long poll that is waiting before the agent interrupts: poll in a thread first.
        waiting_visible = []
        for i in range(rounds):
            sid = served.session()
            result: dict = {}
            poll_http = requests.Session()

            def poll() -> None:
                body = served.wait(sid, http=poll_http)
                result["seen"] = time.time()
                result["body"] = body

            served.send(sid, "go")
            poller = threading.Thread(target=poll)
            poller.start()
            poller.join(30)
            body = result["body"]
            if body["status"] == "interrupted":
                waiting_visible.append(result["seen"] - body["interrupts"][0]["payload"]["called_at"])
                served.http.delete(f"{served.url}/sessions/{sid}", timeout=10)
        return {
            "visible_p50": pct(visible, 0.5), "visible_p90": pct(visible, 0.9),
            "waiting_visible_p50": pct(waiting_visible, 0.5) if waiting_visible else float("nan"),
            "waiting_visible_p90": pct(waiting_visible, 0.9) if waiting_visible else float("nan"),
            "reached_p50": pct(reached, 0.5), "reached_p90": pct(reached, 0.9),
            "completed_p50": pct(completed, 0.5), "completed_p90": pct(completed, 0.9),
            "n": len(visible),
        }
    finally:
        served.stop()


def bench_capacity(sessions: int) -> dict[str, float]:
    served = Served("bench.agents:mixed", "--workers", "2", "--threads", "64")
    try:
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
        for i in range(50):
            t0 = time.perf_counter()
            served.send(other, f"x{i}")
            assert served.wait(other)["status"] == "idle"
            echo_latencies.append(time.perf_counter() - t0)

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
        }
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--only", choices=["echo", "interrupt", "capacity"])
    args = parser.parse_args()
    turns, rounds, sessions = (100, 30, 50) if args.quick else (500, 100, 200)
    print(f"# motus serve benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]})\n")
    if args.only in (None, "echo"):
        r = bench_echo(turns)
        print(f"Echo turn (POST message + long poll sees idle), n={r['n']}: p50 {ms(r['p50'])}, p90 {ms(r['p90'])}, p99 {ms(r['p99'])}")
    if args.only in (None, "interrupt"):
        r = bench_interrupt(rounds)
        print(f"Interrupt visible to an already-waiting long poll: p50 {ms(r['waiting_visible_p50'])}, p90 {ms(r['waiting_visible_p90'])}")
        print(f"Interrupt visible (poll sent right after POST), n={r['n']}: p50 {ms(r['visible_p50'])}, p90 {ms(r['visible_p90'])}")
        print(f"Resume reaches the agent: p50 {ms(r['reached_p50'])}, p90 {ms(r['reached_p90'])}")
        print(f"Resume to turn complete (long poll sees idle): p50 {ms(r['completed_p50'])}, p90 {ms(r['completed_p90'])}")
    if args.only in (None, "capacity"):
        r = bench_capacity(sessions)
        print(f"Capacity, --workers 2: {r['sessions']} sessions interrupted at once in {r['time_to_interrupt_all']:.2f} s")
        print(f"  echo turns of another session meanwhile: p50 {ms(r['echo_p50_while_waiting'])}, p90 {ms(r['echo_p90_while_waiting'])}")
        print(f"  worker processes: {r['worker_processes']}, USS median {r['uss_median_mib']:.1f} MiB each, {r['uss_total_mib']:.0f} MiB in all")
        print(f"  server threads while {r['sessions']} wait: {r['server_threads']}")
        print(f"  all {r['sessions']} resumed and idle in {r['time_to_finish_all_after_resume']:.2f} s")


if __name__ == "__main__":
    main()
