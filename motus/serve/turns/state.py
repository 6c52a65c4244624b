"""The state of turns and sessions: what a turn is, what a session is, and what they show.

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

A session's public status is derived from its turn and never assigned (``Session.status``):
a turn this instance runs shows its state's (``_PUBLIC``); a turn it does not run (another
instance's, ``ELSEWHERE``, or one a shutdown cut short and left in the store, ``ENDED``) is
``interrupted`` while it waits on a person and ``running`` otherwise, as its stored row says;
with no turn, the last one's outcome: ``error`` with an error, else ``idle``.

Threads: nothing here locks. A ``Session``'s fields and its ``Turn`` are guarded by
``Session.lock``, taken by ``motus.serve.turns.machine`` and the modules beside it; an
``After`` belongs to the one thread that filled it under a session lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from motus.serve.errors import InvalidTransition
from motus.serve.events import isoformat
from motus.serve.pool import Handle
from motus.durable.records import INTERRUPT, MODEL, Interrupt, JournalEntry, Record, Resume
from motus.serve.store import Event, SessionRecord, TurnRecord

#: A turn whose outcome the server failed to apply (a bug, or a fault in a collaborator such
#: as a metrics hook): it ends with this rather than holding its slot for ever.
OUTCOME_FAILED = "Turn ended: the server could not apply its outcome (see the server log)"
#: The same for any other message of its worker (an interrupt, a journal record).
MESSAGE_FAILED = "Turn ended: the server could not apply a message from its worker (see the server log)"

#: How many no-longer-pending interrupt ids a session remembers, to explain a 404.
RETIRED_INTERRUPTS_KEPT = 256


NOT_WAITING = "Session not actively waiting for resume"
TIMED_OUT = "Agent timed out"
CANCELLED = "Turn cancelled"
EXITED = "Worker process exited unexpectedly"

#: How a turn ended, for metrics (``motus_turns_ended_total{outcome}``); any other error is "error".
OUTCOMES: dict[str | None, str] = {None: "idle", TIMED_OUT: "timeout", CANCELLED: "cancelled", EXITED: "exited"}

#: Who resolved an interrupt that expired (``answered_by`` and the audit's ``by``).
BY_TIMEOUT = "timeout"
#: Why an answered interrupt cannot be resumed (in the 404's detail).
ALREADY_RESUMED = "it was already resumed"
EXPIRED = "it expired and was resolved with its default"
#: Who acted on a server without API keys.
ANONYMOUS = "anonymous"


def already_resumed(by: str | None, at: float | None) -> str:
    """``ALREADY_RESUMED``, naming who answered (a key's name) and when, where known: a
    person whose answer came late is told whose counted."""
    who = f" by {by}" if by and by != ANONYMOUS else ""
    when = isoformat(at)
    return f"{ALREADY_RESUMED}{who}" + (f" at {when}" if when else "")


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
    #: The approvals given so far towards its quorum, each {"by", "at"} (``Turn.approvals``).
    approvals: tuple[dict[str, Any], ...] = field(default=(), compare=False)

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
    by: str | None = None  # the name of the key that sent its message, for people
    #: Interrupt id -> approvals given so far towards its quorum, each {"by", "at"}; stored
    #: in the turn's row (``TurnRecord.approvals``). Replaced, never changed in place.
    approvals: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)  # for the turn duration metric

    def under_way(self) -> bool:
        """Whether something of its worker's is not settled: a call inside its body
        (``calls_in_flight``) or a message that waits for the store (the backlog). A waiting
        turn is parked, or a shutdown parks it, only when nothing is."""
        return bool(self.backlog) or self.calls_in_flight()

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

    def replies(self) -> list[JournalEntry]:
        """Its finished model records: what the agent said so far (``live.agent_text``)."""
        return [e for e in self.journal.values() if e.kind == MODEL and e.done]

    def conflict(self, message: object) -> str | None:
        """Why a well-formed interrupt or record cannot be what a worker of ours sends at this
        point of its turn's journal, or None. A worker numbers its records itself, gives each
        interrupt a new id and sends again only an interrupt still unanswered (a replay
        waiting again); a message that breaks one of these would replace a pending interrupt,
        show one id twice, or leave the session waiting on an answer it already has."""
        if isinstance(message, Record):
            known = self.journal.get(message.entry.seq)
            if known is not None and known.kind == INTERRUPT:
                return f"record: its seq is the interrupt {known.ref}'s"
            return None
        if not isinstance(message, Interrupt):
            return None
        known = self.journal.get(message.seq)
        if known is not None:
            if known.kind != INTERRUPT or known.ref != message.interrupt_id:
                return f"interrupt: its seq is {known.describe()}'s"
            if known.done:
                return f"interrupt: {message.interrupt_id} was already answered"
            return None  # a replay waiting again
        if any(e.kind == INTERRUPT and e.ref == message.interrupt_id for e in self.journal.values()):
            return f"interrupt: its id {message.interrupt_id} is another interrupt's"
        # ``--max-interrupts`` is the worker's to hold: it knows which pending interrupts the
        # agent gave up on (``asyncio.wait_for(interrupt(...), t)``), the server does not.
        return None

    def record(self, approvals: dict[str, tuple[dict[str, Any], ...]] | None = None) -> TurnRecord:
        """The turn's row; ``approvals`` in place of its own (a change about to be committed)."""
        given = self.approvals if approvals is None else approvals
        return TurnRecord(
            turn_id=self.turn_id, message=self.message, webhook=self.webhook, deadline=self.deadline, grants=self.grants,
            started_at=self.started_at, by=self.by, approvals={ref: tuple(a) for ref, a in given.items() if a},
        )


@dataclass(eq=False)
class Session:
    """One session: its history, its outcome, its live turn. Guarded by ``lock``."""

    session_id: str
    touched: float  # wall clock of the last write
    state: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    error: str | None = None
    turn_id: int = 0
    turn: Turn | None = None
    retired: OrderedDict[str, str] = field(default_factory=OrderedDict)
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool name -> {"by", "at"}
    title: str | None = None  # a client's, or the first user message's (``titles.derived``)
    #: history index -> {"by", "at"}: who sent the user message that started a turn, and when.
    senders: dict[int, dict[str, Any]] = field(default_factory=dict)
    deleted: bool = False
    #: Dropped from the server's memory to keep it within ``--session-cache`` (its row is
    #: the whole of it): a thread that took this copy before then looks the session up again.
    forgotten: bool = False
    #: Shared stores: the stored row's version this copy was read at, the instance that
    #: runs its live turn, and whether another instance has changed the row since.
    version: int = 0
    owner: str | None = None
    stale: bool = False
    #: Shared stores: the last row version this instance committed itself (and published
    #: then); a version its copy reached by reading the row again was published by nobody.
    saved_here: int = 0
    #: The store may show what this copy no longer does: its turn was given up on when the
    #: store failed (ended here, still waiting in the row). Cleared by its next save.
    store_behind: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def status(self) -> SessionStatus:
        """The public status, derived (see the module docstring): never assigned."""
        turn = self.turn
        if turn is not None:
            public = _PUBLIC.get(turn.state)
            if public is not None:
                return public
            return SessionStatus.INTERRUPTED if turn.pending() else SessionStatus.RUNNING
        return SessionStatus.ERROR if self.error is not None else SessionStatus.IDLE

    def view(self) -> SessionView:
        interrupts: tuple[PendingInterrupt, ...] = ()
        if self.turn is not None and self.status is SessionStatus.INTERRUPTED:
            approvals = self.turn.approvals
            interrupts = tuple(pending_interrupt(e, approvals.get(e.ref or "", ())) for e in self.turn.pending())
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
            "title": self.title,
            "senders": self.senders,
            "version": self.version,
            "owner": self.owner,
        }
        if "senders" in changes and changes.get("state") is None:
            # A save without the history leaves the stored senders as they are (SessionRecord.senders).
            raise ValueError("a session's senders change only with its history")
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

    def why_not_pending(self, interrupt_id: str) -> str:
        """The 404's detail for a resume of ``interrupt_id``, which is not pending."""
        why = self.retired.get(interrupt_id)
        if self.status is not SessionStatus.INTERRUPTED:
            reason = f" (interrupt {interrupt_id}: {why})" if why else ""
            return f"{NOT_WAITING}{reason}"
        if why:
            return f"Interrupt {interrupt_id} is not pending: {why}"
        return f"Interrupt {interrupt_id} not found among the session's pending interrupts"


@dataclass
class After:
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
    #: Of ``publish``: changes that count as inbox changes whatever the inbox shows when they
    #: are announced (``Machine._announce``).
    inbox_touched: list[str] = field(default_factory=list)
    budget: list[Turn] = field(default_factory=list)  # began to wait: is the live-turn budget exceeded?


def session_from(record: SessionRecord) -> Session:
    """A working copy of a stored session; its live turn, if any, is another
    instance's (``ELSEWHERE``) until adopted."""
    status = SessionStatus(record.status)
    session = Session(
        session_id=record.session_id,
        touched=record.touched,
        state=record.state or [],
        response=record.response,
        error=record.error,
        turn_id=record.turn_id,
        grants=dict(record.grants),
        title=record.title,
        senders=dict(record.senders),
        version=record.version,
        owner=record.owner,
    )
    if record.turn is not None and status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED):
        session.turn = Turn(
            session_id=session.session_id,
            turn_id=record.turn_id,
            message=record.turn.message,
            webhook=record.turn.webhook,
            deadline=record.turn.deadline,
            journal={e.seq: e for e in record.turn.journal},
            grants=record.turn.grants,
            started_at=record.turn.started_at,
            by=record.turn.by,
            approvals={ref: tuple(dict(a) for a in given) for ref, given in record.turn.approvals.items()},
            state=TurnState.ELSEWHERE,
        )
    elif status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED):
        session.error = EXITED  # a row without its turn: cannot be resumed (an error)
    return session


def busy(turn: Turn | None) -> bool:
    """Work the shutdown grace waits for: a turn running or about to, or one waiting on a
    person while a call of it is still inside its body (an approved tool, say) or a message
    of its worker waits for the store (the backlog)."""
    if turn is None:
        return False
    if turn.state in (TurnState.RUNNING, TurnState.QUEUED, TurnState.RESUMING):
        return True
    return turn.state is TurnState.WAITING and turn.under_way()


def last_line(text: str) -> str:
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


def pending_interrupt(entry: JournalEntry, approvals: Any = ()) -> PendingInterrupt:
    """A pending interrupt as clients see it, with the approvals given so far towards its quorum."""
    return PendingInterrupt(entry.ref or "", entry.payload or {}, entry.created_at, entry.expires_at,
                            tuple(dict(a) for a in approvals))


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


def webhook_wants(webhook: dict[str, Any] | None, event: str) -> bool:
    """Whether a message's webhook asked for ``event`` (the guide's default: idle, error)."""
    if not webhook:
        return False
    wanted = webhook.get("events")
    return event in (wanted if wanted is not None else ("idle", "error"))
