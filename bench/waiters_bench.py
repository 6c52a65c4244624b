"""Waiting clients (issue 27, item 2): what 10,000 clients waiting at once cost one instance.

Run from the repository root on an otherwise idle machine::

    python bench/waiters_bench.py                                  # 10,000 waiters, this checkout
    python bench/waiters_bench.py --waiters 2000 --samples 50       # quicker
    python bench/waiters_bench.py --root /tmp/before:before --root .:after

Per checkout (``--root PATH:LABEL``, one after the other), a server with the default options
but a SQLite file of its own (``python -m motus serve start bench.agents:waiters``), then:

1. ``--waiters / 2`` sessions are created; the memory of the server tree (sum of USS) and
   the p50 of ``--echo`` echo turns of a side client (message, then long poll until idle)
   with no one waiting.
2. ``--waiters`` connections are opened by one selector thread of this process (no thread
   per client): half ``GET /sessions/{id}/events`` (one per session, what an open web chat
   holds), half ``GET /interrupts?type=user_input&wait=true&timeout=280`` (an approver
   waiting for questions). Counted: streams answered 200, anything refused (503), long
   polls answered before their event (they must not be: the inbox is empty).
3. With all of them waiting: the tree's memory again (the difference over step 1, per
   waiter), and the side client's echo p50 again (its ratio to step 1).
4. Wake latency of a stream: ``--samples`` times, one at a time, a stream's session is sent
   ``wait``; the agent stamps ``time.time()`` into its interrupt payload just before
   ``interrupt()``; the figure is from that stamp to the moment this process has read the
   ``interrupt`` event off that stream (so it includes the pipe, the commit and the publish).
   The other question polls are woken by none of these (an approval is not a question).
5. Wake latency of a broadcast: one session is sent ``question``; every question poll is
   answered with it; the figure per poll is from the agent's stamp to its answer read here,
   reported as p50/p99/max over all of them. Beside it, the same from the stamp to when
   this machine's kernel received the answer's first bytes (``SO_TIMESTAMPNS`` on each poll's
   socket): what this process's one reading thread adds (it is behind while thousands of
   answers arrive at once) is not in that one; what its CPU takes from the server's is.

Timestamps compare ``time.time()`` of two processes on one machine: they share the clock.
This process and the server share the two cores: reading 10,000 sockets costs CPU here too.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.durable_bench import Clients, Http, Served, checkouts, kill_all, report_log, table  # noqa: E402
from bench.serve_bench import pct  # noqa: E402

AGENT = "bench.agents:waiters"
#: ``SO_TIMESTAMPNS`` (Linux): each read also returns when the kernel received the data.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
POLL = "/interrupts?type=user_input&wait=true&timeout=280"


class Waiter:
    """One waiting connection, read by the ``Readers`` thread."""

    __slots__ = ("sock", "kind", "sid", "buf", "status", "answered_at", "arrived_at", "eof", "marks")

    def __init__(self, sock: socket.socket, kind: str, sid: str | None) -> None:
        self.sock = sock
        self.kind = kind  # "stream" or "poll"
        self.sid = sid
        self.buf = bytearray()
        self.status: int | None = None
        self.answered_at: float | None = None  # a poll: when its whole answer was read
        self.arrived_at: float | None = None  # a poll: when the kernel received its first bytes
        self.eof = False
        self.marks: dict[bytes, float] = {}  # a stream: when each awaited marker came


class Readers:
    """One thread reading every waiting connection (level-triggered selector)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.waiters: list[Waiter] = []
        self.awaited: dict[Waiter, bytes] = {}
        self.stopped = False
        self.thread = threading.Thread(target=self.run, name="readers", daemon=True)
        self.thread.start()

    def open(self, port: int, path: str, kind: str, sid: str | None) -> Waiter:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        if kind == "poll":
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setblocking(False)
        waiter = Waiter(sock, kind, sid)
        with self.lock:
            self.waiters.append(waiter)
            self.selector.register(sock, selectors.EVENT_READ, waiter)
        return waiter

    def expect(self, waiter: Waiter, marker: bytes) -> None:
        with self.lock:
            self.awaited[waiter] = marker

    def run(self) -> None:
        while not self.stopped:
            try:
                ready = self.selector.select(0.2)
            except (OSError, ValueError):
                continue
            now = time.time()
            for key, _ in ready:
                waiter: Waiter = key.data
                try:
                    if waiter.kind == "poll":
                        data, ancillary, _, _ = waiter.sock.recvmsg(65536, 64)
                        if data and waiter.arrived_at is None:
                            waiter.arrived_at = kernel_time(ancillary)
                    else:
                        data = waiter.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    waiter.eof = True
                    with self.lock:
                        self.selector.unregister(waiter.sock)
                    continue
                waiter.buf += data
                if waiter.status is None and b"\r\n" in waiter.buf:
                    waiter.status = int(bytes(waiter.buf.split(b"\r\n", 1)[0]).split()[1])
                if waiter.kind == "poll" and waiter.answered_at is None and complete(waiter.buf):
                    waiter.answered_at = now
                with self.lock:
                    marker = self.awaited.get(waiter)
                    if marker is not None and marker in waiter.buf:
                        waiter.marks[marker] = now
                        del self.awaited[waiter]
                if waiter.kind == "stream" and len(waiter.buf) > 1 << 16:
                    del waiter.buf[:-4096]  # keep the tail: markers are looked for in new data

    def close(self) -> None:
        self.stopped = True
        self.thread.join(5)
        for waiter in self.waiters:
            waiter.sock.close()
        self.selector.close()


def kernel_time(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The ``SCM_TIMESTAMPNS`` of a ``recvmsg`` (a ``struct timespec``), as ``time.time()``."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds + nanoseconds / 1e9
    return None


def complete(buf: bytearray) -> bool:
    head, sep, body = bytes(buf).partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def echo_p50(http: Http, sid: str, turns: int) -> float:
    """The p50 of an echo turn: message, then long polls until it is not running (a 503,
    every long-poll slot taken, is waited out for a second and asked again, as
    ``motus.client`` does)."""
    took = []
    for n in range(turns):
        started = time.perf_counter()
        http.call("POST", f"/sessions/{sid}/messages", {"content": f"echo {n}"})
        while True:
            status, body = http.request("GET", f"/sessions/{sid}?wait=true&timeout=30")
            if status == 503:
                time.sleep(1.0)
                continue
            if status != 200:
                raise RuntimeError(f"long poll: {status} {body!r}")
            if body["status"] != "running":
                break
        took.append(time.perf_counter() - started)
    return pct(took, 0.5)


def wait_for(predicate: Any, seconds: float, what: str) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    print(f"  [warn] gave up after {seconds:g} s waiting for {what}")
    return False


def measure(root: Path, label: str, waiters: int, samples: int, echoes: int) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="motus-waiters-")
    served = Served(f"waiters-{label}", "--store", f"sqlite:///{folder}/bench.sqlite3", agent=AGENT, root=root, log="waiters", settle=1.0)
    readers = Readers()
    row: dict[str, Any] = {"label": label}
    try:
        clients = Clients(served.port, 16)
        half = waiters // 2
        sids = clients.map(lambda http, _: http.call("POST", "/sessions", {})["session_id"], range(half))
        clients.close()
        side = served.http
        side_sid = side.call("POST", "/sessions", {})["session_id"]
        echo_p50(side, side_sid, 5)  # warm
        idle = served.memory()["uss"]
        row["echo alone"] = echo_p50(side, side_sid, echoes)

        started = time.perf_counter()
        streams = [readers.open(served.port, f"/sessions/{sid}/events", "stream", sid) for sid in sids]
        polls = [readers.open(served.port, POLL, "poll", None) for _ in range(waiters - half)]
        wait_for(lambda: all(w.status is not None or w.eof for w in streams), 120, "every stream's answer")
        row["open s"] = time.perf_counter() - started
        wait_for(lambda: served.health().get("open_streams", 0) >= sum(w.status == 200 for w in streams), 30, "the streams counted")
        row["streams 200"] = sum(w.status == 200 for w in streams)
        row["refused"] = sum(w.status == 503 for w in streams + polls)
        row["polls answered early"] = sum(w.status is not None for w in polls)
        time.sleep(2.0)  # let every connection settle in the server before reading its memory
        row["MiB more"] = (served.memory()["uss"] - idle) / 2**20
        row["KiB each"] = row["MiB more"] * 1024 / waiters
        row["echo waiting"] = echo_p50(side, side_sid, echoes)

        wakes = []
        for waiter in [w for w in streams if w.status == 200][:samples]:
            readers.expect(waiter, b"event: interrupt")
            side.call("POST", f"/sessions/{waiter.sid}/messages", {"content": "wait"})
            if not wait_for(lambda w=waiter: b"event: interrupt" in w.marks, 10, "a stream's interrupt"):
                continue
            text = bytes(waiter.buf)
            at = text.rfind(b"event: interrupt")
            data = json.loads(text[at:].split(b"data: ", 1)[1].split(b"\n", 1)[0])
            wakes.append(waiter.marks[b"event: interrupt"] - data["payload"]["called_at"])
        if wakes:
            row["stream wake p50"], row["stream wake p99"] = pct(wakes, 0.5), pct(wakes, 0.99)
        row["stream samples"] = len(wakes)

        held = [w for w in polls if w.status is None]
        asker = side.call("POST", "/sessions", {})["session_id"]
        side.call("POST", f"/sessions/{asker}/messages", {"content": "question"})
        wait_for(lambda: all(w.answered_at is not None or w.eof for w in held), 120, "every question poll's answer")
        stamp = None
        latencies = []
        arrivals = []
        for waiter in held:
            if waiter.answered_at is None:
                continue
            if stamp is None:
                body = bytes(waiter.buf).split(b"\r\n\r\n", 1)[1]
                stamp = json.loads(body)[0]["payload"]["called_at"]
            latencies.append(waiter.answered_at - stamp)
            if waiter.arrived_at is not None:
                arrivals.append(waiter.arrived_at - stamp)
        if arrivals:
            row["arrived p50"], row["arrived p99"], row["arrived max"] = pct(arrivals, 0.5), pct(arrivals, 0.99), max(arrivals)
        if latencies:
            row["broadcast p50"], row["broadcast p99"], row["broadcast max"] = pct(latencies, 0.5), pct(latencies, 0.99), max(latencies)
        row["broadcast answered"] = len(latencies)
    finally:
        readers.close()
        served.stop()
        report_log(served)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--echo", type=int, default=30)
    parser.add_argument("--root", action="append", default=[], help="PATH:LABEL of a checkout (repeat; default: this one)")
    opts = parser.parse_args()
    roots = checkouts(opts.root, "this checkout")
    rows = []
    try:
        for root, label in roots:
            rows.append(measure(root, label, opts.waiters, opts.samples, opts.echo))
    finally:
        kill_all()

    def f(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value * 1000:.1f} ms" if value < 60 else f"{value:.0f}"
        return str(value)

    print(f"\n### {opts.waiters:,} waiting clients (half event streams, half inbox long polls)\n")
    table(
        ("checkout", "streams 200", "refused", "polls answered early", "tree memory over idle", "per waiter",
         "echo p50 alone", "echo p50 while waiting", "stream wake p50 / p99", "broadcast to polls p50 / p99 / max",
         "broadcast, the kernel's receipt: p50 / p99 / max"),
        [(
            r["label"], r.get("streams 200"), r.get("refused"), r.get("polls answered early"),
            f"{r.get('MiB more', 0):.1f} MiB", f"{r.get('KiB each', 0):.1f} KiB",
            f(r.get("echo alone")), f"{f(r.get('echo waiting'))} ({r.get('echo waiting', 0) / max(r.get('echo alone', 1), 1e-9):.2f}x)",
            f"{f(r.get('stream wake p50'))} / {f(r.get('stream wake p99'))} (n={r.get('stream samples')})",
            f"{f(r.get('broadcast p50'))} / {f(r.get('broadcast p99'))} / {f(r.get('broadcast max'))} (n={r.get('broadcast answered')})",
            f"{f(r.get('arrived p50'))} / {f(r.get('arrived p99'))} / {f(r.get('arrived max'))}",
        ) for r in rows],
    )


if __name__ == "__main__":
    main()
