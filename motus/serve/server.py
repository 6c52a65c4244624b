"""``AgentServer``: configuration, and the glue between the session store and the pool.

It owns one ``SessionStore``, one ``WorkerPool``, one ``WebhookSender`` and one housekeeping
thread (TTL sweeps). Nothing starts in ``__init__``: the pool, its threads and the forkserver
start in ``start()``, called lazily by the first request or eagerly by the process that
serves (after gunicorn forks its worker), never in a process that merely imports the app.

Consistency between the store and the pool: a turn's status change and the matching pool
action (park a turn that waits on a human; queue the final resume for a compute slot) happen
together under ``_turn_lock``, so a fast resume can never be overtaken by the park of the
interrupt it answers. Lock order: ``_turn_lock`` -> pool lock -> store lock.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import Any

from flask import Flask

from motus.serve.agents import check_agent, load_agent
from motus.serve.auth import ApiKeys
from motus.serve.interrupt import Interrupt, Result
from motus.serve.pool import CANCELLED, PoolClosed, Turn, WorkerPool
from motus.serve.sessions import (
    NOT_WAITING,
    InterruptNotPending,
    PendingInterrupt,
    ServerUnavailable,
    SessionStatus,
    SessionStore,
)
from motus.serve.webhooks import WebhookSender

log = logging.getLogger(__name__)

#: Request bodies above this are refused with 413 (resume values fit with room to spare).
DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024
#: A long poll never waits longer than this, whatever ``timeout`` it asks for.
DEFAULT_MAX_WAIT_SECONDS = 300.0
#: One turn may wait on at most this many interrupts at once.
DEFAULT_MAX_INTERRUPTS = 64


class AgentServer:
    """Serve one agent over HTTP.

    ``agent`` is an import path ``"module:attr"`` (preferred: workers preload the module) or
    the agent object itself (it must then be picklable, e.g. a module-level function).
    """

    def __init__(
        self,
        agent: Any,
        max_workers: int = 0,
        ttl: float = 0,
        timeout: float = 0,
        max_sessions: int = 0,
        shutdown_timeout: float = 0,
        allow_custom_ids: bool = False,
        ui: bool = True,
        warm_workers: int | None = None,
        api_keys: ApiKeys | list[str] | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_wait: float = DEFAULT_MAX_WAIT_SECONDS,
        max_interrupts: int = DEFAULT_MAX_INTERRUPTS,
        max_waiters: int = 0,
    ) -> None:
        if isinstance(agent, str):
            load_agent(agent)  # a bad path is a clear error now, not at the first turn
            self.agent_path: str | None = agent
            self._agent_obj = None
        else:
            check_agent(agent)
            self.agent_path = None
            self._agent_obj = agent
        self.max_workers = max_workers or (os.cpu_count() or 1)
        self.ttl = ttl
        self.timeout = timeout
        self.shutdown_timeout = shutdown_timeout
        self.allow_custom_ids = allow_custom_ids
        self.ui = ui
        self.warm_workers = warm_workers
        self.api_keys = api_keys if isinstance(api_keys, ApiKeys) else ApiKeys.from_sources(api_keys or ())
        self.max_request_bytes = max_request_bytes
        self.max_wait = max_wait
        self.max_interrupts = max_interrupts
        # Long polls each hold a request thread; past this many at once, a poll answers at
        # once with the current state instead of waiting, so polls can never starve the
        # threads that resumes and health checks need. 0 = no cap.
        self.waiters = threading.BoundedSemaphore(max_waiters) if max_waiters else None
        self.store = SessionStore(max_sessions=max_sessions, ttl=ttl)
        self.webhooks = WebhookSender()
        self._turn_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._pool: WorkerPool | None = None
        self._started_pid: int | None = None
        self._stopping = threading.Event()
        self._stopped = False
        self._housekeeper: threading.Thread | None = None
        self._app: Flask | None = None

    # -- lifecycle ------------------------------------------------------------------

    @property
    def app(self) -> Flask:
        """The WSGI app (created once; creating it starts nothing)."""
        if self._app is None:
            from motus.serve.app import create_app

            self._app = create_app(self)
        return self._app

    @property
    def pool(self) -> WorkerPool:
        return self.start()

    def start(self) -> WorkerPool:
        """Start the pool and housekeeping in this process (idempotent, thread-safe)."""
        with self._start_lock:
            if self._pool is not None:
                if self._started_pid != os.getpid():
                    raise RuntimeError("AgentServer was started in another process; create it after forking")
                return self._pool
            if self._stopped:
                raise PoolClosed("Server is shutting down")
            self._claim_process()
            pool = WorkerPool(
                listener=self,
                agent_path=self.agent_path,
                agent_obj=self._agent_obj,
                max_workers=self.max_workers,
                timeout=self.timeout,
                warm=self.warm_workers,
                max_interrupts=self.max_interrupts,
            )
            _raise_open_file_limit()
            pool.start()
            self._pool = pool
            self._started_pid = os.getpid()
            if self.ttl:
                self._housekeeper = threading.Thread(target=self._sweep_loop, name="motus-ttl-sweeper", daemon=True)
                self._housekeeper.start()
            atexit.register(self.shutdown)
            log.info("serving %s with %d worker slots", self.agent_path or self._agent_obj, self.max_workers)
            return pool

    @staticmethod
    def _claim_process() -> None:
        """Under gunicorn, make sure this is the only worker serving these sessions."""
        if "gunicorn" not in sys.modules:
            return
        from motus.serve.gunicorn_app import claim_single_worker

        try:
            claim_single_worker()
        except RuntimeError as exc:
            log.error("%s", exc)
            raise ServerUnavailable(str(exc)) from None

    def begin_shutdown(self) -> None:
        """Release long polls and refuse new work at once (safe to call from any thread)."""
        self._stopping.set()
        self.store.close()

    def shutdown(self) -> None:
        """Stop: in-flight turns get ``shutdown_timeout`` seconds (0 = as long as they need);
        turns waiting on a human are cancelled at once, since nobody can resume them any more.
        Idempotent."""
        self.begin_shutdown()
        with self._start_lock:
            self._stopped = True
            pool = self._pool
        if pool is not None and self._started_pid == os.getpid():
            pool.shutdown(self.shutdown_timeout)
        if self._housekeeper is not None:
            self._housekeeper.join()
        self.webhooks.close()
        atexit.unregister(self.shutdown)

    def _sweep_loop(self) -> None:
        interval = min(max(self.ttl / 4, 0.05), 5.0)
        while not self._stopping.wait(interval):
            try:
                removed = self.store.sweep()
            except Exception:
                log.exception("TTL sweep failed")
                continue
            if removed:
                log.info("TTL sweep removed %d idle or errored sessions", len(removed))

    # -- operations used by the views -------------------------------------------------

    def health(self) -> dict[str, Any]:
        running = self._pool.running_count() if self._pool is not None else 0
        return {
            "status": "ok",
            "max_workers": self.max_workers,
            "running_workers": running,
            "total_sessions": len(self.store),
        }

    def send_message(self, session_id: str, message: dict[str, Any], webhook: dict[str, Any] | None) -> None:
        pool = self.pool
        with self._turn_lock:
            turn_id, state = self.store.start_turn(session_id, message, webhook)
            try:
                sends = pool.submit(session_id, turn_id, message, state)
            except PoolClosed:
                self.store.fail_turn(session_id, turn_id, CANCELLED)
                raise
        pool.deliver(sends)  # never under _turn_lock: a send may block on a slow worker

    def resume(self, session_id: str, interrupt_id: str, value: Any) -> SessionStatus:
        """Deliver one resume; returns the status it left the session in (``running`` once
        every pending interrupt is resolved, else ``interrupted``), whatever happened since."""
        pool = self.pool
        with self._turn_lock:
            turn_id, all_resolved = self.store.take_interrupt(session_id, interrupt_id)
            sends = pool.resume(session_id, turn_id, interrupt_id, value, unpark=all_resolved)
            if sends is None:
                self.store.retire_interrupt(session_id, interrupt_id, "its worker had already ended")
        if sends is None:
            raise InterruptNotPending(f"{NOT_WAITING}: the worker of interrupt {interrupt_id} has ended")
        pool.deliver(sends)
        return SessionStatus.RUNNING if all_resolved else SessionStatus.INTERRUPTED

    def delete(self, session_id: str) -> None:
        with self._turn_lock:
            live_turn = self.store.delete(session_id)
            sends = self._pool.cancel(session_id, live_turn) if live_turn is not None and self._pool is not None else []
        if sends and self._pool is not None:
            self._pool.deliver(sends)

    # -- TurnListener (the pool's manager thread) --------------------------------------

    def turn_interrupted(self, turn: Turn, interrupt: Interrupt) -> None:
        pending = PendingInterrupt(interrupt_id=interrupt.interrupt_id, payload=interrupt.payload)
        with self._turn_lock:
            became = self.store.interrupt_turn(turn.session_id, turn.turn_id, pending)
            sends = self._pool.park(turn.session_id, turn.turn_id) if became and self._pool is not None else []
        if sends and self._pool is not None:
            self._pool.deliver(sends)

    def turn_completed(self, turn: Turn, result: Result) -> None:
        end = self.store.complete_turn(turn.session_id, turn.turn_id, result.response, result.state)
        if end is not None:
            self.webhooks.send(end)

    def turn_failed(self, turn: Turn, error: str) -> None:
        end = self.store.fail_turn(turn.session_id, turn.turn_id, error)
        if end is not None:
            if end.status is SessionStatus.ERROR:
                log.info("turn %s of session %s failed: %s", turn.turn_id, turn.session_id, _last_line(error))
            self.webhooks.send(end)

    # -- running it -------------------------------------------------------------------

    def run(self, host: str = "127.0.0.1", port: int = 8000, threads: int = 128) -> None:
        """Serve with gunicorn (one process, ``threads`` request threads) until stopped."""
        from motus.serve.gunicorn_app import run_gunicorn

        run_gunicorn(lambda: self, host=host, port=port, threads=threads, shutdown_timeout=self.shutdown_timeout)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def _raise_open_file_limit() -> None:
    """Each live turn holds two descriptors (its pipe and its process sentinel) in this
    process, so hundreds of sessions waiting on a human need more than the usual soft limit
    of 1024. Raise the soft limit to the hard limit; failing that, keep what we have."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open file limit from %s: %s", soft, exc)
