"""What an echo turn costs the machine: CPU per turn across the server tree, throughput, latency.

Run from the repository root::

    python bench/turn_cost_bench.py               # 15 s of load, default SQLite store
    python bench/turn_cost_bench.py --seconds 5   # shorter
    python bench/turn_cost_bench.py --store memory
    python bench/turn_cost_bench.py --history 200 # each session starts with 200 messages of 2 KB

What it measures (issue 15's targets, on the default store, a SQLite file in a temp folder):

1. Throughput and CPU: ``--workers 2``, 8 client threads (``serve_bench.echo_load``), each
   running echo turns back to back on its own session (``POST /messages``, then a long poll that sees ``idle``; a new
   session every 50 turns so the history stays short). Turns completed per second, and the
   CPU seconds the whole server tree spent (gunicorn arbiter and worker, fork server, agent
   workers; exited workers count through the fork server that reaped them) divided by the
   turns: CPU per turn. Where the CPU went, by process, is printed too. Targets: at least
   250 turns a second; at most 7 ms of CPU per turn.
2. Latency: one client, 50 ms between turns: echo turn p50 (target under 4 ms).

A busy machine slows every figure; the share of the CPU that went to other processes is
printed so a noisy run can be recognised.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import CpuMeter, Http, Served, kill_all, table  # noqa: E402
from bench.serve_bench import echo_load, long_history, ms, pct  # noqa: E402

AGENT = "bench.agents:echo"
CLIENTS = 8


def load(served: Served, seconds: float, history: list[dict[str, str]] | None = None) -> tuple[int, list[tuple[str, str]], float, dict[str, float]]:
    """``serve_bench.echo_load`` (8 clients, back to back) with the CPU of each part of the
    server's tree measured around it."""
    meter = CpuMeter(served)
    meter.start()
    result = echo_load(f"http://127.0.0.1:{served.port}", seconds, CLIENTS, history)
    before = dict(meter.before)
    rows = meter.stop()
    after, _ = meter.snapshot()
    server_cpu = sum(after[r] - before.get(r, 0.0) for r in after if r != "this benchmark (clients)")
    return int(result["turns"]), rows, server_cpu, result


def latency(served: Served, turns: int) -> list[float]:
    http = Http(served.port)
    values = []
    try:
        sid = http.call("POST", "/sessions", {})["session_id"]
        for i in range(turns + 20):
            time.sleep(0.05)
            started = time.perf_counter()
            http.call("POST", f"/sessions/{sid}/messages", {"content": "hi"})
            body = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            assert body["status"] == "idle", body
            if i >= 20:
                values.append(time.perf_counter() - started)
            if i % 50 == 49:
                sid = http.call("POST", "/sessions", {})["session_id"]
    finally:
        http.close()
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--turns", type=int, default=200, help="latency samples")
    parser.add_argument("--store", default=None, help="memory, or a store URL (default: SQLite in a temp folder)")
    parser.add_argument("--history", type=int, default=0, help="preload each session with N messages of 2 KB (load part)")
    args = parser.parse_args()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = args.store or f"sqlite:///{Path(tmp) / 'cost.db'}"
            served = Served("cost", "--workers", "2", "--store", store, "--max-sessions", "0", agent=AGENT, settle=1.0)
            turns, rows, cpu, result = load(served, args.seconds, long_history(args.history))
            wall = result["wall"]
            print(f"# echo turns, --workers 2, {CLIENTS} clients, {args.seconds:.0f} s, store {store.split(':')[0]}"
                  + (f", {args.history} messages of 2 KB of history" if args.history else ""))
            print(f"throughput: {turns / wall:.0f} turns/s ({turns} turns in {wall:.1f} s); "
                  f"turn p50 under load {ms(result['p50'])}")
            print(f"server tree CPU: {cpu:.2f} s = {cpu / turns * 1000:.2f} ms per turn")
            table(("Process", "CPU"), rows)
            values = latency(served, args.turns)
            print(f"echo turn, one client, 50 ms apart: p50 {ms(pct(values, 0.5))}, p90 {ms(pct(values, 0.9))} (n={len(values)})")
    finally:
        kill_all()


if __name__ == "__main__":
    main()
