"""Answers written without waiting on the client: the socket stand-in a request thread writes to.

Owns ``Answer``: what a thread writes goes to the socket at once when the socket takes it, and
what it does not take is kept (up to ``MAX_HELD_ANSWER``, within the worker's total) for the
main loop to send; past those limits the thread writes itself, under a deadline.

Guarantees: a client that does not read its answer holds no thread beyond ``--read-timeout``
plus a second per ``ANSWER_MIN_RATE`` bytes, nor beyond ``ANSWER_STOP_SECONDS`` after a
SIGTERM, and such clients together hold at most ``DIRECT_WRITERS`` threads (past those, the
answers of clients that take nothing are cut off); every byte kept is counted in the worker's total (``Budget``) and uncounted when
sent or discarded. Threads: the serving thread writes while it serves; afterwards only the
main loop touches the answer (``flush``, ``deadline``, ``discard``). No gunicorn internals
are touched here.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections import deque
from itertools import islice
from typing import Any, Protocol

#: Bytes all connections together may hold in the worker: requests being read (heads
#: included) and answers waiting for their client. Raised to four bodies of the largest size
#: when ``--max-request-bytes`` is larger. A body still arriving when the total is over it is
#: answered 413 with ``Retry-After``; an answer that would take it over is written by its
#: thread (see ``Answer``).
MAX_BUFFERED_TOTAL = 64 * 1024 * 1024
#: The largest answer the main loop sends for a thread (half the least total, so one answer
#: never takes it all); a larger one is written by its thread. It was 8 MiB: four people
#: opening a 10 MB history at once then took four threads, which ``DIRECT_WRITERS`` now caps.
MAX_HELD_ANSWER = 32 * 1024 * 1024
#: At most this many request threads (and at most a quarter of ``--threads``, at least one)
#: wait at a time on a client that takes nothing of an answer they write themselves (one too
#: large for the main loop, or one that came when the worker's total was full). A thread
#: writing to a client that reads holds no place: it takes one only once its client has
#: taken nothing for ``STALLED_AFTER``, and gives it back when the client reads again. With
#: none free, the answer is cut off (its connection closed, logged with the unread ones).
#: So clients that do not read take at most these threads, never every thread (150 clients
#: that never read a 4 MB history held all 4 threads for 27 s; 300 of an 8 MB one all 128
#: and 1.5 GB), and people who read a large answer are not turned away for them.
DIRECT_WRITERS = 4
#: How long a client may take nothing before its thread needs one of the places.
STALLED_AFTER = 0.5
#: (Threads writing answers themselves at all, reading clients' included, are at most a
#: quarter of ``--threads``, at least two: each holds its whole answer. 200 clients that never
#: read a 4 MB history otherwise had ~128 such answers alive at once before being cut off.)
#: A client has ``--read-timeout`` seconds, plus one second per this many bytes, to take an
#: answer; then its connection is closed.
ANSWER_MIN_RATE = 256 * 1024
#: Once the server is stopping (SIGTERM), a client has this many seconds more to take what is
#: still being written to it, whatever its own deadline: clients that do not read must not
#: hold the stop (a thread writing a 3 MB answer to one had ~22 s, and the arbiter killed the
#: worker before it was done).
ANSWER_STOP_SECONDS = 2.0
#: A thread writing itself looks at the stop this often while the client takes nothing.
_STOP_CHECK_SECONDS = 0.25

_WRITE_PIECE = 256 * 1024
_IOV_BATCH = 64


class Budget(Protocol):
    """What an answer needs of its worker: the client's time, and the count of held bytes."""

    read_timeout: float
    #: ``time.monotonic()`` past which no answer may still be written: infinite until the
    #: server stops, then ``ANSWER_STOP_SECONDS`` after the SIGTERM.
    stop_writes_at: float

    def hold_bytes(self, size: int) -> bool: ...

    def add_buffered(self, size: int) -> None: ...

    def tally(self, what: str) -> None: ...

    def take_place(self, kind: str) -> bool:
        """Count one more thread writing an answer itself (``"writing"``), or one of those
        waiting on a client that takes nothing (``"stalled"``: the ``DIRECT_WRITERS``
        places), if fewer than the most of that kind do."""
        ...

    def give_place(self, kind: str) -> None: ...


class _NoPlace(Exception):
    """No place was free for a thread writing an answer itself (``Budget.take_place``)."""


class AnswerTimedOut(BrokenPipeError):
    """The client did not take its answer in time (gunicorn ends the connection quietly,
    as for a broken pipe)."""


_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
#: A held rest of an answer smaller than half of what it is a view of, from this size, is
#: copied out of it (see ``_alone``).
_COPY_REST_FROM = 64 * 1024


def _alone(view: memoryview) -> bytes | memoryview:
    """What to hold of an answer's unsent rest: the view itself, or, when it is a small part
    of a large object (a socket took most of a 4 MB body), a copy, so the object is freed.
    What the worker's total counts is then the memory held: a view kept the whole body alive
    for the rest it counted, and 64 MiB counted held ~190 MiB of bodies."""
    base = view.obj
    whole = len(base) if isinstance(base, (bytes, bytearray)) else len(view)
    if whole >= _COPY_REST_FROM and len(view) * 2 < whole:
        return bytes(view)
    return view


class Answer:
    """Stands in for the client's socket while a thread serves a request.

    What the thread writes (the status line, headers, body, a file, the events of a stream)
    goes to the socket at once when the socket takes it without waiting; what it does not
    take is kept, up to ``MAX_HELD_ANSWER`` and while the worker's total allows, and sent by
    the main loop once the thread is done. So a client that does not read its answer holds
    no thread. Past those limits the thread writes itself, each write under a deadline of
    ``--read-timeout`` plus a second per ``ANSWER_MIN_RATE`` bytes (then ``AnswerTimedOut``),
    holding one of the worker's ``DIRECT_WRITERS`` places while its client takes nothing;
    with none free, the answer is cut off (``AnswerTimedOut``). Anything else (``shutdown``, ``close``, ``setblocking``...) goes to the socket.
    """

    def __init__(self, sock: socket.socket, worker: Budget) -> None:
        self._sock = sock
        self._worker = worker
        self.parts: deque[bytes | memoryview] = deque()
        self.held = 0  # bytes in parts, counted in the worker's total
        self.direct = not _DONTWAIT  # writing with blocking calls (keeps nothing)
        self.failed = False  # cut off mid-answer: nothing more may be sent
        #: When set, every byte the thread writes is also added here (the whole answer, as
        #: the application wrote it, whatever the socket took): for the alike requests the
        #: worker answers with a copy.
        self.copy: bytearray | None = None

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
        if self.copy is not None:
            self.copy += data
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
            if self.held + len(view) <= MAX_HELD_ANSWER and self._worker.hold_bytes(len(view)):
                self.parts.append(_alone(view))
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
        self._worker.add_buffered(-self.held)
        self.held = 0
        self._write(parts)

    def _write(self, parts: list[Any]) -> None:
        """Blocking writes, all of ``parts`` within one deadline, cut short by the server's
        stop (``Budget.stop_writes_at``), and, since a thread is one of few, given up when the
        client takes nothing for ``--read-timeout`` seconds (four clients that never read a
        60 MB history held every place for ~240 s). While the client takes nothing the thread
        holds one of the ``DIRECT_WRITERS`` places (none free: cut off). Each ``send`` waits at
        most ``_STOP_CHECK_SECONDS`` and says how much the socket took, so a stop that begins
        meanwhile is seen within that and no byte is sent twice."""
        size = sum(len(part) for part in parts)
        stall = self._worker.read_timeout
        progress = time.monotonic()
        deadline = progress + stall + size / ANSWER_MIN_RATE
        sock = self._sock
        placing = bool(_DONTWAIT)  # where nothing can be written without waiting, every write is a thread's
        placed = False
        writing = False
        try:
            if placing:
                if not self._worker.take_place("writing"):  # each holds its whole answer
                    raise _NoPlace
                writing = True
            for part in parts:
                view = memoryview(part)
                while view:
                    now = time.monotonic()
                    if placing and not placed and now - progress >= STALLED_AFTER:
                        if not self._worker.take_place("stalled"):
                            raise _NoPlace
                        placed = True
                    remaining = min(deadline, progress + stall, self._worker.stop_writes_at) - now
                    if remaining <= 0:
                        raise TimeoutError
                    wait = min(remaining, _STOP_CHECK_SECONDS)
                    if placing and not placed:
                        wait = min(wait, max(0.001, progress + STALLED_AFTER - now))
                    sock.settimeout(wait)
                    try:
                        sent = sock.send(view[:_WRITE_PIECE])
                    except TimeoutError:
                        continue  # nothing taken yet: look at the deadlines again
                    if sent:
                        progress = time.monotonic()
                        if placed:
                            self._worker.give_place("stalled")  # it reads again
                            placed = False
                    view = view[sent:]
        except TimeoutError:
            self._worker.tally("unread")
            raise AnswerTimedOut(errno.EPIPE, "the client did not take its answer in time") from None
        except _NoPlace:
            self._worker.tally("unread")
            raise AnswerTimedOut(errno.EPIPE, "no room for another answer written by its thread") from None
        finally:
            if placed:
                self._worker.give_place("stalled")
            if writing:
                self._worker.give_place("writing")
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
            self._worker.add_buffered(-sent)
            self.held -= sent
            while sent:
                first = parts[0]
                if sent >= len(first):
                    sent -= len(first)
                    parts.popleft()
                else:
                    parts[0] = _alone(memoryview(first)[sent:])
                    sent = 0
        return True

    # -- the main loop ----------------------------------------------------------------------

    def keep(self, data: bytes) -> bool:
        """Hold ``data`` for the main loop to send (``flush``), counted in the worker's total;
        False, holding nothing, if the total cannot take it."""
        if len(data) > MAX_HELD_ANSWER or not self._worker.hold_bytes(len(data)):
            return False
        self.keep_counted(data)
        return True

    def keep_counted(self, data: bytes) -> None:
        """Hold ``data``, already counted in the worker's total, for the main loop to send."""
        self.parts.append(data)
        self.held += len(data)

    def deadline(self) -> float:
        return time.monotonic() + self._worker.read_timeout + self.held / ANSWER_MIN_RATE

    def flush(self) -> bool:
        """Send what the (non-blocking) socket takes now; True once all is sent."""
        return self._send(0)

    def discard(self) -> None:
        self.parts.clear()
        self._worker.add_buffered(-self.held)
        self.held = 0


