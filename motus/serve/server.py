"""``AgentServer``: configuration and lifecycle. The turns themselves live in ``turns.py``.

It owns one ``Store`` (``--store``), one ``Events``, one ``Turns`` (every session and the
state machine of its turn), one ``WorkerPool`` and one ``WebhookSender``. Nothing starts in
``__init__``: the store is opened, sessions are recovered from it, and the pool, its threads
and the fork server start in ``start()``, called eagerly by the process that serves (after
gunicorn forks its worker) or lazily by the first request, never in a process that merely
imports the app.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
import threading
from typing import Any

from flask import Flask

from motus.serve.agents import agent_blob, check_agent, load_agent
from motus.serve.auth import ENV_VAR as API_KEY_ENV_VAR
from motus.serve.auth import ApiKeys, is_loopback
from motus.serve.policy import ApprovalPolicy, load_policy
from motus.serve.config import BY_NAME, DEFAULTS, DURABLE_PARK_AFTER, PARK_BY_STORE, default_live_turns, stream_budget, waiter_budget
from motus.serve.errors import ServerUnavailable
from motus.serve.events import Events
from motus.serve.metrics import ServerMetrics
from motus.serve.pool import PoolClosed, WorkerPool
from motus.serve.processes import WORKER_PROCESS_NAME, WORKER_WITH_MAIN_NAME
from motus.serve.store import SharedStore, Store, StoreError, default_store_url, store_from_url
from motus.serve.streams import StreamSlots
from motus.serve.turns import Answered, SessionStatus, Turns
from motus.serve.webhooks import SECRET_ENV_VAR as WEBHOOK_SECRET_ENV_VAR
from motus.serve.webhooks import WebhookSender

log = logging.getLogger(__name__)

# The defaults are the settings table's (``motus.serve.config``), so ``AgentServer(agent)``
# serves as ``motus serve start agent`` does with no flags. These names stay for importers.
#: Request bodies above this are refused with 413 (resume values fit with room to spare).
DEFAULT_MAX_REQUEST_BYTES: int = DEFAULTS["max_request_bytes"]
#: A long poll never waits longer than this, whatever ``timeout`` it asks for.
DEFAULT_MAX_WAIT_SECONDS: float = DEFAULTS["max_wait"]
#: One turn may wait on at most this many interrupts at once.
DEFAULT_MAX_INTERRUPTS: int = DEFAULTS["max_interrupts"]
#: How long running turns may take to finish when the server stops.
DEFAULT_SHUTDOWN_TIMEOUT: float = DEFAULTS["shutdown_timeout"]
#: The store URL's environment variable (``--store``'s default), kept from agents.
STORE_ENV_VAR = BY_NAME["store"].env_var
#: With a durable store, a turn waiting on a person is parked after this many seconds.
DEFAULT_PARK_AFTER = DURABLE_PARK_AFTER
#: Event streams open at once (each holds a request thread; the CLI has 128 by default).
DEFAULT_MAX_STREAMS: int = DEFAULTS["max_streams"]


class AgentServer:
    """Serve one agent over HTTP.

    ``agent`` (or ``agent_fn``, the reference product's name for it) is an import path
    ``"module:attr"`` (preferred: workers preload the module) or the agent object itself,
    which must then pickle: a function must be a module-level ``def``, and anything else is
    a ``ValueError`` here, never a turn that cannot start (see ``agents.agent_blob``).
    ``store`` is a store URL (``memory``, ``sqlite:///PATH``) or a ``Store``; the default is
    ``sqlite:///.motus/<module>.<attr>.sqlite3`` for an import path, memory for an object.
    ``park_after``: seconds a turn waits on a person before its process is ended (``None``
    = never); the default is 30 s with a durable store and never with ``memory``.
    ``max_live_turns``: turns waiting on a person that keep their process; past it the
    longest-waiting park at once (a burst of approvals costs rows, not a process each); 0 =
    no budget; the default is ``default_live_turns(max_workers)``. Only where turns park.
    ``threads``: the request threads it is served with; event streams get at most
    ``max_streams`` of them and long polls what is left (``max_waiters``, unless given; 0 =
    no cap), keeping ``config.RESERVED_THREADS`` for resumes and health checks; those
    budgets bound only waits that hold a thread: served by ``MotusWorker``, up to
    ``max_waiting`` waiting long polls and streams are held without one (``waiting.py``). Every
    default is the settings table's (``motus.serve.config``): ``AgentServer(agent)`` serves
    as ``motus serve start agent`` with no flags does.
    """

    def __init__(
        self,
        agent: Any = None,
        max_workers: int = DEFAULTS["workers"],
        ttl: float = DEFAULTS["ttl"],
        timeout: float = DEFAULTS["timeout"],
        max_sessions: int = DEFAULTS["max_sessions"],
        session_cache: int = DEFAULTS["session_cache"],
        shutdown_timeout: float = DEFAULTS["shutdown_timeout"],
        allow_custom_ids: bool = DEFAULTS["allow_custom_ids"],
        ui: bool = DEFAULTS["ui"],
        warm_workers: int | None = None,
        api_keys: ApiKeys | list[str] | None = None,
        max_request_bytes: int = DEFAULTS["max_request_bytes"],
        max_wait: float = DEFAULTS["max_wait"],
        max_interrupts: int = DEFAULTS["max_interrupts"],
        max_waiters: int | None = None,
        store: str | Store | None = DEFAULTS["store"],
        park_after: float | None | str = DEFAULTS["park_after"],
        max_live_turns: int | None = DEFAULTS["max_live_turns"],
        lease_seconds: float = DEFAULTS["lease_seconds"],
        host: str = DEFAULTS["host"],
        allowed_hosts: list[str] | None = None,
        webhook_allow: list[str] | None = None,
        agent_fn: Any = None,
        max_streams: int = DEFAULTS["max_streams"],
        max_waiting: int = DEFAULTS["max_waiting"],
        webhook_secret: str | None = DEFAULTS["webhook_secret"],
        metrics_port: int | None = DEFAULTS["metrics_port"],
        threads: int = DEFAULTS["threads"],
        approval_policy: str | ApprovalPolicy | None = DEFAULTS["approval_policy"],
    ) -> None:
        agent = _one_agent(agent, agent_fn)
        self._agent_blob: bytes | None = None
        if isinstance(agent, str):
            load_agent(agent)  # a bad path is a clear error now, not at the first turn
            self.agent_path: str | None = agent
            self._agent_obj = None
        else:
            check_agent(agent)
            self._agent_blob = agent_blob(agent)  # ValueError now if no worker could load it
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
        self._streams_wanted = max_streams
        self._waiters_wanted = max_waiters
        self.max_waiting = max_waiting
        self._share_threads(threads)
        if store is None:
            store = default_store_url(self.agent_path)
        self.store: Store = store_from_url(store) if isinstance(store, str) else store
        if isinstance(self.store, SharedStore):
            self.store.lease_seconds = lease_seconds
        if park_after == PARK_BY_STORE:
            park_after = DEFAULT_PARK_AFTER if self.store.durable else None
        self.park_after: float | None = park_after  # type: ignore[assignment]
        if max_live_turns is None:
            max_live_turns = default_live_turns(self.max_workers)
        self.max_live_turns = max_live_turns
        self.events = Events()
        #: The address the server is bound to: a loopback-bound server accepts only loopback
        #: Host names (plus ``allowed_hosts``), and its webhooks may reach private networks.
        self.host = host
        self.allowed_hosts = list(allowed_hosts or ())
        self.webhook_allow = list(webhook_allow or ())
        # Reachable from elsewhere: bound beyond loopback, or named with --allowed-host (the
        # README's reverse-proxy setup binds to loopback): then webhooks may not reach
        # loopback or private services unless --webhook-allow says so.
        exposed = not is_loopback(host) or bool(self.allowed_hosts)
        self.webhooks = WebhookSender(allow=self.webhook_allow, exposed=exposed, secret=webhook_secret)
        #: The operator's approval policy file, read once (``motus.serve.policy``).
        self.approval_policy = (
            approval_policy if isinstance(approval_policy, ApprovalPolicy) or not approval_policy
            else load_policy(approval_policy, self.api_keys.writers if self.api_keys else None)
        )
        self.turns = Turns(
            self.store,
            self.events,
            max_workers=self.max_workers,
            timeout=timeout,
            park_after=self.park_after,
            max_live_turns=self.max_live_turns,
            max_sessions=max_sessions,
            session_cache=session_cache,
            ttl=ttl,
            max_interrupts=max_interrupts,
            on_end=self.webhooks.send,
            approval_policy=self.approval_policy,
            key_roles=self.api_keys.writers if self.api_keys else None,
        )
        #: Prometheus metrics (``GET /metrics``; with ``metrics_port``, also served there
        #: without an API key, on ``host``, from ``start()``).
        self.metrics = ServerMetrics(self)
        self.metrics.instrument_store(self.store)
        self.turns.metrics = self.webhooks.metrics = self.metrics
        self.metrics_port = metrics_port
        self._start_lock = threading.Lock()
        self._pool: WorkerPool | None = None
        self._started_pid: int | None = None
        self._stopped = False
        self._app: Flask | None = None

    def _share_threads(self, threads: int) -> None:
        """Budget ``threads`` request threads. Long polls and event streams share them, and
        together must leave ``RESERVED_THREADS`` for resumes and health checks: streams get up
        to ``max_streams``, long polls what remains (or ``max_waiters`` if it was given; 0 =
        no cap). Past that many at once, a poll answers at once with the current state
        instead of waiting, so polls can never starve the threads resumes need. Called before
        any request is served."""
        self.threads = threads
        streams = stream_budget(threads, self._streams_wanted)
        waiters = self._waiters_wanted if self._waiters_wanted is not None else waiter_budget(threads, streams)
        self.streams = StreamSlots(streams)
        self.waiters = threading.BoundedSemaphore(waiters) if waiters else None

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
        """Open the store, recover its sessions, start the pool and housekeeping in this
        process (idempotent, thread-safe). A store that cannot be opened is a
        ``StoreError`` (the CLI checks it before serving, so this is rare)."""
        with self._start_lock:
            if self._pool is not None:
                if self._started_pid != os.getpid():
                    raise RuntimeError("AgentServer was started in another process; create it after forking")
                return self._pool
            if self._stopped:
                raise PoolClosed("Server is shutting down")
            self._claim_process()
            try:
                self.store.open()
            except StoreError as exc:
                log.error("%s", exc)
                raise ServerUnavailable(str(exc)) from None
            replays = self.turns.recover()
            # The keys were read when this server was built. Agents must not see them: a
            # tool that prints its environment would leak what approves tool calls. Worker
            # processes inherit this process' environment through the fork server, which
            # the pool below starts.
            os.environ.pop(API_KEY_ENV_VAR, None)
            os.environ.pop(WEBHOOK_SECRET_ENV_VAR, None)
            os.environ.pop(STORE_ENV_VAR, None)  # a database URL with its password: whoever writes there answers interrupts
            pool = WorkerPool(
                listener=self.turns,
                agent_path=self.agent_path,
                agent_blob=self._agent_blob,
                warm=self.warm_workers if self.warm_workers is not None else min(2 * self.max_workers, 16),
                busy=self.turns.busy,
                metrics=self.metrics,
            )
            _raise_open_file_limit()
            pool.start()
            self._pool = pool
            self._started_pid = os.getpid()
            self.turns.start(pool)
            if self.metrics_port is not None:
                self.metrics.serve(self.host, self.metrics_port)
            atexit.register(self.shutdown)
            log.info(
                "serving %s with %d worker slots, store %s (%d sessions, %d turns to replay)",
                self.agent_path or self._agent_obj, self.max_workers, self.store.url, len(self.turns), replays,
            )
            if self.api_keys:
                # Names and roles, never secrets: how each key was read is visible at a glance.
                log.info("API keys: %s", self.api_keys.describe())
            return pool

    @staticmethod
    def _claim_process() -> None:
        """Under gunicorn, make sure this is the only worker serving these sessions."""
        if "gunicorn" not in sys.modules:
            return
        from motus.serve.gunicorn import claim_single_worker

        try:
            claim_single_worker()
        except RuntimeError as exc:
            log.error("%s", exc)
            raise ServerUnavailable(str(exc)) from None

    def begin_shutdown(self) -> None:
        """Release long polls and refuse new work at once (safe to call from any thread)."""
        self.turns.begin_shutdown()

    def hurry_shutdown(self) -> None:
        """A quick stop: running turns are not waited for (see ``Turns.hurry``). Safe from a
        signal handler."""
        self.turns.hurry()

    def shutdown(self) -> None:
        """Stop. Turns waiting on a person are parked in a durable store (cancelled with
        ``memory``); running turns get ``shutdown_timeout`` seconds, then are left to be
        replayed at the next start (cancelled with ``memory``). Idempotent."""
        self.begin_shutdown()
        with self._start_lock:
            self._stopped = True
            pool = self._pool
        if pool is not None and self._started_pid == os.getpid():
            self.turns.shutdown(self.shutdown_timeout)
            pool.shutdown()
            self.store.close()
        self.webhooks.close()
        self.metrics.close()
        atexit.unregister(self.shutdown)

    # -- operations used by the views -------------------------------------------------

    def health(self) -> dict[str, Any]:
        counts = self.turns.counts()
        return {
            "status": "ok",
            "max_workers": self.max_workers,
            "running_workers": counts["running_workers"],
            "total_sessions": len(self.turns),
            "store": self.store.kind,
            "live_turns": counts["live_turns"],
            "parked_turns": counts["parked_turns"],
            "open_streams": self.streams.open,
        }

    def send_message(
        self, session_id: str, message: dict[str, Any], webhook: dict[str, Any] | None, by: str | None = None
    ) -> None:
        self.start()
        self.turns.start_turn(session_id, message, webhook, by=by)

    def resume(
        self, session_id: str, interrupt_id: str, value: Any, by: str = "anonymous", roles: frozenset[str] = frozenset()
    ) -> SessionStatus:
        return self.answer(session_id, interrupt_id, value, by=by, roles=roles).status

    def answer(
        self, session_id: str, interrupt_id: str, value: Any, by: str = "anonymous", roles: frozenset[str] = frozenset()
    ) -> Answered:
        """``resume``, saying also where a quorum of approvals stands after it."""
        self.start()
        return self.turns.answer(session_id, interrupt_id, value, by=by, roles=roles)

    def delete(self, session_id: str) -> None:
        self.turns.delete(session_id)

    # -- running it -------------------------------------------------------------------

    def run(
        self,
        host: str | None = None,
        port: int = DEFAULTS["port"],
        threads: int | None = None,
        log_level: str = DEFAULTS["log_level"],
        read_timeout: float = DEFAULTS["read_timeout"],
        log_format: str = DEFAULTS["log_format"],
    ) -> None:
        """Serve with gunicorn (one process, ``threads`` request threads) until stopped;
        ``host`` and ``threads`` default to the server's own (other ``threads`` re-budget
        long polls and event streams as ``--threads`` does)."""
        from motus.serve.gunicorn import run_gunicorn

        if multiprocessing.current_process().name in (WORKER_PROCESS_NAME, WORKER_WITH_MAIN_NAME):
            # The workers of an agent defined in the main script run that script again; an
            # unguarded run() there would start a second server inside a worker.
            raise RuntimeError(
                "AgentServer.run() was called inside a worker process: worker processes run the "
                "main script again, so start the server under 'if __name__ == \"__main__\":'"
            )

        if threads is not None and threads != self.threads:
            self._share_threads(threads)  # as --threads would have
        run_gunicorn(
            lambda: self,
            host=self.host if host is None else host,
            port=port,
            threads=self.threads,
            shutdown_timeout=self.shutdown_timeout,
            log_level=log_level,
            read_timeout=read_timeout,
            log_format=log_format,
        )


def _one_agent(agent: Any, agent_fn: Any) -> Any:
    """``AgentServer(agent)``, ``AgentServer(agent=...)`` or ``AgentServer(agent_fn=...)``."""
    if agent is not None and agent_fn is not None:
        raise TypeError("AgentServer() takes the agent once: pass agent or agent_fn, not both")
    if agent is None and agent_fn is None:
        raise TypeError("AgentServer() needs an agent: pass agent_fn=<function or 'module:attr'> (or agent=)")
    return agent if agent is not None else agent_fn


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
