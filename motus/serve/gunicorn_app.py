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
"""

from __future__ import annotations

import fcntl
import math
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
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
    path = os.path.join(tempfile.gettempdir(), f"motus-gunicorn-{os.getppid()}.lock")
    handle = open(path, "a+")  # noqa: SIM115 - held for the life of the process
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


class MotusWorker(ThreadWorker):
    """gthread worker that releases long polls as soon as a graceful stop begins."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        server = _server_of(self)
        if server is not None:
            # Signal handler context: do the locking work on a fresh thread.
            threading.Thread(target=server.begin_shutdown, name="motus-begin-shutdown", daemon=True).start()


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
    """Serve ``factory()``'s app (called in the worker, after the fork) until stopped."""
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
    _Application(factory, options).run()
