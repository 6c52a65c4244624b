"""The worker's quick stop (SIGQUIT, SIGINT) from a signal handler never waits on a lock.

A terminal's Ctrl-C reaches the worker and the arbiter, which then sends the worker SIGQUIT:
two quit signals, the second possibly while the first is handled. gthread's handler shut the
thread pool down, which takes the pool's lock; when the frame the signal interrupted held it
(the first quit's own shutdown, or the main loop's ``submit``), the handler waited on it for
good and the arbiter killed the worker 45 s later (seen once by hand, `py-spy dump`: two
``handle_quit`` frames, the inner one in ``ThreadPoolExecutor.shutdown``).

A real ``MotusWorker`` (gunicorn's constructor, its default settings, a real thread pool);
the lock held as the interrupted frame held it, the handler called on the same thread.
"""

from __future__ import annotations

import os
import signal
import threading

from gunicorn.config import Config
from gunicorn.glogging import Logger

from motus.serve.gunicorn.worker import MotusWorker


def worker() -> MotusWorker:
    cfg = Config()
    made = MotusWorker(1, os.getppid(), [], None, 30, cfg, Logger(cfg))
    made.tpool = made.get_thread_pool()
    return made


def close(target: MotusWorker) -> None:
    if not target.tpool._shutdown_lock.locked():  # noqa: SLF001 - held for good by a handler that blocked
        target.tpool.shutdown()
    target.tmp.close()  # the heartbeat file gunicorn's constructor opened


def quit_while_the_pool_s_lock_is_held(target: MotusWorker) -> str:
    """Call the handler on a thread that holds the pool's lock, as the interrupted frame
    did; what it did: "exit" (``SystemExit``, gunicorn's quick stop) or "returned"."""
    outcome: list[str] = []

    def interrupted_frame() -> None:
        with target.tpool._shutdown_lock:  # noqa: SLF001 - what the interrupted frame holds
            try:
                target.handle_quit(signal.SIGQUIT, None)
                outcome.append("returned")
            except SystemExit:
                outcome.append("exit")

    thread = threading.Thread(target=interrupted_frame, name="interrupted-main-loop", daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the quit handler waits on the thread pool's lock"
    return outcome[0]


def test_a_quit_that_interrupts_the_main_loop_inside_the_pool_s_lock_still_exits() -> None:
    target = worker()
    try:
        assert quit_while_the_pool_s_lock_is_held(target) == "exit"
        assert target.alive is False
    finally:
        close(target)


def test_a_second_quit_during_the_first_returns_at_once() -> None:
    target = worker()
    try:
        try:
            target.handle_quit(signal.SIGINT, None)  # the terminal's Ctrl-C
        except SystemExit:
            pass  # the quick stop under way
        else:
            raise AssertionError("the first quit did not stop the worker")
        assert quit_while_the_pool_s_lock_is_held(target) == "returned"  # the arbiter's SIGQUIT, inside the first
    finally:
        close(target)
