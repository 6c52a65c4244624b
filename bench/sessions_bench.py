"""Many sessions in the store (issue 27, item 4): the server's memory and a request to any of them.

A SQLite store is filled with ``--sessions`` sessions (default 100,000), half idle (a user
message and a reply each) and half parked (interrupted, one approval pending, no process),
written straight into the file with ``SqliteStore`` (the rows a server writes). Then, per
checkout (``--root PATH:LABEL``, as in the other benches), a server is started on a copy of
that file with the default options but ``--max-sessions 0``, and:

- the memory of its whole process tree (USS) once ``/health`` answers and it has settled,
  against the same server on an empty store (``idle``);
- ``GET /sessions/{id}`` of one session again and again (held in memory), and of sessions
  picked at random among all (almost all read from the store), p50 and p99 of each;
- ``GET /sessions`` (every session) and ``GET /interrupts`` (every pending approval) once each,
  then ``GET /interrupts?type=tool_approval`` and ``?type=user_input`` (``motus serve inbox
  --type`` and a client waiting for questions ask one type), and the tree's memory after them;
- ``POST /sessions/{id}/messages`` to a random idle session until it is idle again (a turn
  on a session read from the store).

Run from the repository root on an otherwise idle machine::

    python bench/sessions_bench.py
    python bench/sessions_bench.py --root /tmp/before:before --root .:after --sessions 20000
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Http, Served, checkouts, kill_all, mib, table  # noqa: E402

AGENT = "bench.agents:approve_once"


def fill(path: Path, count: int) -> list[tuple[str, str]]:
    """``count`` sessions in a new SQLite file, half idle and half parked; returns (id, kind)."""
    from motus.serve.store.sqlite import SqliteStore

    store = SqliteStore(f"sqlite:///{path}?synchronous=normal", str(path), synchronous="normal")
    store.open()
    try:
        return fill_store(store, count)
    finally:
        store.close()


def fill_store(store: object, count: int, owner: str | None = None) -> list[tuple[str, str]]:
    """``count`` sessions written into an open store, half idle and half parked (their live
    turns owned by ``owner``: on PostgreSQL, an instance that stays alive in the store's
    eyes, or the servers would take the turns over); returns (id, kind)."""
    from motus.durable.journal import canonical_payload
    from motus.durable.records import INTERRUPT, JournalEntry
    from motus.serve.store import Event, SessionRecord, TurnRecord

    made: list[tuple[str, str]] = []
    now = time.time()
    user = {"role": "user", "content": "delete the old logs, please"}
    reply = {"role": "assistant", "content": "Done: the old logs are deleted."}

    def write(first: int, last: int) -> None:
        for i in range(first, last):
            sid = f"00000000-0000-4000-8000-{i:012d}"
            at = now - count + i
            if i % 2 == 0:
                store.save(SessionRecord(sid, "idle", [user, reply], reply, None, 1, at), events=[Event(sid, "status", {"status": "idle"}, at)])
                continue
            payload = {"type": "tool_approval", "tool_name": "delete_file", "arguments": {"path": f"/logs/{i}.log"}}
            entry = JournalEntry(seq=1, kind=INTERRUPT, key=canonical_payload(payload), label="tool_approval", ref=f"int-{i:012d}",
                                 payload=payload, created_at=at)
            turn = TurnRecord(turn_id=1, message=user, journal=[entry], started_at=at)
            store.save(SessionRecord(sid, "interrupted", [], None, None, 1, at, turn=turn, owner=owner), entries=[entry],
                       events=[Event(sid, "status", {"status": "interrupted"}, at)])

    threads = [threading.Thread(target=write, args=(k * count // 4, (k + 1) * count // 4)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(count):
        made.append((f"00000000-0000-4000-8000-{i:012d}", "idle" if i % 2 == 0 else "parked"))
    return made


def timed_gets(http: Http, paths: list[str]) -> list[float]:
    out = []
    for path in paths:
        t0 = time.perf_counter()
        status, _ = http.request("GET", path)
        out.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def run(root: Path, label: str, filled: Path, sessions: list[tuple[str, str]], samples: int, tmp: Path) -> dict[str, object]:
    empty = Served(f"{label}-empty", "--store", f"sqlite:///{tmp}/{label}-empty.db", "--max-sessions", "0", "--workers", "2",
                   agent=AGENT, log="sessions", root=root, settle=2.0)
    idle = empty.memory()["uss"]
    empty.stop()
    copy = tmp / f"{label}.db"
    shutil.copy(filled, copy)
    started = time.perf_counter()
    served = Served(label, "--store", f"sqlite:///{copy}", "--max-sessions", "0", "--workers", "2", agent=AGENT, log="sessions",
                    root=root, settle=2.0)
    ready = served.health_at
    try:
        held = served.memory()["uss"]
        http = Http(served.port)
        rng = random.Random(7)
        one = sessions[-2][0]
        timed_gets(http, [f"/sessions/{one}"] * 50)  # warm
        cached = timed_gets(http, [f"/sessions/{one}"] * samples)
        picked = [f"/sessions/{rng.choice(sessions)[0]}" for _ in range(samples)]
        anywhere = timed_gets(http, picked)
        after_gets = served.memory()["uss"]
        t0 = time.perf_counter()
        status, listed = http.request("GET", "/sessions")
        listing = time.perf_counter() - t0
        after_list = served.memory()["uss"]
        t0 = time.perf_counter()
        status2, inbox = http.request("GET", "/interrupts")
        inboxing = time.perf_counter() - t0
        after_inbox = served.memory()["uss"]
        typed = []  # as ``motus serve inbox --type`` and question polls ask: one type each
        for kind in ("tool_approval", "user_input"):
            t0 = time.perf_counter()
            status3, items = http.request("GET", f"/interrupts?type={kind}")
            typed.append((kind, status3, len(items) if isinstance(items, list) else items, time.perf_counter() - t0))
        after_typed = served.memory()["uss"]
        turn_times = []
        for sid, kind in rng.sample([s for s in sessions if s[1] == "idle"], 20):
            t0 = time.perf_counter()
            http.call("POST", f"/sessions/{sid}/messages", {"content": "go"})
            body = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            if body["status"] == "interrupted":
                http.call("POST", f"/sessions/{sid}/resume", {"interrupt_id": body["interrupts"][0]["interrupt_id"], "value": {"approved": True}})
                body = http.call("GET", f"/sessions/{sid}?wait=true&timeout=30")
            if body["status"] != "idle":
                raise RuntimeError(f"{sid}: {body}")
            turn_times.append(time.perf_counter() - t0)
        after = served.memory()["uss"]
        health = served.health()
        http.close()
        return {
            "label": label, "ready": ready, "idle": idle, "held": held, "after": after, "after_gets": after_gets,
            "after_list": after_list, "after_inbox": after_inbox, "after_typed": after_typed, "typed": typed,
            "cached": cached, "anywhere": anywhere,
            "list": (status, len(listed) if isinstance(listed, list) else listed, listing),
            "inbox": (status2, len(inbox) if isinstance(inbox, list) else inbox, inboxing),
            "turns": turn_times, "health": health, "wall": time.perf_counter() - started,
        }
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--root", action="append", default=[], help="PATH:LABEL of a checkout (repeatable); default this one")
    args = parser.parse_args()
    roots = checkouts(args.root)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        filled = tmp / "filled.db"
        t0 = time.perf_counter()
        sessions = fill(filled, args.sessions)
        print(f"sessions_bench: {args.sessions} sessions written in {time.perf_counter() - t0:.1f} s "
              f"({filled.stat().st_size / 2**20:.0f} MiB file)", flush=True)
        results = []
        try:
            for root, label in roots:
                results.append(run(root, label, filled, sessions, args.samples, tmp))
                print(f"  {label} done", flush=True)
        finally:
            kill_all()
    rows = []
    for r in results:
        cached, anywhere = r["cached"], r["anywhere"]
        rows.append((
            r["label"], f"{r['ready']:.1f} s", mib(r["idle"]), f"{mib(r['held'])} (+{mib(r['held'] - r['idle'])})",
            f"{mib(r['after_gets'])} / {mib(r['after_list'])} / {mib(r['after_inbox'])} / {mib(r['after_typed'])} / {mib(r['after'])}",
            f"{ms(statistics.median(cached))} / {ms(pct(cached, 0.99))}",
            f"{ms(statistics.median(anywhere))} / {ms(pct(anywhere, 0.99))}",
            f"{statistics.median(anywhere) / statistics.median(cached):.2f}x",
            f"{r['list'][2] * 1000:.0f} ms ({r['list'][1]})", f"{r['inbox'][2] * 1000:.0f} ms ({r['inbox'][1]})",
            " / ".join(f"{seconds * 1000:.0f} ms ({count})" for _, _, count, seconds in r["typed"]),
            ms(statistics.median(r["turns"])),
        ))
    print()
    table(("checkout", "ready in", "tree idle (empty store)", "tree with the sessions",
           "after the GETs / the list / the inbox / its two types / the turns",
           "GET one held: p50 / p99", "GET any: p50 / p99", "any / held", "GET /sessions", "GET /interrupts",
           "then ?type=tool_approval / ?type=user_input",
           "a turn on a stored session, p50"), rows)
    for r in results:
        print(f"\n{r['label']}: /health {r['health']}")


if __name__ == "__main__":
    main()
