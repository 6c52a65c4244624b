"""Waiting clients hold no thread (issue 27, item 2): under ``motus serve start`` a long poll
or an event stream that waits is held by the gunicorn worker's main loop, not by one of
``--threads``; it is served again (a long poll) or resumed (a stream) when its event comes,
its client leaving frees it at once, and a stop answers every one of them.

The clients here are raw sockets, so that a hundred of them cost the test no thread either,
and so that the framing on the wire (chunks, HTTP/1.0) is what is checked.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests
import pytest

from motus.serve.streams import PEER_CHECK_SECONDS
from tests.conftest import Server, wait_until
from tests.support.processes import alive as _alive

#: Four request threads: without held waits, one stream and one long poll could wait at once.
ARGS = ("--workers", "1", "--threads", "4", "--shutdown-timeout", "1")


class Raw:
    """One HTTP request on a socket of its own, read by hand."""

    def __init__(
        self, server: Server, path: str, version: str = "1.1", headers: tuple[str, ...] = (), rcvbuf: int | None = None,
    ) -> None:
        url = urlsplit(server.url)
        if rcvbuf is None:
            self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        else:  # a small receive window, set before connecting: the server's writes stop soon
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(30)
            self.sock.connect((url.hostname, url.port))
        extra = "".join(f"{header}\r\n" for header in headers)
        self.sock.sendall(f"GET {path} HTTP/{version}\r\nHost: {url.netloc}\r\n{extra}\r\n".encode())
        self.buf = b""

    def ready(self) -> bool:
        """Whether anything (an answer, an event, end of file) came, without waiting."""
        return bool(self.buf) or bool(select.select([self.sock], [], [], 0)[0])

    def read_until(self, marker: bytes, timeout: float = 20.0) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{marker!r} did not come within {timeout} s; got {self.buf[-300:]!r}")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"end of file before {marker!r}; got {self.buf[-300:]!r}")
            self.buf += chunk
        return self.buf

    def answer(self, timeout: float = 20.0) -> tuple[int, object]:
        """A whole answer with a ``Content-Length`` body: its status and its JSON."""
        head = self.read_until(b"\r\n\r\n", timeout).split(b"\r\n\r\n", 1)[0]
        lines = head.decode().split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        start = len(head) + 4
        deadline = time.monotonic() + timeout
        while len(self.buf) < start + length:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, "end of file inside the body"
            self.buf += chunk
        return int(lines[0].split()[1]), json.loads(self.buf[start:start + length])

    def until_eof(self, timeout: float = 20.0) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                return self.buf
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()

    def reset(self) -> None:
        """Hang up with a reset (nothing unsent is delivered, the server's next write fails)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def long_polls_open(server: Server) -> float:
    """The long-poll gauge (``/metrics``): long polls waiting, held or on a thread."""
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("motus_long_polls_open "):
            return float(line.split()[1])
    raise AssertionError("no motus_long_polls_open in /metrics")


def unsent_bytes(server: Server, raw: Raw) -> int:
    """What the server's end of ``raw``'s connection has queued and the client not taken
    (the kernel's send queue, read with ``ss``)."""
    port = raw.sock.getsockname()[1]
    server_port = urlsplit(server.url).port
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{server_port} and dport = :{port} )"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return int(out[1]) if len(out) > 1 else 0


def serving_process(server: Server) -> psutil.Process:
    """The gunicorn worker: the process that serves requests on threads (the most threads)."""
    return max(server.descendants(), key=lambda process: process.num_threads())


@pytest.fixture
def opened() -> list[Raw]:
    raws: list[Raw] = []
    yield raws
    for raw in raws:
        raw.close()


def test_a_hundred_streams_and_a_hundred_long_polls_wait_on_four_threads(start_server, opened: list[Raw]) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    watched = [server.create_session() for _ in range(100)]
    streams = [Raw(server, f"/sessions/{sid}/events") for sid in watched]
    polls = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(100)]
    opened += streams + polls
    for sid, stream in zip(watched, streams):
        stream.read_until(f'"session_id":"{sid}"}}\n\n\r\n'.encode())  # the whole ready event
        stream.buf = b""
    wait_until(lambda: server.get("/health").json()["open_streams"] == 100, what="every stream open at once")
    assert serving_process(server).num_threads() < 40  # not one per waiting client

    # Others are served meanwhile, and an echo turn wakes no inbox poll (the inbox is unchanged).
    side = server.create_session()
    server.send(side, "echo meanwhile")
    assert server.wait_for_status(side, "idle")["response"]["content"] == "echo: meanwhile"
    assert not any(poll.ready() for poll in polls)

    # Each stream is woken by its own session's change.
    for sid, stream in list(zip(watched, streams))[:5]:
        server.send(sid, f"echo to {sid}")
        stream.read_until(f'"content":"echo: to {sid}"'.encode())
    assert not any(stream.ready() for stream in streams[5:])

    # An interrupt wakes every inbox poll, each answered with it.
    asking = server.create_session()
    server.send(asking, "approval rm")
    for poll in polls:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]

    # A client that hangs up is forgotten at once.
    for stream in streams[50:]:
        stream.close()
    wait_until(lambda: server.get("/health").json()["open_streams"] == 50, what="the closed streams forgotten")

    # A stop ends the streams still held: the last chunk, then the end of the connection.
    assert server.stop() == 0
    for stream in streams[:50]:
        assert stream.until_eof().endswith(b"0\r\n\r\n"), stream.buf[-200:]


def inbox_answers(server: Server) -> float:
    """``motus_http_requests_total`` of the inbox answered 200 (``/metrics``)."""
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("motus_http_requests_total{") and 'endpoint="motus_api.inbox"' in line and 'status="200"' in line:
            return float(line.split()[-1])
    return 0.0


def answer_length(buf: bytes) -> int:
    """The length of the first whole answer (head and ``Content-Length`` body) in ``buf``."""
    head = buf.split(b"\r\n\r\n", 1)[0]
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return len(head) + 4 + length


def test_alike_long_polls_woken_together_each_get_the_answer_with_a_request_id_of_their_own(
    start_server, opened: list[Raw],
) -> None:
    """One interrupt wakes every inbox poll; the polls whose requests are the same bytes are
    answered with one run of the view and a copy each. Each copy is a whole answer of its
    own: the same body, its own request id (or the client's own, echoed), counted and
    logged as a request, and the connection kept alive for the next request."""
    server = start_server("tests.agents:dispatch", *ARGS)
    plain = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(40)]
    named = [Raw(server, "/interrupts?wait=true&timeout=120", headers=("X-Request-Id: approver-7",)) for _ in range(5)]
    questions = Raw(server, "/interrupts?type=user_input&wait=true&timeout=120")
    opened += [*plain, *named, questions]
    wait_until(lambda: long_polls_open(server) == 46, what="every long poll waiting")
    counted = inbox_answers(server)

    asking = server.create_session()
    server.send(asking, "approval rm")
    bodies, ids = [], []
    for poll in [*plain, *named]:
        status, items = poll.answer()
        assert status == 200, items
        bodies.append(items)
        head = poll.buf.split(b"\r\n\r\n", 1)[0].decode()
        ids.append(next(line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("x-request-id:")))
    assert all(body == bodies[0] for body in bodies) and [item["session_id"] for item in bodies[0]] == [asking]
    assert len(set(ids[:40])) == 40 and all(len(i) == 32 for i in ids[:40]), ids  # each its own
    assert ids[40:] == ["approver-7"] * 5  # the client's own id, echoed
    assert not questions.ready()  # a question poll is not woken by an approval, nor answered by a copy
    wait_until(lambda: inbox_answers(server) - counted == 45, what="each answer counted as a request")

    def inbox_lines() -> list[str]:
        return [line for line in server.log().splitlines() if "motus.access: GET /interrupts" in line and " 200 " in line]

    wait_until(lambda: len(inbox_lines()) >= 45, what="each answer in the access log")
    # The polls woken in one pass of the main loop get copies; how the 45 wakes fall into
    # passes depends on the machine's load (alone, all in one: 43 copies), so at least one.
    copies = [line for line in inbox_lines() if "(a copy of an alike request's answer)" in line]
    assert 1 <= len(copies) <= 43 and len(inbox_lines()) == 45, inbox_lines()

    # Each connection is still kept alive: its next request is read and answered.
    for poll in [*plain, *named]:
        poll.buf = b""
        poll.sock.sendall(f"GET /health HTTP/1.1\r\nHost: {urlsplit(server.url).netloc}\r\n\r\n".encode())
        status, body = poll.answer()
        assert status == 200 and body["status"] == "ok", body  # type: ignore[index]
    assert long_polls_open(server) == 1  # the question poll still waits


def copy_sender_threads(server: Server) -> int:
    """The serving process's threads named by the copy senders (``motus-copies``)."""
    process = serving_process(server)
    names = []
    for task in os.listdir(f"/proc/{process.pid}/task"):
        try:
            names.append(Path(f"/proc/{process.pid}/task/{task}/comm").read_text().strip())
        except OSError:
            continue  # a thread that ended meanwhile
    return sum(name.startswith("motus-copies") for name in names)


def test_hundreds_of_alike_long_polls_get_their_copies_from_the_copy_senders(start_server, opened: list[Raw]) -> None:
    """Past ``COPIES_PER_BATCH`` alike polls, the copies are sent by the copy sender threads
    in batches and each connection is handed back to the main loop: every poll still gets a
    whole answer of its own (its own request id), counted, and its connection kept alive."""
    from motus.serve.gunicorn.copies import COPIES_PER_BATCH

    count = 3 * COPIES_PER_BATCH + 17
    server = start_server("tests.agents:dispatch", *ARGS)
    polls = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(count)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == count, what="every long poll waiting")
    assert copy_sender_threads(server) == 0  # made at the first broadcast that needs them
    counted = inbox_answers(server)
    asking = server.create_session()
    server.send(asking, "approval rm")
    got = read_all(polls)
    ids = set()
    for buf in got:
        assert len(buf) == answer_length(buf), buf[-200:]
        head, body = buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200 ") and [item["session_id"] for item in json.loads(body)] == [asking], buf[:300]
        ids.add(next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"x-request-id:")))
    assert len(ids) == count  # each its own
    assert copy_sender_threads(server) >= 1
    wait_until(lambda: inbox_answers(server) - counted == count, what="each answer counted as a request")
    for poll in polls:  # kept alive: the next request on each connection is answered
        poll.buf = b""
        poll.sock.sendall(f"GET /health HTTP/1.1\r\nHost: {urlsplit(server.url).netloc}\r\n\r\n".encode())
    for buf in read_all(polls):
        assert buf.startswith(b"HTTP/1.1 200 ") and len(buf) == answer_length(buf), buf[:300]
    assert long_polls_open(server) == 0
    assert "Traceback" not in server.log()


def test_hundreds_of_alike_long_polls_with_small_windows_each_get_a_large_answer_whole(start_server, opened: list[Raw]) -> None:
    """Copies the sockets do not take at once (small receive windows, a 256 KiB answer) are
    sent partly by the copy senders and the rest by the main loop, each whole and in order."""
    from motus.serve.gunicorn.copies import COPIES_PER_BATCH

    count = COPIES_PER_BATCH + 40
    server = start_server("tests.agents:dispatch", *ARGS)
    hanging, sid = server.create_session(), server.create_session()
    server.send(hanging, "hang")  # takes the one turn worker: the next turn waits for it
    server.send(sid, "echo " + "y" * (256 * 1024))
    polls = [Raw(server, f"/sessions/{sid}?wait=true&timeout=120", rcvbuf=4096) for _ in range(count)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == count, what="every long poll waiting")
    assert server.delete(f"/sessions/{hanging}").status_code == 204  # the echo runs, and ends
    got = read_all(polls)
    bodies = set()
    for buf in got:
        assert len(buf) == answer_length(buf), (len(buf), buf[:300])
        bodies.add(buf.split(b"\r\n\r\n", 1)[1])
    assert len(bodies) == 1 and json.loads(bodies.pop())["status"] == "idle"
    assert copy_sender_threads(server) >= 1
    assert long_polls_open(server) == 0
    assert "Traceback" not in server.log()


def test_alike_long_polls_whose_first_waits_again_are_each_served_again(start_server, opened: list[Raw]) -> None:
    """Alike polls woken by a change that does not end their wait (an approval, for polls of
    questions) wait again, each of them, and are then answered by their own event."""
    server = start_server("tests.agents:dispatch", *ARGS)
    polls = [Raw(server, "/interrupts?type=user_input&wait=true&timeout=120") for _ in range(20)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 20, what="every long poll waiting")
    approving = server.create_session()
    server.send(approving, "approval rm")  # wakes the question polls, which find none and wait again
    wait_until(lambda: server.get(f"/sessions/{approving}").json()["status"] == "interrupted", what="the approval")
    asking = server.create_session()
    server.send(asking, "question colour")
    for poll in polls:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
    wait_until(lambda: long_polls_open(server) == 0, what="no long poll left waiting")


def read_all(raws: list[Raw], timeout: float = 60.0) -> list[bytes]:
    """Read every one of ``raws`` at once (select) until each has a whole ``Content-Length``
    answer or its end of file; what each got."""
    left = {raw.sock: raw for raw in raws}
    # Appended to in place, and the answer's length computed once its head is in: a 12 MiB
    # answer comes in ~3,000 small reads, and copying (or scanning) the whole buffer at each
    # one took most of a test's 16 s.
    got = {raw.sock: bytearray(raw.buf) for raw in raws}
    wanted: dict[socket.socket, int] = {}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        ready, _, _ = select.select(list(left), [], [], max(0.0, deadline - time.monotonic()))
        for sock in ready:
            buf = got[sock]
            chunk = sock.recv(1 << 20)
            buf += chunk
            if sock not in wanted and b"\r\n\r\n" in buf[:65536]:
                wanted[sock] = answer_length(bytes(buf[:65536]))
            if not chunk or (sock in wanted and len(buf) >= wanted[sock]):
                del left[sock]
    for raw in raws:
        raw.buf = bytes(got[raw.sock])
    return [raw.buf for raw in raws]


def test_alike_long_polls_with_a_large_answer_and_a_small_window_each_get_it_whole(
    start_server, opened: list[Raw],
) -> None:
    """A copy the socket does not take at once is kept for the main loop to send, a large one
    too (12 MiB, three times, within the worker's total): no alike poll is cut off mid-answer
    or refused, however slowly its window opens. (Copies past the total are refused whole,
    with a 503 and ``Retry-After``: ``test_slow_clients_attacks.py``.)"""
    server = start_server("tests.agents:dispatch", *ARGS, "--max-request-bytes", str(32 * 1024 * 1024))
    hanging, sid = server.create_session(), server.create_session()
    server.send(hanging, "hang")  # takes the one turn worker: the next turn waits for it
    size = 12 * 1024 * 1024
    server.send(sid, "echo " + "x" * size)  # its session's answer: 12 MiB, more than a socket takes at once
    polls = [Raw(server, f"/sessions/{sid}?wait=true&timeout=120", rcvbuf=4096) for _ in range(3)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 3, what="every long poll waiting")
    assert server.delete(f"/sessions/{hanging}").status_code == 204  # the echo runs, and ends
    got = read_all(polls)  # every client reads, at once, as fast as its window lets it
    whole = [len(buf) > size and len(buf) == answer_length(buf) for buf in got]
    copies = server.log().count("(a copy of an alike request's answer)")
    assert all(whole), f"cut off mid-answer: {[len(buf) for buf in got]} bytes ({copies} copies)"
    assert "did not take its answer in time" not in server.log()


def test_alike_long_polls_with_a_request_pipelined_behind_are_answered_in_order(start_server, opened: list[Raw]) -> None:
    """A client may send its next request behind its long poll: an alike poll answered with a
    copy then has that request read and answered, on the same connection, in order."""
    server = start_server("tests.agents:dispatch", *ARGS)
    netloc = urlsplit(server.url).netloc
    polls = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(10)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 10, what="every long poll waiting")
    for poll in polls:
        poll.sock.sendall(f"GET /health HTTP/1.1\r\nHost: {netloc}\r\n\r\n".encode())
    asking = server.create_session()
    server.send(asking, "approval rm")
    for poll in polls:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
        poll.buf = poll.buf[answer_length(poll.buf):]  # what came after the first answer
    for poll in polls:
        data = poll.read_until(b'"status":"ok"')
        assert b"HTTP/1.1 200" in data, data[-300:]
    wait_until(lambda: long_polls_open(server) == 0, what="no long poll left waiting")


@pytest.mark.parametrize("version, headers", [("1.0", ()), ("1.1", ("Connection: close",))], ids=["http-1.0", "connection-close"])
def test_alike_long_polls_whose_connection_closes_after_are_each_answered_then_closed(
    start_server, opened: list[Raw], version: str, headers: tuple[str, ...],
) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    polls = [Raw(server, "/interrupts?wait=true&timeout=120", version=version, headers=headers) for _ in range(8)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 8, what="every long poll waiting")
    counted = inbox_answers(server)
    asking = server.create_session()
    server.send(asking, "approval rm")
    for poll in polls:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
        poll.until_eof()
    wait_until(lambda: inbox_answers(server) - counted == 8, what="each answer counted once")
    assert long_polls_open(server) == 0


def test_alike_http_1_0_keep_alive_long_polls_get_a_copy_and_stay_open(start_server, opened: list[Raw]) -> None:
    """HTTP/1.0 with ``Connection: keep-alive`` (a proxy's default) is kept alive after a copy
    too: the next request on each connection is read and answered."""
    server = start_server("tests.agents:dispatch", *ARGS)
    netloc = urlsplit(server.url).netloc
    polls = [Raw(server, "/interrupts?wait=true&timeout=120", version="1.0", headers=("Connection: keep-alive",))
             for _ in range(8)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 8, what="every long poll waiting")
    asking = server.create_session()
    server.send(asking, "approval rm")
    for poll in polls:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
    for poll in polls:
        poll.buf = b""
        poll.sock.sendall(f"GET /health HTTP/1.0\r\nHost: {netloc}\r\nConnection: keep-alive\r\n\r\n".encode())
        status, body = poll.answer()
        assert status == 200 and body["status"] == "ok", body  # type: ignore[index]
    assert long_polls_open(server) == 0


def watched_fds(process: psutil.Process) -> set[int]:
    """The descriptors ``process``'s selector (epoll) watches, from ``/proc``."""
    fds: set[int] = set()
    for entry in (f"/proc/{process.pid}/fd/{name}" for name in os.listdir(f"/proc/{process.pid}/fd")):
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if "eventpoll" in target:
            with open(entry.replace("/fd/", "/fdinfo/")) as info:
                fds |= {int(line.split()[1]) for line in info if line.startswith("tfd:")}
    return fds


def server_fd(process: psutil.Process, raw: Raw) -> int:
    """The worker's descriptor of ``raw``'s connection."""
    port = raw.sock.getsockname()[1]
    return next(c.fd for c in process.net_connections("tcp") if c.raddr and c.raddr.port == port)


@pytest.mark.parametrize("then", ["reset", "sigterm"])
def test_alike_long_polls_set_aside_while_their_first_waits_for_a_thread(start_server, opened: list[Raw], then: str) -> None:
    """Woken while every thread is busy, the first of alike polls waits for a thread and the
    others are set aside (in no table of the main loop; their sockets stay in its selector,
    so a wake of thousands costs no system call each) meanwhile. Clients that reset then
    are closed once the first is answered (no descriptor kept, no worker error); a stop then
    still answers (or closes) every one of them promptly."""
    # The hung turn's --timeout: long enough that, on a loaded machine, the approval sent at
    # half of it still reaches its interrupt within its own (4 s was lost once in CI), and
    # that the ten polls, each half a second on the one thread before it is held, and the
    # blockers are all in place before the approval runs.
    turn_timeout = 20
    # One thread: clients that do not read hold at most one (answer.DIRECT_WRITERS), so one
    # is every thread.
    server = start_server("tests.agents:dispatch", *ARGS, "--threads", "1", "--timeout", str(turn_timeout), "--read-timeout", "30",
                          "--max-request-bytes", str(40 * 1024 * 1024))
    big = server.create_session()
    server.send(big, "echo " + "x" * (38 * 1024 * 1024))  # no thread can leave it to the main loop (32 MiB at most)
    server.wait_for_status(big, "idle", timeout=60)
    hanging, asking = server.create_session(), server.create_session()
    server.send(hanging, "hang")  # killed at --timeout; then the approval, queued behind it, runs
    sent = time.monotonic()
    # Not a synchronisation but the scenario's timing: the approval must run once every thread
    # is busy, and only a timer can start it then (a request would need a thread). It waits
    # behind the hung turn, killed at --timeout; and since a turn's --timeout counts from its
    # message, the approval is sent half that later, so that it is still in time to run.
    wait_until(lambda: time.monotonic() - sent > turn_timeout / 2, timeout=turn_timeout, what="half the hung turn's time")
    server.send(asking, "approval rm")
    polls = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(10)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 10, what="every long poll waiting")
    worker = serving_process(server)
    baseline = worker.num_fds()
    fds = [server_fd(worker, poll) for poll in polls]
    blockers = [Raw(server, f"/sessions/{big}", rcvbuf=4096)]  # reads nothing: the thread writes
    opened += blockers
    wait_until(lambda: all(unsent_bytes(server, blocker) > 0 for blocker in blockers), what="every thread busy")
    # The approval wakes every poll: the first leaves the selector to wait for a thread, the
    # others are set aside, still watched (a reset among them is seen, not spun on).
    wait_until(lambda: len(set(fds) - watched_fds(worker)) == 1, timeout=20, what="the polls woken, the first waiting for a thread")
    assert not any(poll.ready() for poll in polls)
    if then == "reset":
        for poll in polls[5:]:
            poll.reset()
        for blocker in blockers:
            blocker.reset()  # the threads are free again
        for poll in polls[:5]:
            status, items = poll.answer()
            assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
        wait_until(lambda: worker.num_fds() <= baseline - 5, what="the reset connections closed")
        assert long_polls_open(server) == 0
        assert "Traceback" not in server.log() and "Error serving" not in server.log()
        return
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    for blocker in blockers:
        blocker.reset()  # the threads are free again (a client that does not read holds a stop up to its deadline)
    for poll in polls:
        data = poll.until_eof(timeout=10)
        assert data.startswith(b"HTTP/1.1 200 "), data[:200]  # answered, then closed
    assert time.monotonic() - started < 5
    assert server.stop() == 0


def test_alike_long_polls_with_different_api_keys_are_not_answered_with_each_others_copy(
    start_server, opened: list[Raw],
) -> None:
    server = start_server("tests.agents:dispatch", *ARGS, "--api-key", "alice=SECRET1", "--api-key", "bob=SECRET2")
    alice = server.with_headers({"Authorization": "Bearer SECRET1"})
    polls = {key: [Raw(server, "/interrupts?wait=true&timeout=120", headers=(f"Authorization: Bearer {key}",))
                   for _ in range(4)] for key in ("SECRET1", "SECRET2", "WRONG")}
    opened += [poll for group in polls.values() for poll in group]
    for poll in polls["WRONG"]:
        status, _ = poll.answer()
        assert status == 401
    wait_until(lambda: long_polls_open(alice) == 8, what="every long poll waiting")
    asking = alice.create_session()
    alice.send(asking, "approval rm")
    for poll in polls["SECRET1"] + polls["SECRET2"]:
        status, items = poll.answer()
        assert status == 200 and [item["session_id"] for item in items] == [asking], items  # type: ignore[union-attr]
    copies = server.log().count("(a copy of an alike request's answer)")
    assert copies <= 6, f"{copies} copies: a poll was answered with a copy of another key's"


def test_alike_session_polls_whose_session_is_deleted_each_get_a_404_and_stay_open(start_server, opened: list[Raw]) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    netloc = urlsplit(server.url).netloc
    sid = server.create_session()
    server.send(sid, "hang")
    wait_until(lambda: server.get(f"/sessions/{sid}").json()["status"] == "running", what="the turn running")
    polls = [Raw(server, f"/sessions/{sid}?wait=true&timeout=120") for _ in range(10)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 10, what="every long poll waiting")
    assert server.delete(f"/sessions/{sid}").status_code == 204
    for poll in polls:
        status, body = poll.answer()
        assert status == 404, body
    for poll in polls:
        poll.buf = b""
        poll.sock.sendall(f"GET /health HTTP/1.1\r\nHost: {netloc}\r\n\r\n".encode())
        status, body = poll.answer()
        assert status == 200, body
    assert long_polls_open(server) == 0


def test_alike_long_polls_with_the_same_client_request_id_or_an_unusable_one(start_server, opened: list[Raw]) -> None:
    """The client's own id (kept only if sane) is echoed to each alike poll; an unusable one
    is replaced, by a fresh id for each."""
    server = start_server("tests.agents:dispatch", *ARGS)
    bad = [Raw(server, "/interrupts?wait=true&timeout=120", headers=("X-Request-Id: not sane!",)) for _ in range(5)]
    mine = [Raw(server, "/interrupts?wait=true&timeout=120", headers=(f"X-Request-Id: r{i}",)) for i in range(5)]
    opened += bad + mine
    wait_until(lambda: long_polls_open(server) == 10, what="every long poll waiting")
    asking = server.create_session()
    server.send(asking, "approval rm")
    ids = []
    for poll in bad + mine:
        status, _ = poll.answer()
        assert status == 200
        head = poll.buf.split(b"\r\n\r\n", 1)[0].decode()
        ids.append(next(line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("x-request-id:")))
    assert len(set(ids[:5])) == 5 and all(len(i) == 32 for i in ids[:5]), ids
    assert ids[5:] == [f"r{i}" for i in range(5)], ids


def test_held_long_polls_answer_at_their_event_at_their_timeout_and_at_a_stop(start_server, opened: list[Raw]) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    # Woken by other changes but not by its own, an inbox poll for questions waits out the
    # time it was given, once: its deadline is its first run's, not reset by each wake.
    questions = Raw(server, "/interrupts?type=user_input&wait=true&timeout=2")
    opened.append(questions)
    started = time.monotonic()
    asking = server.create_session()
    server.send(asking, "approval rm")  # an approval: the question poll runs again, finds none
    wait_until(lambda: server.get(f"/sessions/{asking}").json()["status"] == "interrupted", what="the approval")
    hanging = [server.create_session() for _ in range(12)]
    for sid in hanging:
        server.send(sid, "hang")  # one runs, the others wait for the one worker: all 'running'
    polls = {sid: Raw(server, f"/sessions/{sid}?wait=true&timeout=120") for sid in hanging}
    short = Raw(server, f"/sessions/{hanging[0]}?wait=true&timeout=1")
    opened += [*polls.values(), short]

    status, body = short.answer()
    assert status == 200 and body["status"] == "running", body  # type: ignore[index]
    status, body = questions.answer()
    assert status == 200 and body == [] and time.monotonic() - started >= 1.9, body

    for sid in hanging[:3]:
        assert server.delete(f"/sessions/{sid}").status_code == 204
        status, body = polls[sid].answer()
        assert status == 404, body
    assert not any(polls[sid].ready() for sid in hanging[3:])

    assert server.stop() == 0  # releases every long poll at once, with the state it reads then
    for sid in hanging[3:]:
        status, body = polls[sid].answer()
        assert status in (200, 503), body


def test_a_held_stream_to_an_http_1_0_client_is_not_chunked(start_server, opened: list[Raw]) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    sid = server.create_session()
    stream = Raw(server, f"/sessions/{sid}/events", version="1.0")
    opened.append(stream)
    stream.read_until(b"event: ready")
    wait_until(lambda: server.get("/health").json()["open_streams"] == 1, what="the stream open")
    server.send(sid, "echo plain")
    data = stream.read_until(b'"content":"echo: plain"')
    body = data.split(b"\r\n\r\n", 1)[1]
    assert b"\r\n" not in body, body  # SSE lines end in \n alone: a \r\n would be chunk framing
    assert server.delete(f"/sessions/{sid}").status_code == 204
    assert b'"status":"deleted"' in stream.until_eof()


@pytest.mark.parametrize("version, headers", [("1.0", ()), ("1.1", ("Connection: close",))], ids=["http-1.0", "connection-close"])
def test_a_held_long_poll_whose_connection_closes_after_it_is_still_answered(
    start_server, opened: list[Raw], version: str, headers: tuple[str, ...],
) -> None:
    """A long poll served again after a park is parsed again from its bytes: the parser must
    not take it for a second request on a connection the first one said to close (gunicorn's
    parser stops there, and the client got the end of the connection instead of an answer:
    behind nginx's default ``proxy_http_version 1.0``, every held long poll)."""
    server = start_server("tests.agents:dispatch", *ARGS)
    poll = Raw(server, "/interrupts?wait=true&timeout=60", version=version, headers=headers)
    short = Raw(server, "/interrupts?wait=true&timeout=1", version=version, headers=headers)
    opened += [poll, short]
    status, body = short.answer()  # at its deadline
    assert status == 200 and body == [], body
    asking = server.create_session()
    server.send(asking, "approval rm")  # at its event (it was held: sent before the short one ended)
    status, body = poll.answer()
    assert status == 200 and [item["session_id"] for item in body] == [asking], body  # type: ignore[union-attr]
    poll.until_eof()  # then the connection ends, as asked


def test_a_held_stream_whose_client_resets_while_its_answer_is_unsent_is_ended(start_server, opened: list[Raw]) -> None:
    """A stream that parks with part of its answer still to send waits in the main loop's
    writes first; a client that goes then (reset, or too slow to read) must end the stream like
    one that leaves while held: its count in /health, and its registration with its session's
    watch (which held the connection until the session's next change), are given back."""
    server = start_server("tests.agents:dispatch", *ARGS)
    sid = server.create_session()
    stream = Raw(server, f"/sessions/{sid}/events", rcvbuf=4096)
    opened.append(stream)
    stream.read_until(b"event: ready")
    wait_until(lambda: server.get("/health").json()["open_streams"] == 1, what="the stream open")
    server.send(sid, "echo " + "x" * (6 * 1024 * 1024))  # an event far larger than the socket takes
    server.wait_for_status(sid, "idle", timeout=60)
    # The event is on its way and stuck (the client reads nothing): the thread writes what
    # the socket takes and leaves the rest to the main loop, as the stream parks again.
    wait_until(lambda: unsent_bytes(server, stream) > 0, what="the event queued, unread")
    stream.reset()
    wait_until(lambda: server.get("/health").json()["open_streams"] == 0, what="the reset stream ended")


def test_a_stream_waiting_on_its_thread_is_not_cut_off_when_a_held_place_frees(start_server, opened: list[Raw]) -> None:
    """Past ``--max-waiting`` a stream waits on its thread, in slices; once a place frees, a
    slice's wait must not park the stream from inside its own body (that ended the body: at
    its next event the client got the end of the stream instead of the event, and /health
    stopped counting it while it was still open)."""
    server = start_server("tests.agents:dispatch", *ARGS, "--max-waiting", "1")
    first_sid, second_sid = server.create_session(), server.create_session()
    first = Raw(server, f"/sessions/{first_sid}/events")
    opened.append(first)
    first.read_until(b"event: ready")
    second = Raw(server, f"/sessions/{second_sid}/events")
    opened.append(second)
    second.read_until(b"event: ready")  # waits on its thread
    wait_until(lambda: server.get("/health").json()["open_streams"] == 2, what="both streams open")
    first.close()
    wait_until(lambda: server.get("/health").json()["open_streams"] == 1, what="the first stream forgotten")
    # Let a slice of the second's wait on its thread end with the place free: a length of
    # time is the condition here (the slices are PEER_CHECK_SECONDS long).
    time.sleep(PEER_CHECK_SECONDS + 1.0)
    assert server.get("/health").json()["open_streams"] == 1
    server.send(second_sid, "echo still here")
    second.read_until(b'"content":"echo: still here"')
    assert server.get("/health").json()["open_streams"] == 1


def test_an_interrupt_answered_after_a_restart_leaves_the_inbox(start_server, tmp_path) -> None:
    """The inbox is kept until a publish says pending interrupts changed, which compares with
    what the inbox last showed of each session: after a restart that must include the
    interrupts the store brought back, or answering one changes nothing the cache sees (and
    GET /interrupts, and every inbox long poll at once, showed it answered and pending)."""
    store = f"sqlite:///{tmp_path / 'inbox.db'}"
    first = start_server("tests.agents:dispatch", *ARGS, "--store", store)
    sid = first.create_session()
    first.send(sid, "approval rm")
    first.wait_for_status(sid, "interrupted")
    assert first.stop() == 0
    second = start_server("tests.agents:dispatch", *ARGS, "--store", store)
    [item] = second.get("/interrupts").json()
    answered = second.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}})
    assert answered.status_code == 200, answered.text
    assert second.get("/interrupts").json() == []
    assert second.wait_for_status(sid, "idle")["response"]["content"].startswith("approved=True")
    started = time.monotonic()
    assert second.get("/interrupts?wait=true&timeout=1").json() == []
    assert time.monotonic() - started >= 0.9


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT], ids=["sigterm", "sigquit"])
def test_a_stop_ends_every_held_wait_promptly_and_leaves_no_process(start_server, opened: list[Raw], sig: int) -> None:
    server = start_server("tests.agents:dispatch", *ARGS)
    sids = [server.create_session() for _ in range(10)]
    streams = [Raw(server, f"/sessions/{sid}/events") for sid in sids]
    polls = [Raw(server, "/interrupts?wait=true&timeout=120") for _ in range(10)]
    opened += streams + polls
    for stream in streams:
        stream.read_until(b"event: ready")
    wait_until(lambda: long_polls_open(server) == 10, what="every long poll waiting")
    descendants = server.descendants()
    started = time.monotonic()
    server.process.send_signal(sig)
    code = server.process.wait(20)
    assert code == 0 or sig == signal.SIGQUIT, server.log()
    for raw in streams + polls:
        raw.until_eof(timeout=10)
    assert time.monotonic() - started < 10
    wait_until(lambda: not [p for p in descendants if _alive(p)], what="every process to end")
    if sig == signal.SIGTERM:  # a graceful stop answers the polls and ends the streams properly
        for poll in polls:
            assert poll.buf.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), poll.buf[:200]
        for stream in streams:
            assert stream.buf.endswith(b"0\r\n\r\n"), stream.buf[-200:]


def test_more_held_waits_than_the_open_file_limit_allows_do_not_end_the_worker(start_server, opened: list[Raw]) -> None:
    """``worker_connections`` is ``--threads + --max-waiting + 1000``, more than a low
    open-file limit allows: one client holding that many long polls made ``accept`` fail with
    EMFILE, which gunicorn raised out of the worker's main loop; the worker died, and with it
    every session of a memory store. It stops accepting instead, until a connection closes."""
    server = start_server("tests.agents.few_descriptors:dispatch", *ARGS)
    sid = server.create_session()
    polls = [Raw(server, "/interrupts?wait=true&timeout=60") for _ in range(400)]  # past 256 descriptors
    opened += polls
    wait_until(lambda: "Out of file descriptors" in server.log(), timeout=30, what="the worker out of descriptors")
    for poll in polls:
        poll.close()

    def status() -> int | None:
        try:
            return server.get(f"/sessions/{sid}", timeout=5).status_code
        except requests.RequestException:
            return None  # still behind the connections being closed

    wait_until(lambda: status() is not None, timeout=30, what="the server to answer again")
    assert status() == 200, server.log()[-3000:]  # the same worker: its session is still there
    assert "Exception in worker process" not in server.log()
    assert "Out of file descriptors" in server.log()
