"""The gunicorn worker motus serves with: gthread, but no request thread waits on a client.

Owns ``MotusWorker`` (``-k motus.serve.gunicorn.MotusWorker``; the old path
``motus.serve.gunicorn_app.MotusWorker`` still works): its main loop reads each request whole
(``framing``) before a thread sees it, hands the thread's answer to the main loop when the
client does not take it at once (``answer``), lingers before closing, and keeps every deadline;
and its signal handling, which starts and hurries the motus server's shutdown.

Guarantees (see ``MotusWorker`` for how):

- A request that has not arrived ``--read-timeout`` seconds after it began (a new connection:
  when it was accepted; a kept-alive one: when its next request began) is answered 408 and
  dropped, however steadily it trickles; one past a limit or with framing that cannot be read
  safely gets a 4xx that names the problem.
- A thread never waits to write its answer: what the socket does not take at once is sent by
  the main loop, and a client that does not take it within ``--read-timeout`` (plus a second
  per 256 KiB) is disconnected. Memory held for clients is bounded (``MAX_BUFFERED_TOTAL``).
- A long poll or event stream that waits holds no thread (``motus.serve.waiting``): the main
  loop keeps up to ``--max-waiting`` of them in its selector (``_held``) until their ticket is
  woken or their deadline passes, then a thread serves the long poll again, or resumes the
  stream, on the same connection. A held client that hangs up is forgotten at once; a held
  stream's keepalive comment is sent by the main loop.
- Held long polls woken by one publish whose requests are the same bytes (headers, key and
  query included) are served once: the first on a thread, the others with a copy of its
  answer, each with its own request id (or the client's, echoed), counted and logged as a
  request of its own (``_answer_alike``). Safe because a GET changes nothing and every view's
  answer depends only on the request's bytes and the server's state (none reads the peer's
  address); if the first waits again, each of the others is served again on its own.
- On SIGTERM the long polls are released at once (``begin_shutdown`` on a fresh thread); a
  SIGQUIT/SIGINT during the server's shutdown hurries it instead of raising into it.

Threads: the tables of connections being read, written, held and closed (``_reading``,
``_writing``, ``_held``, ``_lingering``) belong to the main loop; a request thread touches
only its own connection and, under ``_buffered_lock``, the byte count and the drop counts;
any thread may append a woken ticket to ``_woken`` (under ``_woken_lock``). gunicorn's
internals are reached only through ``private`` (``WorkerSeam`` and its helpers).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import selectors
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from motus.serve.gunicorn.answer import ANSWER_STOP_SECONDS, DIRECT_WRITERS, MAX_BUFFERED_TOTAL, MAX_HELD_ANSWER, Answer
from motus.serve.gunicorn.copies import COPIES_PER_BATCH, GONE, Copies, send_copies
from motus.serve.gunicorn.copies import senders as copy_senders
from motus.serve.gunicorn.framing import (
    DEFAULT_MAX_BODY,
    Limits,
    Refused,
    RequestReader,
    status_answer,
    timeout_detail,
)
from motus.serve.processes import fork_zygote_early
from motus.serve.waiting import Parked, Ticket, serving
from motus.serve.gunicorn.private import (
    HeldRequest,
    WorkerSeam,
    body_failed,
    client_of,
    forget_message,
    is_held,
    restore_socket,
    serving_from,
    socket_of,
    take_buffered,
)

log = logging.getLogger(__name__)

#: The read timeout when none is given (``--read-timeout``; ``$MOTUS_READ_TIMEOUT`` when the
#: worker class is used from gunicorn's own command line).
DEFAULT_READ_TIMEOUT = 10.0
#: After an answer that closes the connection, how long (and how many bytes) the worker
#: reads what the client still sends before closing, so that the close does not reset the
#: connection under an answer the client has not read yet (RFC 9112 9.6).
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 64 * 1024
#: How often the worker logs the clients it dropped or refused (one line for all of them).
DROP_LOG_INTERVAL = 60.0
#: How long a woken alike long poll waits for room for its copy in the worker's total (the
#: copies before it being taken) before it is answered 503 with ``Retry-After``.
COPY_ROOM_WAIT_SECONDS = 2.0

_READ_CHUNK = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


class _Parked:
    """A thread's result for a request it handed to the main loop to hold (``waiting``)."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "PARKED"


PARKED = _Parked()


def _framed(data: bytes, chunked: bool) -> bytes:
    """``data`` as the next piece of a response body (one chunk when it is chunked)."""
    return b"%X\r\n%s\r\n" % (len(data), data) if chunked else data


def _chunked(request: bytes | bytearray) -> bool:
    """Whether gunicorn chunks a streamed answer to this request: from HTTP/1.1 on."""
    line_end = request.find(b"\r\n")
    return not bytes(request[:line_end if line_end >= 0 else len(request)]).rstrip().endswith(b"HTTP/1.0")


def server_of(worker: Any) -> Any:
    """The motus server a gunicorn worker serves (``None`` before the app is loaded, or for
    an application that is not motus')."""
    app = getattr(worker, "wsgi", None)
    extensions = getattr(app, "extensions", {})
    return extensions.get("motus")


def configured_read_timeout(app: Any) -> float:
    value = getattr(app, "motus_read_timeout", None)
    if value is None:
        try:
            value = float(os.environ.get("MOTUS_READ_TIMEOUT", DEFAULT_READ_TIMEOUT))
        except ValueError:
            log.warning("Ignoring MOTUS_READ_TIMEOUT=%r: not a number of seconds", os.environ["MOTUS_READ_TIMEOUT"])
            value = DEFAULT_READ_TIMEOUT
    return value if value > 0 else DEFAULT_READ_TIMEOUT


class MotusWorker(WorkerSeam):
    """gthread worker whose request threads never wait on a client.

    gunicorn's gthread worker hands a connection to a thread as soon as it is readable; the
    thread then reads the request and writes the answer with blocking calls, so a client that
    sends a byte now and then, or that does not read its answer, holds a thread for as long
    as it likes: with ``--threads`` such connections, nobody else is served. Here the main
    loop (a selector, no threads) does the waiting:

    - It reads each request until it is complete (``RequestReader``) and only then hands it
      to a thread, which parses it from memory (``HeldRequest``). A request still
      incomplete at its deadline is answered 408 and closed; one past a limit (head, body,
      framing) is answered with a 4xx naming the problem.
    - The thread writes its answer without waiting (``Answer``): what the socket does not
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
        self.read_timeout = configured_read_timeout(self.app)
        self.stop_writes_at = math.inf  # see answer.Budget: set at the first SIGTERM
        cfg = self.cfg
        self._read_in_loop = not cfg.is_ssl and getattr(cfg, "http2_cleartext", "off") in ("off", None, False) and getattr(cfg, "proxy_protocol", "off") in ("off", None, False)
        self._limits = Limits(cfg, DEFAULT_MAX_BODY)
        self._budget = MAX_BUFFERED_TOTAL
        self._reading: dict[Any, RequestReader] = {}  # insertion order is deadline order
        self._writing: dict[Any, tuple[Answer, Any, float]] = {}  # answers the main loop sends
        self._lingering: dict[Any, list[float]] = {}  # [deadline, bytes drained]; deadline order
        self._buffered = 0  # bytes held for clients: requests being read, answers being sent
        self._buffered_lock = threading.Lock()
        #: Threads writing an answer themselves, [now, most], under _buffered_lock: "stalled",
        #: those whose client takes nothing (answer.DIRECT_WRITERS places); "writing", all of
        #: them, readers' included (each holds its whole answer): a quarter of --threads, 2 at least.
        self._writers = {
            "stalled": [0, min(DIRECT_WRITERS, max(1, self.cfg.threads // 4))],
            "writing": [0, max(2, self.cfg.threads // 4)],
        }
        self._held: dict[Any, float] = {}  # waiting requests held without a thread -> deadline
        self._held_deadlines: list[tuple[float, int, Any]] = []  # heap; stale entries skipped
        self._held_order = itertools.count()
        self._woken: deque[tuple[Any, Ticket]] = deque()
        self._woken_lock = threading.Lock()
        self._counts = {"timed out": 0, "refused": 0, "unread": 0}
        self._counts_logged_at = -math.inf
        self._notified_at = -math.inf
        self._copy_senders: ThreadPoolExecutor | None = None  # made at the first large broadcast
        #: Alike long polls whose copy waits for room in the worker's total, oldest first:
        #: (deadline, copies, conn, done, result). The main loop's only.
        self._copies_waiting: deque[tuple[float, Copies, Any, Any, Any]] = deque()

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
        # Still single-threaded, with the agent the arbiter imported: the zygote forks from
        # here instead of importing everything again in a fresh interpreter.
        fork_zygote_early()
        super().load_wsgi()
        config = getattr(self.wsgi, "config", None)
        limit = config.get("MAX_CONTENT_LENGTH") if isinstance(config, dict) else None
        self._limits = Limits(self.cfg, int(limit) if limit else DEFAULT_MAX_BODY)
        self._budget = max(MAX_BUFFERED_TOTAL, 4 * self._limits.max_body)

    def handle_exit(self, sig: int, frame: Any) -> None:
        first = self.alive  # the arbiter sends SIGTERM again while it waits: act on the first
        if first:
            # Answers still being written (by a thread or the main loop) get this long more:
            # a client that does not read must not hold the stop (answer.ANSWER_STOP_SECONDS).
            self.stop_writes_at = time.monotonic() + ANSWER_STOP_SECONDS
        super().handle_exit(sig, frame)
        server = server_of(self)
        if first and server is not None:
            # Signal handler context: do the locking work on a fresh thread.
            threading.Thread(target=server.begin_shutdown, name="motus-begin-shutdown", daemon=True).start()

    #: Set by the ``worker_exit`` hook (``app.worker_exit``) when the server's shutdown begins.
    motus_exiting = False
    #: Set by the first quick stop (``handle_quit``).
    motus_quitting = False

    def handle_quit(self, sig: int, frame: Any) -> None:
        """SIGQUIT or SIGINT: gunicorn's quick stop. Running turns are not waited for: they
        are treated as at the end of ``--shutdown-timeout`` (replayed at the next start, or
        cancelled with their webhooks). gunicorn's own handler raises ``SystemExit`` wherever
        the main thread is; once the server's shutdown is under way that would cut it short
        (no cancellation, no webhooks, the store left open), so then this only hurries it.
        So does a second quit signal while the first is handled (a terminal's Ctrl-C, then
        the arbiter's SIGQUIT): the handler it interrupts is already on its way out."""
        server = server_of(self)
        if server is not None:
            server.hurry_shutdown()
        if self.motus_exiting or self.motus_quitting:
            return
        self.motus_quitting = True
        self.gunicorn_quit(sig, frame)

    # -- bookkeeping ---------------------------------------------------------------------------

    def add_buffered(self, size: int) -> None:
        if size:
            with self._buffered_lock:
                self._buffered += size

    def hold_bytes(self, size: int) -> bool:
        """Count ``size`` more bytes held for a client, if the total allows."""
        with self._buffered_lock:
            if self._buffered + size > self._budget:
                return False
            self._buffered += size
            return True

    def take_place(self, kind: str) -> bool:
        with self._buffered_lock:
            count = self._writers[kind]
            if count[0] >= count[1]:
                return False
            count[0] += 1
            return True

    def give_place(self, kind: str) -> None:
        with self._buffered_lock:
            self._writers[kind][0] -= 1

    def _buffered_total(self) -> int:
        with self._buffered_lock:
            return self._buffered

    def tally(self, what: str) -> None:
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
            parts.append(f"closed {counts['unread']} connection(s) whose client did not take its answer in time, or whose answer found no room left for such clients")
        if parts:
            text = "; ".join(parts)
            self.log.warning("%s; a reverse proxy in front of motus can absorb slow clients", text[0].upper() + text[1:])
            self._counts_logged_at = now

    # -- the main loop: read requests without a thread ---------------------------------------

    def motus_enqueue(self, conn: Any) -> None:
        """Every way a connection reaches the thread pool (new, kept alive and readable,
        pipelined) comes here, in the main thread: read its request first."""
        if not self._read_in_loop:
            self.gunicorn_enqueue(conn)
            return
        # A kept-alive connection may hold the start of its next request already.
        leftover = getattr(conn, "motus_leftover", b"")
        conn.motus_leftover = b""
        leftover += take_buffered(conn)
        socket_of(conn).setblocking(False)
        reader = RequestReader(time.monotonic() + self.read_timeout, self._limits, leftover)
        self.add_buffered(len(reader.buf))
        self._reading[conn] = reader
        self._advance(conn, reader, recv=True)

    def _on_readable(self, conn: Any, _sock: Any) -> None:
        reader = self._reading.get(conn)
        if reader is not None:
            self._advance(conn, reader, recv=True)

    def _advance(self, conn: Any, reader: RequestReader, recv: bool = False) -> None:
        size = len(reader.buf)
        gone = False
        if recv:
            try:
                data: bytes | None = socket_of(conn).recv(_READ_CHUNK)
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
            self.add_buffered(len(reader.buf) - size)
            self._refuse(conn, reader, refusal)
            return
        self.add_buffered(len(reader.buf) - size)
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
            self.watch(conn, selectors.EVENT_READ, partial(self._on_readable, conn))
            reader.registered = True

    def _hand_over(self, conn: Any, reader: RequestReader) -> None:
        self._forget(conn, reader)
        data = reader.buf
        end = reader.end
        if end < len(data):
            conn.motus_leftover = bytes(data[end:])  # a pipelined request: read after this one
            self.add_buffered(end - len(data))
            del data[end:]
        conn.motus_request = data  # the thread takes it, and releases its count
        self.gunicorn_enqueue(conn)

    def _forget(self, conn: Any, reader: RequestReader) -> None:
        del self._reading[conn]
        if reader.registered:
            self.unwatch(conn)
            reader.registered = False

    def _drop(self, conn: Any, reader: RequestReader, timed_out: bool = False) -> None:
        self._forget(conn, reader)
        self.add_buffered(-len(reader.buf))
        if timed_out and reader.begun:
            # A request had begun: tell the client why (best effort; it may not be reading).
            self._send_nowait(conn, status_answer(408, f"Request Timeout: {timeout_detail(self.read_timeout)}"))
            self.tally("timed out")
        self.close_connection(conn)

    def _refuse(self, conn: Any, reader: RequestReader, refusal: Refused) -> None:
        self._forget(conn, reader)
        self.add_buffered(-len(reader.buf))
        self.tally("refused")
        self.log.debug("Refused a request from %s: %s %s", client_of(conn), refusal.status, refusal.detail)
        self._send_nowait(conn, status_answer(refusal.status, refusal.detail, refusal.headers))
        self._linger(conn)

    @staticmethod
    def _send_nowait(conn: Any, data: bytes) -> bool:
        try:
            return socket_of(conn).send(data) == len(data)
        except OSError:
            return False

    # -- the main loop: send answers, close connections --------------------------------------

    def motus_finish(self, conn: Any, fs: Any) -> None:
        answer: Answer | None = getattr(conn, "motus_answer", None)
        if answer is None:
            self.gunicorn_finish(conn, fs)
            return
        conn.motus_answer = None
        try:
            result = fs.result() if not fs.cancelled() else False
        except Exception:  # handle() catches everything; a bug must still close the connection
            self.log.exception("Error serving a request")
            result = False
        alike = getattr(conn, "motus_alike", None)
        if alike:
            conn.motus_alike = None
            answered, conn.motus_answered = getattr(conn, "motus_answered", None), None
            self._answer_alike(alike, answer, result, answered)
        try:
            if answer.failed:
                raise BrokenPipeError
            socket_of(conn).setblocking(False)
            done = answer.flush()
        except OSError:
            answer.discard()
            self._close_answered(conn, result)
            return
        if done:
            self._after_answer(conn, fs, result)
            return
        self._writing[conn] = (answer, result, answer.deadline())
        self.watch(conn, selectors.EVENT_WRITE, partial(self._on_writable, conn, fs))

    def _on_writable(self, conn: Any, fs: Any, _sock: Any) -> None:
        answer, result, _ = self._writing[conn]
        try:
            done = answer.flush()
        except OSError:
            done = None
        if done is False:
            return
        del self._writing[conn]
        self.unwatch(conn)
        if done:
            self._after_answer(conn, fs, result)
        else:
            answer.discard()
            self._close_answered(conn, result)

    def _close_answered(self, conn: Any, result: Any) -> None:
        """Close a connection whose answer could not be sent. One that parked (a stream
        under way, with part of its answer unsent) is given up as a held one is: its ticket
        leaves its watch and its stream ends (else /health counts it open for good, and the
        watch keeps it until that key's next publish)."""
        if result is PARKED:
            self._release(conn)
        else:
            self.close_connection(conn)

    def _after_answer(self, conn: Any, fs: Any, result: Any) -> None:
        if result is PARKED:
            self._hold(conn)
            return
        conn.motus_woken = False  # a wake that came as this request ended: not the next one's
        if not result:
            self._linger(conn)
        elif getattr(conn, "motus_leftover", b""):
            self.motus_enqueue(conn)  # the next request is here already: the socket may stay quiet
        else:
            self.gunicorn_finish(conn, fs)  # kept alive, back in the selector

    def _linger(self, conn: Any) -> None:
        """Close after an answer: stop sending, read (and throw away) what the client still
        sends for up to ``LINGER_SECONDS``, then close. Closing at once, with bytes of the
        client unread, would reset the connection under an answer it has not read yet."""
        try:
            sock = socket_of(conn)
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
            self.watch(conn, selectors.EVENT_READ, partial(self._on_linger_readable, conn))
        except (OSError, ValueError, KeyError):
            self.close_connection(conn)
            return
        self._lingering[conn] = [time.monotonic() + LINGER_SECONDS, 0]

    def _on_linger_readable(self, conn: Any, _sock: Any) -> None:
        entry = self._lingering.get(conn)
        if entry is None:
            return
        try:
            data = socket_of(conn).recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        entry[1] += len(data)
        if not data or entry[1] >= LINGER_MAX_BYTES:
            del self._lingering[conn]
            self.unwatch(conn)
            self.close_connection(conn)

    # -- the main loop: hold waiting requests without a thread ------------------------------

    def _may_hold(self) -> bool:
        """Any thread: whether one more waiting request may be held (``--max-waiting``)."""
        server = server_of(self)
        return server is not None and self.alive and len(self._held) < getattr(server, "max_waiting", 0)

    def _new_ticket(self, conn: Any) -> Ticket:
        return Ticket(self._wake, self._may_hold, conn)

    def _wake(self, tickets: list[Ticket]) -> None:
        """Any thread (a publisher): the tickets' event came (all that one publish woke); the
        main loop resumes their requests."""
        with self._woken_lock:
            first = not self._woken
            self._woken.extend((ticket.subject, ticket) for ticket in tickets)
        if first:
            self.call_in_main_loop(self._run_woken)

    def _run_woken(self) -> None:
        """Resume the requests woken since the last pass. Held long polls woken together
        whose requests are the same bytes (one inbox query by many approvers, one session
        watched from several tabs) are served once: the first runs on a thread, and the
        others get a copy of its answer (``_answer_alike``). They were woken by the same
        publish and would each have read the same state; serving each on a thread in turn,
        about a millisecond apiece under the GIL, made the last of 5,000 wait seconds."""
        with self._woken_lock:
            woken = list(self._woken)
            self._woken.clear()
        alike: dict[bytes, list[Any]] = {}
        for conn, ticket in woken:
            if getattr(conn, "motus_ticket", None) is not ticket:
                continue  # that request is over
            if conn not in self._held:
                conn.motus_woken = True  # woken before its thread handed it over: resumed then
            elif ticket.stream is None and self.alive:
                alike.setdefault(bytes(conn.motus_rerun), []).append(conn)
            else:
                self._resume(conn)
        for first, *others in alike.values():
            for conn in others:
                self._set_aside(conn)
            if others:
                self._count_held_poll(-len(others))
            first.motus_alike = others or None
            self._resume(first)

    def _set_aside(self, conn: Any) -> None:
        """A woken long poll that waits for the answer of an alike one (its ``motus_alike``):
        in no table of the main loop until that answer is known, a few milliseconds. Its
        socket stays in the selector (``motus_aside``), so setting thousands aside costs no
        system call each: if it becomes readable meanwhile, ``_on_held_readable`` takes it
        out, and ``_leave_aside`` does before anything else is done with it."""
        del self._held[conn]
        conn.motus_woken = False
        conn.motus_aside = True

    def _leave_aside(self, conn: Any) -> None:
        if getattr(conn, "motus_aside", False):
            conn.motus_aside = False
            self.unwatch(conn)

    def _answer_alike(self, alike: list[Any], answer: Answer, result: Any, answered: Any) -> None:
        """Main loop, once the thread serving the first of alike long polls is done: send
        each of the others a copy of its answer, with a request id of its own, counted and
        logged as its own request (``copies.Copies``; many are sent by the copy senders).
        If that answer is not a whole one to copy (the request waits again, or its client was
        gone mid-answer), each is served again on its own."""
        copy, answer.copy = answer.copy, None
        if result is PARKED or not result or answer.failed or answered is None or not copy:
            for conn in alike:
                self._rerun(conn)
            return
        copy = bytes(copy)
        done: Future[Any] = Future()
        done.set_result(result)
        # All copies of a small answer counted in the worker's total at once; one at a time
        # (each may be refused) when that is more than it may take at once.
        counted = len(copy) <= MAX_HELD_ANSWER and self.hold_bytes(len(copy) * len(alike))
        copies = Copies(self, self.wsgi, copy, answered, counted)
        inline = len(alike) <= COPIES_PER_BATCH
        if not inline and self._copy_senders is None:
            self._copy_senders = copy_senders()
        for start in range(0, len(alike), COPIES_PER_BATCH):
            # Batch by batch, so the senders start while the main loop prepares the next.
            ready, refused = copies.prepare(alike[start:start + COPIES_PER_BATCH])
            for conn in refused:
                if len(copy) > MAX_HELD_ANSWER:
                    self._rerun(conn)  # too large for the main loop: a thread writes it
                else:  # sent once the copies before it are taken (_retry_copies), or a 503
                    self._copies_waiting.append((time.monotonic() + COPY_ROOM_WAIT_SECONDS, copies, conn, done, result))
            if inline:
                self._copies_sent(send_copies(ready), done, result)
            else:
                self._copy_senders.submit(self._send_copies, ready, done, result)  # type: ignore[union-attr]

    def _retry_copies(self, now: float, force: bool) -> None:
        """Main loop, once a pass: alike long polls waiting for room for their copy get it,
        oldest first, as the copies sent before them are taken (30 people reading a 6 MB
        answer at once: 19 were refused when their copies were counted before any was sent);
        one still waiting after ``COPY_ROOM_WAIT_SECONDS``, or once the worker stops, gets a 503."""
        waiting = self._copies_waiting
        while waiting:
            deadline, copies, conn, done, result = waiting[0]
            if force or not self.alive or deadline <= now:  # at a stop, at once, as held polls
                waiting.popleft()
                self._no_room_for_copy(conn)
                continue
            ready, refused = copies.prepare([conn])
            if refused:
                return  # still no room: the ones behind it wait too, in order
            waiting.popleft()
            self._copies_sent(send_copies(ready), done, result)

    def _no_room_for_copy(self, conn: Any) -> None:
        """An alike long poll whose copy the worker's total could not hold for
        ``COPY_ROOM_WAIT_SECONDS`` (clients have not taken the answers they were sent): a 503
        with ``Retry-After``, sent from here. Served again on a thread instead, each would make
        the same large answer, and with no room to hold it, cut it off (1,000 such polls of a
        3 MB answer kept every thread busy for a minute)."""
        self._leave_aside(conn)
        ticket: Ticket | None = conn.motus_ticket
        conn.motus_ticket = conn.motus_rerun = None
        if ticket is not None:
            ticket.cancel()
        self.tally("refused")
        self._send_nowait(conn, status_answer(
            503, f"Answer not sent now: the server already holds {self._budget // 2**20} MiB of answers its clients "
            "have not taken; retry later", (("Retry-After", "1"),),
        ))
        self._linger(conn)

    def _send_copies(self, ready: list[tuple[Any, bytes]], done: Any, result: Any) -> None:
        """A copy sender: send a batch of copies, then hand the batch back to the main loop."""
        try:
            sent = send_copies(ready)
        except Exception:
            # A bug: the batch's connections are closed rather than left in no table, and
            # the bytes counted for their copies are uncounted with them.
            self.log.exception("Error sending copies of an answer")
            sent = [(conn, len(body), GONE) for conn, body in ready]
        self.call_in_main_loop(self._copies_sent, sent, done, result)

    def _copies_sent(self, sent: list[tuple[Any, int, int]], done: Any, result: Any) -> None:
        """Main loop: after copies were sent (each ``sent`` of ``size`` bytes, or ``GONE``),
        keep each connection alive for its next request, send the rest of its copy later,
        or close it."""
        for conn, size, sent in sent:
            self._leave_aside(conn)
            if sent == GONE:
                self.add_buffered(-size)
                self.close_connection(conn)  # the client is gone
            elif sent == size:
                self.add_buffered(-size)
                self._after_answer(conn, done, result)  # the common case: the socket took it all
            else:
                self.add_buffered(-sent)
                sending = Answer(socket_of(conn), self)
                sending.keep_counted(conn.motus_unsent)
                conn.motus_unsent = None
                self._writing[conn] = (sending, result, sending.deadline())
                self.watch(conn, selectors.EVENT_WRITE, partial(self._on_writable, conn, done))

    def _rerun(self, conn: Any) -> None:
        """Serve a long poll that is in no table of the main loop again, from the start."""
        self._leave_aside(conn)
        data = conn.motus_rerun
        conn.motus_rerun = None
        self.add_buffered(len(data))
        conn.motus_request = data
        self.gunicorn_enqueue(conn)

    def _hold(self, conn: Any) -> None:
        ticket: Ticket = conn.motus_ticket
        stream = ticket.stream
        deadline = time.monotonic() + stream.keepalive_every if stream is not None else (ticket.deadline or 0.0)
        heap = self._held_deadlines
        if len(heap) > 2 * len(self._held) + 64:
            # Entries of requests woken before their deadline stay until it passes: rebuild
            # now and then, so churn costs neither memory nor the connections they name.
            heap[:] = [(when, next(self._held_order), held) for held, when in self._held.items()]
            heapq.heapify(heap)
        self._held[conn] = deadline
        heapq.heappush(heap, (deadline, next(self._held_order), conn))
        if stream is None:
            self._count_held_poll(1)
        try:
            socket_of(conn).setblocking(False)
            self.watch(conn, selectors.EVENT_READ, partial(self._on_held_readable, conn))
        except (OSError, ValueError, KeyError):
            self._release(conn)
            return
        if getattr(conn, "motus_woken", False):
            self._resume(conn)

    def _count_held_poll(self, delta: int) -> None:
        """The long-poll gauge counts held long polls too (they wait, on no thread)."""
        server = server_of(self)
        if server is not None:
            server.metrics.held_long_polls(delta)

    def _on_held_readable(self, conn: Any, _sock: Any) -> None:
        if conn not in self._held:
            self._leave_aside(conn)  # a pipelined request, or the client left: seen after the copy
            return
        try:
            data = socket_of(conn).recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.unwatch(conn)  # its next request (pipelined): read once this one is answered
        else:
            self._release(conn)  # the client hung up: nobody to answer

    def _resume(self, conn: Any) -> None:
        """Serve a held request on a thread again: a long poll from the start (its wait ends
        at its first deadline), a stream where it parked."""
        del self._held[conn]
        self.unwatch(conn)
        conn.motus_woken = False
        ticket: Ticket = conn.motus_ticket
        if ticket.stream is not None:
            conn.motus_pump = True
            self.gunicorn_enqueue(conn)
        else:
            self._count_held_poll(-1)
            self._rerun(conn)

    def _release(self, conn: Any) -> None:
        """Give a held request up (its client left, or the worker stops) and close it."""
        was_held = self._held.pop(conn, None) is not None
        self.unwatch(conn)
        ticket: Ticket | None = getattr(conn, "motus_ticket", None)
        conn.motus_ticket = conn.motus_rerun = None
        if was_held and ticket is not None and ticket.stream is None:
            self._count_held_poll(-1)
        if ticket is not None:
            ticket.cancel()
            if ticket.stream is not None:
                ticket.stream.end()
        self.close_connection(conn)

    def _expire_held(self, now: float, force: bool) -> None:
        """Held requests past their deadline: a long poll is served again (and answers what
        is); a stream gets its keepalive comment, sent from here, and waits on."""
        if force:
            for conn in list(self._held):
                self._release(conn)
            self._held_deadlines.clear()
            return
        heap = self._held_deadlines
        while heap and heap[0][0] <= now:
            deadline, _, conn = heapq.heappop(heap)
            if self._held.get(conn) != deadline:
                continue  # resumed or released since
            ticket: Ticket = conn.motus_ticket
            stream = ticket.stream
            if stream is None:
                ticket.cancel()
                self._resume(conn)
                continue
            frame = _framed(stream.keepalive, getattr(conn, "motus_chunked", True))
            try:
                sent = socket_of(conn).send(frame)
            except OSError:
                sent = -1
            if sent != len(frame):
                self._release(conn)  # not even a comment fits: the client is not reading
                continue
            later = now + stream.keepalive_every
            self._held[conn] = later
            heapq.heappush(heap, (later, next(self._held_order), conn))

    def _pump(self, conn: Any) -> Any:
        """A thread: go on with a held event stream until it parks again or ends."""
        ticket: Ticket = conn.motus_ticket
        stream = ticket.stream
        chunked = getattr(conn, "motus_chunked", True)
        answer = Answer(socket_of(conn), self)
        result: Any = False
        try:
            while True:
                try:
                    data = next(stream)
                except StopIteration:
                    if chunked:
                        answer.sendall(_LAST_CHUNK)
                    break
                except Parked:
                    result = PARKED
                    break
                if data:
                    answer.sendall(_framed(data, chunked))
        except OSError as exc:
            self.log.debug("A held event stream's client is gone: %s", exc)
        except Exception:
            self.log.exception("Error serving an event stream")
        finally:
            if result is not PARKED:
                stream.end()
                conn.motus_ticket = None
            conn.motus_answer = answer
        return result

    # -- deadlines ----------------------------------------------------------------------------

    def motus_expire(self, force: bool) -> None:
        """Once a pass of gunicorn's main loop (after its own expiry of kept-alive connections);
        ``force`` as the worker stops: drop every connection still being read, written or
        closed."""
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
        for conn, (answer, result, deadline) in list(self._writing.items()):
            if deadline <= now or force or self.stop_writes_at <= now:
                del self._writing[conn]
                self.unwatch(conn)
                answer.discard()
                self.tally("unread")
                self._close_answered(conn, result)
        while self._lingering:
            conn, (deadline, _) = next(iter(self._lingering.items()))
            if deadline > now and not force:
                break
            del self._lingering[conn]
            self.unwatch(conn)
            self.close_connection(conn)
        self._retry_copies(now, force)
        self._expire_held(now, force)
        self._log_counts(now)

    def motus_wait_limit(self, timeout: float) -> float:
        """The main loop waits for events at most until the next deadline (slightly after it)."""
        deadlines = [deadline for _, _, deadline in self._writing.values()]
        if self._writing and self.stop_writes_at < math.inf:
            deadlines.append(self.stop_writes_at)
        if self._reading:
            deadlines.append(next(iter(self._reading.values())).deadline)
        if self._lingering:
            deadlines.append(next(iter(self._lingering.values()))[0])
        if self._held_deadlines:
            deadlines.append(self._held_deadlines[0][0])
        if self._copies_waiting:
            deadlines.append(self._copies_waiting[0][0])
        if deadlines:
            timeout = min(timeout, max(0.0, min(deadlines) - time.monotonic()) + 0.01)
        return timeout

    # -- a thread: serve the request the main loop read ------------------------------------

    def motus_handle(self, conn: Any) -> Any:
        if getattr(conn, "motus_pump", False):
            conn.motus_pump = False
            return self._pump(conn)
        data = getattr(conn, "motus_request", None)
        if data is None:
            return self.gunicorn_handle(conn)
        conn.motus_request = None
        held = HeldRequest(data)
        answer = Answer(socket_of(conn), self)
        ticket = getattr(conn, "motus_ticket", None)
        if ticket is None:  # a new request (a held long poll served again keeps its ticket)
            ticket = conn.motus_ticket = self._new_ticket(conn)
        if getattr(conn, "motus_alike", None):
            answer.copy = bytearray()  # alike requests wait for a copy (``_answer_alike``)
        ticket.answered = None
        result: Any = False
        serving(ticket)
        try:
            real = serving_from(conn, held, answer)
            try:
                result = self.gunicorn_handle(conn)
            except Parked:
                # It waits: the main loop holds it (see ``_hold``). A stream is under way;
                # a long poll has answered nothing yet and is served again when woken.
                result = PARKED
                conn.motus_chunked = _chunked(data)
                if ticket.stream is None:
                    conn.motus_rerun = data
            finally:
                restore_socket(conn, real)
            if result:
                forget_message(conn)  # read whole: nothing of it to drain before the next
        finally:
            serving(None)
            held.release()
            self.add_buffered(-len(data))
            if result is not PARKED:
                conn.motus_ticket = None
                if answer.copy is not None:
                    conn.motus_answered = ticket.answered
            conn.motus_answer = answer  # sent by the main loop (finish_request)
        return result

    def motus_keepalive_after(self, conn: Any, keepalive: Any) -> Any:
        if not is_held(conn):
            return self.gunicorn_keepalive_after(conn, keepalive)
        # The request was read whole and the next one begins where the main loop says, so
        # there is nothing to drain; a body gunicorn could not decode ends the connection.
        return bool(keepalive) and not body_failed(conn)

