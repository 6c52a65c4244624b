"""Old home of motus' gunicorn integration, kept so that its import paths keep working.

``-k motus.serve.gunicorn_app.MotusWorker`` (the README's, and users' gunicorn command lines)
names this module; everything lives in ``motus.serve.gunicorn`` now. New code imports from
there.
"""

from __future__ import annotations

from motus.serve.gunicorn.answer import ANSWER_MIN_RATE, MAX_BUFFERED_TOTAL, MAX_HELD_ANSWER, AnswerTimedOut
from motus.serve.gunicorn.app import MotusApplication, end_worker_process, post_worker_init, run_gunicorn, worker_exit
from motus.serve.gunicorn.arbiter import SINGLE_WORKER_MESSAGE, MotusArbiter, claim_single_worker
from motus.serve.gunicorn.framing import DEFAULT_MAX_BODY, MAX_CHUNKS, MAX_HEAD_BYTES, Refused
from motus.serve.gunicorn.worker import (
    DEFAULT_READ_TIMEOUT,
    DROP_LOG_INTERVAL,
    LINGER_MAX_BYTES,
    LINGER_SECONDS,
    MotusWorker,
    server_of,
)

# The private names of the single module, for code that reached into it.
_Application = MotusApplication
_Arbiter = MotusArbiter
_post_worker_init = post_worker_init
_worker_exit = worker_exit
_end_worker_process = end_worker_process
_server_of = server_of

__all__ = [
    "ANSWER_MIN_RATE",
    "DEFAULT_MAX_BODY",
    "DEFAULT_READ_TIMEOUT",
    "DROP_LOG_INTERVAL",
    "LINGER_MAX_BYTES",
    "LINGER_SECONDS",
    "MAX_BUFFERED_TOTAL",
    "MAX_CHUNKS",
    "MAX_HEAD_BYTES",
    "MAX_HELD_ANSWER",
    "SINGLE_WORKER_MESSAGE",
    "AnswerTimedOut",
    "MotusWorker",
    "Refused",
    "claim_single_worker",
    "run_gunicorn",
]
