"""Two versions of motus side by side, on the same machine at the same moments.

Run from the repository root, with the other version checked out elsewhere::

    git worktree add /tmp/before HEAD~3
    python bench/ab_bench.py /tmp/before .               # both parts
    python bench/ab_bench.py /tmp/before . --only process --turns 600
    python bench/ab_bench.py /tmp/before . --only server --slices 12

Why: on a small VM the machine's own speed drifts by a third within minutes, so two runs of
``turn_cost_bench.py`` one after the other cannot show a difference of a few per cent. Here
the two versions take turns at short intervals, so both see the same machine:

1. ``process``: a zygote of each version (``motus.serve.zygote.Zygote`` driven directly, no
   server), echo turns alternating between them one by one (the order flips every turn).
   Per version: the CPU of the zygote and its children per turn (exited children count
   through the zygote's children times), and job to result p50/p90. ``--history N`` gives each job N pairs of messages.
2. ``server``: a server of each version (``--workers 2``, its own SQLite file, or
   ``--store memory``), and 8 clients running echo turns back to back against one, then the
   other, in slices of ``--slice`` seconds (the order flips every slice). Per version: turns a
   second and the server tree's CPU per turn over its own slices only.

Each version runs with its own tree first on ``PYTHONPATH``, so the trees must be complete
checkouts of this repository. Differences under ~0.1 ms a turn stay within the noise even so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Served, kill_all  # noqa: E402
from bench.serve_bench import echo_load, long_history, ms, pct, tree_cpu  # noqa: E402

AGENT = "bench.agents:echo"


def _cpu_with_children(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def _job_bytes(tree: Path, history: int) -> bytes:
    """The echo job as ``tree``'s own classes pickle it. A Job pickled here would name this
    tree's module (``motus.durable.records`` since the records moved there), which a worker of
    an older tree would load from somewhere else: a Job, but not its own."""
    import subprocess

    code = (
        "import pickle, sys\n"
        "from motus.serve.protocol import Job\n"
        "pair = [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hi'}]\n"
        f"job = Job(session_id='ab', turn_id=1, message={{'role': 'user', 'content': 'hi'}}, state=pair * {history})\n"
        "sys.stdout.buffer.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, check=True).stdout


def bench_process(trees: list[Path], turns: int, history: int) -> None:
    from motus.serve.protocol import Result
    from motus.serve.zygote import Zygote

    base = list(sys.path)
    runs: list[dict[str, Any]] = []
    try:
        for tree in trees:
            # The zygote takes this process's sys.path: the tree's own motus comes first.
            sys.path[:] = [str(tree), *(p for p in base if Path(p or ".").resolve() != ROOT)]
            zygote = Zygote(AGENT, None)
            job = _job_bytes(tree, history)
            run: dict[str, Any] = {"tree": tree, "zygote": zygote, "warm": [], "latency": [], "cpu": 0.0, "job": job}
            runs.append(run)
            child, conn = zygote.start_child()
            conn.send_bytes(job)
            conn.recv()
            conn.close()
            child.join(5)
            child.close()
            run["warm"] = [zygote.start_child() for _ in range(2)]
        sys.path[:] = base
        for index in range(turns):
            for run in runs if index % 2 == 0 else runs[::-1]:  # neither always follows the other
                zygote = run["zygote"]
                before = _cpu_with_children(zygote.pid)
                child, conn = run["warm"].pop(0)
                started = time.perf_counter()
                conn.send_bytes(run["job"])
                result = conn.recv()
                run["latency"].append(time.perf_counter() - started)
                assert isinstance(result, Result), result
                conn.close()
                child.join(5)
                child.close()
                run["warm"].append(zygote.start_child())
                run["cpu"] += _cpu_with_children(zygote.pid) - before
    finally:
        sys.path[:] = base
        for run in runs:
            for child, conn in run["warm"]:
                conn.close()
                child.join(5)
                child.close()
            run["zygote"].close()
    print(f"## Process side: {turns} echo turns each, alternating, {history * 2} messages of history\n")
    print("| tree | zygote and children, CPU a turn | job to result p50 | p90 |")
    print("|---|---|---|---|")
    for run in runs:
        print(f"| {run['tree']} | {run['cpu'] / turns * 1000:.2f} ms | {ms(pct(run['latency'], 0.5))} | {ms(pct(run['latency'], 0.9))} |")
    print()


def bench_server(trees: list[Path], slices: int, seconds: float, store: str, history: int = 0) -> None:
    preload = long_history(history)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        cluster = None
        if store == "postgresql":  # a throwaway cluster, a database each
            from tests.support.pg import Cluster

            cluster = stack.enter_context(Cluster())
        try:
            for index, tree in enumerate(trees):
                if cluster is not None:
                    url = cluster.create_database()
                else:
                    url = f"sqlite:///{tmp}/ab{index}.db" if store == "sqlite" else store
                served = Served(f"ab{index}", "--workers", "2", "--store", url, "--max-sessions", "0", agent=AGENT,
                                settle=0, log="ab", root=tree)
                runs.append({"tree": tree, "served": served, "url": f"http://127.0.0.1:{served.port}", "turns": 0,
                             "wall": 0.0, "cpu": 0.0, "p50": []})
            for run in runs:
                echo_load(run["url"], 1.0, history=preload)  # warm processes up, first-time work done
            for index in range(slices):
                for run in runs if index % 2 == 0 else runs[::-1]:
                    pid = run["served"].process.pid
                    before = tree_cpu(pid)
                    result = echo_load(run["url"], seconds, history=preload)
                    run["cpu"] += tree_cpu(pid) - before
                    run["turns"] += result["turns"]
                    run["wall"] += result["wall"]
                    run["p50"].append(result["p50"])
        finally:
            kill_all()
    print(f"## Server: 8 clients back to back, {slices} slices of {seconds:g} s each, alternating, store {store}"
          + (f", sessions preloaded with {history} messages of 2 KB" if history else "") + "\n")
    print("| tree | turns a second | server tree CPU a turn | turn p50 under load (median of slices) |")
    print("|---|---|---|---|")
    for run in runs:
        print(f"| {run['tree']} | {run['turns'] / run['wall']:.0f} | {run['cpu'] / run['turns'] * 1000:.2f} ms | "
              f"{ms(statistics.median(run['p50']))} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="a checkout of the version to compare against")
    parser.add_argument("after", type=Path, help="a checkout of the version to measure (often .)")
    parser.add_argument("--only", choices=["process", "server"])
    parser.add_argument("--turns", type=int, default=500, help="process part: echo turns per version")
    parser.add_argument("--history", type=int, default=0, help="process part: pairs of messages of history per job")
    parser.add_argument("--slices", type=int, default=8, help="server part: slices per version")
    parser.add_argument("--server-history", type=int, default=0, help="server part: preload each session with N messages of 2 KB")
    parser.add_argument("--slice", type=float, default=1.5, help="server part: seconds per slice")
    parser.add_argument("--store", default="sqlite", help="server part: sqlite (a file each), postgresql (a throwaway cluster, a database each) or memory")
    args = parser.parse_args()
    trees = [args.before.resolve(), args.after.resolve()]
    for tree in trees:
        if not (tree / "motus" / "serve" / "zygote.py").exists():
            raise SystemExit(f"{tree} is not a checkout of motus")
    if args.only in (None, "process"):
        bench_process(trees, args.turns, args.history)
    if args.only in (None, "server"):
        bench_server(trees, args.slices, args.slice, args.store, args.server_history)


if __name__ == "__main__":
    main()
