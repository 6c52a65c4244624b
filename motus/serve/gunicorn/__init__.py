"""Serving motus under gunicorn: one worker process, many threads.

One process owns the live turns (their worker processes and pipes) and, with SQLite, the
store file, so exactly one gunicorn worker may serve them; its threads serve requests (long
polls hold a thread each), and ``--workers`` of motus counts concurrent turns, not gunicorn
workers.

The package, by concern:

- ``app``: ``run_gunicorn``, the gunicorn application and the server hooks (start the motus
  server after the fork, shut it down and end the worker process at exit).
- ``arbiter``: one worker only (``claim_single_worker``), and the arbiter's quick graceful stop.
- ``worker``: ``MotusWorker``, the gthread worker whose request threads never wait on a
  client (``-k motus.serve.gunicorn.MotusWorker``).
- ``framing``: where a request ends, read by the main loop; the 4xx refusals.
- ``answer``: the socket stand-in a thread writes its answer to.
- ``private``: every use of gunicorn's internals, with the versions each was checked against.

``motus.serve.gunicorn_app`` re-exports the names it used to define.
"""

from __future__ import annotations

from motus.serve.gunicorn.app import run_gunicorn
from motus.serve.gunicorn.arbiter import SINGLE_WORKER_MESSAGE, claim_single_worker
from motus.serve.gunicorn.worker import MotusWorker

__all__ = ["SINGLE_WORKER_MESSAGE", "MotusWorker", "claim_single_worker", "run_gunicorn"]
