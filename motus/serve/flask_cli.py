"""``flask motus serve AGENT [options]``: the same server on Werkzeug's threaded server.

Loaded by Flask's CLI through the ``flask.commands`` entry point. Werkzeug's reloader is
never used: it would restart (and re-fork) the process that owns the worker pool.

Werkzeug serves each connection on a thread of its own, so a slow client holds a thread but
never one that another client needs. ``--read-timeout`` still applies: a request (head and
body) that has not arrived that many seconds after it began (or, on a kept-alive
connection, after the previous response) ends the connection, with an error response if
the application was reading its body (400 or 408). There is no cap on connections or threads
here: this is a development server; ``motus serve start`` (or a reverse proxy) is the one
for production.
"""

from __future__ import annotations

import functools
import io
import socket
import time
from typing import Any

from flask.cli import AppGroup

from motus.serve.cli import (
    check_agent_path,
    check_metrics_port,
    check_port_free,
    configure_logging,
    read_key_file,
    resolve_store,
    server_factory,
    server_options,
    warn_if_exposed,
)

motus_group = AppGroup("motus", help="motus agent serving.")


@functools.cache
def _timeout_error_class() -> type[Exception]:
    from werkzeug.exceptions import RequestTimeout

    class ReadTimedOut(TimeoutError, RequestTimeout):
        """As ``TimeoutError``, http.server ends the connection while reading the head; as
        ``RequestTimeout``, the application's error handler answers 408 while it reads the body
        (a body of known length: werkzeug reports it as a disconnect, 400). Never a short
        read, so a body cut off at the deadline is never taken for a whole one."""

        def __init__(self, seconds: float) -> None:
            detail = f"the request's headers and body must arrive within {seconds:g} s (--read-timeout)"
            TimeoutError.__init__(self, detail)
            RequestTimeout.__init__(self, detail)

        def __str__(self) -> str:
            return str(self.description)

    return ReadTimedOut


def _timeout_error(seconds: float) -> Exception:
    return _timeout_error_class()(seconds)  # type: ignore[call-arg]


class _DeadlineSocketReader(io.RawIOBase):
    """A socket's reading side where every read ends at the request's deadline."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        super().__init__()
        self._sock = sock
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.expired = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if self.expired or remaining <= 0:
            self.expired = True
            raise _timeout_error(self.seconds)
        prior = self._sock.gettimeout()
        self._sock.settimeout(remaining if prior is None else min(prior, remaining))
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            if prior is not None and prior < remaining:
                raise
            self.expired = True
            raise _timeout_error(self.seconds) from None
        finally:
            self._sock.settimeout(prior)


def request_handler(read_timeout: float) -> type:
    """Werkzeug's request handler, with ``read_timeout`` bounding each request's arrival."""
    from werkzeug.serving import WSGIRequestHandler

    class DeadlineRequestHandler(WSGIRequestHandler):
        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the plain reader; this one bounds every read by the deadline
            self._reader = _DeadlineSocketReader(self.connection, read_timeout)
            self.rfile = io.BufferedReader(self._reader)

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            pass  # the application logs each request itself (motus.access), with its request id

        def handle_one_request(self) -> None:
            self._reader.deadline = time.monotonic() + read_timeout
            super().handle_one_request()
            if self._reader.expired:
                self.close_connection = True

    return DeadlineRequestHandler


@motus_group.command("serve", with_appcontext=False)
@server_options
def serve_command(**opts: Any) -> None:
    """Serve AGENT (module.path:attribute) on Werkzeug's threaded server."""
    from werkzeug.serving import run_simple

    configure_logging(opts["log_level"], opts["log_format"])
    check_agent_path(opts["agent"])
    check_port_free(opts["host"], opts["port"])
    check_metrics_port(opts)
    opts["store"] = resolve_store(opts)
    warn_if_exposed(opts["host"], tuple(opts["api_keys"]) + tuple(read_key_file(opts.get("api_key_file"))))
    server = server_factory(opts)()
    server.start()
    try:
        run_simple(
            opts["host"],
            opts["port"],
            server.app,
            threaded=True,
            use_reloader=False,
            use_debugger=False,
            request_handler=request_handler(opts["read_timeout"]),
        )
    finally:
        server.shutdown()
