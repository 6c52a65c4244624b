"""motus as a gunicorn application: ``run_gunicorn`` and the server hooks.

Owns how ``motus serve start`` and ``AgentServer.run`` run gunicorn: the options (one
``MotusWorker``, ``--threads`` request threads, timeouts, the log format), the application that
creates the motus server in the worker after the fork (``MotusApplication.load``), the arbiter
it runs (``MotusArbiter``), and the two server hooks: ``post_worker_init`` starts the server,
``worker_exit`` shuts it down and ends the worker process.

Guarantees:

- The agent server (its pool, threads and fork server) is created and started in the worker
  process after gunicorn forks it (``load`` and ``post_worker_init``), never in the arbiter.
- On SIGTERM the worker first releases every long poll (``MotusWorker.handle_exit``), then,
  when gunicorn has finished the in-flight requests, ``worker_exit`` runs the server's
  shutdown: running turns get ``--shutdown-timeout``, then are left to be replayed at the next
  start (durable store) or cancelled (memory), and no worker process survives.
- A second gunicorn worker (``gunicorn -w 2 wsgi:app``) is refused at boot
  (``arbiter.claim_single_worker``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from motus.serve.gunicorn.arbiter import MotusArbiter, claim_single_worker
from motus.serve.gunicorn.private import control_socket_options
from motus.serve.gunicorn.worker import server_of

log = logging.getLogger(__name__)


def post_worker_init(worker: Any) -> None:
    """gunicorn's ``post_worker_init`` hook: start the motus server in the worker, after the fork."""
    server = server_of(worker)
    if server is not None:
        server.start()


def worker_exit(arbiter: Any, worker: Any) -> None:
    """gunicorn's ``worker_exit`` hook: shut the motus server down once gunicorn has finished
    the in-flight requests, then end the worker process (``end_worker_process``)."""
    if worker.pid != os.getpid():  # gunicorn also calls this hook in the arbiter, for a dead worker
        return
    exiting = sys.exc_info()[1]  # the SystemExit gunicorn is propagating (see end_worker_process)
    worker.motus_exiting = True
    try:
        server = server_of(worker)
        if server is not None:
            server.shutdown()
    finally:
        end_worker_process(exiting)


def end_worker_process(exiting: BaseException | None) -> None:
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


class MotusApplication(BaseApplication):
    def __init__(self, factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        options = {**self._options, **control_socket_options(self.cfg.settings)}
        for key, value in options.items():
            self.cfg.set(key, value)

    motus_read_timeout: float | None = None  # read by MotusWorker

    def load(self) -> Any:
        claim_single_worker()
        return self._factory().app

    def run(self) -> None:
        try:
            MotusArbiter(self).run()
        except RuntimeError as exc:  # as gunicorn's own ``run`` reports a failed start
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.exit(1)


def run_gunicorn(
    factory: Callable[[], Any],
    host: str,
    port: int,
    threads: int,
    shutdown_timeout: float,
    max_waiting: int = 10_000,
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
        "worker_class": "motus.serve.gunicorn.MotusWorker",
        "threads": threads,
        # Connections the worker holds at once: requests on threads, waits held without one
        # (--max-waiting), and 1,000 more idle keep-alive ones; gunicorn's 1,000 would refuse
        # every new client once that many event streams are open.
        "worker_connections": threads + max_waiting + 1000,
        "timeout": 60,
        "graceful_timeout": graceful,
        "keepalive": 5,
        "loglevel": log_level,
        "errorlog": "-",
        "post_worker_init": post_worker_init,
        "worker_exit": worker_exit,
        "proc_name": "motus-serve",
    }
    from motus.serve.logs import gunicorn_logger_class

    logger_class = gunicorn_logger_class(log_format)  # --log-format json: gunicorn's lines too
    if logger_class is not None:
        options["logger_class"] = logger_class
    application = MotusApplication(factory, options)
    application.motus_read_timeout = read_timeout
    application.run()
