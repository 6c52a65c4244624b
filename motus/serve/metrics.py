"""Prometheus metrics of one ``AgentServer``: ``GET /metrics`` (behind the API key when keys
are set) and, with ``--metrics-port``, a listener of its own.

Every server has its own ``CollectorRegistry`` (never the process-global one), so several
servers in one process (tests) count apart. Two kinds of metric:

- Events, counted where they happen (``Hooks``): turns started and ended, interrupts raised
  and answered, worker process starts, store operations, webhook deliveries, HTTP requests.
  A hook is a counter increment or a histogram observation: no I/O, and no lock but the
  metric's own. The parts of the server call the hooks of ``NO_METRICS`` (which do nothing)
  until the server hands them its ``ServerMetrics``.
- State, read when Prometheus scrapes (``_StateCollector``): sessions, live and parked
  turns, pending interrupts, compute slots, worker processes, long polls and event streams
  open. Nothing is kept in step on the hot path for these.

Names follow Prometheus' conventions: a ``motus_`` prefix, ``_total`` on counters, base
units (``_seconds``). No label takes a session id, a path or anything else a client
chooses: every label value comes from a fixed set.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

log = logging.getLogger(__name__)

#: How a turn ended (``motus_turns_ended_total{outcome}``).
TURN_OUTCOMES = ("idle", "error", "timeout", "cancelled", "exited", "deleted")
#: How an interrupt was answered (``motus_interrupt_wait_seconds{resolution}``).
RESOLUTIONS = ("resume", "timeout")
#: What became of a webhook (``motus_webhook_deliveries_total{outcome}``): delivered (2xx),
#: failed (refused, unreachable, timed out, not 2xx), dropped (never sent: queue full or
#: shutting down), error (an unexpected exception in the sender).
WEBHOOK_OUTCOMES = ("delivered", "failed", "dropped", "error")
#: Store methods timed by ``motus_store_operation_seconds{operation}``.
STORE_OPERATIONS = ("save", "save_entries", "delete", "events_after", "event_bounds", "audit")
#: HTTP methods counted by name; any other is counted as ``other``.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})

TURN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
HUMAN_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400, 86400)
START_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Hooks:
    """What the parts of a server report. These do nothing; ``ServerMetrics`` counts."""

    def turn_started(self) -> None:
        pass

    def turn_ended(self, outcome: str, seconds: float) -> None:
        pass

    def interrupt_raised(self) -> None:
        pass

    def interrupt_answered(self, resolution: str, seconds: float | None) -> None:
        pass

    def worker_started(self, seconds: float) -> None:
        pass

    def webhook(self, outcome: str) -> None:
        pass

    def long_poll(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def held_long_polls(self, delta: int) -> None:
        """Long polls the serving worker holds without a thread, more (or fewer) by ``delta``."""

    def request(self, method: str, endpoint: str | None, status: int, count: int = 1) -> None:
        pass


NO_METRICS = Hooks()


class ServerMetrics(Hooks):
    """The metrics of one server (``server`` is its ``AgentServer``, read at scrape time)."""

    def __init__(self, server: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        self.registry = CollectorRegistry()
        registry = self.registry
        self.turns_started = Counter("motus_turns_started_total", "Turns started (a message sent to a session).", registry=registry)
        self.turns_ended = Counter(
            "motus_turns_ended_total",
            "Turns ended, by outcome: idle (a response), error (the agent failed, or the store gave up), timeout "
            "(--timeout), cancelled (shutdown), exited (its process died), deleted (its session was deleted).",
            ["outcome"], registry=registry,
        )
        self.turn_duration = Histogram(
            "motus_turn_duration_seconds",
            "Seconds from a turn's start to its end, time waiting on people included, by outcome.",
            ["outcome"], buckets=TURN_BUCKETS, registry=registry,
        )
        self.interrupts_raised = Counter("motus_interrupts_total", "Interrupts raised by agents (each waits on a person).", registry=registry)
        self.interrupt_wait = Histogram(
            "motus_interrupt_wait_seconds",
            "Seconds from an interrupt being raised to its answer (the person's time), by resolution: resume, "
            "or timeout (it expired and took its default).",
            ["resolution"], buckets=HUMAN_BUCKETS, registry=registry,
        )
        self.worker_start = Histogram(
            "motus_worker_start_seconds",
            "Seconds to start one worker process (ahead of need: a warm process).",
            buckets=START_BUCKETS, registry=registry,
        )
        self.store_latency = Histogram(
            "motus_store_operation_seconds", "Seconds one session store operation took, by operation.",
            ["operation"], buckets=STORE_BUCKETS, registry=registry,
        )
        self.store_errors = Counter(
            "motus_store_errors_total", "Session store operations that raised, by operation.", ["operation"], registry=registry,
        )
        self.webhooks = Counter(
            "motus_webhook_deliveries_total",
            "Webhook deliveries, by outcome: delivered (2xx), failed (refused, unreachable, timed out or not 2xx), "
            "dropped (never sent: queue full or shutting down), error (unexpected).",
            ["outcome"], registry=registry,
        )
        self.long_polls = Gauge(
            "motus_long_polls_open", "Long polls waiting now (GET /sessions/{id}?wait=true, GET /interrupts?wait=true).",
            registry=registry,
        )
        self.requests = Counter(
            "motus_http_requests_total", "HTTP requests answered by the application, by method, endpoint and status.",
            ["method", "endpoint", "status"], registry=registry,
        )
        for outcome in TURN_OUTCOMES:
            self.turns_ended.labels(outcome)
        for resolution in RESOLUTIONS:
            self.interrupt_wait.labels(resolution)
        for outcome in WEBHOOK_OUTCOMES:
            self.webhooks.labels(outcome)
        self._ended = {outcome: (self.turns_ended.labels(outcome), self.turn_duration.labels(outcome)) for outcome in TURN_OUTCOMES}
        registry.register(_StateCollector(server))
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, resident memory... of the server process
        self._listener: tuple[Any, threading.Thread] | None = None
        self._request_children: dict[tuple[str, str | None, int], Any] = {}

    # -- hooks -----------------------------------------------------------------------------

    def turn_started(self) -> None:
        self.turns_started.inc()

    def turn_ended(self, outcome: str, seconds: float) -> None:
        counter, histogram = self._ended.get(outcome) or self._ended["error"]
        counter.inc()
        histogram.observe(max(0.0, seconds))

    def interrupt_raised(self) -> None:
        self.interrupts_raised.inc()

    def interrupt_answered(self, resolution: str, seconds: float | None) -> None:
        if seconds is not None:
            self.interrupt_wait.labels(resolution).observe(max(0.0, seconds))

    def worker_started(self, seconds: float) -> None:
        self.worker_start.observe(seconds)

    def webhook(self, outcome: str) -> None:
        self.webhooks.labels(outcome).inc()

    def long_poll(self) -> AbstractContextManager[Any]:
        return self.long_polls.track_inprogress()

    def held_long_polls(self, delta: int) -> None:
        self.long_polls.inc(delta)

    def request(self, method: str, endpoint: str | None, status: int, count: int = 1) -> None:
        key = (method, endpoint, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(method if method in HTTP_METHODS else "other", endpoint or "none", str(status))
            if method in HTTP_METHODS:  # a bounded set of keys: methods, endpoints and statuses are
                self._request_children[key] = child
        child.inc(count)

    # -- the store -------------------------------------------------------------------------

    def instrument_store(self, store: Any) -> None:
        """Time ``store``'s operations, every one of them a method of the ``Store`` interface
        (its bound methods are wrapped on the instance, so the store's own code is unchanged).
        Idempotent."""
        if getattr(store, "_motus_timed", False):
            return
        for name in STORE_OPERATIONS:
            setattr(store, name, _timed(getattr(store, name), self.store_latency.labels(name), self.store_errors.labels(name)))
        try:
            store._motus_timed = True
        except AttributeError:
            pass

    # -- exposition ------------------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The scrape body and its content type (OpenMetrics when the client asks for it)."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def serve(self, host: str, port: int) -> int | None:
        """Serve ``/metrics`` without authentication on ``host:port`` (a thread of its own);
        returns the port (useful with 0), or None (logged) when it cannot listen there: the
        agent server goes on without it."""
        from prometheus_client.exposition import start_wsgi_server

        try:
            httpd, thread = start_wsgi_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            log.error("cannot serve metrics on %s port %d: %s", host, port, exc.strerror or exc)
            return None
        thread.name = "motus-metrics"
        self._listener = (httpd, thread)
        bound = httpd.server_address[1]
        log.info("metrics: http://%s:%d/metrics (no API key asked)", f"[{host}]" if ":" in host else host, bound)
        return bound

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            httpd, thread = listener
            httpd.shutdown()
            httpd.server_close()
            thread.join(5)


def _timed(method: Callable[..., Any], histogram: Any, errors: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        except BaseException:
            errors.inc()
            raise
        finally:
            histogram.observe(time.perf_counter() - started)

    return timed


class _StateCollector:
    """Gauges read from the server when scraped (no bookkeeping on the hot path)."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def describe(self) -> list[Any]:
        return []  # collected only when scraped, never at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        server = self._server
        turns = server.turns
        counts = turns.counts()
        pending, parked = turns.interrupt_counts()
        yield _gauge(GaugeMetricFamily, "motus_sessions", "Sessions held by the server.", len(turns))
        yield _gauge(
            GaugeMetricFamily, "motus_sessions_in_memory",
            "Sessions held in memory: with a durable store at most --session-cache beyond those that must stay, the rest read from the store when used.",
            turns.in_memory(),
        )
        yield _gauge(GaugeMetricFamily, "motus_turns_live", "Turns not ended whose process is alive or about to be (queued, running, waiting, resuming).", counts["live_turns"])
        yield _gauge(GaugeMetricFamily, "motus_turns_parked", "Turns waiting on a person whose process was ended (--park-after); a resume replays them.", counts["parked_turns"])
        yield _gauge(GaugeMetricFamily, "motus_interrupts_pending", "Interrupts waiting on a person now (parked ones included).", pending)
        yield _gauge(GaugeMetricFamily, "motus_interrupts_parked", "Pending interrupts whose turn is parked.", parked)
        yield _gauge(GaugeMetricFamily, "motus_compute_slots", "Compute slots: turns that may run code at once (--workers).", server.max_workers)
        yield _gauge(GaugeMetricFamily, "motus_compute_slots_in_use", "Compute slots held by running turns.", counts["running_workers"])
        pool = server._pool
        stats = pool.stats() if pool is not None else {"processes": 0, "warm": 0}
        yield _gauge(GaugeMetricFamily, "motus_worker_processes", "Worker processes alive (warm spares included).", stats["processes"])
        yield _gauge(GaugeMetricFamily, "motus_worker_processes_warm", "Warm worker processes ready for a turn.", stats["warm"])
        yield _gauge(GaugeMetricFamily, "motus_event_streams_open", "Event streams (GET /events) open now.", server.streams.open)


def _gauge(family: Any, name: str, documentation: str, value: float) -> Any:
    return family(name, documentation, value=value)
