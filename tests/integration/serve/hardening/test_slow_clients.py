"""Slow clients (slowloris) cannot take the request threads from everyone else.

Each test runs a real server with few request threads and a short ``--read-timeout``, opens
hundreds of loopback connections that send part of a request and then one byte every half
second (one helper thread drives them all through a selector), and checks that

- another client's requests (health, create, message, the interrupt, the resume) are each
  answered within about a second meanwhile, and
- every slow connection is closed by the server within ``--read-timeout`` plus a margin,
  although it keeps sending: the timeout bounds the whole head and body, not each read.

The last part checks that the worker's own request reader (it reads every request whole
before a thread sees it) keeps HTTP working: unusual but valid requests are served, and
requests it will not read are answered with a 4xx that names the problem.
"""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, Server, free_port, server_env, server_factory, wait_healthy, wait_until

READ_TIMEOUT = 2.0
#: How late after ``READ_TIMEOUT`` a slow connection may still be open (the server sweeps
#: on its own clock; this is a correctness property, not a benchmark).
DROP_MARGIN = 1.5
#: The bound on each request of the well-behaved client while the attack runs.
ANSWER_WITHIN = 1.5
DRIP_INTERVAL = 0.5

HEAD = b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
SLOW_HEAD = (HEAD + b"X-Slow: ", b"a")
SLOW_BODY = (HEAD + b"Content-Length: 1000\r\n\r\n{", b" ")
SLOW_CHUNKED = (HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n", b"1\r\n \r\n")
SILENT = (b"", b"")
#: Large bodies (3 MB) that stop coming: read by the main loop too, up to --max-request-bytes.
SLOW_BIG_BODY = (HEAD + b"Content-Length: 3000000\r\n\r\n{" + b" " * 1_500_000, b" ")
SLOW_BIG_CHUNKED = (HEAD + b"Transfer-Encoding: chunked\r\n\r\n2dc6c0\r\n{" + b" " * 1_500_000, b" ")


@dataclass
class SlowConnection:
    sock: socket.socket
    kind: str
    opened: float
    closed: float | None = None
    received: bytes = b""
    how: str = ""


@dataclass
class Trickler:
    """Connections that each send an opening and then ``drip`` every ``DRIP_INTERVAL``.

    With ``reconnect``, every connection the server closes is replaced by a new one, so the
    attack lasts until ``stop()``; ``dropped`` holds the closed ones.
    """

    port: int
    kinds: dict[str, tuple[tuple[bytes, bytes], int]]  # kind -> ((opening, drip), count)
    reconnect: bool = False
    live: list[SlowConnection] = field(default_factory=list)
    dropped: list[SlowConnection] = field(default_factory=list)
    drips: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)

    def start(self) -> Trickler:
        for kind, (_, count) in self.kinds.items():
            for _ in range(count):
                self._open(kind)
        self._thread.start()
        return self

    def _open(self, kind: str) -> None:
        opening, _ = self.kinds[kind][0]
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        conn = SlowConnection(sock, kind, time.monotonic())
        sock.sendall(opening)
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self.live.append(conn)

    def _close(self, conn: SlowConnection, how: str) -> None:
        conn.closed, conn.how = time.monotonic(), how
        self._selector.unregister(conn.sock)
        conn.sock.close()
        with self._lock:
            self.live.remove(conn)
            self.dropped.append(conn)
        if self.reconnect and not self._stop.is_set():
            self._open(conn.kind)

    def _run(self) -> None:
        try:
            next_drip = time.monotonic() + DRIP_INTERVAL
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=max(0.0, min(0.05, next_drip - time.monotonic()))):
                    conn: SlowConnection = key.data
                    try:
                        data = conn.sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        self._close(conn, f"reset ({exc.__class__.__name__})")
                        continue
                    if data:
                        conn.received += data
                    else:
                        self._close(conn, "eof")
                if time.monotonic() >= next_drip:
                    next_drip += DRIP_INTERVAL
                    for conn in list(self.live):
                        drip = self.kinds[conn.kind][0][1]
                        if not drip or conn.closed is not None:
                            continue
                        try:
                            conn.sock.send(drip)
                        except BlockingIOError:
                            pass
                        except OSError:
                            pass  # closed by the server: the selector reports it
                    self.drips += 1
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def dropped_count(self, kind: str | None = None) -> int:
        with self._lock:
            return sum(1 for conn in self.dropped if kind is None or conn.kind == kind)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for conn in list(self.live):
            self._selector.unregister(conn.sock)
            conn.sock.close()
        self._selector.close()
        if self.error is not None:
            raise AssertionError(f"the slow-client thread failed: {self.error!r}")

    def check_drops(self, now: float, answers: tuple[bytes, ...] = (b"HTTP/1.1 408 ",)) -> None:
        """Every connection was closed by the server in time, and none is overdue."""
        limit = READ_TIMEOUT + DROP_MARGIN
        late = [(c.kind, round(c.closed - c.opened, 2)) for c in self.dropped if c.closed - c.opened > limit]
        assert not late, f"slow connections closed later than {limit}s: {late[:10]}"
        overdue = [(c.kind, round(now - c.opened, 2)) for c in self.live if now - c.opened > limit]
        assert not overdue, f"slow connections still open after {limit}s: {overdue[:10]}"
        for conn in self.dropped:
            # Closed without a response, or with a 408 (for a partial request).
            assert conn.received == b"" or conn.received.startswith(answers), conn.received[:200]


@contextmanager
def trickling(server: Server, kinds: dict[str, tuple[tuple[bytes, bytes], int]], reconnect: bool = False) -> Iterator[Trickler]:
    port = int(server.url.rsplit(":", 1)[1])
    trickler = Trickler(port, kinds, reconnect=reconnect)
    try:
        trickler.start()
        # The attack is on once every connection has been sent a byte or two.
        wait_until(lambda: trickler.drips >= 2 or trickler.error, timeout=10, what="the slow clients to start dripping")
        yield trickler
    finally:
        trickler.stop()


class Timed:
    """Times each request of a well-behaved client (a new connection every time)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.timings: list[tuple[str, float]] = []

    def __call__(self, what: str, call: Callable[[], requests.Response]) -> requests.Response:
        started = time.monotonic()
        response = call()
        self.timings.append((what, time.monotonic() - started))
        return response

    def check(self) -> None:
        slow = [(what, round(seconds, 3)) for what, seconds in self.timings if seconds > ANSWER_WITHIN]
        assert not slow, f"requests answered later than {ANSWER_WITHIN}s under attack: {slow}"

    def summary(self) -> str:
        worst = max(seconds for _, seconds in self.timings)
        return f"{len(self.timings)} requests, worst {worst * 1000:.0f} ms"


def approval_round(server: Server, timed: Timed) -> None:
    """Create a session, send a message, see its interrupt, resume it, see it end."""
    assert timed("health", lambda: server.get("/health", timeout=10)).status_code == 200
    created = timed("create", lambda: server.post("/sessions", json={}, timeout=10))
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    sent = timed("message", lambda: server.post(f"/sessions/{session_id}/messages", json={"content": "old.txt"}, timeout=10))
    assert sent.status_code == 202, sent.text
    waited = timed("interrupt", lambda: server.get(f"/sessions/{session_id}", params={"wait": "true", "timeout": 10}, timeout=15))
    body = waited.json()
    assert body["status"] == "interrupted", body
    interrupt_id = body["interrupts"][0]["interrupt_id"]
    resumed = timed("resume", lambda: server.post(f"/sessions/{session_id}/resume", json={"interrupt_id": interrupt_id, "value": {"approved": True}}, timeout=10))
    assert resumed.status_code == 200, resumed.text
    done = timed("completed", lambda: server.get(f"/sessions/{session_id}", params={"wait": "true", "timeout": 10}, timeout=15))
    assert done.json()["status"] == "idle", done.json()
    assert timed("delete", lambda: server.delete(f"/sessions/{session_id}", timeout=10)).status_code == 204


def start_small(start_server: Callable[..., Server]) -> Server:
    """A server with a short read timeout. Tests that attack it start their own; the
    well-behaved ones pass ``shared_server`` and share one (none of them logs a traceback)."""
    return start_server("tests.agents:approval", "--threads", "16", "--workers", "2", "--read-timeout", str(READ_TIMEOUT))


def test_slow_headers_do_not_stop_a_resume(start_server) -> None:
    server = start_small(start_server)
    timed = Timed(server)
    with trickling(server, {"head": (SLOW_HEAD, 200)}, reconnect=True) as attack:
        rounds = 0
        # Keep serving until the first 200 have been dropped and replaced, so the client is
        # measured both under a steady attack and through the server's sweeps.
        while rounds < 3 or attack.dropped_count() < 200:
            approval_round(server, timed)
            rounds += 1
            if rounds > 200:
                raise AssertionError(f"the server dropped only {attack.dropped_count()} slow connections")
        attack.check_drops(time.monotonic())
    timed.check()
    print(f"\nslow headers: {rounds} approval rounds, {timed.summary()}, {attack.dropped_count()} slow connections dropped")
    assert "Traceback" not in server.log()


def test_slow_bodies_and_silent_connections_are_dropped(start_server) -> None:
    server = start_small(start_server)
    timed = Timed(server)
    kinds = {"body": (SLOW_BODY, 100), "chunked": (SLOW_CHUNKED, 50), "silent": (SILENT, 50)}
    with trickling(server, kinds) as attack:
        approval_round(server, timed)
        wait_until(lambda: attack.dropped_count() >= 200, timeout=READ_TIMEOUT + DROP_MARGIN + 5, what="every slow connection to be dropped")
        attack.check_drops(time.monotonic())
        partial = [c for c in attack.dropped if c.kind != "silent"]
        assert sum(1 for c in partial if c.received.startswith(b"HTTP/1.1 408 ")) >= len(partial) // 2, [c.how for c in partial[:10]]
        assert all(c.received == b"" for c in attack.dropped if c.kind == "silent")
    approval_round(server, timed)
    timed.check()
    print(f"\nslow bodies: {timed.summary()}")
    assert "Traceback" not in server.log()


def test_large_slow_bodies_are_dropped(start_server) -> None:
    server = start_small(start_server)
    timed = Timed(server)
    with trickling(server, {"big": (SLOW_BIG_BODY, 4), "big chunked": (SLOW_BIG_CHUNKED, 4)}) as attack:
        wait_until(lambda: attack.dropped_count() >= 8, timeout=READ_TIMEOUT + DROP_MARGIN + 5, what="the large slow bodies to be dropped")
        # The main loop reads the whole body, so each gets its 408 (and no thread ever sees a
        # short body it could take for a whole one).
        attack.check_drops(time.monotonic())
        assert all(c.received for c in attack.dropped), [c.how for c in attack.dropped]
    approval_round(server, timed)
    timed.check()
    listed = server.get("/sessions").json()
    assert len(listed) == 0, listed  # none of the cut-off requests created a session
    assert "Traceback" not in server.log()


def test_idle_kept_alive_connections_hold_no_thread(shared_server) -> None:
    server = start_small(shared_server)
    timed = Timed(server)
    kept: list[requests.Session] = []
    try:
        for _ in range(100):
            client = requests.Session()
            kept.append(client)
            assert client.get(server.url + "/health", timeout=10).status_code == 200  # then idle, kept alive
        approval_round(server, timed)
    finally:
        for client in kept:
            client.close()
    timed.check()


# -- the request reader keeps HTTP working --------------------------------------------------


def _raw(server: Server) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


class _Responses:
    """Reads responses (each with a Content-Length) off a socket, one after another."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"connection closed after {self.data[:200]!r}"
        self.data += chunk

    def next(self) -> tuple[bytes, bytes]:
        while b"\r\n\r\n" not in self.data:
            self._more()
        head, _, rest = self.data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            self._more()
            rest = self.data.partition(b"\r\n\r\n")[2]
        self.data = rest[length:]
        return head, rest[:length]


def test_requests_of_every_shape_still_work(shared_server) -> None:
    server = start_small(shared_server)
    # A large body (more than the reader buffers before handing over to a thread).
    big = b"{" + b" " * (3 * 1024 * 1024) + b"}"
    response = requests.post(server.url + "/sessions", data=big, headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 201, response.text

    # Expect: 100-continue gets exactly one interim response, then the real one.
    with _raw(server) as sock:
        body = b'{"state": []}'
        sock.sendall(HEAD + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(1)
            assert chunk
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        head, answer = _Responses(sock).next()
        assert head.startswith(b"HTTP/1.1 201 "), head
        assert json.loads(answer)["status"] == "idle"

    # Chunked, in pieces; then two pipelined requests on the same connection.
    with _raw(server) as sock:
        sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        for piece in (b"2\r\n{}\r\n", b"0\r\n\r\n"):
            sock.sendall(piece)
        responses = _Responses(sock)
        head, _ = responses.next()
        assert head.startswith(b"HTTP/1.1 201 "), head
        get = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        sock.sendall(get + get[:20])
        sock.sendall(get[20:])
        for _ in range(2):
            head, answer = responses.next()
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert json.loads(answer)["status"] == "ok"

    # A request that trickles in within the timeout is served, not dropped.
    with _raw(server) as sock:
        request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        for index in range(0, len(request), 8):
            sock.sendall(request[index:index + 8])
            time.sleep(READ_TIMEOUT / 20)  # deliberate pacing: slow, but inside the timeout
        head, _ = _Responses(sock).next()
        assert head.startswith(b"HTTP/1.1 200 "), head
    assert "Traceback" not in server.log()


def test_flask_serve_drops_slow_clients(tmp_path: Path) -> None:
    """``flask motus serve`` (Werkzeug, a thread per connection) drops them too."""
    port = free_port()
    log_path = tmp_path / "flask.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flask", "motus", "serve", "tests.agents:approval", "--port", str(port),
             "--workers", "1", "--read-timeout", str(READ_TIMEOUT)],
            cwd=ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)  # type: ignore[arg-type]
    try:
        wait_healthy(server.url, process, log_path)  # type: ignore[arg-type]
        timed = Timed(server)
        with trickling(server, {"head": (SLOW_HEAD, 30), "body": (SLOW_BODY, 30)}) as attack:
            approval_round(server, timed)
            wait_until(lambda: attack.dropped_count() >= 60, timeout=READ_TIMEOUT + DROP_MARGIN + 5, what="every slow connection to be dropped")
            # Werkzeug turns an error while reading a body of known length into 400 ("client
            # disconnected"); a slow head just ends the connection.
            attack.check_drops(time.monotonic(), answers=(b"HTTP/1.1 408 ", b"HTTP/1.1 400 "))
            assert all(c.received == b"" for c in attack.dropped if c.kind == "head")
        timed.check()
    finally:
        process.terminate()
        try:
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


# -- what the request reader refuses, and what it still serves ----------------------------------


@pytest.fixture(scope="module")
def reader_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("reader")) as start:
        yield start("tests.agents:approval", "--threads", "4", "--workers", "1", "--read-timeout", "5", "--max-request-bytes", "65536")


def _exchange(server: Server, data: bytes) -> bytes:
    """Send ``data`` on a new connection; what comes back until the server closes it."""
    with _raw(server) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except OSError:
            pass
    return received


GET = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
POST = HEAD  # POST /sessions, JSON


@pytest.mark.parametrize(
    ("request_bytes", "status", "named"),
    [
        (GET + b"X-Pad: " + b"a" * 8200 + b"\r\n\r\n", 431, "header field is longer than 8190 bytes"),
        (GET + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 7000) for i in range(10)) + b"\r\n", 431, "may total at most 65536 bytes"),
        (GET + b"".join(b"X-%d: a\r\n" % i for i in range(101)) + b"\r\n", 431, "more than 100 header fields"),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414, "Request line too long: the limit is 4094 bytes"),
        (b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n", 400, "bare LF"),
        (GET + b" folded: value\r\n\r\n", 400, "line folding"),
        (POST + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400, "both a Content-Length and a Transfer-Encoding"),
        (POST + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400, "Content-Length is given 2 times"),
        (POST + b"Content-Length: +2\r\n\r\n{}", 400, "is not a number of bytes"),
        (POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 400, "Unsupported Transfer-Encoding 'gzip, chunked'"),
        (POST + b"Transfer-Encoding: chunked, identity\r\n\r\n", 400, "Unsupported Transfer-Encoding"),
        (POST.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"),
        (POST + b"Expect: the-unexpected\r\nContent-Length: 2\r\n\r\n", 417, "only expectation understood is 100-continue"),
        (POST + b"Content-Length: 70000\r\n\r\n", 413, "the limit is 65536 bytes (--max-request-bytes)"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"8000\r\n" + b" " * 0x8000 + b"\r\n" + b"8001\r\n", 413, "the limit is 65536 bytes"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400, "chunk size 'zz'"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\n{}\r\n0\r\n\r\n", 400, "longer than its size"),
    ],
    ids=[
        "long-field", "large-head", "many-fields", "long-request-line", "bare-lf", "obs-fold", "length-and-chunked",
        "two-lengths", "signed-length", "gzip-coding", "chunked-not-last", "chunked-http10", "unknown-expectation",
        "length-over-limit", "chunked-over-limit", "bad-chunk-size", "chunk-longer-than-its-size",
    ],
)
def test_a_request_the_reader_will_not_read_is_answered_with_a_4xx_naming_why(reader_server: Server, request_bytes: bytes, status: int, named: str) -> None:
    """Answered by the worker's main loop, before any thread or the application sees it:
    the status, a JSON ``detail`` that names the problem, and the connection closed."""
    answer = _exchange(reader_server, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    assert b"Connection: close" in head and b"Content-Type: application/json" in head, head
    detail = json.loads(body)["detail"]
    assert named in detail, detail
    assert "Traceback" not in reader_server.log()


def test_unusual_but_valid_requests_are_served(reader_server: Server) -> None:
    sessions = len(reader_server.get("/sessions").json())
    # Empty lines before the request line (RFC 9112 2.2) and a list of codings gunicorn takes.
    answer = _exchange(reader_server, b"\r\n\r\n" + POST + b"Transfer-Encoding: identity, chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 201 "), answer[:200]
    # HTTP/1.0 with Expect: the expectation is ignored (no 100 Continue), the body is read.
    body = b'{"state": []}'
    answer = _exchange(reader_server, POST.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert answer.startswith(b"HTTP/1.0 201 "), answer[:200]
    # A chunked body in small pieces, with extensions and a trailer, then a pipelined GET.
    with _raw(reader_server) as sock:
        sock.sendall(POST + b"Transfer-Encoding: chunked\r\n\r\n1;a=b\r\n{")
        sock.sendall(b"\r\n1 ; c=\"d\"\r\n}\r\n0\r\nX-Trailer: yes\r\n\r\n" + GET + b"\r\n")
        responses = _Responses(sock)
        head, _ = responses.next()
        assert head.startswith(b"HTTP/1.1 201 "), head
        head, answer = responses.next()
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(answer)["status"] == "ok", head
    assert len(reader_server.get("/sessions").json()) == sessions + 3
    assert "Traceback" not in reader_server.log()


def test_a_body_over_the_limit_gets_a_413_its_client_can_read(reader_server: Server) -> None:
    """The 413 goes out as soon as the head is in; the worker then reads and drops what the
    client still sends (for a while) before closing, so a client that sends its whole body
    first (``requests`` does) still reads the answer instead of a reset connection."""
    response = requests.post(reader_server.url + "/sessions", data=b" " * (3 * 2**20), headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text[:200]
    assert "--max-request-bytes" in response.json()["detail"]


def test_a_large_answer_reaches_a_client_that_reads_it_slowly(shared_server) -> None:
    """An answer bigger than the socket buffers is written as the client takes it (the
    main loop sends what a thread could not), whole and in order, and the kept-alive
    connection then serves the next pipelined request."""
    server = start_small(shared_server)
    state = [{"role": "user", "content": "x" * 1000}] * 3000
    created = server.post("/sessions", json={"state": state})
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: it sets the window
        sock.settimeout(10)
        sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        get = b"GET /sessions/%s/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % session_id.encode()
        sock.sendall(get + GET + b"\r\n")
        received = bytearray()
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096) or b"!"  # (a closed connection fails below)
        head, _, rest = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        received = bytearray(rest)
        while len(received) < length:  # small reads: the answer comes as the client takes it
            chunk = sock.recv(4096)
            assert chunk, f"connection closed after {len(received)} of {length} bytes"
            received += chunk
        assert json.loads(received[:length]) == state
        responses = _Responses(sock)
        responses.data = bytes(received[length:])
        head, answer = responses.next()
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(answer)["status"] == "ok", head
    assert "Traceback" not in server.log()


def test_past_the_memory_bound_a_body_gets_413_and_retry_after(start_server) -> None:
    """What the worker holds for clients is bounded (64 MiB): with 6 bodies of almost 10 MB
    and 130 unfinished 56 KB heads held, a new request with a body is told to come back
    (413 with Retry-After, before its body is sent), and a request without one is served."""
    server = start_server("tests.agents:approval", "--threads", "4", "--workers", "1", "--read-timeout", "30")
    port = int(server.url.rsplit(":", 1)[1])
    held: list[socket.socket] = []
    try:
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
            sock.sendall(POST + b"Content-Length: 10000000\r\n\r\n" + b" " * 9_999_000)
        pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 8000) for i in range(7))
        for _ in range(130):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
            sock.sendall(GET + pad)

        def refused() -> bytes | None:
            answer = _exchange(server, POST + b"Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n")
            return answer if answer.startswith(b"HTTP/1.1 413 ") else None

        # The worker reads what was sent as it comes: the bound is crossed once it has.
        answer = wait_until(refused, timeout=20, interval=0.1, what="a body to be refused past the memory bound")
        head, _, body = answer.partition(b"\r\n\r\n")  # type: ignore[union-attr]
        assert b"Retry-After: " in head, head
        assert "retry later" in json.loads(body)["detail"], body
        assert server.get("/health", timeout=10).status_code == 200
    finally:
        for sock in held:
            sock.close()
    # Once they are gone, a body is taken again.
    assert server.post("/sessions", json={"state": []}, timeout=10).status_code == 201
    assert "Traceback" not in server.log()
