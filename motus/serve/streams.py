"""Server-sent events: ``GET /events`` and ``GET /sessions/{id}/events``.

Each event is one committed change, read back from the store's event log, so its ``id:`` is
the store's sequence number and a client that reconnects with ``Last-Event-ID`` (or
``?after=N``) gets every later event exactly once, in order, also across a server restart
with a durable store. Events are only ever read from the log, never handed over in memory,
so a stream cannot see a change a crash could take back (the change and its event are one
transaction).

What a stream sends::

    retry: 2000                                  (reconnect after 2 s)
    id: 41 / event: ready / data: {...}          (only when no Last-Event-ID was given: where "now" is)
    id: 42 / event: interrupt / data: {"session_id": ..., "interrupt_id": ..., ...}
    : keepalive                                  (a comment every KEEPALIVE_SECONDS)

Event kinds: ``status`` (``{"status"}``: idle, running, interrupted, error, deleted),
``interrupt`` (the interrupt as the inbox shows it), ``resolved`` (``interrupt_id``, ``by``,
``value``, ``reason``: resume or timeout), ``message`` (the turn's response), ``error``,
``grant`` and ``revoke``. A client that asks for events older than the log still keeps, or
after an id the log never issued (one from an earlier server life), gets a ``reset`` event
(reload the state, then carry on from its id). A session's stream ends after its ``deleted``
status; every stream ends when the server shuts down.

A stream that waits on a thread holds one, so at most ``--max-streams`` do at once (503
beyond), leaving the other threads to resumes and health checks. Served by ``MotusWorker``
a waiting stream holds no thread (``_Stream``, ``motus.serve.waiting``): it gives its slot
back at its first wait, and the worker holds up to ``--max-waiting`` of them.

Threads: a stream's body is iterated by one thread at a time: its request thread, or, once
parked, whichever thread the worker resumes it on; it waits on ``Events`` (woken by
``publish`` after each commit) and reads the store. The slot is released by ``close``,
which the WSGI server calls however the response ends (also when it was never iterated),
or at the first park.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from flask import Response

from motus.serve.errors import BadRequest, TooManyStreams
from motus.serve.events import ALL, isoformat
from motus.serve.store import Event
from motus.serve.waiting import Parked, Ticket, current

#: A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_SECONDS = 15.0
#: The client's reconnection delay, sent as ``retry:``.
RETRY_MILLISECONDS = 2000
#: Events read from the store at once.
BATCH = 200
#: While idle, a stream looks this often whether its client hung up, so a closed stream's
#: slot is free again within about this long rather than at the next keepalive.
PEER_CHECK_SECONDS = 2.0


def event_data(event: Event) -> dict[str, Any]:
    data: dict[str, Any] = {"session_id": event.session_id, "at": isoformat(event.at)}
    for key, value in event.data.items():
        data[key] = isoformat(value) if key in ("created_at", "expires_at") and isinstance(value, (int, float)) else value
    return data


def format_event(seq: int | None, kind: str, data: dict[str, Any]) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    # json.dumps never emits a raw newline, so the data is one line, as SSE requires.
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _cursor(last_event_id: str | None, after: str | None) -> int | None:
    raw = last_event_id if last_event_id not in (None, "") else after
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:  # isdigit alone takes "²", which int() refuses
        source = "Last-Event-ID header" if last_event_id not in (None, "") else "query parameter 'after'"
        raise BadRequest(f"The {source} must be an event id (a whole number >= 0), got {raw[:40]!r}")
    return int(text)


class StreamSlots:
    """``--max-streams``: streams holding a request thread (``on_threads``, capped) and all
    open streams (``open``, for /health and the metrics; a stream held by the worker without
    a thread counts there only). Counters rather than a semaphore so /health can show them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.on_threads = 0
        self._lock = threading.Lock()

    def take(self, held: bool = False) -> bool:
        """A new stream: ``held`` when its worker can hold it without a thread (no slot is
        taken then); otherwise a slot, if one is free."""
        with self._lock:
            if not held and not self._take_thread_locked():
                return False
            self.open += 1
            return True

    def take_thread(self) -> bool:
        """A held stream must wait on its thread after all (``--max-waiting`` reached)."""
        with self._lock:
            return self._take_thread_locked()

    def _take_thread_locked(self) -> bool:
        if self.limit and self.on_threads >= self.limit:
            return False
        self.on_threads += 1
        return True

    def off_thread(self) -> None:
        """A stream stopped holding a thread (its worker holds it now)."""
        with self._lock:
            self.on_threads -= 1

    def give(self, on_thread: bool = True) -> None:
        with self._lock:
            self.open -= 1
            if on_thread:
                self.on_threads -= 1


#: What ``_Stream._events`` yields where it would wait, when its server can hold it.
_PARK = object()


class _Stream:
    """The response body: an iterator whose ``close`` always gives the slot back.

    Served with a ticket (``waiting.current()``, under ``MotusWorker``), it does not wait on a
    thread: where it would, it registers the ticket with ``Events.hold`` and ``__next__``
    raises ``Parked``; the worker keeps the connection, sends the keepalives itself, and
    calls ``__next__`` again (on some thread) once woken. The first park gives the stream
    slot back (a held stream holds no thread, which is what the slots budget); from then on
    the worker owns the stream, and ends it with ``end`` (a ``close`` by the WSGI server
    while it is parked is the worker's hand-over, not the end)."""

    #: For the worker holding a parked stream: the comment it sends, and how often.
    keepalive = b": keepalive\n\n"
    keepalive_every = KEEPALIVE_SECONDS

    def __init__(
        self, server: Any, session_id: str | None, after: int | None, sock: socket.socket | None = None,
        ticket: Ticket | None = None, on_thread: bool = True,
    ) -> None:
        self.server = server
        self.sock = sock
        self.session_id = session_id
        self.after = after
        self.ticket = ticket
        self.parked = False
        self._on_thread = on_thread  # counts in the slots' ``on_threads``
        self._closed = False
        self._lock = threading.Lock()
        self._texts = self._events()
        if ticket is not None:
            ticket.stream = self

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        self.parked = False
        text = next(self._texts)
        if text is _PARK:
            assert self.ticket is not None
            self.parked = True
            with self._lock:
                first, self._on_thread = self._on_thread, False
            if first:
                self.server.streams.off_thread()  # the worker holds it now: no thread, no slot
            raise Parked(self.ticket)
        return text.encode("utf-8")

    def close(self) -> None:
        if self.parked:
            return  # handed to the worker, which calls ``end``
        self.end()

    def end(self) -> None:
        """The stream is over (any thread, once it is not being iterated)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            on_thread = self._on_thread
        self.parked = False
        self.server.streams.give(on_thread)
        self._texts.close()

    def _events(self) -> Iterator[Any]:
        store, events = self.server.store, self.server.events
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        oldest, newest = store.event_bounds()
        if self.after is None:
            last = newest
            yield format_event(newest, "ready", {"last_event_id": newest, "session_id": self.session_id})
        elif (oldest and self.after < oldest - 1) or self.after > newest:
            # Older than the log keeps, or newer than any id it issued (an id from an earlier
            # server life: a memory store starts again at 1): either way events were missed.
            last = newest
            why = (f"events after {self.after} are no longer kept (the oldest kept is {oldest})" if self.after <= newest
                   else f"event {self.after} was never issued by this server (the newest is {newest})")
            yield format_event(newest, "reset", {
                "reason": f"{why}; reload the state", "last_event_id": newest, "session_id": self.session_id,
            })
        else:
            last = self.after
        key = self.session_id or ALL
        while not self._closed:
            batch = store.events_after(last, self.session_id, BATCH)
            for event in batch:
                last = event.seq
                yield format_event(event.seq, event.kind, event_data(event))
                if self.session_id is not None and event.kind == "status" and event.data.get("status") == "deleted":
                    return
            if batch:
                continue
            if events.closing:
                return
            seen = last
            ticket = self.ticket
            if ticket is not None and ticket.may_hold():
                # Held by the worker until a publish of ``key`` (or the server closing); it
                # sends the keepalives meanwhile.
                if events.hold(key, lambda: store.events_after(seen, self.session_id, 1), ticket):
                    yield _PARK
                continue
            if not self._on_thread:
                # Past --max-waiting: this stream waits on its thread, if a slot is free;
                # otherwise it ends, and its client reconnects (``retry:``) to a 503 or a slot.
                if not self.server.streams.take_thread():
                    return
                with self._lock:
                    self._on_thread = True
            idle_until = time.monotonic() + KEEPALIVE_SECONDS
            woke = None
            while woke is None and not events.closing and time.monotonic() < idle_until:
                if _peer_gone(self.sock):
                    return
                slice_ = min(PEER_CHECK_SECONDS, max(0.0, idle_until - time.monotonic()))
                # On this thread even should a held place free meanwhile: parking raises
                # ``Parked`` out of this generator, which would end the stream.
                woke = events.wait(key, lambda: store.events_after(seen, self.session_id, 1) or None, slice_, may_park=False)
            if woke is None:
                if events.closing:
                    return
                yield ": keepalive\n\n"


def _peer_gone(sock: socket.socket | None) -> bool:
    """Whether the client closed its end (a read would return end-of-file). Only known
    under gunicorn, which hands the socket over; elsewhere the next write tells."""
    if sock is None:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: still there
    except OSError:
        return True  # reset, or already closed


def event_stream(
    server: Any, session_id: str | None, last_event_id: str | None, after: str | None, sock: socket.socket | None = None
) -> Response:
    """The ``text/event-stream`` response, or 503 when every stream slot is taken."""
    cursor = _cursor(last_event_id, after)
    ticket = current()
    held = ticket is not None and ticket.may_hold()
    if not server.streams.take(held=held):
        raise TooManyStreams(
            f"Too many open event streams ({server.streams.limit}, see --max-streams); close one, "
            "or long-poll GET /sessions/{id}?wait=true instead",
            headers={"Retry-After": "5"},
        )
    try:
        stream = _Stream(server, session_id, cursor, sock, ticket, on_thread=not held)
        # Passed through as it is, so that a park reaches the worker from ``__next__``.
        response = Response(stream, mimetype="text/event-stream", direct_passthrough=True)
    except BaseException:
        server.streams.give(not held)
        raise
    response.headers["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response
