"""Running ``AgentServer`` under gunicorn: one worker process, many threads.

One process owns the live turns (their worker processes and pipes) and, with SQLite, the
store file, so exactly one gunicorn worker may serve them; its threads serve requests (long
polls hold a thread each), and ``--workers`` of motus counts concurrent turns, not gunicorn
workers.

Guarantees:

- The agent server (its pool, threads and fork server) is created and started in the worker
  process after gunicorn forks it (``load`` and ``post_worker_init``), never in the arbiter.
- On SIGTERM the worker first releases every long poll (so gunicorn's graceful stop does not
  wait for them), then, when gunicorn has finished the in-flight requests, ``worker_exit``
  runs the server's shutdown: running turns get ``--shutdown-timeout``, then are left to be
  replayed at the next start (durable store) or cancelled (memory), and no worker process
  survives.
- A second gunicorn worker (``gunicorn -w 2 wsgi:app``) is refused at boot with a message
  that explains why (see ``claim_single_worker``).
- No request thread waits on a client. The worker's main loop reads each request (head and
  body) without blocking and hands the connection to a thread only once the request is
  complete; the thread parses it from memory. A request that has not arrived
  ``--read-timeout`` seconds after it began (a new connection: when it was accepted; a
  kept-alive one: when its next request began) is answered 408 and dropped, however steadily
  it trickles; one past a limit or with framing that cannot be read safely gets a 4xx that
  names the problem. Nor does a thread wait to write its answer: what the socket does not
  take at once is sent by the main loop, and a client that does not take it within
  ``--read-timeout`` (plus a second per 256 KiB) is disconnected.
  Memory held for clients is bounded (``MAX_BUFFERED_TOTAL``). See ``MotusWorker``.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import logging
import math
import os
import queue
import re
import selectors
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import islice
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.http.unreader import Unreader
from gunicorn.sock import close_sockets
from gunicorn.workers.gthread import ThreadWorker

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
#: Bytes of one request head (request line and header fields) the main loop holds: past it,
#: 431. gunicorn's own limits apply per line (``limit_request_line``, 4094 bytes, 414;
#: ``limit_request_field_size``, 8190 bytes, 431) and per count (``limit_request_fields``, 100).
MAX_HEAD_BYTES = 64 * 1024
#: The largest body when the application sets no ``MAX_CONTENT_LENGTH`` (motus sets it from
#: ``--max-request-bytes``).
DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: Bytes all connections together may hold in the worker: requests being read (heads
#: included) and answers waiting for their client. Raised to four bodies of the largest size
#: when ``--max-request-bytes`` is larger. A body still arriving when the total is over it is
#: answered 413 with ``Retry-After``; an answer that would take it over is written by its
#: thread (see ``_Answer``).
MAX_BUFFERED_TOTAL = 64 * 1024 * 1024
#: The largest answer the main loop sends for a thread; a larger one is written by its thread.
MAX_HELD_ANSWER = 8 * 1024 * 1024
#: A client has ``--read-timeout`` seconds, plus one second per this many bytes, to take an
#: answer; then its connection is closed.
ANSWER_MIN_RATE = 256 * 1024
#: A chunked body may come in at most this many chunks (each costs the main loop a little
#: work, so a body of one-byte chunks is refused rather than scanned).
MAX_CHUNKS = 65536
#: After an answer that closes the connection, how long (and how many bytes) the worker
#: reads what the client still sends before closing, so that the close does not reset the
#: connection under an answer the client has not read yet (RFC 9112 9.6).
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 64 * 1024
#: How often the worker logs the clients it dropped or refused (one line for all of them).
DROP_LOG_INTERVAL = 60.0

_READ_CHUNK = 64 * 1024
_WRITE_PIECE = 256 * 1024
_IOV_BATCH = 64
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
}


def _configured_read_timeout(app: Any) -> float:
    value = getattr(app, "motus_read_timeout", None)
    if value is None:
        try:
            value = float(os.environ.get("MOTUS_READ_TIMEOUT", DEFAULT_READ_TIMEOUT))
        except ValueError:
            log.warning("Ignoring MOTUS_READ_TIMEOUT=%r: not a number of seconds", os.environ["MOTUS_READ_TIMEOUT"])
            value = DEFAULT_READ_TIMEOUT
    return value if value > 0 else DEFAULT_READ_TIMEOUT


def _timeout_detail(seconds: float) -> str:
    return f"the request's headers and body must arrive within {seconds:g} s (--read-timeout)"


def _status_answer(status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete answer that closes the connection, its body ``{"detail": ...}`` as the
    application's errors are."""
    reason = _REASONS.get(status, "Error")
    body = json.dumps({"detail": detail}).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\n%s\r\n%s"
        % (status, reason.encode(), len(body), extra, body)
    )


class Refused(Exception):
    """A request the main loop answers itself (``status`` and ``detail``) and then closes:
    a head or body past a limit, or framing that cannot be read safely."""

    def __init__(self, status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


class _Limits:
    """What the main loop enforces while it reads a request (from gunicorn's settings and
    the application's body limit)."""

    __slots__ = ("request_line", "field_size", "fields", "max_body")

    def __init__(self, cfg: Any, max_body: int) -> None:
        line = cfg.limit_request_line
        self.request_line = MAX_HEAD_BYTES if line <= 0 else min(line, 8190)
        self.field_size = cfg.limit_request_field_size if cfg.limit_request_field_size > 0 else 8190
        self.fields = cfg.limit_request_fields if cfg.limit_request_fields > 0 else 32768
        self.max_body = max_body


class _ChunkScanner:
    """Finds where a chunked body ends (RFC 9112 7.1) as its bytes arrive, without decoding
    it: gunicorn decodes it again in the thread, from the same bytes. Only the framing is
    judged here (sizes, the CRLF after each chunk's data, the trailer section's end); what
    gunicorn refuses beyond that (a malformed extension or trailer field) reaches the
    application as a 400 without any wait, since every byte is there."""

    SIZE, DATA, DATA_END, TRAILER = range(4)
    __slots__ = ("start", "pos", "phase", "left", "size", "chunks", "trailer", "limits")

    def __init__(self, start: int, limits: _Limits) -> None:
        self.start = self.pos = start
        self.phase = self.SIZE
        self.left = 0  # bytes of the current chunk's data still to come
        self.size = 0  # decoded bytes so far
        self.chunks = 0
        self.trailer = 0
        self.limits = limits

    def scan(self, buf: bytearray) -> int | None:
        """Where the body ends in ``buf`` (just past it), or None while it has not."""
        pos, end, limits = self.pos, len(buf), self.limits
        try:
            while True:
                if self.phase == self.DATA:
                    taken = min(self.left, end - pos)
                    pos += taken
                    self.left -= taken
                    if self.left:
                        return None
                    self.phase = self.DATA_END
                if self.phase == self.DATA_END:
                    if end - pos < 2:
                        return None
                    if buf[pos:pos + 2] != b"\r\n":
                        raise Refused(400, "Malformed chunked body: a chunk's data is longer than its size says (no CRLF after it)")
                    pos += 2
                    self.phase = self.SIZE
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if end - pos > limits.field_size:
                        what = "trailer field" if self.phase == self.TRAILER else "chunk size line"
                        raise Refused(431 if self.phase == self.TRAILER else 400, f"Malformed chunked body: a {what} longer than {limits.field_size} bytes")
                    return None
                if self.phase == self.TRAILER:
                    if line_end == pos:  # the empty line that ends the trailer section
                        pos += 2
                        return pos
                    self.trailer += line_end + 2 - pos
                    if self.trailer > MAX_HEAD_BYTES:
                        raise Refused(431, f"Malformed chunked body: trailer fields over {MAX_HEAD_BYTES} bytes")
                    pos = line_end + 2
                    continue
                line = bytes(buf[pos:line_end])
                size_text, semicolon, _ = line.partition(b";")
                if semicolon:
                    size_text = size_text.rstrip(b" \t")
                if not _HEX.fullmatch(size_text):
                    raise Refused(400, f"Malformed chunked body: chunk size {size_text[:20].decode('latin-1')!r} is not a hexadecimal number")
                size = int(size_text, 16)
                self.chunks += 1
                self.size += size
                if self.size > limits.max_body:
                    raise Refused(413, f"Request body too large: the limit is {limits.max_body} bytes (--max-request-bytes)")
                if self.chunks > MAX_CHUNKS:
                    raise Refused(400, f"Chunked body in more than {MAX_CHUNKS} chunks: send larger chunks, or a Content-Length")
                pos = line_end + 2
                if size:
                    self.phase, self.left = self.DATA, size
                else:
                    self.phase = self.TRAILER
        finally:
            self.pos = pos


class _RequestReader:
    """One request being read by the main loop, without a thread.

    The worker appends what it receives to ``buf``; ``state()`` says whether the request is
    complete (``READY``: it ends at ``end``, and any bytes after it belong to the next
    request) or needs more (``WAITING``), and raises ``Refused`` for a request that will not
    be read: a head past its limits, framing that is malformed or ambiguous (a
    Content-Length and a Transfer-Encoding, several Content-Lengths, a coding other than
    chunked, a chunked HTTP/1.0 request), an expectation other than ``100-continue``, a body
    over the limit. Every request a thread sees is thus whole, and its framing is the one
    gunicorn reads: it parses the same bytes again, and never reads the socket.
    """

    WAITING, READY = "waiting", "ready"

    __slots__ = (
        "buf", "deadline", "limits", "registered", "_scanned", "_line_start", "_lines",
        "_body_start", "_end", "_chunks", "_continue",
    )

    def __init__(self, deadline: float, limits: _Limits, data: bytes = b"") -> None:
        self.buf = bytearray(data)
        self.deadline = deadline
        self.limits = limits
        self.registered = False
        self._scanned = 0  # head bytes checked so far
        self._line_start = 0  # where the head's current line began
        self._lines = 0  # complete lines of the head (the request line first)
        self._body_start: int | None = None
        self._end: int | None = None  # where the request ends, once known
        self._chunks: _ChunkScanner | None = None
        self._continue = False  # owes the client a 100 Continue before its body

    @property
    def begun(self) -> bool:
        return bool(self.buf)

    @property
    def end(self) -> int:
        assert self._end is not None
        return self._end

    def state(self) -> str:
        if self._body_start is None and not self._scan_head():
            return self.WAITING
        if self._end is None:
            self._end = self._chunks.scan(self.buf)  # type: ignore[union-attr]
            if self._end is None:
                return self.WAITING
        return self.READY if len(self.buf) >= self._end else self.WAITING

    @property
    def body_pending(self) -> bool:
        """The head is in and the body is not: the bytes still to come are a body's."""
        return self._body_start is not None

    def take_continue(self) -> bool:
        """True once, if the client waits for ``100 Continue`` before sending its body."""
        owed, self._continue = self._continue, False
        return owed

    def _scan_head(self) -> bool:
        buf = self.buf
        if self._lines == 0 and self._line_start == 0:
            while buf[:2] == b"\r\n":  # RFC 9112 2.2: empty lines before the request line
                del buf[:2]
        while True:
            newline = buf.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(buf)
                self._check_line(len(buf) - self._line_start - 1)  # its CR may have come
                if len(buf) > MAX_HEAD_BYTES:
                    raise Refused(431, f"Request head too large: the request line and header fields may total at most {MAX_HEAD_BYTES} bytes")
                return False
            if newline == self._line_start or buf[newline - 1] != 0x0D:
                raise Refused(400, "Malformed request head: a line ends with a bare LF; HTTP lines end with CRLF")
            length = newline - 1 - self._line_start
            self._line_start = self._scanned = newline + 1
            if length == 0 and self._lines:
                self._body_start = newline + 1
                if self._body_start > MAX_HEAD_BYTES:
                    raise Refused(431, f"Request head too large: the request line and header fields may total at most {MAX_HEAD_BYTES} bytes")
                self._read_head()
                return True
            self._check_line(length)
            self._lines += 1
            if self._lines - 1 > self.limits.fields:
                raise Refused(431, f"Request head too large: more than {self.limits.fields} header fields")

    def _check_line(self, length: int) -> None:
        if self._lines == 0:
            if length > self.limits.request_line:
                raise Refused(414, f"Request line too long: the limit is {self.limits.request_line} bytes")
        elif length + 2 > self.limits.field_size:
            raise Refused(431, f"Request head too large: a header field is longer than {self.limits.field_size} bytes")

    def _read_head(self) -> None:
        """Learn from the complete head where the body ends, or refuse the request."""
        body_start = self._body_start
        assert body_start is not None
        request_line, *fields = bytes(self.buf[:body_start - 4]).split(b"\r\n")
        http10 = request_line.rsplit(b" ", 1)[-1] == b"HTTP/1.0"
        lengths: list[bytes] = []
        codings: list[bytes] = []
        expect_lines: list[tuple[int, int]] = []
        offset = len(request_line) + 2
        for line in fields:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip(b" \t"):
                shown = line[:60].decode("latin-1")
                raise Refused(400, f"Malformed header line {shown!r} (a field is 'Name: value' on one line; obsolete line folding is not accepted)")
            key, value = name.lower(), value.strip(b" \t")
            if key == b"content-length":
                lengths.append(value)
            elif key == b"transfer-encoding":
                codings.extend(item.strip(b" \t").lower() for item in value.split(b","))
            elif key == b"expect":
                if value.lower() != b"100-continue":
                    shown = value[:60].decode("latin-1")
                    raise Refused(417, f"Expectation failed: 'Expect: {shown}' is not supported; the only expectation understood is 100-continue")
                expect_lines.append((offset, offset + len(line) + 2))
            offset += len(line) + 2
        if codings:
            if lengths:
                raise Refused(400, "Ambiguous request: it has both a Content-Length and a Transfer-Encoding; send one of them")
            if http10:
                raise Refused(400, "Malformed request: Transfer-Encoding is not allowed in an HTTP/1.0 request; send a Content-Length")
            if codings[-1] != b"chunked" or any(coding != b"identity" for coding in codings[:-1]):
                shown = ", ".join(coding.decode("latin-1") for coding in codings)[:80]
                raise Refused(400, f"Unsupported Transfer-Encoding {shown!r}: send the body chunked ('Transfer-Encoding: chunked') or with a Content-Length")
        elif len(lengths) > 1:
            raise Refused(400, f"Ambiguous request: Content-Length is given {len(lengths)} times; give it once")
        elif lengths and not lengths[0].isdigit():
            shown = lengths[0][:30].decode("latin-1")
            raise Refused(400, f"Malformed request: Content-Length {shown!r} is not a number of bytes")
        if expect_lines and not http10:
            # HTTP/1.1 "Expect: 100-continue": the 100 comes from here (if the body has not
            # come with the head); the lines go, so gunicorn does not send another. An HTTP/1.0
            # client's expectation is ignored (RFC 9110 10.1.1), by gunicorn too.
            for begin, finish in reversed(expect_lines):
                del self.buf[begin:finish]
                body_start -= finish - begin
            self._body_start = body_start
            self._continue = True
        if codings:
            self._chunks = _ChunkScanner(body_start, self.limits)
            return
        length = int(lengths[0]) if lengths else 0
        if length > self.limits.max_body:
            raise Refused(413, f"Request body too large: the limit is {self.limits.max_body} bytes (--max-request-bytes)")
        self._end = body_start + length
        if not length:
            self._continue = False


class _HeldRequest(Unreader):
    """The request as the main loop read it, for gunicorn's parser in the thread: read from
    memory, never from the socket; past its end, end of file."""

    def __init__(self, data: bytearray) -> None:
        super().__init__()
        self._view: memoryview | None = memoryview(data)
        self._pos = 0

    def chunk(self, size_hint: int | None = None) -> bytes:
        view = self._view
        if view is None or self._pos >= len(view):
            return b""
        size = min(max(size_hint or 0, 64 * 1024), 1024 * 1024)
        piece = bytes(view[self._pos:self._pos + size])
        self._pos += len(piece)
        return piece

    def release(self) -> None:
        """Let the request's bytes go (the connection may wait for its next request long)."""
        if self._view is not None:
            self._view.release()
            self._view = None
        self.buf = io.BytesIO()


class AnswerTimedOut(BrokenPipeError):
    """The client did not take its answer in time (gunicorn ends the connection quietly,
    as for a broken pipe)."""


_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class _Answer:
    """Stands in for the client's socket while a thread serves a request.

    What the thread writes (the status line, headers, body, a file, the events of a stream)
    goes to the socket at once when the socket takes it without waiting; what it does not
    take is kept, up to ``MAX_HELD_ANSWER`` and while the worker's total allows, and sent by
    the main loop once the thread is done. So a client that does not read its answer holds
    no thread. Past those limits the thread writes itself, each write under a deadline of
    ``--read-timeout`` plus a second per ``ANSWER_MIN_RATE`` bytes (then ``AnswerTimedOut``).
    Anything else (``shutdown``, ``close``, ``setblocking``...) goes to the socket.
    """

    def __init__(self, sock: socket.socket, worker: MotusWorker) -> None:
        self._sock = sock
        self._worker = worker
        self.parts: deque[bytes | memoryview] = deque()
        self.held = 0  # bytes in parts, counted in the worker's total
        self.direct = not _DONTWAIT  # writing with blocking calls (keeps nothing)
        self.failed = False  # cut off mid-answer: nothing more may be sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    # -- the thread -------------------------------------------------------------------------

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.failed:
            raise BrokenPipeError(errno.EPIPE, "the answer was cut off")
        if not isinstance(data, bytes):
            data = bytes(data)
        if not data:
            return
        try:
            self._sendall(data)
        except OSError:
            self.failed = True
            raise

    def _sendall(self, data: bytes | memoryview) -> None:
        if not self.direct:
            view = memoryview(data)
            if self.parts:
                self._send(_DONTWAIT)
            if not self.parts:
                try:
                    sent = self._sock.send(view, _DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                if sent == len(view):
                    return
                view = view[sent:]
            if self.held + len(view) <= MAX_HELD_ANSWER and self._worker._hold(len(view)):
                self.parts.append(view)
                self.held += len(view)
                return
            # Too much for the main loop to keep: from here on, this thread writes.
            self.direct = True
            self._write_held()
            data = view
        self._write([data])

    def send(self, data: Any, flags: int = 0) -> int:
        self.sendall(data)
        return len(data)

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """Read the file into the answer (``socket.sendfile`` would block the thread on a
        client that does not read, whatever the socket's timeout says)."""
        fd = file.fileno()
        left = os.fstat(fd).st_size - offset if count is None else count
        sent = 0
        while left > 0:
            piece = os.pread(fd, min(left, _WRITE_PIECE), offset + sent)
            if not piece:
                break
            self.sendall(piece)
            sent += len(piece)
            left -= len(piece)
        return sent

    def _write_held(self) -> None:
        parts, self.parts = list(self.parts), deque()
        self._worker._add_buffered(-self.held)
        self.held = 0
        self._write(parts)

    def _write(self, parts: list[Any]) -> None:
        """Blocking writes, all of ``parts`` within one deadline."""
        size = sum(len(part) for part in parts)
        deadline = time.monotonic() + self._worker.read_timeout + size / ANSWER_MIN_RATE
        sock = self._sock
        try:
            for part in parts:
                view = memoryview(part)
                for start in range(0, len(view), _WRITE_PIECE):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    sock.settimeout(remaining)
                    sock.sendall(view[start:start + _WRITE_PIECE])
        except TimeoutError:
            self._worker._count("unread")
            raise AnswerTimedOut(errno.EPIPE, "the client did not take its answer in time") from None
        finally:
            try:
                sock.settimeout(None)
            except OSError:
                pass

    # -- both -----------------------------------------------------------------------------------

    def _send(self, flags: int) -> bool:
        """Send held parts while the socket takes them; True once none is left. Raises
        ``OSError`` when the connection is gone."""
        parts = self.parts
        sock = self._sock
        while parts:
            try:
                sent = sock.sendmsg(list(islice(parts, _IOV_BATCH)), (), flags)
            except (BlockingIOError, InterruptedError):
                return False
            self._worker._add_buffered(-sent)
            self.held -= sent
            while sent:
                first = parts[0]
                if sent >= len(first):
                    sent -= len(first)
                    parts.popleft()
                else:
                    parts[0] = memoryview(first)[sent:]
                    sent = 0
        return True

    # -- the main loop ----------------------------------------------------------------------

    def deadline(self) -> float:
        return time.monotonic() + self._worker.read_timeout + self.held / ANSWER_MIN_RATE

    def flush(self) -> bool:
        """Send what the (non-blocking) socket takes now; True once all is sent."""
        return self._send(0)

    def discard(self) -> None:
        self.parts.clear()
        self._worker._add_buffered(-self.held)
        self.held = 0


class MotusWorker(ThreadWorker):
    """gthread worker whose request threads never wait on a client.

    gunicorn's gthread worker hands a connection to a thread as soon as it is readable; the
    thread then reads the request and writes the answer with blocking calls, so a client that
    sends a byte now and then, or that does not read its answer, holds a thread for as long
    as it likes: with ``--threads`` such connections, nobody else is served. Here the main
    loop (a selector, no threads) does the waiting:

    - It reads each request until it is complete (``_RequestReader``) and only then hands it
      to a thread, which parses it from memory (``_HeldRequest``). A request still
      incomplete at its deadline is answered 408 and closed; one past a limit (head, body,
      framing) is answered with a 4xx naming the problem.
    - The thread writes its answer without waiting (``_Answer``): what the socket does not
      take at once is kept and sent by the main loop, which closes the connection of a
      client that does not take it in time.
    - Idle connections (new, or kept alive between requests) and connections being closed
      (``_linger``) wait in the selector too.

    Not covered (motus configures none of them): TLS, HTTP/2 and the PROXY protocol keep
    gunicorn's behaviour. Put a reverse proxy in front in production anyway: it also caps
    connections per client, which no timeout does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = _configured_read_timeout(self.app)
        cfg = self.cfg
        self._read_in_loop = not cfg.is_ssl and getattr(cfg, "http2_cleartext", "off") in ("off", None, False) and getattr(cfg, "proxy_protocol", "off") in ("off", None, False)
        self._limits = _Limits(cfg, DEFAULT_MAX_BODY)
        self._budget = MAX_BUFFERED_TOTAL
        self._reading: dict[Any, _RequestReader] = {}  # insertion order is deadline order
        self._writing: dict[Any, tuple[_Answer, Any, float]] = {}  # answers the main loop sends
        self._lingering: dict[Any, list[float]] = {}  # [deadline, bytes drained]; deadline order
        self._buffered = 0  # bytes held for clients: requests being read, answers being sent
        self._buffered_lock = threading.Lock()
        self._counts = {"timed out": 0, "refused": 0, "unread": 0}
        self._counts_logged_at = -math.inf
        self._notified_at = -math.inf

    #: gunicorn's loop tells the arbiter it is alive on every pass, with a ``utime()`` of a
    #: file each time: two or three a turn under load. The arbiter gives a silent worker
    #: ``timeout`` (60 s), so once a second is plenty.
    NOTIFY_EVERY_SECONDS = 1.0

    def notify(self) -> None:
        now = time.monotonic()
        if now - self._notified_at >= self.NOTIFY_EVERY_SECONDS:
            self._notified_at = now
            super().notify()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        config = getattr(self.wsgi, "config", None)
        limit = config.get("MAX_CONTENT_LENGTH") if isinstance(config, dict) else None
        self._limits = _Limits(self.cfg, int(limit) if limit else DEFAULT_MAX_BODY)
        self._budget = max(MAX_BUFFERED_TOTAL, 4 * self._limits.max_body)

    def handle_exit(self, sig: int, frame: Any) -> None:
        first = self.alive  # the arbiter sends SIGTERM again while it waits: act on the first
        super().handle_exit(sig, frame)
        server = _server_of(self)
        if first and server is not None:
            # Signal handler context: do the locking work on a fresh thread.
            threading.Thread(target=server.begin_shutdown, name="motus-begin-shutdown", daemon=True).start()

    #: Set by ``_worker_exit`` when the server's shutdown begins.
    motus_exiting = False

    def handle_quit(self, sig: int, frame: Any) -> None:
        """SIGQUIT or SIGINT: gunicorn's quick stop. Running turns are not waited for: they
        are treated as at the end of ``--shutdown-timeout`` (replayed at the next start, or
        cancelled with their webhooks). gunicorn's own handler raises ``SystemExit`` wherever
        the main thread is; once the server's shutdown is under way that would cut it short
        (no cancellation, no webhooks, the store left open), so then this only hurries it."""
        server = _server_of(self)
        if server is not None:
            server.hurry_shutdown()
        if not self.motus_exiting:
            super().handle_quit(sig, frame)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _add_buffered(self, size: int) -> None:
        if size:
            with self._buffered_lock:
                self._buffered += size

    def _hold(self, size: int) -> bool:
        """Count ``size`` more bytes held for a client, if the total allows."""
        with self._buffered_lock:
            if self._buffered + size > self._budget:
                return False
            self._buffered += size
            return True

    def _buffered_total(self) -> int:
        with self._buffered_lock:
            return self._buffered

    def _count(self, what: str) -> None:
        with self._buffered_lock:
            self._counts[what] += 1

    def _log_counts(self, now: float) -> None:
        if now - self._counts_logged_at < DROP_LOG_INTERVAL:
            return
        with self._buffered_lock:
            counts = dict(self._counts)
            for key in self._counts:
                self._counts[key] = 0
        parts = []
        if counts["timed out"]:
            parts.append(f"dropped {counts['timed out']} client(s) that did not send their request within {self.read_timeout:g} s (--read-timeout)")
        if counts["refused"]:
            parts.append(f"refused {counts['refused']} request(s) past a limit or with malformed framing")
        if counts["unread"]:
            parts.append(f"closed {counts['unread']} connection(s) whose client did not take its answer in time")
        if parts:
            text = "; ".join(parts)
            self.log.warning("%s; a reverse proxy in front of motus can absorb slow clients", text[0].upper() + text[1:])
            self._counts_logged_at = now

    def _close(self, conn: Any) -> None:
        """Close a connection the worker holds in none of its tables any more."""
        self.nr_conns -= 1
        conn.close()

    def _unregister(self, conn: Any) -> None:
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    # -- the main loop: read requests without a thread ---------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        """Every way a connection reaches the thread pool (new, kept alive and readable,
        pipelined) comes here, in the main thread: read its request first."""
        if not self._read_in_loop:
            super().enqueue_req(conn)
            return
        # A kept-alive connection may hold the start of its next request already.
        leftover = getattr(conn, "motus_leftover", b"")
        conn.motus_leftover = b""
        if conn.parser is not None:
            leftover += conn.parser.unreader.take_buffered()
        conn.sock.setblocking(False)
        reader = _RequestReader(time.monotonic() + self.read_timeout, self._limits, leftover)
        self._add_buffered(len(reader.buf))
        self._reading[conn] = reader
        self._advance(conn, reader, recv=True)

    def _on_readable(self, conn: Any, _sock: Any) -> None:
        reader = self._reading.get(conn)
        if reader is not None:
            self._advance(conn, reader, recv=True)

    def _advance(self, conn: Any, reader: _RequestReader, recv: bool = False) -> None:
        size = len(reader.buf)
        gone = False
        if recv:
            try:
                data: bytes | None = conn.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data, gone = None, True
            if data == b"":
                gone = True  # the client is gone, or half-closed: serve what is complete
            elif data:
                reader.buf += data
        try:
            state = reader.state()
            if state == reader.WAITING and reader.body_pending and self._buffered_total() + len(reader.buf) - size > self._budget:
                raise Refused(
                    413,
                    f"Request body not accepted now: the server already holds {self._budget // 2**20} MiB of "
                    "other requests and answers; retry later",
                    (("Retry-After", str(max(1, math.ceil(self.read_timeout)))),),
                )
        except Refused as refusal:
            self._add_buffered(len(reader.buf) - size)
            self._refuse(conn, reader, refusal)
            return
        self._add_buffered(len(reader.buf) - size)
        if state == reader.READY:
            self._hand_over(conn, reader)
            return
        if gone:
            self._drop(conn, reader)
            return
        if reader.take_continue() and not self._send_nowait(conn, _CONTINUE):
            # The client waits for a 100 Continue before its body: sent from here, so the
            # body arrives here too.
            self._drop(conn, reader)
            return
        if not reader.registered:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
            reader.registered = True

    def _hand_over(self, conn: Any, reader: _RequestReader) -> None:
        self._forget(conn, reader)
        data = reader.buf
        end = reader.end
        if end < len(data):
            conn.motus_leftover = bytes(data[end:])  # a pipelined request: read after this one
            self._add_buffered(end - len(data))
            del data[end:]
        conn.motus_request = data  # the thread takes it, and releases its count
        super().enqueue_req(conn)

    def _forget(self, conn: Any, reader: _RequestReader) -> None:
        del self._reading[conn]
        if reader.registered:
            self._unregister(conn)
            reader.registered = False

    def _drop(self, conn: Any, reader: _RequestReader, timed_out: bool = False) -> None:
        self._forget(conn, reader)
        self._add_buffered(-len(reader.buf))
        if timed_out and reader.begun:
            # A request had begun: tell the client why (best effort; it may not be reading).
            self._send_nowait(conn, _status_answer(408, f"Request Timeout: {_timeout_detail(self.read_timeout)}"))
            self._count("timed out")
        self._close(conn)

    def _refuse(self, conn: Any, reader: _RequestReader, refusal: Refused) -> None:
        self._forget(conn, reader)
        self._add_buffered(-len(reader.buf))
        self._count("refused")
        self.log.debug("Refused a request from %s: %s %s", conn.client, refusal.status, refusal.detail)
        self._send_nowait(conn, _status_answer(refusal.status, refusal.detail, refusal.headers))
        self._linger(conn)

    @staticmethod
    def _send_nowait(conn: Any, data: bytes) -> bool:
        try:
            return conn.sock.send(data) == len(data)
        except OSError:
            return False

    # -- the main loop: send answers, close connections --------------------------------------

    def finish_request(self, conn: Any, fs: Any) -> None:
        answer: _Answer | None = getattr(conn, "motus_answer", None)
        if answer is None:
            super().finish_request(conn, fs)
            return
        conn.motus_answer = None
        try:
            result = fs.result() if not fs.cancelled() else False
        except Exception:  # handle() catches everything; a bug must still close the connection
            self.log.exception("Error serving a request")
            result = False
        try:
            if answer.failed:
                raise BrokenPipeError
            conn.sock.setblocking(False)
            done = answer.flush()
        except OSError:
            answer.discard()
            self._close(conn)
            return
        if done:
            self._after_answer(conn, fs, result)
            return
        self._writing[conn] = (answer, result, answer.deadline())
        self.poller.register(conn.sock, selectors.EVENT_WRITE, partial(self._on_writable, conn, fs))

    def _on_writable(self, conn: Any, fs: Any, _sock: Any) -> None:
        answer, result, _ = self._writing[conn]
        try:
            done = answer.flush()
        except OSError:
            done = None
        if done is False:
            return
        del self._writing[conn]
        self._unregister(conn)
        if done:
            self._after_answer(conn, fs, result)
        else:
            answer.discard()
            self._close(conn)

    def _after_answer(self, conn: Any, fs: Any, result: Any) -> None:
        if not result:
            self._linger(conn)
        elif getattr(conn, "motus_leftover", b""):
            self.enqueue_req(conn)  # the next request is here already: the socket may stay quiet
        else:
            super().finish_request(conn, fs)  # kept alive, back in the selector

    def _linger(self, conn: Any) -> None:
        """Close after an answer: stop sending, read (and throw away) what the client still
        sends for up to ``LINGER_SECONDS``, then close. Closing at once, with bytes of the
        client unread, would reset the connection under an answer it has not read yet."""
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_linger_readable, conn))
        except (OSError, ValueError, KeyError):
            self._close(conn)
            return
        self._lingering[conn] = [time.monotonic() + LINGER_SECONDS, 0]

    def _on_linger_readable(self, conn: Any, _sock: Any) -> None:
        entry = self._lingering.get(conn)
        if entry is None:
            return
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        entry[1] += len(data)
        if not data or entry[1] >= LINGER_MAX_BYTES:
            del self._lingering[conn]
            self._unregister(conn)
            self._close(conn)

    # -- deadlines ----------------------------------------------------------------------------

    def _expire(self, force: bool = False) -> None:
        now = time.monotonic()
        while self._reading:
            conn, reader = next(iter(self._reading.items()))
            if reader.deadline > now and not force:
                break
            self._drop(conn, reader, timed_out=not force)
        if not self.alive:
            # Stopping: connections that have not begun a request are not waited for.
            for conn, reader in list(self._reading.items()):
                if not reader.begun:
                    self._drop(conn, reader)
        for conn, (answer, _, deadline) in list(self._writing.items()):
            if deadline <= now or force:
                del self._writing[conn]
                self._unregister(conn)
                answer.discard()
                self._count("unread")
                self._close(conn)
        while self._lingering:
            conn, (deadline, _) = next(iter(self._lingering.items()))
            if deadline > now and not force:
                break
            del self._lingering[conn]
            self._unregister(conn)
            self._close(conn)
        self._log_counts(now)

    def murder_keepalived(self, force: bool = False) -> None:  # gunicorn calls this every loop
        super().murder_keepalived(force)
        self._expire(force)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        deadlines = [deadline for _, _, deadline in self._writing.values()]
        if self._reading:
            deadlines.append(next(iter(self._reading.values())).deadline)
        if self._lingering:
            deadlines.append(next(iter(self._lingering.values()))[0])
        if deadlines:
            timeout = min(timeout, max(0.0, min(deadlines) - time.monotonic()) + 0.01)
        super().wait_for_and_dispatch_events(timeout)

    # -- a thread: serve the request the main loop read ------------------------------------

    def handle(self, conn: Any) -> Any:
        data = getattr(conn, "motus_request", None)
        if data is None:
            return super().handle(conn)
        conn.motus_request = None
        held = _HeldRequest(data)
        answer = _Answer(conn.sock, self)
        result: Any = False
        try:
            conn.data_ready = True  # the bytes are here: no waiting for the socket
            conn.init()
            conn.parser.unreader = held
            conn.sock = answer
            try:
                result = super().handle(conn)
            finally:
                conn.sock = answer._sock
            if result:
                conn.parser.mesg = None  # read whole: nothing of it to drain before the next
        finally:
            held.release()
            self._add_buffered(-len(data))
            conn.motus_answer = answer  # sent by the main loop (finish_request)
        return result

    def _keepalive_after(self, conn: Any, keepalive: Any) -> Any:
        if not isinstance(getattr(conn.parser, "unreader", None), _HeldRequest):
            return super()._keepalive_after(conn, keepalive)
        # The request was read whole and the next one begins where the main loop says, so
        # there is nothing to drain; a body gunicorn could not decode ends the connection.
        body = getattr(conn.parser.mesg, "body", None)
        return bool(keepalive) and getattr(body, "failed", False) is not True


def _post_worker_init(worker: Any) -> None:
    server = _server_of(worker)
    if server is not None:
        server.start()


def _worker_exit(arbiter: Any, worker: Any) -> None:
    if worker.pid != os.getpid():  # gunicorn also calls this hook in the arbiter, for a dead worker
        return
    exiting = sys.exc_info()[1]  # the SystemExit gunicorn is propagating (see _end_worker_process)
    worker.motus_exiting = True
    try:
        server = _server_of(worker)
        if server is not None:
            server.shutdown()
    finally:
        _end_worker_process(exiting)


def _end_worker_process(exiting: BaseException | None) -> None:
    """End the gunicorn worker here, once its server has shut down, with the status it is
    exiting with, instead of letting ``sys.exit`` unwind the arbiter's stack it was forked on.

    What unwinding would still do is all waste or harm: interpreter finalisation frees every
    object one by one (0.12 s for a plain agent, 0.5 s with the OpenAI Agents SDK imported),
    and runs the atexit handlers and ``finally`` blocks the worker inherited from the arbiter,
    which are the arbiter's to run (``multiprocessing`` ends its forked children with
    ``os._exit`` for the same reason). What matters is kept: the store, webhooks and metrics
    were closed by the server's shutdown, and the logs and standard streams are flushed here.
    gunicorn calls ``worker_exit`` from a ``finally`` clause as its ``sys.exit`` propagates, so
    the status is that exception's (``exiting``); called any other way, this does nothing. It
    runs even if the shutdown raised, so the worker never unwinds into the arbiter's code.
    """
    if not isinstance(exiting, SystemExit):
        return
    code = exiting.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:  # sys.exit("message"): printed, status 1, as the interpreter would
        print(code, file=sys.stderr)
        status = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError) as exc:  # closed or replaced: nothing left to flush
            log.debug("could not flush %r at exit: %s", stream, exc)
    os._exit(status)


class _Arbiter(Arbiter):
    """gunicorn's arbiter, but a graceful stop returns as soon as the worker has exited.

    gunicorn's own ``stop`` checks for the worker every 0.1 s and sleeps once more after it
    has reaped it, which made every stop 0.1-0.2 s longer than the worker took. Here the wait
    is on the arbiter's signal queue, which a SIGCHLD fills at once. The rest is gunicorn's:
    the listening sockets are closed first (TCP only, so nothing to unlink), a SIGINT or
    SIGQUIT during the wait turns it into gunicorn's quick stop, and a worker still alive
    after ``graceful_timeout`` is killed (gunicorn's ``stop``, called at the end, would have
    given it a second ``graceful_timeout``). The SIGTERM is sent again every second of the
    wait (the worker acts on the first).
    """

    def stop(self, graceful: bool = True) -> None:
        if graceful and self.WORKERS and not self.dirty_arbiter_pid:
            close_sockets(self.LISTENERS, False)
            self.LISTENERS = []
            self.kill_workers(signal.SIGTERM)
            deadline = time.monotonic() + self.cfg.graceful_timeout
            # Reap first: the SIGCHLD of a worker that died just before the stop may have been
            # taken off the queue with the SIGTERM that began it, and will not come again.
            self.reap_workers()
            while self.WORKERS and time.monotonic() < deadline:
                try:
                    sig = self.SIG_QUEUE.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    sig = None
                if sig in (signal.SIGINT, signal.SIGQUIT):
                    graceful = False
                    break
                self.reap_workers()
                if sig is None and self.WORKERS:
                    # Again: a worker forked just before the stop (to replace a dead one) may
                    # have had the first SIGTERM before it set its own handlers, and lost it.
                    self.kill_workers(signal.SIGTERM)
            if graceful and self.WORKERS:
                # Out of time: gunicorn's stop would begin another whole graceful_timeout.
                self.kill_workers(signal.SIGKILL)
        super().stop(graceful)


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

    def run(self) -> None:
        try:
            _Arbiter(self).run()
        except RuntimeError as exc:  # as gunicorn's own ``run`` reports a failed start
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.exit(1)


def run_gunicorn(
    factory: Callable[[], Any],
    host: str,
    port: int,
    threads: int,
    shutdown_timeout: float,
    log_level: str = "info",
    read_timeout: float = 10.0,
    log_format: str = "text",
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
        # Connections the worker holds at once (idle keep-alive ones included); gunicorn's
        # 1,000 would refuse every new client once that many event streams are open.
        "worker_connections": threads + 1000,
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
    from motus.serve.logs import gunicorn_logger_class

    logger_class = gunicorn_logger_class(log_format)  # --log-format json: gunicorn's lines too
    if logger_class is not None:
        options["logger_class"] = logger_class
    application = _Application(factory, options)
    application.motus_read_timeout = read_timeout
    application.run()
