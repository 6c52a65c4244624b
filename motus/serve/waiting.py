"""Waiting without a thread: how a long poll or an event stream hands itself to the server
that serves it, and is handed back when there is something to say.

A long poll (``GET /sessions/{id}?wait=true``, ``GET /interrupts?wait=true``) or an event
stream spends nearly all its life waiting on ``Events``. Served by a plain WSGI server that
wait holds a request thread. A server that can hold a waiting request without a thread (the
gunicorn ``MotusWorker``) gives each request a ``Ticket`` for the thread serving it
(``serving``); ``Events`` then, instead of blocking, registers the ticket with the watch it
would have waited on and raises ``Parked``. The worker keeps the connection in its selector
until the ticket is woken (a ``publish`` of that key, the server closing) or its deadline
passes, then serves it on a thread again:

- a long poll is served again from the start, as the same request (GETs change nothing), and
  its wait ends at the deadline its first run set (``Ticket.deadline``), so a wake that finds
  nothing new parks it again for the time left. Serving it again costs a request's CPU, so a
  long poll that got one of the long-poll thread slots first waits on its thread for a
  moment (``Ticket.thread_until``): most turns end within it, and only longer waits park;
- an event stream is a response already under way: its body iterator (see ``streams``) is
  resumed where it parked, and what it yields is written to the same connection.

Guarantees: the check and the registration happen under the watch's Condition, like a
``wait``, so a publish between them is never missed; a ticket is woken at most once per
park (``wake`` after the first is a no-op until it parks again); without a ticket (any
other server, or past the worker's cap on held requests) everything waits on a thread as
before, so behaviour and API are the same either way.

Threads: a ticket is created and read by the worker's main loop and by the one request
thread serving it at a time; ``wake`` may be called from any thread (a publisher) and only
hands the ticket (with the others of one publish) to the worker's ``on_wake``, which must
be cheap and never block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_current = threading.local()


class Parked(BaseException):
    """Raised where a request would wait: the serving worker holds it until it is woken.

    A ``BaseException``, so that no ``except Exception`` on the way (Flask's error handlers,
    gunicorn's request handling) turns it into an error answer."""

    def __init__(self, ticket: "Ticket") -> None:
        super().__init__("parked")
        self.ticket = ticket


class Ticket:
    """One request a worker can hold without a thread.

    ``deadline`` (``time.monotonic()``) is set by the first wait that parks it and kept for
    the request's runs after; ``stream`` is the body of a parked event stream (None for a long
    poll). ``watch`` is where the ticket is registered while parked (owned by ``Events``)."""

    __slots__ = ("on_wake", "may_hold", "subject", "deadline", "thread_until", "stream", "watch", "events", "answered",
                 "_armed", "_lock", "__weakref__")

    def __init__(self, on_wake: Callable[[list["Ticket"]], None], may_hold: Callable[[], bool], subject: Any = None) -> None:
        #: Where woken tickets are handed back: a list of them, all of this holder's that one
        #: publish woke (``wake_all``); ``subject`` is whatever the holder needs back with
        #: each (the worker: the ticket's connection).
        self.on_wake = on_wake
        self.may_hold = may_hold
        self.subject = subject
        self.deadline: float | None = None
        #: Until when (``time.monotonic()``) the wait may block its thread before it parks:
        #: a wait that ends within it costs no second run (see ``app._take_waiter``).
        self.thread_until: float | None = None
        self.stream: Any = None
        self.watch: Any = None
        self.events: Any = None
        #: What the request log said of the answer once the request was answered
        #: (``motus.serve.logs.Answered``): the worker counts and logs a copy of it for each
        #: alike request it answers with the same bytes.
        self.answered: Any = None
        self._armed = False
        self._lock = threading.Lock()

    def arm(self) -> None:
        """About to park: the next ``wake`` counts."""
        with self._lock:
            self._armed = True

    def wake(self) -> None:
        """Any thread: hand the ticket back to its worker (once per park)."""
        wake_all([self])

    def disarm(self) -> bool:
        """The worker gives up the park (deadline, client gone, stop): later wakes do nothing.
        True if it was still armed (no wake is on its way)."""
        with self._lock:
            armed, self._armed = self._armed, False
        return armed

    def cancel(self) -> None:
        """The worker gives up the park: no wake counts any more, and the watch forgets it."""
        self.disarm()
        events = self.events
        if events is not None:
            events.forget(self)


def wake_all(tickets: list[Ticket]) -> None:
    """Any thread: ``wake`` each ticket, those of one holder handed over in one call (a
    publish that wakes thousands of waiters costs the worker one hand-over, not thousands)."""
    holders: dict[Callable[[list[Ticket]], None], list[Ticket]] = {}
    for ticket in tickets:
        if ticket.disarm():
            holders.setdefault(ticket.on_wake, []).append(ticket)
    for on_wake, woken in holders.items():
        on_wake(woken)


def current() -> Ticket | None:
    """The ticket of the request this thread serves, if its server can hold it."""
    return getattr(_current, "ticket", None)


def serving(ticket: Ticket | None) -> None:
    """Set (or, with None, clear) the ticket of the request this thread serves."""
    _current.ticket = ticket
