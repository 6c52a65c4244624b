"""Sessions: the state machine every client drives, and the in-memory store that holds them.

::

    idle ──start_turn── running ──┬── complete_turn ──▶ idle
     ▲                    ▲       ├── interrupt_turn ──▶ interrupted
     │                    │       └── fail_turn ──────▶ error ──start_turn──▶ running
     │                    └── take_interrupt (the last pending one) ── interrupted

Guarantees:

- Every transition is one method that checks the current state, changes it and calls
  ``notify_all()`` on the session's Condition while holding the store's lock, so a long
  poll (``wait``) wakes within milliseconds of any change. The lock is held only for the
  transition, never across I/O.
- Events from a worker carry the ``turn_id`` they belong to; an event for a turn that is no
  longer the session's live turn (it was deleted, timed out, or superseded) is ignored and
  reported as stale, so a late worker message can never resurrect or corrupt a session.
- An interrupt id is pending exactly once: ``take_interrupt`` removes it, so a second resume
  of the same id is a 404, whatever the session's status.
- TTL sweeps remove only ``idle`` and ``error`` sessions. "Touched" means written to (created,
  a turn started, interrupted, resumed or ended): reading a session, or long-polling it, does
  not keep an abandoned session alive.

Thread ownership: request threads (create, get, wait, delete, start_turn, take_interrupt),
the pool's reader thread (interrupt_turn, complete_turn, fail_turn) and the housekeeping
thread (sweep) all go through this module; all ``Session`` attributes are guarded by
``SessionStore._lock`` and are never handed out: readers get immutable ``SessionView``
copies.

The store's interface (create, get, list, delete, transitions, sweep) is deliberately small
so that a durable backend can replace it without touching the views or the pool.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

#: How many no-longer-pending interrupt ids a session remembers, to explain a 404.
RETIRED_INTERRUPTS_KEPT = 256

NOT_WAITING = "Session not actively waiting for resume"


class SessionStatus(str, Enum):
    IDLE = "idle"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class ServeError(Exception):
    """A domain error with the HTTP status and the ``detail`` a client should see."""

    status_code = 400

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class SessionNotFound(ServeError):
    status_code = 404

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id} not found")


class SessionConflict(ServeError):
    status_code = 409


class ServerUnavailable(ServeError):
    """503: the server cannot take this now (session limit, shutting down)."""

    status_code = 503


class SessionLimitReached(ServerUnavailable):
    pass


class InterruptNotPending(ServeError):
    status_code = 404


@dataclass(frozen=True)
class PendingInterrupt:
    interrupt_id: str
    payload: dict[str, Any]

    @property
    def type(self) -> str:
        value = self.payload.get("type")
        return value if isinstance(value, str) else "unknown"


@dataclass(frozen=True)
class SessionView:
    """An immutable snapshot of a session, safe to use outside the lock."""

    session_id: str
    status: SessionStatus
    response: dict[str, Any] | None
    error: str | None
    interrupts: tuple[PendingInterrupt, ...]
    total_messages: int
    turn_id: int


@dataclass(frozen=True)
class TurnEnd:
    """What a finished turn leaves for the webhook, if the turn asked for one."""

    session_id: str
    status: SessionStatus
    response: dict[str, Any] | None
    error: str | None
    messages: list[dict[str, Any]]
    webhook: dict[str, Any] | None


@dataclass
class Session:
    session_id: str
    cond: threading.Condition
    touched: float
    status: SessionStatus = SessionStatus.IDLE
    state: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    error: str | None = None
    pending: dict[str, PendingInterrupt] = field(default_factory=dict)
    retired: OrderedDict[str, str] = field(default_factory=OrderedDict)
    turn_id: int = 0
    webhook: dict[str, Any] | None = None
    deleted: bool = False

    def view(self) -> SessionView:
        return SessionView(
            session_id=self.session_id,
            status=self.status,
            response=self.response,
            error=self.error,
            interrupts=tuple(self.pending.values()),
            total_messages=len(self.state),
            turn_id=self.turn_id,
        )

    def live_turn(self, turn_id: int) -> bool:
        return (
            not self.deleted
            and turn_id == self.turn_id
            and self.status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED)
        )

    def retire_pending(self, why: str) -> None:
        for interrupt_id in self.pending:
            self.retire(interrupt_id, why)
        self.pending.clear()

    def retire(self, interrupt_id: str, why: str) -> None:
        self.retired[interrupt_id] = why
        while len(self.retired) > RETIRED_INTERRUPTS_KEPT:
            self.retired.popitem(last=False)


class SessionStore:
    """All sessions of this server process, in memory.

    ``clock`` is ``time.monotonic`` by default; it is only used for TTL arithmetic.
    """

    def __init__(self, max_sessions: int = 0, ttl: float = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._closing = False

    # -- lookups -----------------------------------------------------------------------

    def _get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def get(self, session_id: str) -> SessionView:
        with self._lock:
            return self._get(session_id).view()

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._get(session_id).state)

    def list(self) -> list[SessionView]:
        with self._lock:
            return [session.view() for session in self._sessions.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def wait(self, session_id: str, timeout: float) -> SessionView:
        """Block until the session is not ``running`` or ``timeout`` seconds pass.

        Raises ``SessionNotFound`` if the session does not exist or is deleted meanwhile.
        Returns at once while the store is closing (server shutdown).
        """
        with self._lock:
            session = self._get(session_id)
            session.cond.wait_for(
                lambda: session.deleted or self._closing or session.status is not SessionStatus.RUNNING,
                timeout=timeout,
            )
            if session.deleted:
                raise SessionNotFound(session_id)
            return session.view()

    # -- lifecycle ---------------------------------------------------------------------

    def create(self, session_id: str | None = None, state: list[dict[str, Any]] | None = None) -> SessionView:
        with self._lock:
            if self._closing:
                raise ServerUnavailable("Server is shutting down")
            if session_id is not None and session_id in self._sessions:
                raise SessionConflict(f"Session {session_id} already exists")
            if self.max_sessions and len(self._sessions) >= self.max_sessions:
                raise SessionLimitReached(
                    f"Session limit reached ({self.max_sessions}); delete a session or raise --max-sessions"
                )
            session_id = session_id or str(uuid.uuid4())
            session = Session(
                session_id=session_id,
                cond=threading.Condition(self._lock),
                touched=self._clock(),
                state=list(state or []),
            )
            self._sessions[session_id] = session
            return session.view()

    def delete(self, session_id: str) -> int | None:
        """Remove the session; return its live turn id if a turn was running or interrupted."""
        with self._lock:
            session = self._get(session_id)
            live = session.turn_id if session.status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED) else None
            session.deleted = True
            session.retire_pending("the session was deleted")
            del self._sessions[session_id]
            session.cond.notify_all()
            return live

    def sweep(self) -> list[str]:
        """Remove idle and error sessions untouched for ``ttl`` seconds (no-op when ttl is 0)."""
        if not self.ttl:
            return []
        with self._lock:
            cutoff = self._clock() - self.ttl
            expired = [
                session
                for session in self._sessions.values()
                if session.status in (SessionStatus.IDLE, SessionStatus.ERROR) and session.touched <= cutoff
            ]
            for session in expired:
                session.deleted = True
                del self._sessions[session.session_id]
                session.cond.notify_all()
            return [session.session_id for session in expired]

    def close(self) -> None:
        """Shutdown: refuse new sessions and release every long poll at once."""
        with self._lock:
            self._closing = True
            for session in self._sessions.values():
                session.cond.notify_all()

    # -- turn transitions ----------------------------------------------------------------

    def start_turn(
        self, session_id: str, message: dict[str, Any], webhook: dict[str, Any] | None = None
    ) -> tuple[int, list[dict[str, Any]]]:
        """idle|error -> running. Returns the new turn id and the state the agent gets."""
        with self._lock:
            session = self._get(session_id)
            if session.status is SessionStatus.RUNNING:
                raise SessionConflict("Session is running; wait for the turn to finish or delete the session")
            if session.status is SessionStatus.INTERRUPTED:
                raise SessionConflict(
                    "Session is interrupted; resume its pending interrupts or delete the session"
                )
            if self._closing:
                raise ServerUnavailable("Server is shutting down")
            session.turn_id += 1
            session.status = SessionStatus.RUNNING
            session.response = None
            session.error = None
            session.webhook = webhook
            session.touched = self._clock()
            session.cond.notify_all()
            return session.turn_id, list(session.state)

    def interrupt_turn(self, session_id: str, turn_id: int, interrupt: PendingInterrupt) -> bool | None:
        """running|interrupted -> interrupted.

        Returns None for a stale turn, True if the session just became interrupted (the turn
        may give up its compute slot), False if it already was.
        """
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or not session.live_turn(turn_id):
                return None
            became = session.status is SessionStatus.RUNNING
            session.pending[interrupt.interrupt_id] = interrupt
            session.status = SessionStatus.INTERRUPTED
            session.touched = self._clock()
            session.cond.notify_all()
            return became

    def take_interrupt(self, session_id: str, interrupt_id: str) -> tuple[int, bool]:
        """Claim one pending interrupt for a resume.

        Returns ``(turn_id, all_resolved)``; when ``all_resolved`` the session is back to
        ``running``. Raises ``InterruptNotPending`` with a detail that says why otherwise.
        """
        with self._lock:
            session = self._get(session_id)
            session.touched = self._clock()
            if interrupt_id not in session.pending:
                raise InterruptNotPending(self._why_not_pending(session, interrupt_id))
            del session.pending[interrupt_id]
            session.retire(interrupt_id, "it was already resumed")
            all_resolved = not session.pending
            if all_resolved:
                session.status = SessionStatus.RUNNING
                session.cond.notify_all()
            return session.turn_id, all_resolved

    def retire_interrupt(self, session_id: str, interrupt_id: str, why: str) -> None:
        """Correct why an interrupt is no longer pending (its resume could not be delivered)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                session.retire(interrupt_id, why)

    @staticmethod
    def _why_not_pending(session: Session, interrupt_id: str) -> str:
        why = session.retired.get(interrupt_id)
        if session.status is not SessionStatus.INTERRUPTED:
            reason = f" (interrupt {interrupt_id}: {why})" if why else ""
            return f"{NOT_WAITING}{reason}"
        if why:
            return f"Interrupt {interrupt_id} is not pending: {why}"
        return f"Interrupt {interrupt_id} not found among the session's pending interrupts"

    def complete_turn(
        self, session_id: str, turn_id: int, response: dict[str, Any], state: list[dict[str, Any]]
    ) -> TurnEnd | None:
        """running|interrupted -> idle. Returns None for a stale turn."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or not session.live_turn(turn_id):
                return None
            session.retire_pending("its turn has already finished")
            session.status = SessionStatus.IDLE
            session.response = response
            session.state = list(state)
            return self._end(session)

    def fail_turn(self, session_id: str, turn_id: int, error: str) -> TurnEnd | None:
        """running|interrupted -> error; the state is left as it was. None for a stale turn."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or not session.live_turn(turn_id):
                return None
            lines = error.strip().splitlines()
            session.retire_pending(f"its turn ended with an error ({lines[-1] if lines else 'no message'})")
            session.status = SessionStatus.ERROR
            session.error = error
            return self._end(session)

    def _end(self, session: Session) -> TurnEnd:
        session.touched = self._clock()
        webhook, session.webhook = session.webhook, None
        session.cond.notify_all()
        return TurnEnd(
            session_id=session.session_id,
            status=session.status,
            response=session.response,
            error=session.error,
            messages=list(session.state),
            webhook=webhook,
        )
