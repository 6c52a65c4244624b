"""Turns: the one state machine of a turn, and the sessions that own them.

A turn's whole life is the ``state`` of one ``Turn``, changed only by ``Turn.move``, which
raises ``InvalidTransition`` on a move the diagram does not have (as
``concurrent.futures.Future`` does)::

                   compute slot                  Interrupt
    start ──▶ QUEUED ──────────▶ RUNNING ─────────────────────▶ WAITING ◀──┐ partial resume
                ▲                  ▲                       ▲   │  │  │ ────┘ (value sent now)
                │ last resume      │ compute slot          │   │  │  └── park-after ──▶ PARKED ◀─┐
                │ (replay)         │ (queued values sent)  │   │  │                       │  │   │ partial resume
                │                  └──────── RESUMING ◀────┼───┘  │ last resume           │  └───┘ (recorded only)
                │                                 │        │      ▼                       │
                │                                 └────────┘  (values wait for a slot)    │
                │                              Interrupt: queued values are sent at once  │
                └─────────────────────────────────────────────────────────────────────────┘

    any state but ENDED ── Result | Failure | process exit | delete | timeout | shutdown ──▶ ENDED

    Shared stores (several instances): ELSEWHERE ── adopted here ──▶ PARKED (waits on a person)
                                                               └──▶ QUEUED (replayed)

What each state holds: QUEUED nothing yet (waits for a slot; a new turn, or a replay);
RUNNING a compute slot and a process; WAITING and RESUMING a process but no slot; PARKED
neither, only rows in the store; ELSEWHERE is a turn another instance runs (this one sees
its rows, records answers to it, and takes it over only if that instance's lease lapses).
The session's public status follows: QUEUED, RUNNING and
RESUMING are ``running``; WAITING and PARKED are ``interrupted``.

Guarantees:

- Every change is committed to the store first, then applied to the working copy, then
  published (long polls wake), all under the session's own lock; a store failure is a 503
  that changed nothing. A lock per session: a slow commit on one session never holds up
  another's transition (the store itself may serialise its writes).
- A compute slot is held exactly while a turn is RUNNING. Slots are handed out by
  ``_dispatch``, which reserves a slot, then re-checks the turn under its session lock and
  gives the slot back if the turn moved on meanwhile; so a resume queued for a turn that
  interrupted again can never keep a slot (the deadlock of the first release).
- Messages from a process the turn no longer owns (a stopped, killed or replaced handle) are
  ignored: a late worker can never resurrect or corrupt a session.
- An interrupt id is pending exactly once; a second resume of it is a 404 that says why.
- A turn is parked only while it waits on a person and no gated tool of it is inside its
  body, so parking never turns an approved action into an "outcome unknown".
- Several instances on one shared store (PostgreSQL): the store is the truth and each
  instance's sessions are a cache of it. Every write names the row version it was based on
  and is refused (``StaleSession``) if another instance wrote first; the change is then
  decided again on the row as it is (``_attempt``). A request reads the row's version before
  it answers, so it sees whatever another instance acknowledged before it. A live turn runs
  on the instance that owns it (``Session.owner``); answers given elsewhere reach it through
  the store's listener (``_changed_elsewhere`` -> ``_refresh_locked``).

Thread ownership and lock order: ``Session`` fields and its ``Turn`` are guarded by
``Session.lock``; the sessions dict by ``_registry``; slots and the ready queue by
``_sched`` (never held while taking a session lock); timers by ``_timers``. Order: session
lock -> ``_registry`` | ``_sched`` | ``_timers`` -> pool lock. No pipe send, webhook, pool
launch or publish happens under a session lock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from motus.serve.errors import (
    GrantNotFound,
    InterruptNotPending,
    InvalidTransition,
    ServerUnavailable,
    StoreCannotTake,
    SessionConflict,
    SessionLimitReached,
    SessionNotFound,
)
from motus.serve.events import ALL, Events
from motus.serve.journal import canonical_payload, pack, unpack
from motus.serve.metrics import NO_METRICS, Hooks
from motus.serve.pool import Handle, PoolClosed, WorkerPool
from motus.serve.protocol import INTERRUPT, Ack, Failure, Interrupt, Job, JournalEntry, Record, Result, Resume, message_problem, resulting_state
from motus.serve.store import AuditRecord, Event, SessionRecord, SharedStore, StaleSession, Store, TurnRecord

log = logging.getLogger(__name__)

#: A turn whose outcome the server failed to apply (a bug, or a fault in a collaborator such
#: as a metrics hook): it ends with this rather than holding its slot for ever.
OUTCOME_FAILED = "Turn ended: the server could not apply its outcome (see the server log)"
#: The same for any other message of its worker (an interrupt, a journal record).
MESSAGE_FAILED = "Turn ended: the server could not apply a message from its worker (see the server log)"

T = TypeVar("T")

#: How many no-longer-pending interrupt ids a session remembers, to explain a 404.
RETIRED_INTERRUPTS_KEPT = 256
#: A waiting turn is parked only after its worker has said nothing for this long, so the
#: other interrupts of one ``asyncio.gather`` arrive before its process ends.
PARK_SETTLE_SECONDS = 0.1

#: How often a change refused by a shared store (the row changed meanwhile) is tried again.
STALE_RETRIES = 8

#: A worker message the store refused is tried again this often, and for this long.
STORE_RETRY_SECONDS = 0.5
STORE_GIVE_UP_SECONDS = 60.0
#: The housekeeper never sleeps longer than this at once (threading's own limit is lower
#: than an infinite --timeout or --park-after); it simply looks again.
MAX_TIMER_WAIT = 3600.0

NOT_WAITING = "Session not actively waiting for resume"
TIMED_OUT = "Agent timed out"
CANCELLED = "Turn cancelled"
EXITED = "Worker process exited unexpectedly"

#: How a turn ended, for metrics (``motus_turns_ended_total{outcome}``); any other error is "error".
_OUTCOMES: dict[str | None, str] = {None: "idle", TIMED_OUT: "timeout", CANCELLED: "cancelled", EXITED: "exited"}

#: Who resolved an interrupt that expired (``answered_by`` and the audit's ``by``).
BY_TIMEOUT = "timeout"
#: Why an answered interrupt cannot be resumed (in the 404's detail).
ALREADY_RESUMED = "it was already resumed"
EXPIRED = "it expired and was resolved with its default"
#: Who acted on a server without API keys.
ANONYMOUS = "anonymous"


class SessionStatus(str, Enum):
    IDLE = "idle"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class TurnState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    RESUMING = "resuming"
    PARKED = "parked"
    #: Shared stores: live on another instance, which runs it; here only its rows are seen.
    ELSEWHERE = "elsewhere"
    ENDED = "ended"


_MOVES: dict[TurnState, frozenset[TurnState]] = {
    TurnState.QUEUED: frozenset({TurnState.RUNNING, TurnState.ENDED}),
    TurnState.RUNNING: frozenset({TurnState.WAITING, TurnState.ENDED}),
    TurnState.WAITING: frozenset({TurnState.WAITING, TurnState.RESUMING, TurnState.PARKED, TurnState.ENDED}),
    TurnState.RESUMING: frozenset({TurnState.RUNNING, TurnState.WAITING, TurnState.ENDED}),
    TurnState.PARKED: frozenset({TurnState.PARKED, TurnState.QUEUED, TurnState.ENDED}),
    TurnState.ELSEWHERE: frozenset({TurnState.PARKED, TurnState.QUEUED, TurnState.ENDED}),
    TurnState.ENDED: frozenset(),
}
_PUBLIC = {
    TurnState.QUEUED: SessionStatus.RUNNING,
    TurnState.RUNNING: SessionStatus.RUNNING,
    TurnState.RESUMING: SessionStatus.RUNNING,
    TurnState.WAITING: SessionStatus.INTERRUPTED,
    TurnState.PARKED: SessionStatus.INTERRUPTED,
}


@dataclass(frozen=True)
class PendingInterrupt:
    interrupt_id: str
    payload: dict[str, Any]
    created_at: float | None = field(default=None, compare=False)  # wall clock
    expires_at: float | None = field(default=None, compare=False)  # wall clock

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
    """What a webhook is sent: a turn that ended, or (if its webhook asked for
    ``"interrupted"``) one that paused."""

    session_id: str
    status: SessionStatus
    response: dict[str, Any] | None
    error: str | None
    messages: list[dict[str, Any]]
    webhook: dict[str, Any] | None
    interrupts: list[dict[str, Any]] | None = None  # for an "interrupted" delivery


@dataclass(eq=False)
class Turn:
    """One turn of one session. Guarded by its session's lock."""

    session_id: str
    turn_id: int
    message: dict[str, Any]
    webhook: dict[str, Any] | None
    deadline: float | None  # wall clock
    journal: dict[int, JournalEntry] = field(default_factory=dict)
    state: TurnState = TurnState.QUEUED
    handle: Handle | None = None
    queued_values: list[Resume] = field(default_factory=list)
    last_heard: float = 0.0  # monotonic: the last message from its process
    backlog: deque[object] = field(default_factory=deque)  # worker messages the store has not taken yet
    backlog_since: float = 0.0  # monotonic
    grants: tuple[str, ...] = ()  # the session's grants when the turn started (replays see the same)
    started_at: float | None = None  # wall clock, for people (the live turn)
    started: float = field(default_factory=time.monotonic)  # for the turn duration metric

    def calls_in_flight(self) -> bool:
        """Whether a journaled call (a tool body, a step, a model request) has started and
        not finished, other than one waiting on a person through an interrupt inside it.
        Parking then would cut it short: it would run again on replay, or, for an approved
        gated tool, become "outcome unknown"."""
        waiting: set[int] = set()
        for entry in self.journal.values():
            if entry.kind == INTERRUPT and not entry.done:
                parent = entry.parent
                while parent is not None and parent not in waiting:
                    waiting.add(parent)
                    above = self.journal.get(parent)
                    parent = above.parent if above is not None else None
        return any(e.kind != INTERRUPT and not e.done and e.seq not in waiting for e in self.journal.values())

    def move(self, new: TurnState) -> bool:
        """Change state; returns True if that gave up a compute slot."""
        if new not in _MOVES[self.state]:
            raise InvalidTransition(f"turn {self.turn_id} of session {self.session_id}: {self.state.value} -> {new.value}")
        freed = self.state is TurnState.RUNNING and new is not TurnState.RUNNING
        self.state = new
        return freed

    def pending(self) -> list[JournalEntry]:
        return sorted((e for e in self.journal.values() if e.kind == INTERRUPT and not e.done), key=lambda e: e.seq)


    def record(self) -> TurnRecord:
        return TurnRecord(
            turn_id=self.turn_id, message=self.message, webhook=self.webhook, deadline=self.deadline, grants=self.grants,
            started_at=self.started_at,
        )


@dataclass(eq=False)
class Session:
    session_id: str
    touched: float  # wall clock of the last write
    status: SessionStatus = SessionStatus.IDLE
    state: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    error: str | None = None
    turn_id: int = 0
    turn: Turn | None = None
    retired: OrderedDict[str, str] = field(default_factory=OrderedDict)
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool name -> {"by", "at"}
    deleted: bool = False
    #: Shared stores: the stored row's version this copy was read at, the instance that
    #: runs its live turn, and whether another instance has changed the row since.
    version: int = 0
    owner: str | None = None
    stale: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self) -> SessionView:
        interrupts: tuple[PendingInterrupt, ...] = ()
        if self.turn is not None and self.status is SessionStatus.INTERRUPTED:
            interrupts = tuple(pending_interrupt(e) for e in self.turn.pending())
        return SessionView(
            session_id=self.session_id,
            status=self.status,
            response=self.response,
            error=self.error,
            interrupts=interrupts,
            total_messages=len(self.state),
            turn_id=self.turn_id,
        )

    def record(self, **changes: Any) -> SessionRecord:
        """The row this session would have with ``changes`` applied (nothing is changed).
        The history (``state``) is left out unless given: it changes only when a turn ends,
        and rewriting it on every interrupt and resume would cost as much as the history."""
        fields = {
            "session_id": self.session_id,
            "status": self.status.value,
            "state": None,
            "response": self.response,
            "error": self.error,
            "turn_id": self.turn_id,
            "touched": self.touched,
            "turn": self.turn.record() if self.turn is not None and self.turn.state is not TurnState.ENDED else None,
            "grants": self.grants,
            "version": self.version,
            "owner": self.owner,
        }
        fields.update(changes)
        if isinstance(fields["status"], SessionStatus):
            fields["status"] = fields["status"].value
        return SessionRecord(**fields)

    def event(self, kind: str, at: float, **data: Any) -> Event:
        return Event(session_id=self.session_id, kind=kind, data=data, at=at)

    def retire(self, interrupt_id: str, why: str) -> None:
        self.retired[interrupt_id] = why
        while len(self.retired) > RETIRED_INTERRUPTS_KEPT:
            self.retired.popitem(last=False)


@dataclass
class _After:
    """What to do once the session lock is released."""

    sends: list[tuple[Handle, object]] = field(default_factory=list)
    stop: list[Handle] = field(default_factory=list)
    kill: list[Handle] = field(default_factory=list)
    launch: list[Handle] = field(default_factory=list)
    ended: list[TurnEnd] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    freed: int = 0
    queued: list[Turn] = field(default_factory=list)
    publish: list[str] = field(default_factory=list)


class Turns:
    """All sessions of this server and the life of their turns (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        events: Events,
        max_workers: int,
        timeout: float = 0,
        park_after: float | None = None,
        max_sessions: int = 0,
        ttl: float = 0,
        max_interrupts: int = 0,
        on_end: Callable[[TurnEnd], None] = lambda end: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        #: The same store when several instances share it (its own methods), else None.
        self.shared: SharedStore | None = store if isinstance(store, SharedStore) else None
        self.events = events
        #: This instance's name in a shared store: the owner of the turns it runs.
        self.instance = self.shared.instance_id if self.shared is not None else "local"
        self.max_workers = max_workers
        self.timeout = timeout
        self.park_after = park_after
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.max_interrupts = max_interrupts
        self._on_end = on_end
        self._clock = clock
        self.pool: WorkerPool | None = None
        self._registry = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._sched = threading.Condition(threading.Lock())
        self._free_slots = max_workers
        self._ready: deque[Turn] = deque()  # may hold stale entries: _grant re-checks
        self._timers = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, str, Turn, int]] = []
        self._counter = itertools.count()
        self._closing = False
        self._stopped = False
        self._hurried = False  # a quick stop: running turns get no more of their grace
        self._draining_done = False  # the shutdown grace is over: no slot is handed out
        self._housekeeper: threading.Thread | None = None
        self.metrics: Hooks = NO_METRICS  # the server's metrics (see metrics.py)
        # Shared stores, housekeeping thread: whether the last lease renewal failed, and
        # until when (monotonic) no other instance's turn is taken over.
        self._lease_lost = False
        self._claim_after = 0.0

    # -- start and stop ------------------------------------------------------------------

    def recover(self) -> int:
        """Load every session from the store (before serving). Interrupted turns come back
        parked with the same interrupt ids; running ones are queued to be replayed.
        Returns how many turns will be replayed. On a shared store every live turn is first
        seen as another instance's: those whose instance is gone are taken over by
        ``start`` (``claim_orphans``), each by one instance."""
        for record in self.store.load():
            session = self._session_from(record)
            with self._registry:
                self._sessions[session.session_id] = session
        replays = 0
        if self.shared is None:
            after = _After()
            for session in self._all():
                if session.turn is not None:
                    self._adopt_locked(session, session.turn, after)
            self._ready.extend(after.queued)
            replays = len(after.queued)
        return replays

    def _session_from(self, record: SessionRecord) -> Session:
        """A working copy of a stored session; its live turn, if any, is another
        instance's (``ELSEWHERE``) until adopted."""
        session = Session(
            session_id=record.session_id,
            touched=record.touched,
            status=SessionStatus(record.status),
            state=record.state or [],
            response=record.response,
            error=record.error,
            turn_id=record.turn_id,
            grants=dict(record.grants),
            version=record.version,
            owner=record.owner,
        )
        if record.turn is not None and session.status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED):
            session.turn = Turn(
                session_id=session.session_id,
                turn_id=record.turn_id,
                message=record.turn.message,
                webhook=record.turn.webhook,
                deadline=record.turn.deadline,
                journal={e.seq: e for e in record.turn.journal},
                grants=record.turn.grants,
                started_at=record.turn.started_at,
                state=TurnState.ELSEWHERE,
            )
        elif session.status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED):
            session.status = SessionStatus.ERROR  # a row without its turn: cannot be resumed
            session.error = EXITED
        return session

    def _adopt_locked(self, session: Session, turn: Turn, after: _After) -> None:
        """A stored turn becomes this instance's to run: parked while it waits on a person,
        queued for replay otherwise; its deadline and interrupt expiries are timed here."""
        pending = turn.pending()
        turn.move(TurnState.PARKED if pending else TurnState.QUEUED)
        session.status = SessionStatus.INTERRUPTED if pending else SessionStatus.RUNNING
        if not pending:
            after.queued.append(turn)
        for entry in pending:
            if entry.expires_at is not None:
                self._schedule(entry.expires_at, "expire", turn, arg=entry.seq)
        if turn.deadline is not None:
            self._schedule(turn.deadline, "timeout", turn)

    def start(self, pool: WorkerPool) -> None:
        self.pool = pool
        if self.shared is not None:
            self.shared.listen(self._changed_elsewhere, self._reconnected)
            self._claim_orphans()
        self._housekeeper = threading.Thread(target=self._housekeep, name="motus-housekeeper", daemon=True)
        self._housekeeper.start()
        self._dispatch()

    def busy(self) -> bool:
        """Whether any turn is running code (the pool refills its spares when not)."""
        with self._sched:
            return self._free_slots < self.max_workers

    def begin_shutdown(self) -> None:
        """Refuse new work and release every long poll at once (any thread)."""
        self._closing = True
        self.events.close()

    def hurry(self) -> None:
        """Cut the running turns' shutdown grace short (a quick stop): ``shutdown`` treats
        them as at the end of its ``timeout`` within a tenth of a second. Only sets a flag, so
        it is safe from a signal handler."""
        self._hurried = True

    def shutdown(self, timeout: float) -> None:
        """Stop every turn. Turns waiting on a person are parked (durable store: they wait in
        the store for the next start) or cancelled (memory). Running turns get ``timeout``
        seconds to finish; then they are left to be replayed at the next start (durable) or
        cancelled (memory). Idempotent."""
        self.begin_shutdown()
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            for session in self._all():
                self._settle_for_shutdown(session)  # waiting turns park (or are cancelled) as soon as they can
            if not any(_busy(s.turn) for s in self._all()):
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if self._hurried or (remaining is not None and remaining <= 0):
                break
            with self._sched:
                self._sched.wait(0.1 if remaining is None else min(0.1, remaining))
        self._draining_done = True
        for session in self._all():
            self._settle_for_shutdown(session, force=True)
        with self._timers:
            self._timers.notify_all()
        if self._housekeeper is not None:
            self._housekeeper.join()

    def _settle_for_shutdown(self, session: Session, force: bool = False) -> None:
        after = _After()
        with session.lock:
            turn = session.turn
            if turn is None or turn.state in (TurnState.ENDED, TurnState.ELSEWHERE):
                return
            waiting = turn.state is TurnState.PARKED or (turn.state is TurnState.WAITING and not turn.calls_in_flight())
            if not (waiting or force):
                return  # still doing work: it gets the shutdown grace
            if self.store.durable:
                if turn.handle is not None:
                    after.kill.append(turn.handle)
                    turn.handle = None
                if turn.state is TurnState.WAITING:
                    turn.move(TurnState.PARKED)
                elif turn.state is not TurnState.PARKED:
                    after.freed += turn.move(TurnState.ENDED)  # left "running" in the store: replayed at start
            else:
                self._end_locked(session, turn, error=CANCELLED, after=after)
        self._finish(after)

    # -- lookups (request threads) -------------------------------------------------------

    def _all(self) -> list[Session]:
        with self._registry:
            return list(self._sessions.values())

    def _all_fresh(self) -> list[Session]:
        """Every session, those another instance created or changed read again first."""
        if self.shared is not None:
            try:
                versions = self.shared.versions()
            except Exception as exc:
                raise ServerUnavailable(f"Could not read the session store: {type(exc).__name__}: {exc}") from None
            for session in self._all():
                if versions.get(session.session_id) != session.version:
                    session.stale = True
            with self._registry:
                unknown = [session_id for session_id in versions if session_id not in self._sessions]
            for session_id in unknown:
                self._load_shared(session_id)
        sessions = self._all()
        for session in sessions:
            if session.stale:
                self._refresh_now(session, publish=False)
        return [session for session in sessions if not session.deleted]

    def _lookup(self, session_id: str) -> Session | None:
        with self._registry:
            return self._sessions.get(session_id)

    def _session(self, session_id: str) -> Session:
        with self._registry:
            session = self._sessions.get(session_id)
        if session is None and self.shared is not None and "\x00" not in session_id:  # (no text column holds a NUL)
            session = self._load_shared(session_id)  # created on another instance
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def _read(self, session_id: str, read: Callable[[Session], T]) -> T:
        """``read(session)`` under its lock, on an up-to-date copy; 404 for one deleted."""
        session = self._session(session_id)
        after = _After()
        try:
            with session.lock:
                self._fresh_locked(session, after, verify=True)
                if session.deleted:
                    raise SessionNotFound(session_id)
                return read(session)
        finally:
            self._finish_read(after)

    def _finish_read(self, after: _After) -> None:
        """``_finish`` for a read, which may run inside a long poll's check, under an
        ``Events`` condition: it publishes nothing (the listener that marked the session
        changed has woken its waiters already)."""
        after.publish.clear()
        self._finish(after)

    def _attempt(self, session_id: str, change: Callable[[Session, _After], T]) -> T:
        """``change(session, after)`` under the session's lock, then its ``after``. On a
        shared store a write refused because another instance changed the row first is
        tried again on the row as it now is (where the change may be refused for good: an
        interrupt answered meanwhile is a 404)."""
        for _ in range(STALE_RETRIES):
            session = self._session(session_id)
            after = _After()
            try:
                with session.lock:
                    self._fresh_locked(session, after, verify=True)
                    if session.deleted:
                        raise SessionNotFound(session_id)
                    result = change(session, after)
            except StaleSession:
                session.stale = True
                continue
            finally:
                self._finish(after)
            return result
        raise ServerUnavailable(f"Session {session_id} kept changing on other instances; try again")

    def __len__(self) -> int:
        with self._registry:
            return len(self._sessions)

    def get(self, session_id: str) -> SessionView:
        return self._read(session_id, Session.view)

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(session_id, lambda session: list(session.state))

    def live(self, session_id: str) -> tuple[int, dict[str, Any], list[JournalEntry], float | None] | None:
        """A snapshot of the live turn (its id, message, journal and start time), or None
        when the session has no turn running or waiting."""
        def live(session: Session) -> tuple[int, dict[str, Any], list[JournalEntry], float | None] | None:
            turn = session.turn
            if turn is None or turn.state is TurnState.ENDED:
                return None
            return turn.turn_id, turn.message, list(turn.journal.values()), turn.started_at

        try:
            return self._read(session_id, live)
        except SessionNotFound:
            return None

    def grants(self, session_id: str) -> dict[str, dict[str, Any]]:
        return self._read(session_id, lambda session: dict(session.grants))

    def revoke(self, session_id: str, tool_name: str, by: str = ANONYMOUS) -> None:
        """Forget a remembered approval. A turn already running keeps the grants it started
        with (a replay must see what the first run saw); the next turn asks again."""
        def revoke(session: Session, after: _After) -> None:
            if tool_name not in session.grants:
                raise GrantNotFound(f"Session {session_id} has no remembered approval for tool {tool_name!r}")
            now = self._clock()
            grants = {name: grant for name, grant in session.grants.items() if name != tool_name}
            self._save(
                session,
                session.record(grants=grants, touched=now),
                events=[session.event("revoke", now, tool_name=tool_name, by=by)],
                audit=[AuditRecord(session_id, "revoke", now, by, {"tool_name": tool_name})],
            )
            session.grants, session.touched = grants, now
            after.publish.append(session_id)

        self._attempt(session_id, revoke)

    def audit(self, session_id: str) -> list[AuditRecord]:
        self.get(session_id)  # 404 for an unknown session
        return self.store.audit(session_id)

    def inbox(self, kind: str | None = None) -> list[tuple[str, PendingInterrupt]]:
        """Every pending interrupt of every session (of type ``kind``), oldest first."""
        found = []
        for session in self._all_fresh():
            with session.lock:
                if session.deleted:
                    continue
                for item in session.view().interrupts:
                    if kind is None or item.type == kind:
                        found.append((session.session_id, item))
        found.sort(key=lambda pair: (pair[1].created_at or 0.0, pair[1].interrupt_id))
        return found

    def wait_inbox(self, kind: str | None, timeout: float) -> list[tuple[str, PendingInterrupt]]:
        """``inbox`` as soon as it is not empty, or empty after ``timeout`` seconds."""
        found = self.events.wait(ALL, lambda: self.inbox(kind) or None, timeout)
        return found or []

    def list(self) -> list[SessionView]:
        views = []
        for session in self._all_fresh():
            with session.lock:
                if not session.deleted:
                    views.append(session.view())
        return views

    def counts(self) -> dict[str, int]:
        live = parked = 0
        for session in self._all():
            turn = session.turn
            state = turn.state if turn is not None else None
            if state is TurnState.PARKED:
                parked += 1
            elif state is not None and state not in (TurnState.ENDED, TurnState.ELSEWHERE):
                live += 1
        with self._sched:
            running = self.max_workers - self._free_slots
        return {"running_workers": running, "live_turns": live, "parked_turns": parked}

    def interrupt_counts(self) -> tuple[int, int]:
        """For metrics: interrupts waiting on a person, and how many of them belong to
        parked turns."""
        pending = parked = 0
        for session in self._all():
            with session.lock:
                turn = session.turn
                if turn is None or session.status is not SessionStatus.INTERRUPTED:
                    continue
                count = len(turn.pending())
                pending += count
                if turn.state is TurnState.PARKED:
                    parked += count
        return pending, parked

    def wait(self, session_id: str, timeout: float) -> SessionView:
        """Block until the session is not ``running`` or ``timeout`` seconds pass; at once
        while the server is closing. ``SessionNotFound`` if it is (or gets) deleted."""

        def check() -> SessionView | None:
            view = self.get(session_id)
            return view if view.status is not SessionStatus.RUNNING else None

        view = self.events.wait(session_id, check, timeout)
        return view if view is not None else self.get(session_id)

    # -- sessions ------------------------------------------------------------------------

    def create(self, session_id: str | None = None, state: list[dict[str, Any]] | None = None) -> SessionView:
        session = Session(session_id=session_id or str(uuid.uuid4()), touched=self._clock(), state=list(state or []))
        with session.lock:
            with self._registry:
                if self._closing:
                    raise ServerUnavailable("Server is shutting down")
                if session.session_id in self._sessions:
                    raise SessionConflict(f"Session {session.session_id} already exists")
                if self.max_sessions and len(self._sessions) >= self.max_sessions:
                    raise SessionLimitReached(
                        f"Session limit reached ({self.max_sessions}); delete a session or raise --max-sessions"
                    )
                self._sessions[session.session_id] = session
            try:
                self._save(session, session.record(state=session.state), events=[session.event("status", session.touched, status="idle")])
            except (ServerUnavailable, StaleSession) as exc:
                session.deleted = True
                with self._registry:
                    self._sessions.pop(session.session_id, None)
                if isinstance(exc, StaleSession):  # created on another instance meanwhile
                    raise SessionConflict(f"Session {session.session_id} already exists") from None
                raise
            return session.view()

    def delete(self, session_id: str) -> None:
        """Remove the session; a live turn ends (its process gets ``EOFError`` and a grace)."""
        def delete(session: Session, after: _After) -> None:
            self._delete_row(session, [session.event("status", self._clock(), status="deleted")])
            session.deleted = True
            turn = session.turn
            if turn is not None and turn.state is not TurnState.ENDED:
                self._stop_turn_locked(turn, after)
                self.metrics.turn_ended("deleted", time.monotonic() - turn.started)
                for entry in turn.pending():
                    session.retire(entry.ref or "", "the session was deleted")
            with self._registry:
                self._sessions.pop(session_id, None)
            after.publish.append(session_id)

        self._attempt(session_id, delete)

    def _delete_row(self, session: Session, events: list[Event]) -> None:
        shared = self.shared
        if shared is not None:
            self._commit(lambda: shared.delete(session.session_id, events, version=session.version))
        else:
            self._commit(lambda: self.store.delete(session.session_id, events))

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove idle and error sessions nothing has written to for ``ttl`` seconds."""
        if not self.ttl:
            return []
        cutoff = (self._clock() if now is None else now) - self.ttl
        removed: list[str] = []
        changed: list[Session] = []
        for session in self._all():
            with session.lock:
                if session.deleted or session.status not in (SessionStatus.IDLE, SessionStatus.ERROR) or session.touched > cutoff:
                    continue
                try:
                    gone = [session.event("status", self._clock(), status="deleted", reason="ttl")]
                    self._delete_row(session, gone)
                except StaleSession:
                    session.stale = True  # changed (or removed) elsewhere meanwhile: read again below
                    changed.append(session)
                    continue
                except ServerUnavailable:
                    log.warning("TTL sweep could not delete session %s from the store", session.session_id)
                    continue
                session.deleted = True
                with self._registry:
                    self._sessions.pop(session.session_id, None)
                removed.append(session.session_id)
            self.events.publish(session.session_id)
        for session in changed:  # a session another instance swept (or wrote) first is forgotten or kept
            try:
                self._refresh_now(session, publish=False)
            except ServerUnavailable as exc:
                log.warning("TTL sweep: session %s is read again when next used: %s", session.session_id, exc.detail)
        return removed

    # -- turns (request threads) ---------------------------------------------------------

    def start_turn(self, session_id: str, message: dict[str, Any], webhook: dict[str, Any] | None = None) -> None:
        """idle|error -> running: commit the new turn, then queue it for a compute slot (it
        runs on this instance, which owns it until it ends)."""

        def start(session: Session, after: _After) -> Turn:
            if session.status is SessionStatus.RUNNING:
                raise SessionConflict("Session is running; wait for the turn to finish or delete the session")
            if session.status is SessionStatus.INTERRUPTED:
                raise SessionConflict("Session is interrupted; resume its pending interrupts or delete the session")
            if self._closing:
                raise ServerUnavailable("Server is shutting down")
            now = self._clock()
            turn = Turn(
                session_id=session_id,
                turn_id=session.turn_id + 1,
                message=message,
                webhook=webhook,
                deadline=now + self.timeout if self.timeout else None,
                grants=tuple(sorted(session.grants)),
                started_at=now,
            )
            self._save(session, session.record(status=SessionStatus.RUNNING, response=None, error=None,
                                      turn_id=turn.turn_id, touched=now, turn=turn.record(), owner=self.instance),
                       events=[session.event("status", now, status="running", turn_id=turn.turn_id)])
            session.turn, session.turn_id, session.owner = turn, turn.turn_id, self.instance
            session.status, session.response, session.error, session.touched = SessionStatus.RUNNING, None, None, now
            after.queued.append(turn)
            after.publish.append(session_id)
            self.metrics.turn_started()
            return turn

        turn = self._attempt(session_id, start)
        if turn.deadline is not None:
            self._schedule(turn.deadline, "timeout", turn)

    def resume(self, session_id: str, interrupt_id: str, value: Any, by: str = ANONYMOUS) -> SessionStatus:
        """Answer one pending interrupt on behalf of ``by`` (a key's name); returns the
        status this left the session in. A turn whose worker runs on another instance gets
        the value from that instance (it reads the answer from the store); one whose instance
        is gone is taken over here and replayed."""

        def resume(session: Session, after: _After) -> SessionStatus:
            turn = session.turn
            pending = turn.pending() if turn is not None and session.status is SessionStatus.INTERRUPTED else []
            entry = next((e for e in pending if e.ref == interrupt_id), None)
            if entry is None or turn is None:
                raise self._not_pending(session, interrupt_id)
            take = turn.state is TurnState.ELSEWHERE and not self._owner_alive(session.owner)
            if take:
                # Journal records do not change the row's version: the copy here may lack
                # some the gone instance wrote (a step, a started tool). Replay from the store's.
                self._refresh_locked(session, after, force=True)
                turn = session.turn
                pending = turn.pending() if turn is not None and session.status is SessionStatus.INTERRUPTED else []
                entry = next((e for e in pending if e.ref == interrupt_id), None)
                if entry is None or turn is None:
                    raise self._not_pending(session, interrupt_id)
                take = turn.state is TurnState.ELSEWHERE
            return self._resolve_locked(session, turn, entry, len(pending) == 1, value, by, after, take=take)

        return self._attempt(session_id, resume)

    def _resolve_locked(
        self, session: Session, turn: Turn, entry: JournalEntry, last: bool, value: Any, by: str, after: _After,
        expired: bool = False, take: bool = False,
    ) -> SessionStatus:
        """One pending interrupt answered (by a person, or by its timeout with its default):
        commit the answer with its audit record, its events and any grant it gives, then
        pass the value on (now, or when the turn gets a slot, or by replay)."""
        now = self._clock()
        interrupt_id = entry.ref or ""
        packed = entry.default if expired and entry.default is not None else pack(("ok", value))
        answered = entry.finished(packed, answered_at=now, answered_by=by)
        status = SessionStatus.RUNNING if last else SessionStatus.INTERRUPTED
        reason = "timeout" if expired else "resume"
        events = [session.event("resolved", now, interrupt_id=interrupt_id, type=entry.label, by=by, value=value, reason=reason,
                                turn_id=turn.turn_id)]
        audit = [AuditRecord(session.session_id, "resolved", now, by, {
            "interrupt_id": interrupt_id, "type": entry.label, "payload": entry.payload, "value": value, "reason": reason,
            "turn_id": turn.turn_id,
        })]
        grants = session.grants
        tool = remembered_tool(entry.payload, value)
        if tool is not None:
            from motus.tools.approval import parse_approval  # the gate's own reading of the value

            if expired or not parse_approval(value).approved:
                tool = None  # nobody approved, or the gate refuses it (edited arguments not an object)
        if tool is not None:
            grants = {**session.grants, tool: {"by": by, "at": now}}
            events.append(session.event("grant", now, tool_name=tool, by=by))
            audit.append(AuditRecord(session.session_id, "grant", now, by, {"tool_name": tool, "interrupt_id": interrupt_id}))
        if last:
            events.append(session.event("status", now, status=status.value))
        owner = self.instance if take else session.owner  # take: its instance is gone, it runs here
        self._save(session, session.record(status=status, touched=now, grants=grants, owner=owner), [answered], events, audit)
        turn.journal[answered.seq] = answered
        session.status, session.touched, session.grants, session.owner = status, now, grants, owner
        session.retire(interrupt_id, EXPIRED if expired else ALREADY_RESUMED)
        self.metrics.interrupt_answered(reason, now - entry.created_at if entry.created_at is not None else None)
        if take:
            self._adopt_locked(session, turn, after)
        self._deliver_locked(session, turn, Resume(interrupt_id=interrupt_id, value=value), last, after)
        return status

    def _deliver_locked(self, session: Session, turn: Turn, message: Resume, last: bool, after: _After) -> None:
        """Pass a committed answer on: to the live worker (now, or with the turn's next
        compute slot when it was the last one), or by replay of a parked turn once all are
        answered. A turn running on another instance is not touched: that instance reads
        the answer from the store and passes it on itself."""
        if turn.state is TurnState.WAITING:
            if last:
                turn.move(TurnState.RESUMING)
                turn.queued_values.append(message)
                after.queued.append(turn)
            else:
                after.sends.append((turn.handle, message))  # type: ignore[arg-type]
        elif turn.state is TurnState.PARKED:
            if last:
                turn.move(TurnState.QUEUED)  # replayed from its journal in a fresh process
                after.queued.append(turn)
        elif turn.state not in (TurnState.ELSEWHERE, TurnState.QUEUED):  # QUEUED: just taken over, replay reads the journal
            raise InvalidTransition(f"session {session.session_id} is interrupted but its turn is {turn.state.value}")
        after.publish.append(session.session_id)

    def _not_pending(self, session: Session, interrupt_id: str) -> InterruptNotPending:
        """The 404 for a resume of an interrupt that is not pending. An instance that learned
        of the answer from another's commit only knows it was answered, not by whom (the turn
        may have ended since, taking its journal with it), so on a shared store the audit
        says whether it expired."""
        if self.shared is not None and session.retired.get(interrupt_id) in (None, ALREADY_RESUMED):
            try:
                records = self.store.audit(session.session_id)
            except Exception as exc:  # the 404 stands; only its reason is less precise
                log.warning("session %s: could not read the audit for a late resume: %s", session.session_id, exc)
                records = []
            for record in records:
                if record.kind == "resolved" and record.data.get("interrupt_id") == interrupt_id:
                    session.retire(interrupt_id, EXPIRED if record.by == BY_TIMEOUT else ALREADY_RESUMED)
        return InterruptNotPending(self._why_not_pending(session, interrupt_id))

    @staticmethod
    def _why_not_pending(session: Session, interrupt_id: str) -> str:
        why = session.retired.get(interrupt_id)
        if session.status is not SessionStatus.INTERRUPTED:
            reason = f" (interrupt {interrupt_id}: {why})" if why else ""
            return f"{NOT_WAITING}{reason}"
        if why:
            return f"Interrupt {interrupt_id} is not pending: {why}"
        return f"Interrupt {interrupt_id} not found among the session's pending interrupts"

    # -- the pool's listener (manager thread) --------------------------------------------

    def worker_message(self, handle: Handle, message: object) -> None:
        """A message from a turn's process. If the store cannot take it now (locked, full),
        it waits in the turn's backlog, with every later message of that turn behind it, and
        is retried: a worker message is never dropped (see ``_retry_backlog``)."""
        session, turn = self._owner(handle)
        if session is None or turn is None:
            return
        after = _After()
        try:
            with session.lock:
                if session.deleted or session.turn is not turn or turn.handle is not handle or turn.state is TurnState.ENDED:
                    return  # a message from a process this turn no longer owns
                turn.last_heard = time.monotonic()
                if turn.backlog:
                    turn.backlog.append(message)
                else:
                    try:
                        self._apply_or_end_locked(session, turn, handle, message, after)
                    except ServerUnavailable as exc:
                        turn.backlog.append(message)
                        turn.backlog_since = time.monotonic()
                        log.warning("session %s: %s; the worker's message waits and is retried", session.session_id, exc.detail)
                        self._schedule(time.monotonic() + STORE_RETRY_SECONDS, "retry", turn, monotonic=True)
        finally:
            self._finish(after)  # what was decided before a failure (a slot freed) still happens
        if self._stopped and isinstance(message, Interrupt):
            self._settle_for_shutdown(session)  # nobody can answer it before the next start

    def _apply_or_end_locked(self, session: Session, turn: Turn, handle: Handle, message: object, after: _After) -> None:
        """``_apply_locked``, and if it fails for any reason but the store's refusal (a bug, or
        a fault in a collaborator such as a metrics hook), end the turn in error and stop its
        process. Left alone, such a turn would never end: after an outcome the pool has
        already finished the handle, and after an interrupt or a record the worker waits for
        an answer or an ``Ack`` that nothing will send. It would hold its compute slot and
        keep a graceful stop waiting."""
        outcome = isinstance(message, (Result, Failure))
        try:
            self._apply_locked(session, turn, handle, message, after)
        except StoreCannotTake as exc:  # a retry would fail the same way
            log.warning("session %s: its worker's %s cannot be stored (%s); the turn ends in error", session.session_id, type(message).__name__, exc.detail)
        except ServerUnavailable:
            raise
        except Exception:
            log.exception("session %s: applying its worker's %s failed; the turn ends in error", session.session_id, type(message).__name__)
        else:
            return
        if session.turn is turn and turn.state is not TurnState.ENDED:
            self._end_locked(session, turn, error=OUTCOME_FAILED if outcome else MESSAGE_FAILED, after=after)

    def _apply_locked(self, session: Session, turn: Turn, handle: Handle, message: object, after: _After) -> None:
        """Commit, then apply, one worker message. Raises ``ServerUnavailable`` with nothing
        changed when the store refuses the write. On a shared store, a row another instance
        changed first (an answer given there, a delete) is read again and the message
        applied to it; if the turn is no longer this instance's, the message is dropped and
        the worker stopped (by the refresh)."""
        for attempt in range(STALE_RETRIES):
            try:
                # After a refusal, a result's history is written whole: the refusal may have
                # been the store finding fewer of the kept messages than it was told (rows
                # changed without the version), which reading the row again does not mend.
                self._apply_once_locked(session, turn, handle, message, after, whole_history=attempt > 0)
                return
            except StaleSession:
                session.stale = True
                self._fresh_locked(session, after)
                if session.deleted or session.turn is not turn or turn.handle is not handle or turn.state is TurnState.ENDED:
                    return
        raise ServerUnavailable(f"Session {session.session_id} kept changing on other instances")

    def _apply_once_locked(
        self, session: Session, turn: Turn, handle: Handle, message: object, after: _After, whole_history: bool = False
    ) -> None:
        problem = message_problem(message) or self._conflict(turn, message)
        if problem is not None:  # the session stays as it was; the process is stopped
            log.warning("session %s: its worker sent a malformed %s", session.session_id, problem)
            self._end_locked(session, turn, error=f"Worker sent a malformed {problem}", after=after)
            return
        if isinstance(message, Interrupt):
            self._interrupted_locked(session, turn, message, after)
        elif isinstance(message, Record):
            self._commit(lambda: self.store.save_entries(session.session_id, turn.turn_id, [message.entry]))
            turn.journal[message.entry.seq] = message.entry
            if message.ack:
                after.sends.append((handle, Ack(message.entry.seq)))
        elif isinstance(message, Result):
            state, kept = resulting_state(handle.job.state, message)
            # The store holds the session's state as it was when the job was made, so the
            # messages kept need not be written again; checked by identity, cheaply, in case
            # the session's state was replaced since (then everything is written).
            stored = session.state
            if whole_history or kept > len(stored) or any(a is not b for a, b in zip(stored[:kept], handle.job.state)):
                kept = 0
            self._end_locked(session, turn, after=after, response=message.response, state=state, kept=kept)
        elif isinstance(message, Failure):
            self._end_locked(session, turn, error=message.error, after=after)
        else:
            log.warning("ignored unexpected %s from the worker of session %s", type(message).__name__, session.session_id)

    def _conflict(self, turn: Turn, message: object) -> str | None:
        """Why a well-formed interrupt or record cannot be what a worker of ours sends at this
        point of its turn's journal, or None. A worker numbers its records itself, gives each
        interrupt a new id and sends again only an interrupt still unanswered (a replay
        waiting again); a message that breaks one of these would replace a pending interrupt,
        show one id twice, or leave the session waiting on an answer it already has."""
        if isinstance(message, Record):
            known = turn.journal.get(message.entry.seq)
            if known is not None and known.kind == INTERRUPT:
                return f"record: its seq is the interrupt {known.ref}'s"
            return None
        if not isinstance(message, Interrupt):
            return None
        known = turn.journal.get(message.seq)
        if known is not None:
            if known.kind != INTERRUPT or known.ref != message.interrupt_id:
                return f"interrupt: its seq is {known.describe()}'s"
            if known.done:
                return f"interrupt: {message.interrupt_id} was already answered"
            return None  # a replay waiting again
        if any(e.kind == INTERRUPT and e.ref == message.interrupt_id for e in turn.journal.values()):
            return f"interrupt: its id {message.interrupt_id} is another interrupt's"
        # ``--max-interrupts`` is the worker's to hold: it knows which pending interrupts the
        # agent gave up on (``asyncio.wait_for(interrupt(...), t)``), the server does not.
        return None

    def _retry_backlog(self, turn: Turn) -> None:
        """Apply a turn's waiting worker messages in order (housekeeping thread). After
        ``STORE_GIVE_UP_SECONDS`` of failures the turn ends in error: its process is stopped,
        and the store keeps what it last accepted (replayed at the next start if durable)."""
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = _After()
        try:
            with session.lock:
                if session.turn is not turn or turn.state is TurnState.ENDED or not turn.backlog:
                    return
                handle = turn.handle
                try:
                    while turn.backlog:
                        self._apply_or_end_locked(session, turn, handle, turn.backlog[0], after)  # type: ignore[arg-type]
                        turn.backlog.popleft()
                        if session.turn is not turn or turn.state is TurnState.ENDED:
                            turn.backlog.clear()
                except ServerUnavailable as exc:
                    if time.monotonic() - turn.backlog_since < STORE_GIVE_UP_SECONDS:
                        self._schedule(time.monotonic() + STORE_RETRY_SECONDS, "retry", turn, monotonic=True)
                    else:
                        log.error("session %s: giving up on the store after %.0f s: %s", session.session_id, STORE_GIVE_UP_SECONDS, exc.detail)
                        turn.backlog.clear()
                        error = f"Could not save the turn to the session store: {exc.detail}"
                        session.status, session.error = SessionStatus.ERROR, error
                        self._stop_turn_locked(turn, after)
                        session.turn = None
                        after.publish.append(session.session_id)
                        self.metrics.turn_ended("error", time.monotonic() - turn.started)
        finally:
            self._finish(after)  # what was decided before a failure (a slot freed) still happens

    def worker_exited(self, handle: Handle) -> None:
        self.worker_message(handle, Failure(error=EXITED))

    def _owner(self, handle: Handle) -> tuple[Session | None, Turn | None]:
        with self._registry:
            session = self._sessions.get(handle.session_id)
        if session is None:
            return None, None
        return session, session.turn

    def _interrupted_locked(self, session: Session, turn: Turn, message: Interrupt, after: _After) -> None:
        now = self._clock()
        known = turn.journal.get(message.seq)
        events: list[Event] = []
        if known is not None and known.kind == INTERRUPT and known.ref == message.interrupt_id:
            entry = known  # a replay waits again on an interrupt it had raised before
        else:
            kind = message.payload.get("type")
            timeout = message.timeout if message.timeout is not None and message.timeout > 0 else None
            entry = JournalEntry(
                seq=message.seq, kind=INTERRUPT, key=canonical_payload(message.payload),
                label=storable_text(kind) if isinstance(kind, str) else "unknown", ref=message.interrupt_id, payload=message.payload,
                parent=message.parent, created_at=now,
                expires_at=now + timeout if timeout is not None else None,
                default=pack(("ok", message.default)) if timeout is not None else None,
            )
            events.append(session.event("interrupt", now, **interrupt_data(entry)))
        if session.status is not SessionStatus.INTERRUPTED:
            events.append(session.event("status", now, status=SessionStatus.INTERRUPTED.value))
        self._save(session, session.record(status=SessionStatus.INTERRUPTED, touched=now), [entry], events)
        turn.journal[entry.seq] = entry
        session.status, session.touched = SessionStatus.INTERRUPTED, now
        if entry is not known:
            self.metrics.interrupt_raised()
        if entry is not known and entry.expires_at is not None:
            self._schedule(entry.expires_at, "expire", turn, arg=entry.seq)
        if entry is not known and _webhook_wants(turn.webhook, "interrupted"):
            after.ended.append(TurnEnd(
                session_id=session.session_id, status=SessionStatus.INTERRUPTED, response=None, error=None,
                messages=[], webhook=turn.webhook, interrupts=[interrupt_data(e) for e in turn.pending()],
            ))
        if turn.state is TurnState.RESUMING:
            after.sends.extend((turn.handle, value) for value in turn.queued_values)  # type: ignore[misc]
            turn.queued_values.clear()
        after.freed += turn.move(TurnState.WAITING)
        after.publish.append(session.session_id)
        if self.park_after is not None:
            self._schedule(time.monotonic() + max(self.park_after, PARK_SETTLE_SECONDS), "park", turn, monotonic=True)

    def _end_locked(
        self,
        session: Session,
        turn: Turn,
        after: _After,
        *,
        error: str | None = None,
        response: dict[str, Any] | None = None,
        state: list[dict[str, Any]] | None = None,
        kept: int = 0,
    ) -> None:
        """Any live state -> ENDED, with the session idle (a result) or in error. ``kept``:
        how many leading messages of ``state`` are the session's stored ones, unchanged."""
        now = self._clock()
        if error is not None:
            error = storable_text(error)
        status = SessionStatus.ERROR if error is not None else SessionStatus.IDLE
        new_state = list(state) if state is not None else session.state
        events = [
            session.event("error", now, error=error) if error is not None else session.event("message", now, response=response),
            session.event("status", now, status=status.value),
        ]
        self._save(session, session.record(status=status, response=response, error=error, state=new_state, touched=now, turn=None,
                                           owner=None, kept=kept if state is not None else 0), events=events)
        if error is not None:
            lines = error.strip().splitlines()
            why = f"its turn ended with an error ({lines[-1] if lines else 'no message'})"
        else:
            why = "its turn has already finished"
        for entry in turn.pending():
            session.retire(entry.ref or "", why)
        session.status, session.response, session.error, session.state, session.touched = status, response, error, new_state, now
        session.owner = None
        self._stop_turn_locked(turn, after)
        session.turn = None  # its journal goes with it; late messages from it are ignored
        after.publish.append(session.session_id)
        if error is not None:
            after.failed.append((session.session_id, error))
        if _webhook_wants(turn.webhook, status.value):  # only then is anything kept for a webhook
            include = bool(turn.webhook.get("include_messages"))  # type: ignore[union-attr]
            after.ended.append(
                TurnEnd(session_id=session.session_id, status=status, response=response, error=error,
                        messages=new_state if include else [], webhook=turn.webhook)
            )
        self.metrics.turn_ended(_OUTCOMES.get(error, "error"), time.monotonic() - turn.started)  # last: it may raise

    def _stop_turn_locked(self, turn: Turn, after: _After) -> None:
        after.freed += turn.move(TurnState.ENDED)
        turn.queued_values.clear()
        if turn.handle is not None:
            after.stop.append(turn.handle)
            turn.handle = None

    # -- several instances on one store (shared stores only) ------------------------------

    def _load_shared(self, session_id: str) -> Session | None:
        """A session another instance created, read from the store into the registry."""
        record = self._store_read(session_id)
        if record is None:
            return None
        session = self._session_from(record)
        with self._registry:
            return self._sessions.setdefault(session_id, session)

    def _store_read(self, session_id: str) -> SessionRecord | None:
        try:
            assert self.shared is not None  # only shared stores have sessions made elsewhere
            return self.shared.load_one(session_id)
        except Exception as exc:
            log.warning("could not read session %s from the store: %s", session_id, exc)
            raise ServerUnavailable(f"Could not read the session store: {type(exc).__name__}: {exc}") from None

    def _owner_alive(self, owner: str | None) -> bool:
        if self.shared is None or owner is None or owner == self.instance:
            return owner is not None or self.shared is None
        if time.monotonic() < self._claim_after:
            return True  # just after an outage, nobody is taken for gone (see _claim_orphans)
        try:
            return self.shared.owner_alive(owner)
        except Exception as exc:
            raise ServerUnavailable(f"Could not read the session store: {type(exc).__name__}: {exc}") from None

    def _refresh_now(self, session: Session, publish: bool) -> None:
        """Read a stale session again under its lock, then do what that decided, with its
        waiters woken only if ``publish`` (not from a read, which may run inside a long
        poll's check). ``ServerUnavailable`` when the store cannot be read: it stays stale."""
        after = _After()
        try:
            with session.lock:
                self._fresh_locked(session, after)
        finally:
            if publish:
                self._finish(after)
            else:
                self._finish_read(after)

    def _fresh_locked(self, session: Session, after: _After, verify: bool = False) -> None:
        """Read the session again if another instance changed it. ``verify`` asks the
        store for the row's version rather than trusting the listener (a request must see
        what another instance acknowledged before it, whose notice may still be on its way)."""
        if self.shared is None or session.deleted:
            return
        if verify and not session.stale:
            try:
                version = self.shared.version_of(session.session_id)
            except Exception as exc:
                raise ServerUnavailable(f"Could not read the session store: {type(exc).__name__}: {exc}") from None
            session.stale = version != session.version
        if session.stale:
            self._refresh_locked(session, after)

    def _refresh_locked(self, session: Session, after: _After, force: bool = False) -> None:
        """Bring the working copy up to the stored row another instance wrote.

        - The row is gone: the session was deleted; a worker of it here is stopped.
        - This instance runs the live turn: interrupts answered elsewhere are passed on to
          its worker (or, all answered, a parked turn is replayed), as a resume here would.
        - Otherwise the stored turn replaces ours: someone else's (``ELSEWHERE``), or one just
          taken over from a gone instance (adopted). A worker of a turn this instance lost
          (its lease lapsed and another took it) is stopped: two never run one turn."""
        record = self._store_read(session.session_id)
        session.stale = False
        turn = session.turn
        live = turn is not None and turn.state is not TurnState.ENDED
        if record is None:
            session.deleted = True
            if live:
                self._stop_turn_locked(turn, after)  # type: ignore[arg-type]
                for entry in turn.pending():  # type: ignore[union-attr]
                    session.retire(entry.ref or "", "the session was deleted")
            with self._registry:
                if self._sessions.get(session.session_id) is session:
                    del self._sessions[session.session_id]
            after.publish.append(session.session_id)
            return
        ours = record.owner == self.instance
        if record.version == session.version and not force and not (ours and live and turn.state is TurnState.ELSEWHERE):  # type: ignore[union-attr]
            return
        fresh = self._session_from(record)
        keep = live and ours and fresh.turn is not None and turn.turn_id == fresh.turn.turn_id and turn.state is not TurnState.ELSEWHERE  # type: ignore[union-attr]
        session.version, session.owner, session.touched = fresh.version, fresh.owner, fresh.touched
        session.status, session.response, session.error = fresh.status, fresh.response, fresh.error
        session.state, session.turn_id, session.grants = fresh.state, fresh.turn_id, fresh.grants
        if keep:
            answered = []
            for entry in fresh.turn.journal.values():  # type: ignore[union-attr]
                known = turn.journal.get(entry.seq)  # type: ignore[union-attr]
                if known is not None and known.kind == INTERRUPT and not known.done and entry.done:
                    turn.journal[entry.seq] = entry  # type: ignore[union-attr]
                    answered.append(entry)
            for index, entry in enumerate(answered):
                session.retire(entry.ref or "", ALREADY_RESUMED)
                last = index == len(answered) - 1 and not turn.pending()  # type: ignore[union-attr]
                try:
                    value = unpack(entry.value)
                except Exception as exc:  # an answer is always a value; a default may not load here
                    value = {"error": f"could not read the stored answer: {exc}"}
                if turn.state in (TurnState.WAITING, TurnState.PARKED):  # type: ignore[union-attr]
                    self._deliver_locked(session, turn, Resume(interrupt_id=entry.ref or "", value=value), last, after)  # type: ignore[arg-type]
                else:  # cannot happen: a turn with a pending interrupt waits; logged, never raised
                    log.warning("session %s: an answer given elsewhere found the turn %s", session.session_id, turn.state.value)  # type: ignore[union-attr]
        else:
            if live:
                for entry in turn.pending():  # type: ignore[union-attr]
                    session.retire(entry.ref or "", ALREADY_RESUMED)
                self._stop_turn_locked(turn, after)  # type: ignore[arg-type]
            session.turn = fresh.turn
            if fresh.turn is not None and ours:
                self._adopt_locked(session, fresh.turn, after)
        after.publish.append(session.session_id)

    def _changed_elsewhere(self, session_id: str, version: int, new_events: bool = True) -> None:
        """The store's listener: a change was committed (by any instance). A session whose
        live turn runs here is read again at once (its worker may be owed an answer, or may
        have to stop); any other is marked to be read again when next used. Then the
        session's waiters are woken (its long polls, streams and the inbox)."""
        session = self._lookup(session_id)
        if session is not None and version == session.version and not new_events:
            return  # this instance's own change, already published when it was committed
        if session is None:
            if version > 0:
                session = self._load_shared(session_id)  # new here: the inbox and lists show it
        elif version != session.version:
            session.stale = True
            turn = session.turn
            deleted = version == 0  # forgotten here at once: its id may be created again, it counts no more
            if deleted or session.owner == self.instance or (turn is not None and turn.state not in (TurnState.ENDED, TurnState.ELSEWHERE)):
                self._refresh_now(session, publish=True)
        self.events.publish(session_id)

    def _reconnected(self) -> None:
        """The listener was away: anything may have changed. Everything is read again."""
        for session in self._all():
            session.stale = True
        for session in self._all():
            self._changed_elsewhere(session.session_id, -1)
        self.events.publish(ALL)

    def _claim_orphans(self) -> None:
        """Renew this instance's lease, then take over the live turns of instances whose
        lease lapsed (housekeeping thread, and once at start). The store gives each to
        exactly one instance; the new owner replays it, or keeps it parked."""
        shared = self.shared
        if shared is None:
            return
        try:
            shared.renew_lease(fresh=self._lease_lost)  # not held up by the pool's reconnect backoff
        except Exception as exc:
            self._lease_lost = True
            log.warning("could not renew this instance's lease: %s", exc)
            return
        if self._lease_lost:
            # After an outage every lease may have lapsed, the live instances' too: take
            # nothing over until each has had a full lease to renew its own.
            self._lease_lost = False
            self._claim_after = time.monotonic() + shared.lease_seconds
            log.info("the lease is renewed again; no turn is taken over for one lease period")
        if time.monotonic() < self._claim_after:
            return
        try:
            claimed = shared.claim_orphans()
        except Exception as exc:
            log.warning("could not take over the turns of gone instances: %s", exc)
            return
        for session_id in claimed:
            log.info("taking over the turn of session %s from an instance whose lease lapsed", session_id)
            session = self._lookup(session_id) or self._load_shared(session_id)
            if session is None:
                continue
            session.stale = True
            try:
                self._refresh_now(session, publish=True)
            except ServerUnavailable as exc:
                log.warning("session %s: %s", session_id, exc.detail)

    # -- slots ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand free compute slots to queued turns (any thread, no session lock held)."""
        if self.pool is None:
            return
        while True:
            with self._sched:
                if self._free_slots <= 0 or not self._ready:
                    return
                turn = self._ready.popleft()
                self._free_slots -= 1
            if not self._grant(turn):
                with self._sched:
                    self._free_slots += 1
                    self._sched.notify_all()

    def _grant(self, turn: Turn) -> bool:
        session = self._lookup(turn.session_id)
        if session is None:
            return False
        after = _After()
        with session.lock:
            if session.deleted or session.turn is not turn or self._draining_done:
                return False  # gone, moved on, or past the shutdown grace: start nothing new
            if turn.state is TurnState.QUEUED:
                job = Job(
                    session_id=turn.session_id, turn_id=turn.turn_id, message=turn.message, state=list(session.state),
                    max_interrupts=self.max_interrupts, journal=tuple(sorted(turn.journal.values(), key=lambda e: e.seq)),
                    grants=turn.grants,
                )
                turn.handle = Handle(session_id=turn.session_id, turn_id=turn.turn_id, job=job)
                turn.last_heard = time.monotonic()
                after.launch.append(turn.handle)
            elif turn.state is TurnState.RESUMING:
                after.sends.extend((turn.handle, value) for value in turn.queued_values)  # type: ignore[misc]
                turn.queued_values.clear()
            else:
                return False  # a stale queue entry: the turn moved on
            turn.move(TurnState.RUNNING)
        self._finish(after)
        return True

    # -- after the lock ------------------------------------------------------------------

    def _finish(self, after: _After) -> None:
        """Do what a transition decided, with no session lock held: pool actions, slot
        release, queueing, publishing, webhooks."""
        pool = self.pool
        if pool is not None:
            for handle in after.kill:
                pool.kill(handle)
            for handle in after.stop:
                pool.stop(handle)
            for handle in after.launch:
                try:
                    pool.launch(handle)
                except PoolClosed:
                    self.worker_message(handle, Failure(error=CANCELLED))
            for handle, message in after.sends:
                pool.send(handle, message)
        if after.freed or after.queued:
            with self._sched:
                self._free_slots += after.freed
                self._ready.extend(after.queued)
                self._sched.notify_all()
            # Before waking the watchers: a resumed turn gets its slot and its value first,
            # rather than after every open event stream has had the GIL.
            self._dispatch()
        for session_id in after.publish:
            self.events.publish(session_id)
        for session_id, error in after.failed:
            log.info("turn of session %s failed: %s", session_id, _last_line(error))
        for end in after.ended:
            self._on_end(end)

    def _save(
        self,
        session: Session,
        record: SessionRecord,
        entries: list[JournalEntry] | tuple[JournalEntry, ...] = (),
        events: list[Event] | tuple[Event, ...] = (),
        audit: list[AuditRecord] | tuple[AuditRecord, ...] = (),
    ) -> None:
        self._commit(lambda: self.store.save(record, entries, events, audit))
        session.version = record.version

    @staticmethod
    def _commit(write: Callable[[], object]) -> None:
        try:
            write()
        except StaleSession:
            raise  # another instance changed the row: the caller reads it again
        except (UnicodeError, OverflowError) as exc:
            log.warning("store write refused: %s: %s", type(exc).__name__, exc)
            raise StoreCannotTake(f"The session store cannot take the change: {type(exc).__name__}: {exc}") from None
        except Exception as exc:
            log.exception("store write failed")
            raise ServerUnavailable(f"Could not save the change to the session store: {type(exc).__name__}: {exc}") from None

    # -- timers: turn deadlines and parking (housekeeping thread) -----------------------

    def _schedule(self, when: float, kind: str, turn: Turn, monotonic: bool = False, arg: int = 0) -> None:
        wall = when if not monotonic else self._clock() + (when - time.monotonic())
        with self._timers:
            heapq.heappush(self._heap, (wall, next(self._counter), kind, turn, arg))
            self._timers.notify_all()

    def _housekeep(self) -> None:
        sweep_every = min(max(self.ttl / 4, 0.05), 5.0) if self.ttl else None
        next_sweep = time.monotonic() + sweep_every if sweep_every else None
        # Shared stores: the lease is renewed (and lapsed ones' turns taken over) three
        # times a lease, so one missed renewal never lets it lapse.
        lease_every = self.shared.lease_seconds / 3 if self.shared is not None else None
        next_lease = time.monotonic() + lease_every if lease_every else None
        while True:
            due: list[tuple[str, Turn, int]] = []
            with self._timers:
                while not self._stopped:
                    now = self._clock()
                    while self._heap and self._heap[0][0] <= now:
                        _, _, kind, turn, arg = heapq.heappop(self._heap)
                        due.append((kind, turn, arg))
                    ticks = [tick for tick in (next_sweep, next_lease) if tick is not None]
                    if due or any(time.monotonic() >= tick for tick in ticks):
                        break
                    waits = [self._heap[0][0] - now] if self._heap else []
                    waits.extend(tick - time.monotonic() for tick in ticks)
                    self._timers.wait(min(max(0.0, min(waits)), MAX_TIMER_WAIT) if waits else None)
                if self._stopped:
                    return
            for kind, turn, arg in due:
                try:
                    if kind == "timeout":
                        self._time_out(turn)
                    elif kind == "expire":
                        self._expire(turn, arg)
                    elif kind == "retry":
                        self._retry_backlog(turn)
                    else:
                        self._park(turn)
                except Exception:
                    log.exception("%s of session %s failed", kind, turn.session_id)
            if next_lease is not None and time.monotonic() >= next_lease:
                next_lease = time.monotonic() + (lease_every or 5.0)
                self._claim_orphans()
            if next_sweep is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + (sweep_every or 1.0)
                try:
                    removed = self.sweep()
                except Exception:
                    log.exception("TTL sweep failed")
                else:
                    if removed:
                        log.info("TTL sweep removed %d idle or errored sessions", len(removed))

    def _time_out(self, turn: Turn) -> None:
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = _After()
        try:
            with session.lock:
                self._fresh_locked(session, after)
                if session.deleted or session.turn is not turn or turn.state in (TurnState.ENDED, TurnState.ELSEWHERE):
                    return
                if turn.deadline is not None and turn.deadline > self._clock():
                    self._schedule(turn.deadline, "timeout", turn)
                    return
                self._end_locked(session, turn, error=TIMED_OUT, after=after)
        except (StaleSession, ServerUnavailable):
            session.stale = True  # looked at again shortly, on the row as it then is
            self._schedule(time.monotonic() + STORE_RETRY_SECONDS, "timeout", turn, monotonic=True)
        finally:
            self._finish(after)

    def _expire(self, turn: Turn, seq: int) -> None:
        """An interrupt's timeout passed: resolve it with its default, ``by`` timeout."""
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = _After()
        try:
            with session.lock:
                self._fresh_locked(session, after)
                if session.deleted or session.turn is not turn or session.status is not SessionStatus.INTERRUPTED:
                    return
                pending = turn.pending()
                entry = next((e for e in pending if e.seq == seq), None)
                if entry is None or entry.expires_at is None:
                    return  # answered meanwhile
                if entry.expires_at > self._clock():
                    self._schedule(entry.expires_at, "expire", turn, arg=seq)
                    return
                value = unpack(entry.default)
                self._resolve_locked(session, turn, entry, len(pending) == 1, value, BY_TIMEOUT, after, expired=True)
        except (StaleSession, ServerUnavailable):
            session.stale = True  # answered elsewhere meanwhile, or the store is away: looked at again
            self._schedule(time.monotonic() + STORE_RETRY_SECONDS, "expire", turn, monotonic=True, arg=seq)
        finally:
            self._finish(after)

    def _park(self, turn: Turn) -> None:
        """WAITING -> PARKED once it has waited ``park_after`` and its worker is quiet."""
        session = self._lookup(turn.session_id)
        if session is None or self.park_after is None:
            return
        after = _After()
        with session.lock:
            if session.turn is not turn or turn.state is not TurnState.WAITING or turn.handle is None:
                return
            quiet_at = turn.last_heard + max(self.park_after, PARK_SETTLE_SECONDS)
            if time.monotonic() < quiet_at or turn.calls_in_flight():
                retry = quiet_at if time.monotonic() < quiet_at else time.monotonic() + 0.5
                self._schedule(retry, "park", turn, monotonic=True)
                return
            after.kill.append(turn.handle)
            turn.handle = None
            turn.move(TurnState.PARKED)
        self._finish(after)


def _busy(turn: Turn | None) -> bool:
    """Work the shutdown grace waits for: a turn running or about to, or one waiting on a
    person while a call of it is still inside its body (an approved tool, say)."""
    if turn is None:
        return False
    if turn.state in (TurnState.RUNNING, TurnState.QUEUED, TurnState.RESUMING):
        return True
    return turn.state is TurnState.WAITING and turn.calls_in_flight()


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def storable_text(text: str) -> str:
    """``text`` as the stores can write it: UTF-8, a lone surrogate (an agent's
    ``ValueError('\\ud800')``, in its traceback) spelt as its escape. A write that can never
    succeed would otherwise be retried as if the store were away, holding the turn's slot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def pending_interrupt(entry: JournalEntry) -> PendingInterrupt:
    return PendingInterrupt(entry.ref or "", entry.payload or {}, entry.created_at, entry.expires_at)


def interrupt_data(entry: JournalEntry) -> dict[str, Any]:
    """An interrupt as events, webhooks and the inbox show it."""
    return {
        "interrupt_id": entry.ref or "",
        "type": entry.label,
        "payload": entry.payload or {},
        "created_at": entry.created_at,
        "expires_at": entry.expires_at,
    }


def remembered_tool(payload: dict[str, Any] | None, value: Any) -> str | None:
    """The tool a resume value approves "for the session", if it does: an approval of a
    ``tool_approval`` interrupt carrying ``"remember": "session"``."""
    if not isinstance(payload, dict) or payload.get("type") != "tool_approval":
        return None
    tool = payload.get("tool_name")
    if not isinstance(tool, str) or not isinstance(value, dict):
        return None
    if value.get("approved") is True and value.get("remember") == "session":
        return tool
    return None


def _webhook_wants(webhook: dict[str, Any] | None, event: str) -> bool:
    """Whether a message's webhook asked for ``event`` (the guide's default: idle, error)."""
    if not webhook:
        return False
    wanted = webhook.get("events")
    return event in (wanted if wanted is not None else ("idle", "error"))
