"""Running ``AgentServer`` under gunicorn: one worker process, many threads.

One process owns the live turns (their worker processes and pipes) and, with SQLite, the
store file, so exactly one gunicorn worker may serve them; its threads serve requests (long
polls hold a thread each), and ``--workers`` of motus counts concurrent turns, not gunicorn
workers.

Guarantees:

- The agent server (its pool, threads and forkserver) is created and started in the worker
  process after gunicorn forks it (``load`` and ``post_worker_init``), never in the arbiter.
- On SIGTERM the worker first releases every long poll (so gunicorn's graceful stop does not
  wait for them), then, when gunicorn has finished the in-flight requests, ``worker_exit``
  runs the server's shutdown: running turns get ``--shutdown-timeout``, then are left to be
  replayed at the next start (durable store) or cancelled (memory), and no worker process
  survives.
- A second gunicorn worker (``gunicorn -w 2 wsgi:app``) is refused at boot with a message
  that explains why (see ``claim_single_worker``).
- A slow client cannot hold a request thread while it sends its request: the worker's main
  loop reads each request (head and body, up to ``MAX_BUFFERED_REQUEST``) without blocking,
  and hands the connection to a thread only once the request is complete. A request that has
  not arrived ``--read-timeout`` seconds after it began (a new connection: when it was
  accepted; a kept-alive one: when its next request began) is answered 408 and dropped,
  however steadily it trickles. Only the rest of a larger body is read in a thread, under
  the same deadline (see ``_RequestReader``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import selectors
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.http.errors import NoMoreData
from gunicorn.http.unreader import SocketUnreader
from gunicorn.workers.gthread import ThreadWorker
from werkzeug.exceptions import RequestTimeout

log = logging.getLogger(__name__)

_held_lock: Any = None
_held_pid: int | None = None

SINGLE_WORKER_MESSAGE = (
    "motus keeps sessions (and the workers waiting on a human) in memory in one process, so a "
    "resume must reach the process that holds its session. Run gunicorn with exactly one worker "
    "(-w 1) and raise --threads for concurrency; motus' own --workers / MOTUS_WORKERS sets how "
    "many turns run at once."
)


def _private_dir() -> str:
    """A directory only this user can write: ``$XDG_RUNTIME_DIR``, else ``<tmp>/motus-<uid>``
    created with mode 0700. A lock file at a predictable name in a shared ``/tmp`` could be
    created first by another local user, and stop the server from booting."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return runtime
    path = os.path.join(tempfile.gettempdir(), f"motus-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(
            f"{path} is not a private directory of this user (owned by uid {info.st_uid}, mode "
            f"{oct(info.st_mode & 0o777)}); remove it or set XDG_RUNTIME_DIR"
        )
    return path


def claim_single_worker() -> None:
    """Refuse to serve from a second worker of the same gunicorn arbiter.

    The first worker takes an exclusive lock on a file named after the arbiter's pid and
    holds it for its life; another worker of that arbiter fails to take it and raises. When
    the first worker dies, its lock goes with it, so gunicorn's restart of it still works.
    """
    global _held_lock, _held_pid
    if _held_lock is not None and _held_pid == os.getpid():
        return
    # A lock inherited across a fork (gunicorn --preload claims in the arbiter) proves
    # nothing about this process: claim again, with a descriptor of our own.
    path = os.path.join(_private_dir(), f"gunicorn-{os.getppid()}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    handle = os.fdopen(fd, "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"Refusing to start a second gunicorn worker. {SINGLE_WORKER_MESSAGE}") from None
    _held_lock, _held_pid = handle, os.getpid()


def _server_of(worker: Any) -> Any:
    app = getattr(worker, "wsgi", None)
    extensions = getattr(app, "extensions", {})
    return extensions.get("motus")


#: The read timeout when none is given (``--read-timeout``; ``$MOTUS_READ_TIMEOUT`` when the
#: worker class is used from gunicorn's own command line).
DEFAULT_READ_TIMEOUT = 10.0
#: Bytes of one request the main loop reads before a thread takes over: every request motus
#: serves fits, except a large ``state`` in ``POST /sessions``.
MAX_BUFFERED_REQUEST = 1024 * 1024
#: Bytes all connections together may hold in the main loop; past it, requests go to threads
#: as soon as their head is in (each thread then reads under the same deadline).
MAX_BUFFERED_TOTAL = 64 * 1024 * 1024
#: How often the worker logs that it dropped slow clients (one line for all of them).
DROP_LOG_INTERVAL = 60.0

_READ_CHUNK = 64 * 1024
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _configured_read_timeout(app: Any) -> float:
    value = getattr(app, "motus_read_timeout", None)
    if value is None:
        try:
            value = float(os.environ.get("MOTUS_READ_TIMEOUT", DEFAULT_READ_TIMEOUT))
        except ValueError:
            log.warning("Ignoring MOTUS_READ_TIMEOUT=%r: not a number of seconds", os.environ["MOTUS_READ_TIMEOUT"])
            value = DEFAULT_READ_TIMEOUT
    return value if value > 0 else DEFAULT_READ_TIMEOUT


class ReadTimedOut(NoMoreData, RequestTimeout):
    """The request did not arrive within the read timeout.

    Raised by a thread's socket reads once the request's deadline has passed (only the rest
    of a large or unusual request is read by a thread). As gunicorn's ``NoMoreData`` it ends
    the connection quietly while gunicorn parses the head; as werkzeug's ``RequestTimeout``
    it becomes a 408 if the application was reading the body (400 "client disconnected" when
    werkzeug's length-limited stream reports it). Never a short read: a body cut off at the
    deadline must not reach the application as if it were whole.
    """

    def __init__(self, seconds: float) -> None:
        NoMoreData.__init__(self, b"")
        RequestTimeout.__init__(self, _timeout_detail(seconds))

    def __str__(self) -> str:
        return str(self.description)


def _timeout_detail(seconds: float) -> str:
    return f"the request's headers and body must arrive within {seconds:g} s (--read-timeout)"


class _DeadlineUnreader(SocketUnreader):
    """gunicorn's socket reader, with every read bounded by the request's deadline."""

    def __init__(self, sock: socket.socket, deadline: float, seconds: float) -> None:
        super().__init__(sock)
        self.deadline = deadline
        self.seconds = seconds
        self.expired = False

    def chunk(self, size_hint: int | None = None) -> bytes:
        remaining = self.deadline - time.monotonic()
        if self.expired or remaining <= 0:
            self.expired = True
            raise ReadTimedOut(self.seconds)
        prior = self.sock.gettimeout()
        # gunicorn's own bounded reads (draining a body for keep-alive) set a timeout too.
        self.sock.settimeout(remaining if prior is None else min(prior, remaining))
        try:
            return super().chunk(size_hint)
        except TimeoutError:
            if prior is not None and prior < remaining:
                raise
            self.expired = True
            raise ReadTimedOut(self.seconds) from None
        finally:
            self.sock.settimeout(prior)


class _RequestReader:
    """One request being read by the main loop, without a thread.

    The worker appends what it receives to ``buf``; ``state()`` says whether the request is
    complete (``READY``), whether
    a thread must take over now (``HAND_OVER``: a malformed or unusual head, left to gunicorn's
    parser; or more than ``MAX_BUFFERED_REQUEST``), or whether to wait for more (``WAITING``).
    Nothing here decides what the request means: gunicorn parses it again, from these bytes.
    """

    WAITING, READY, HAND_OVER = "waiting", "ready", "hand over"

    __slots__ = ("buf", "deadline", "registered", "_scan_from", "_body_start", "_need", "_chunked", "_expect_at")

    def __init__(self, deadline: float, data: bytes = b"") -> None:
        self.buf = bytearray(data)
        self.deadline = deadline
        self.registered = False
        self._scan_from = 0
        self._body_start: int | None = None
        self._need: int | None = None  # bytes of a complete request with a Content-Length body
        self._chunked = False
        self._expect_at: tuple[int, int] | None = None  # an "Expect: 100-continue" line

    def state(self) -> str:
        buf = self.buf
        if self._body_start is None:
            start = 0
            while start < len(buf) and buf[start] in b"\r\n":  # RFC 9112 2.2: empty lines first
                start += 1
            if start == len(buf):
                return self.WAITING
            match = _END_OF_HEAD.search(buf, max(start, self._scan_from))
            if match is None:
                self._scan_from = max(start, len(buf) - 3)
                return self.HAND_OVER if len(buf) >= MAX_BUFFERED_REQUEST else self.WAITING
            self._body_start = match.end()
            if not self._read_head(start, match.start()):
                return self.HAND_OVER
        if self._chunked:
            # The end of a chunked body is CRLF CRLF; chunk data that happens to end so only
            # hands the request over early, to a thread that reads it under the deadline.
            if len(buf) > self._body_start and (buf.endswith(b"\n\r\n") or buf.endswith(b"\n\n")):
                return self.READY
        elif self._need is not None and len(buf) >= self._need:
            return self.READY
        return self.HAND_OVER if len(buf) >= MAX_BUFFERED_REQUEST else self.WAITING

    def _read_head(self, start: int, end: int) -> bool:
        """Learn where the body ends from the head; False to leave the head to gunicorn."""
        lines = bytes(self.buf[start:end]).split(b"\n")
        offset = start + len(lines[0]) + 1
        lengths, codings = [], []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                return False  # obs-fold, junk: gunicorn answers it
            name, value = name.lower(), value.strip()
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings.append(value.lower())
            elif name == b"expect":
                if value.lower() != b"100-continue" or self._expect_at is not None or not lines[0].rstrip().endswith(b"HTTP/1.1"):
                    return False
                self._expect_at = (offset, offset + len(line) + 1)
            offset += len(line) + 1
        if codings:
            if lengths or len(codings) != 1 or codings[0] != b"chunked":
                return False
            self._chunked = True
            return True
        if len(set(lengths)) > 1 or (lengths and not lengths[0].isdigit()):
            return False
        self._need = self._body_start + (int(lengths[0]) if lengths else 0)  # type: ignore[operator]
        return True

    @property
    def head_done(self) -> bool:
        return self._body_start is not None

    @property
    def expects_continue(self) -> bool:
        return self._expect_at is not None

    def take_expect(self) -> bool:
        """Remove the ``Expect: 100-continue`` line; True if there was one (the caller then
        owes the client its ``100 Continue``, which gunicorn will not send again)."""
        if self._expect_at is None:
            return False
        begin, end = self._expect_at
        del self.buf[begin:end]
        removed = end - begin
        self._expect_at = None
        self._body_start -= removed  # type: ignore[operator]
        if self._need is not None:
            self._need -= removed
        return True


class MotusWorker(ThreadWorker):
    """gthread worker that reads requests in its main loop and releases long polls as soon
    as a graceful stop begins.

    gunicorn's gthread worker hands a connection to a thread as soon as it is readable, and
    the thread then parses the request with blocking reads, so a client that sends a byte
    now and then holds a thread for as long as it likes: with ``--threads`` such
    connections, nobody else is served. Here the main loop (a selector, no threads) reads
    each request until it is complete and only then hands it over; a request still incomplete
    at its deadline is answered 408 and closed. Idle connections (new, or kept alive between
    requests) wait in the selector too and hold no thread.

    Not covered (motus configures neither): TLS and HTTP/2 prior knowledge need the thread's
    handshake first, so they keep gunicorn's behaviour. Put a reverse proxy in front in
    production anyway: it also caps connections per client, which no timeout does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = _configured_read_timeout(self.app)
        self._read_in_loop = not self.cfg.is_ssl and getattr(self.cfg, "http2_cleartext", "off") in ("off", "upgrade", None, False)
        self._reading: dict[Any, _RequestReader] = {}  # insertion order is deadline order
        self._buffered = 0  # bytes of requests read by the main loop, not yet taken by a thread
        self._buffered_lock = threading.Lock()
        self._dropped = 0
        self._dropped_logged_at = -math.inf

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        server = _server_of(self)
        if server is not None:
            # Signal handler context: do the locking work on a fresh thread.
            threading.Thread(target=server.begin_shutdown, name="motus-begin-shutdown", daemon=True).start()

    # -- the main loop: read requests without a thread ---------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        """Every way a connection reaches the thread pool (new, kept alive and readable,
        pipelined) comes here, in the main thread: read its request first."""
        if not self._read_in_loop:
            super().enqueue_req(conn)
            return
        # A kept-alive connection may hold the start of its next request already.
        leftover = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        conn.sock.setblocking(False)  # a pipelined request comes back from a thread blocking
        reader = _RequestReader(time.monotonic() + self.read_timeout, leftover)
        self._add_buffered(len(leftover))
        self._reading[conn] = reader
        self._advance(conn, reader, recv=True)

    def _on_readable(self, conn: Any, _sock: Any) -> None:
        reader = self._reading.get(conn)
        if reader is not None:
            self._advance(conn, reader, recv=True)

    def _advance(self, conn: Any, reader: _RequestReader, recv: bool = False) -> None:
        if recv:
            try:
                data: bytes | None = conn.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._drop(conn, reader)
                return
            if data == b"":
                # The client is gone (or half-closed): serve what is complete, else close.
                if reader.state() == reader.READY:
                    self._hand_over(conn, reader)
                else:
                    self._drop(conn, reader)
                return
            if data:
                reader.buf += data
                self._add_buffered(len(data))
        state = reader.state()
        if state == reader.WAITING and reader.head_done and self._buffered_total() > MAX_BUFFERED_TOTAL:
            state = reader.HAND_OVER
        if state == reader.WAITING and reader.expects_continue:
            # The client waits for a 100 Continue before its body: send it now, so the body
            # arrives here rather than in a thread, and keep gunicorn from sending another.
            if not self._send_nowait(conn, _CONTINUE):
                self._drop(conn, reader)
                return
            size = len(reader.buf)
            reader.take_expect()
            self._add_buffered(len(reader.buf) - size)
            state = reader.state()
        if state == reader.WAITING:
            if not reader.registered:
                self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
                reader.registered = True
            return
        self._hand_over(conn, reader)

    def _hand_over(self, conn: Any, reader: _RequestReader) -> None:
        self._forget(conn, reader)
        conn.motus_request = (bytes(reader.buf), reader.deadline)  # released by handle()
        super().enqueue_req(conn)

    def _forget(self, conn: Any, reader: _RequestReader) -> None:
        del self._reading[conn]
        if reader.registered:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
            reader.registered = False

    def _drop(self, conn: Any, reader: _RequestReader, timed_out: bool = False) -> None:
        self._forget(conn, reader)
        self._add_buffered(-len(reader.buf))
        if timed_out and reader.buf.strip(b"\r\n"):
            # A request had begun: tell the client why (best effort; it may not be reading).
            body = json.dumps({"detail": f"Request Timeout: {_timeout_detail(self.read_timeout)}"}).encode()
            self._send_nowait(
                conn,
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body),
            )
            self._dropped += 1
        self.nr_conns -= 1
        conn.close()

    @staticmethod
    def _send_nowait(conn: Any, data: bytes) -> bool:
        try:
            return conn.sock.send(data) == len(data)
        except OSError:
            return False

    def _add_buffered(self, size: int) -> None:
        if size:
            with self._buffered_lock:
                self._buffered += size

    def _buffered_total(self) -> int:
        with self._buffered_lock:
            return self._buffered

    def _expire_reads(self, force: bool = False) -> None:
        now = time.monotonic()
        while self._reading:
            conn, reader = next(iter(self._reading.items()))
            if reader.deadline > now and not force:
                break
            self._drop(conn, reader, timed_out=not force)
        if not self.alive:
            # Stopping: connections that have not begun a request are not waited for.
            for conn, reader in list(self._reading.items()):
                if not reader.buf.strip(b"\r\n"):
                    self._drop(conn, reader)
        if self._dropped and now - self._dropped_logged_at >= DROP_LOG_INTERVAL:
            self.log.warning(
                "Dropped %d client(s) that did not send their request within %g s (--read-timeout); "
                "a reverse proxy in front of motus can absorb slow clients",
                self._dropped, self.read_timeout,
            )
            self._dropped, self._dropped_logged_at = 0, now

    def murder_keepalived(self, force: bool = False) -> None:  # gunicorn calls this every loop
        super().murder_keepalived(force)
        self._expire_reads(force)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._reading:
            first = next(iter(self._reading.values()))
            timeout = min(timeout, max(0.0, first.deadline - time.monotonic()) + 0.01)
        super().wait_for_and_dispatch_events(timeout)

    # -- a thread: serve the request the main loop read ------------------------------------

    def handle(self, conn: Any) -> Any:
        request = getattr(conn, "motus_request", None)
        if request is None:
            return super().handle(conn)
        conn.motus_request = None
        data, deadline = request
        self._add_buffered(-len(data))
        conn.data_ready = True  # the bytes are here: no waiting for the socket
        conn.sock.setblocking(True)
        conn.init()
        reader = _DeadlineUnreader(conn.sock, deadline, self.read_timeout)
        reader.unread(data)
        conn.parser.unreader = reader
        result = super().handle(conn)
        # A request cut off by its deadline leaves the connection mid-request: close it.
        return False if reader.expired else result


def _post_worker_init(worker: Any) -> None:
    server = _server_of(worker)
    if server is not None:
        server.start()


def _worker_exit(arbiter: Any, worker: Any) -> None:
    server = _server_of(worker)
    if server is not None:
        server.shutdown()


class _Application(BaseApplication):
    def __init__(self, factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    motus_read_timeout: float | None = None  # read by MotusWorker

    def load(self) -> Any:
        claim_single_worker()
        return self._factory().app


def run_gunicorn(
    factory: Callable[[], Any],
    host: str,
    port: int,
    threads: int,
    shutdown_timeout: float,
    log_level: str = "info",
    read_timeout: float = 10.0,
) -> None:
    """Serve ``factory()``'s app (called in the worker, after the fork) until stopped.

    ``read_timeout``: seconds a client has to send a whole request (head and body) once it
    has connected or begun its next request; later, it is answered 408 and dropped.
    """
    graceful = math.ceil(shutdown_timeout) + 15 if shutdown_timeout else 365 * 24 * 3600
    options = {
        "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "workers": 1,
        "worker_class": "motus.serve.gunicorn_app.MotusWorker",
        "threads": threads,
        "timeout": 60,
        "graceful_timeout": graceful,
        "keepalive": 5,
        "loglevel": log_level,
        "errorlog": "-",
        "post_worker_init": _post_worker_init,
        "worker_exit": _worker_exit,
        "proc_name": "motus-serve",
        "control_socket_disable": True,
    }
    application = _Application(factory, options)
    application.motus_read_timeout = read_timeout
    application.run()
