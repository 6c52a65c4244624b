"""Every use motus makes of gunicorn's internals, in one place.

Owns the seam between motus and gunicorn's undocumented code: the gthread worker's methods
that ``MotusWorker`` replaces (each override here only forwards to a named motus hook, and
gunicorn's own behaviour stays reachable through a ``gunicorn_*`` method), the attributes of a
gthread connection (``TConn``) motus reads or swaps, the HTTP parser's input buffer
(``Unreader``), and the arbiter's state a graceful stop waits on.

What is *not* here is gunicorn's documented interface, used freely elsewhere: settings
(``cfg.set``, ``cfg.<name>``), server hooks (``post_worker_init``, ``worker_exit``),
``BaseApplication`` (``load_config``, ``load``, ``run``), and a custom worker's base class
(``gunicorn.workers.base.Worker``: ``alive``, ``cfg``, ``log``, ``app``, ``wsgi``, ``tmp``,
``notify``, ``load_wsgi``, ``handle_exit``, ``handle_quit``).

Guarantees: each touch below says why motus needs it and the gunicorn versions it was read
against. The supported range (``pyproject.toml``) is the one these were checked against;
``.ci/run`` runs the serving tests once more on its lowest version. A gunicorn upgrade is
reviewed here, and nowhere else.
"""

from __future__ import annotations

import errno
import io
import queue
from typing import Any

from gunicorn.arbiter import Arbiter
from gunicorn.http.unreader import Unreader
from gunicorn.sock import close_sockets
from gunicorn.workers.base import Worker
from gunicorn.workers.gthread import ThreadWorker

#: What ``accept`` meets when the process (or the system) has no descriptor left for a client.
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

#: The releases whose source every touch below was read against. The serving tests pass on
#: 27.0.0 and 27.0.1, the range ``pyproject.toml`` states (``>=27,<28``). Below 27.0 they do
#: not, for reasons outside this module (measured on 24.1.1): gthread's stop waits on an idle
#: kept-alive connection for the whole ``graceful_timeout`` (27.0 stopped waiting on them),
#: and gunicorn answers an HTTP/1.0 ``Expect: 100-continue`` itself; 22 and 23 have a
#: different gthread worker altogether (no method queue; ``finish_request`` runs in the thread).
CHECKED_VERSIONS = "24.1.1, 25.0.3, 25.1.0, 26.0.0, 26.1.0, 26.2.0, 27.0.0, 27.0.1"
TESTED_VERSIONS = "27.0.0, 27.0.1"


def control_socket_options(settings: dict[str, Any]) -> dict[str, Any]:
    """``control_socket_disable`` where gunicorn has it (25.1 and later): motus has no use for
    gunicorn's control socket (``gunicornc``), and the socket file would be one more thing a
    server leaves behind. Older versions have no such socket and refuse the unknown setting,
    so there it is not set. Checked: absent in 24.1.1 and 25.0.3, present 25.1.0-27.0.1."""
    return {"control_socket_disable": True} if "control_socket_disable" in settings else {}


# -- a connection (gthread's TConn) ------------------------------------------------------------
# ``TConn`` is gthread's private connection record. motus reads its socket and peer address,
# and for a request the main loop read whole, swaps the parser's input and the socket for the
# length of one ``handle`` (see ``serving_from``). Fields checked in 24.1.1-27.0.1: ``sock``,
# ``client``, ``parser`` (``None`` until ``init``), ``init()``; ``data_ready`` exists from 26.0
# (setting it on an older TConn is harmless: nothing reads it there). ``MotusWorker`` also keeps
# attributes of its own on a TConn (``motus_leftover``, ``motus_request``, ``motus_answer``,
# and for a request held while it waits ``motus_ticket``, ``motus_rerun``, ``motus_pump``,
# ``motus_woken``, ``motus_chunked``), which needs TConn to be a plain class without
# ``__slots__`` (it is).


def socket_of(conn: Any) -> Any:
    """The client's socket (``TConn.sock``)."""
    return conn.sock


def client_of(conn: Any) -> Any:
    """The client's address (``TConn.client``), for logs."""
    return conn.client


def take_buffered(conn: Any) -> bytes:
    """Bytes the connection's parser already read past its last request (a kept-alive
    connection may hold the start of its next one), taken out of the parser. gunicorn 26.2
    added ``Unreader.take_buffered``; before it the same buffer is ``Unreader.buf`` (a
    ``BytesIO``, in every version checked), emptied here the way ``take_buffered`` does."""
    parser = conn.parser
    if parser is None:
        return b""
    unreader = parser.unreader
    take = getattr(unreader, "take_buffered", None)
    if take is not None:
        return bytes(take())
    data = unreader.buf.getvalue()
    unreader.buf = io.BytesIO()
    return bytes(data)


class HeldRequest(Unreader):
    """The request as the main loop read it, for gunicorn's parser in the thread: read from
    memory, never from the socket; past its end, end of file.

    gunicorn's ``Unreader`` is the parser's input: ``chunk`` is what it calls for more bytes
    (``size_hint`` from 26.2; none before) and ``buf`` what it keeps of them. Checked
    24.1.1-27.0.1."""

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


def serving_from(conn: Any, held: HeldRequest, stand_in: Any) -> Any:
    """Prepare ``conn`` for gunicorn's ``handle`` to serve the request in ``held``: the parser
    reads ``held`` instead of the socket, and the answer is written to ``stand_in`` instead of
    the socket. Returns the real socket, to be put back with ``restore_socket``.

    ``init`` creates the parser on a new connection (``TConn.init``, idempotent in every version
    checked); ``data_ready`` tells 26.0+ not to wait for the socket to become readable, since
    the bytes are here. The parser reads through ``parser.unreader`` and the response writes to
    ``conn.sock`` (read by ``handle_request`` when it builds the response). Checked
    24.1.1-27.0.1."""
    conn.data_ready = True
    conn.init()
    conn.parser.unreader = held
    real, conn.sock = conn.sock, stand_in
    return real


def restore_socket(conn: Any, real: Any) -> None:
    conn.sock = real


def is_held(conn: Any) -> bool:
    """Whether the connection's current request was served from memory (``serving_from``)."""
    return isinstance(getattr(conn.parser, "unreader", None), HeldRequest)


def forget_message(conn: Any) -> None:
    """Tell the parser its last message was read whole, so that it drains nothing of it before
    the next request (``parser.mesg``, checked 24.1.1-27.0.1)."""
    conn.parser.mesg = None


def body_failed(conn: Any) -> bool:
    """Whether gunicorn gave up decoding the last request's body (``mesg.body.failed``, set
    by the body readers of 26.2+; never set before, so False there)."""
    body = getattr(conn.parser.mesg, "body", None)
    return getattr(body, "failed", False) is True


# -- the gthread worker --------------------------------------------------------------------------


class WorkerSeam(ThreadWorker):
    """gunicorn's gthread worker with its private methods turned into motus hooks.

    Each override forwards to one ``motus_*`` hook, whose default here is gunicorn's own
    behaviour; ``MotusWorker`` implements the hooks. The methods and what they are in gthread
    (checked 24.1.1-27.0.1 unless said otherwise):

    - ``accept(listener)``: the listener's callback; overridden here only so that running
      out of descriptors stops accepting instead of ending the worker (see ``accept``).
    - ``enqueue_req(conn)``: every way a connection reaches the thread pool (accepted, kept
      alive and readable, pipelined); main thread.
    - ``finish_request(conn, fs)``: a thread is done with a connection; main thread (via the
      method queue).
    - ``murder_keepalived(force)``: called once a pass of the main loop, and (27.0+) with
      ``force`` as the worker stops; before 27.0 it takes no argument.
    - ``wait_for_and_dispatch_events(timeout)``: the main loop's wait (at most 1 s a pass).
    - ``handle(conn)``: a thread serves one request; returns whether to keep the connection.
    - ``_keepalive_after(conn, keepalive)`` (26.2+; before, ``handle`` drained the body itself,
      which a request served from memory makes a no-op): whether a connection whose answer
      allowed keep-alive may be reused.
    """

    def accept(self, listener: Any) -> None:
        """gthread's ``accept`` (main thread; the listener's selector callback, checked
        24.1.1-27.0.1), except that running out of descriptors does not end the worker:
        gthread re-raises any error but EAGAIN/ECONNABORTED, out of its main loop, so the
        worker died (every running turn and a memory store's sessions with it) once a client
        held more connections than the open-file limit allows, which ``worker_connections``
        (``threads + --max-waiting + 1000``) may well exceed. Instead the worker stops
        accepting until one of its connections closes: ``worker_connections`` becomes the
        count it holds (the run loop compares them before every wait)."""
        try:
            ThreadWorker.accept(self, listener)
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
            if self.worker_connections > self.nr_conns:
                self.log.warning(
                    "Out of file descriptors (%s) with %d connections open: accepting at most that many from now on; "
                    "raise the open-file limit (ulimit -n) or lower --max-waiting", exc.strerror, self.nr_conns,
                )
            self.worker_connections = max(1, self.nr_conns)
            self.set_accept_enabled(False)

    def enqueue_req(self, conn: Any) -> None:
        self.motus_enqueue(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        self.motus_finish(conn, fs)

    def murder_keepalived(self, force: bool = False) -> None:
        if force:  # only 27.0+ passes it (once, as the worker stops); before, no argument
            super().murder_keepalived(force=True)
        else:
            super().murder_keepalived()
        self.motus_expire(force)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        super().wait_for_and_dispatch_events(self.motus_wait_limit(timeout))

    def handle(self, conn: Any) -> Any:
        return self.motus_handle(conn)

    def _keepalive_after(self, conn: Any, keepalive: Any) -> Any:
        return self.motus_keepalive_after(conn, keepalive)

    # -- hooks: gunicorn's behaviour unless the subclass says otherwise ------------------------

    def motus_enqueue(self, conn: Any) -> None:
        self.gunicorn_enqueue(conn)

    def motus_finish(self, conn: Any, fs: Any) -> None:
        self.gunicorn_finish(conn, fs)

    def motus_expire(self, force: bool) -> None:
        """Once a pass of the main loop (``force``: the worker is stopping)."""

    def motus_wait_limit(self, timeout: float) -> float:
        return timeout

    def motus_handle(self, conn: Any) -> Any:
        return self.gunicorn_handle(conn)

    def motus_keepalive_after(self, conn: Any, keepalive: Any) -> Any:
        return self.gunicorn_keepalive_after(conn, keepalive)

    # -- gunicorn's own behaviour ---------------------------------------------------------------

    def gunicorn_enqueue(self, conn: Any) -> None:
        """Hand the connection to the thread pool (its ``handle`` runs in a thread)."""
        ThreadWorker.enqueue_req(self, conn)

    def gunicorn_finish(self, conn: Any, fs: Any) -> None:
        """Keep the connection alive in the selector or close it, as ``fs``'s result says."""
        ThreadWorker.finish_request(self, conn, fs)

    def gunicorn_quit(self, sig: int, frame: Any) -> None:
        """gunicorn's quick stop (``alive`` off, the ``worker_int`` hook, ``SystemExit``),
        without gthread's ``tpool.shutdown``. That takes the thread pool's lock from a signal
        handler, and the frame the signal interrupted may hold it: the main loop's
        ``submit``, or the first quit's own shutdown when a second quit signal arrives
        meanwhile (a terminal's Ctrl-C reaches the worker and the arbiter, which then sends
        the worker SIGQUIT). The handler then waited on it for good, and the worker was
        killed by the arbiter 45 s later. The exit wakes and joins the pool's threads anyway
        (``concurrent.futures``' exit hook)."""
        Worker.handle_quit(self, sig, frame)

    def gunicorn_handle(self, conn: Any) -> Any:
        """Read and serve one request from the connection (blocking)."""
        return ThreadWorker.handle(self, conn)

    def gunicorn_keepalive_after(self, conn: Any, keepalive: Any) -> Any:
        return ThreadWorker._keepalive_after(self, conn, keepalive)

    # -- the selector and the connection count ------------------------------------------------
    # ``poller`` is the main loop's selector and ``nr_conns`` the count of open connections
    # it compares with ``worker_connections`` before accepting: a connection motus closes
    # itself must be counted out. Checked 24.1.1-27.0.1.

    def watch(self, conn: Any, events: int, callback: Any) -> None:
        """Call ``callback(sock)`` from the main loop when the connection's socket is ready."""
        self.poller.register(conn.sock, events, callback)

    def unwatch(self, conn: Any) -> None:
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass  # not registered, or already closed: nothing to stop watching

    def call_in_main_loop(self, callback: Any, *args: Any) -> None:
        """From any thread: run ``callback(*args)`` in the main loop soon (gthread's
        ``method_queue.defer``, a queue and a wake-up pipe; present 24.0-27.0.1)."""
        self.method_queue.defer(callback, *args)

    def close_connection(self, conn: Any) -> None:
        """Close a connection the worker holds in none of its tables any more."""
        self.nr_conns -= 1
        conn.close()


# -- the arbiter ---------------------------------------------------------------------------------


class ArbiterSeam(Arbiter):
    """gunicorn's arbiter, with ``stop`` turned into a hook and the state a stop waits on
    behind named methods.

    ``stop(graceful)`` is called by the arbiter's ``halt`` (SIGTERM, SIGINT, SIGQUIT); motus'
    ``motus_stop`` runs first and returns whether gunicorn's own stop, called after it, is still
    to be graceful. ``halt(reason, exit_status)`` ends in ``sys.exit``; motus'
    ``motus_halted`` runs after it, as the exit unwinds. The state read (checked 24.1.1-27.0.1): ``WORKERS`` (pid -> worker),
    ``LISTENERS`` (the listening sockets), ``SIG_QUEUE`` (a ``queue.SimpleQueue`` of signals
    since 24.0; SIGCHLD is put there too), ``kill_workers``, ``reap_workers``, and
    ``dirty_arbiter_pid`` (25.0+; no dirty arbiter before, so 0).
    """

    def stop(self, graceful: bool = True) -> None:
        super().stop(self.motus_stop(graceful))

    def halt(self, reason: str | None = None, exit_status: int = 0) -> None:
        """gunicorn's ``halt`` (stop, hooks, ``sys.exit``), then ``motus_halted``."""
        try:
            super().halt(reason, exit_status)
        finally:
            self.motus_halted()

    def motus_stop(self, graceful: bool) -> bool:
        return graceful

    def motus_halted(self) -> None:
        """Runs last as the arbiter exits, its workers stopped."""

    def has_workers(self) -> bool:
        return bool(self.WORKERS)

    def has_dirty_arbiter(self) -> bool:
        return bool(getattr(self, "dirty_arbiter_pid", 0))

    def close_listeners(self) -> None:
        """Stop listening (TCP only here, so there is no socket file to unlink)."""
        close_sockets(self.LISTENERS, False)
        self.LISTENERS = []

    def signal_workers(self, sig: int) -> None:
        self.kill_workers(sig)

    def reap(self) -> None:
        """Collect the workers that have exited."""
        self.reap_workers()

    def next_signal(self, timeout: float) -> int | None:
        """The next signal the arbiter received (SIGCHLD included), or None after ``timeout``."""
        try:
            return self.SIG_QUEUE.get(timeout=timeout)
        except queue.Empty:
            return None
