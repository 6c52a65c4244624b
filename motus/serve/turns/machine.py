"""The turn machine: every transition of a turn, the messages of its worker process, and
what a transition does once its session's lock is released.

The states and the moves between them are ``motus.serve.turns.state``'s; this module makes
the moves. ``Machine`` is the base of ``Turns`` (``motus.serve.turns.sessions``): it holds the
registry of sessions and the collaborators (the store, the compute ``Slots``, the ``Timers``,
the ``Replicas`` of other instances), and never asks which store it has: whatever differs
between one process and several instances on a shared store is the ``Replicas``'.

Guarantees:

- Every change is committed to the store first, then applied to the working copy, then
  published (long polls wake), all under the session's own lock; a store failure is a 503
  that changed nothing. A lock per session: a slow commit on one session never holds up
  another's transition (the store itself may serialise its writes).
- No pipe send, webhook, pool launch or publish happens under a session lock: a transition
  records them in an ``After``, which ``_finish`` carries out once the lock is released.
- Messages from a process the turn no longer owns (a stopped, killed or replaced handle) are
  ignored: a late worker can never resurrect or corrupt a session.
- An interrupt id is pending exactly once; a second resume of it is a 404 that says why.
- A worker message the store cannot take now waits in its turn's backlog and is retried
  (``_retry_backlog``): never dropped, never applied out of order.
- On a shared store, a write refused because another instance wrote first (``StaleSession``)
  is decided again on the row as it now is (``_attempt``, ``_apply_locked``).

Thread ownership and lock order: ``Session`` fields and its ``Turn`` are guarded by
``Session.lock``; the sessions dict by ``_registry``; slots by ``Slots.lock``, timers by
``Timers.lock`` (neither held while taking a session lock); what the inbox last showed
(``_inboxed``) by ``_inboxed_lock``, a leaf; a read of a session from the store by its stripe
of ``_loading``. Order: ``_loading`` -> session lock -> ``_registry`` | slots | timers |
``_inboxed_lock`` -> pool lock, and ``_registry`` -> ``_inboxed_lock`` (``_announce``). Request threads call the transitions, the pool's
manager thread ``worker_message``, the housekeeping thread the timed ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import islice
from dataclasses import dataclass
from typing import Any, TypeVar

from motus.api.approvers import approval_record, counted, effective, is_approval, progress, quorum_of, quorum_refusal, refusal, unrememberable
from motus.api.titles import derived_title
from motus.serve.errors import InterruptNotPending, InvalidTransition, NotAnApprover, Unprocessable, ServerUnavailable, SessionConflict, TryAgain, SessionNotFound, StoreCannotTake
from motus.serve.events import Events
from motus.durable.journal import canonical_payload, pack
from motus.serve.metrics import NO_METRICS, Hooks
from motus.serve.policy import ApprovalPolicy
from motus.serve.pool import Handle, PoolClosed, WorkerPool
from motus.serve.live import agent_text
from motus.durable.records import INTERRUPT, MODEL, Ack, Failure, Interrupt, Job, JournalEntry, Record, Result, Resume, message_problem, resulting_state
from motus.serve.store import AuditRecord, DurableStore, Event, SessionRecord, StaleSession, Store
from motus.serve.turns.queries import InboxCache
from motus.serve.turns.replicas import Replicas, replicas_for
from motus.serve.turns.slots import Slots
from motus.serve.turns.state import (
    already_resumed,
    ANONYMOUS,
    CANCELLED,
    EXITED,
    EXPIRED,
    MESSAGE_FAILED,
    OUTCOME_FAILED,
    OUTCOMES,
    After,
    Session,
    SessionStatus,
    Turn,
    TurnEnd,
    TurnState,
    interrupt_data,
    last_line,
    remembered_tool,
    storable_text,
    webhook_wants,
)
from motus.serve.turns.timers import PARK_SETTLE_SECONDS, STORE_GIVE_UP_SECONDS, STORE_RETRY_SECONDS, Timers

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How often a change refused by a shared store (the row changed meanwhile) is tried again.
STALE_RETRIES = 8

#: The most sessions one trim of the cache looks at. A trim follows every read from the
#: store, which adds one session; looking at a few dozen keeps the cache at its size while
#: there is anything to forget, and when there is not (a burst of thousands of turns, each
#: held until it parks) each read still costs a bounded look, not a pass over all of them.
TRIM_LOOK = 64


@dataclass(frozen=True)
class Answered:
    """What a person's answer did: the session's status after it, and, when it was one
    approval of a quorum that still needs more, how many more (``needed``) and where the
    quorum stands for people (``progress``: ``1 of 2 approvals: alice``)."""

    status: SessionStatus
    needed: int | None = None
    progress: str | None = None


class Machine:
    """The sessions of this server and the transitions of their turns (see the module docstring)."""

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
        max_live_turns: int = 0,
        session_cache: int = 0,
        approval_policy: ApprovalPolicy | None = None,
        key_roles: dict[str, frozenset[str]] | None = None,
    ) -> None:
        self.store = store
        #: The operator's policy file (immutable): it wins over what a payload says.
        self.approval_policy = approval_policy
        #: Each name of an API key that may write, with its roles (None: no keys); immutable.
        #: An approval towards a quorum counts only while its key is here with its role.
        self.key_roles = key_roles
        self.events = events
        self.max_workers = max_workers
        self.timeout = timeout
        self.park_after = park_after
        #: Turns waiting on a person that keep their process (0: no budget, only park_after);
        #: past it the longest-waiting park at once. Only where turns park (park_after set).
        self.max_live_turns = max_live_turns
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.max_interrupts = max_interrupts
        self._on_end = on_end
        self._clock = clock
        self.pool: WorkerPool | None = None
        self._registry = threading.Lock()
        #: The sessions held in memory, least recently used first. With a store that outlives
        #: the process, at most ``session_cache`` of them (0: all) beyond those that must stay
        #: (``Replicas.may_forget``); the rest are read from the store when used.
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.session_cache = session_cache
        #: One reader of a given session id from the store at a time (``_load``), striped.
        self._loading = tuple(threading.Lock() for _ in range(64))
        #: What ``_trim`` keeps to: memory's sessions are nowhere else, so all are kept.
        self._cache_limit = session_cache if isinstance(store, DurableStore) else 0
        #: What the inbox last showed of each session (``_inbox_view``: its pending interrupt
        #: ids and what else the inbox shows of them), so that a publish changes the inbox
        #: and wakes its long polls only when that changed (``_announce``).
        self._inboxed: dict[str, dict[str, str]] = {}  # session -> "interrupt id#approvals" (and the like) -> type
        self._inboxed_lock = threading.Lock()
        #: Turns that began to wait on a person with a process (``_park_over_budget``).
        self._live_waiting: dict[Turn, None] = {}
        self._live_waiting_lock = threading.Lock()
        #: The inbox as last read, for one ``Events.inbox_generation`` only (``Queries.inbox``).
        self._inbox_cache = InboxCache(-1)
        self.slots = Slots(max_workers)
        self._closing = False
        self._stopped = False
        self._hurried = False  # a quick stop: running turns get no more of their grace
        self._draining_done = False  # the shutdown grace is over: no slot is handed out
        self._housekeeper: threading.Thread | None = None
        self._swept = 0  # the sessions the TTL sweep under way removed so far (housekeeper's)
        self.timers = Timers(clock, lambda: self._stopped)
        self.metrics: Hooks = NO_METRICS  # the server's metrics (see metrics.py)
        #: What other instances on a shared store do, or that there are none.
        self.replicas: Replicas = replicas_for(store, self)
        #: This instance's name in a shared store: the owner of the turns it runs.
        self.instance = self.replicas.instance

    # -- lookups (request threads) -------------------------------------------------------

    def _all(self) -> list[Session]:
        with self._registry:
            return list(self._sessions.values())

    def _lookup(self, session_id: str) -> Session | None:
        """The session if it is held in memory (now the most recently used), else None."""
        with self._registry:
            session = self._sessions.get(session_id)
            if session is not None:
                self._sessions.move_to_end(session_id)
            return session

    def _session(self, session_id: str) -> Session:
        """The session, read from the store if it is not held in memory (created on another
        instance, or forgotten to keep within ``session_cache``); 404 if it does not exist."""
        session = self._lookup(session_id) or self._load(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def _load(self, session_id: str) -> Session | None:
        """Read a session that is not held into memory (``Replicas.load``), or None if the
        store has none. One thread at a time reads a given id, and it looks at the registry
        again first: a copy read while another thread held the session, changed it and
        forgot it again would be older than the store, and with one process nothing would
        ever read it again (the working copy is the truth). Then the cache is trimmed."""
        with self._loading[hash(session_id) % len(self._loading)]:
            session = self._lookup(session_id)
            if session is None:
                session = self.replicas.load(session_id)
        self._trim()
        return session

    def _read(self, session_id: str, read: Callable[[Session], T]) -> T:
        """``read(session)`` under its lock, on an up-to-date copy; 404 for one deleted."""
        return self._locked(session_id, lambda session, _after: read(session), self._finish_read)

    def _hold(self, session: Session, adopt: bool) -> Session:
        """Hold a session read from the store in memory, unless another thread did first
        (then that copy). ``adopt``: its live turn is this instance's (one process, or a row
        a shared store says this instance owns), parked or queued for replay as at a start.
        What the inbox shows of it is remembered for ``_announce``, as at a start."""
        after = After()
        with session.lock:  # held while registered: nobody uses the copy before it is adopted
            with self._registry:
                held = self._sessions.setdefault(session.session_id, session)
            if held is session:
                if adopt and session.turn is not None:
                    self._adopt_locked(session, session.turn, after)
                pending = _inbox_view(session)
                if pending:
                    with self._inboxed_lock:
                        self._inboxed.setdefault(session.session_id, pending)
        self._finish(after)
        return held

    def _trim(self, look: int | None = None) -> bool:
        """Forget the least recently used sessions beyond ``session_cache`` that may be
        forgotten (``Replicas.may_forget``: no process, no timer, nothing only memory holds),
        looking at no more than ``look`` of them (``TRIM_LOOK`` unless told). A session in use (its lock taken) is
        passed over; one that must stay is moved to the most recent end, so the next trim
        looks at others first. True when it forgot some and the cache is still over."""
        if not self._cache_limit:
            return False
        with self._registry:
            excess = len(self._sessions) - self._cache_limit
            if excess <= 0:
                return False
            candidates = list(islice(self._sessions.values(), min(excess, TRIM_LOOK if look is None else look)))
        forgot = 0
        for session in candidates:
            if not session.lock.acquire(blocking=False):
                continue
            try:
                forget = not session.deleted and self.replicas.may_forget(session)
                with self._registry:
                    if self._sessions.get(session.session_id) is not session:
                        continue
                    if forget:
                        del self._sessions[session.session_id]
                        session.forgotten = True
                        forgot += 1
                    else:
                        self._sessions.move_to_end(session.session_id)
            finally:
                session.lock.release()
        with self._registry:
            return forgot > 0 and len(self._sessions) > self._cache_limit

    def _finish_read(self, after: After) -> None:
        """``_finish`` for a read, which may run inside a long poll's check, under an
        ``Events`` condition: it publishes nothing (the listener that marked the session
        changed has woken its waiters already)."""
        after.publish.clear()
        self._finish(after)

    def _attempt(self, session_id: str, change: Callable[[Session, After], T]) -> T:
        """``change(session, after)`` under the session's lock, then its ``after``. On a
        shared store a write refused because another instance changed the row first is
        tried again on the row as it now is (where the change may be refused for good: an
        interrupt answered meanwhile is a 404)."""
        return self._locked(session_id, change, self._finish)

    def _locked(self, session_id: str, use: Callable[[Session, After], T], finish: Callable[[After], None]) -> T:
        """``use(session, after)`` under the session's lock on an up-to-date copy (404 for
        one deleted), then ``finish(after)``. Tried again on the session as it now is when
        the copy locked was forgotten meanwhile (the registry or the store has it), or when
        a shared store refused a write because another instance changed the row first."""
        why = "kept changing on other instances"
        for _ in range(STALE_RETRIES):
            session = self._session(session_id)
            after = After()
            try:
                with session.lock:
                    if session.forgotten:
                        why = "kept moving in and out of memory"
                        continue
                    self.replicas.fresh_locked(session, after, verify=True)
                    if session.deleted:
                        raise SessionNotFound(session_id)
                    result = use(session, after)
            except StaleSession:
                session.stale = True
                why = "kept changing on other instances"
                continue
            finally:
                finish(after)
            return result
        raise TryAgain(f"Session {session_id} {why}; try again")

    def _refresh_now(self, session: Session, publish: bool, load: bool = False, reread: bool = False) -> None:
        """Read a stale session again under its lock, then do what that decided, with its
        waiters woken only if ``publish`` (not from a read, which may run inside a long
        poll's check). ``ServerUnavailable`` when the store cannot be read: it stays stale.
        A copy forgotten meanwhile is not the session any more: the one held now is read
        again instead (``load``: read from the store if none is, when the refresh must act,
        e.g. adopt a turn just taken over; else nothing is held, nothing to refresh).
        ``reread``: read the row whether or not the copy is marked stale."""
        for _ in range(STALE_RETRIES):
            after = After()
            try:
                with session.lock:
                    if not session.forgotten:
                        if reread and not session.deleted:
                            self.replicas.refresh_locked(session, after)
                        else:
                            self.replicas.fresh_locked(session, after)
                        return
            finally:
                if publish:
                    self._finish(after)
                else:
                    self._finish_read(after)
            found = self._lookup(session.session_id) or (self._load(session.session_id) if load else None)
            if found is None:
                return
            session = found
            session.stale = True
        raise TryAgain(f"Session {session.session_id} kept moving in and out of memory; try again")

    # -- turns (request threads) ---------------------------------------------------------

    def start_turn(
        self, session_id: str, message: dict[str, Any], webhook: dict[str, Any] | None = None, by: str | None = None
    ) -> None:
        """idle|error -> running: commit the new turn, then queue it for a compute slot (it
        runs on this instance, which owns it until it ends). ``by`` is the name of the key
        that sent the message; a session without a title takes the message's."""

        def start(session: Session, after: After) -> Turn:
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
                by=by,
            )
            title = session.title or derived_title(message)
            self._save(session, session.record(status=SessionStatus.RUNNING, response=None, error=None,
                                      turn_id=turn.turn_id, touched=now, turn=turn.record(), owner=self.instance,
                                      title=title),
                       events=[session.event("status", now, status="running", turn_id=turn.turn_id)])
            session.turn, session.turn_id, session.owner, session.title = turn, turn.turn_id, self.instance, title
            session.response, session.error, session.touched = None, None, now
            after.queued.append(turn)
            after.publish.append(session_id)
            self.metrics.turn_started()
            return turn

        turn = self._attempt(session_id, start)
        if turn.deadline is not None:
            self.timers.schedule(turn.deadline, "timeout", turn)

    def override_for(self, payload: Any) -> Any:
        """The operator's policy file's table for an interrupt with this payload, or None."""
        return self.approval_policy.for_payload(payload) if self.approval_policy is not None else None

    def policy_for(self, payload: Any) -> Any:
        """The policy that governs an interrupt (``motus.api.approvers.effective``): its
        tool's, with the file's fields in place; None when nothing restricts who answers."""
        return effective(payload, self.override_for(payload))

    def shown_payload(self, payload: Any) -> Any:
        """An interrupt's payload as clients see it: with the policy the server enforces."""
        return self.approval_policy.shown(payload) if self.approval_policy is not None else payload

    def quorum_state(self, payload: Any, approvals: Any, sender: str | None) -> tuple[int, list[Any]]:
        """An interrupt's quorum (1: none) and the approvals given so far that count
        (``motus.api.approvers.counted``: keys still here with the role, not the sender
        where the policy forbids it)."""
        policy = self.policy_for(payload)
        quorum = quorum_of(policy)
        return quorum, (counted(approvals, policy, self.key_roles, sender) if quorum > 1 and approvals else [])

    def _allowed_grants(self, grants: Any) -> tuple[str, ...]:
        """The grants a turn may use (``ApprovalPolicy.allowed_grants``; all without a file)."""
        if self.approval_policy is None:
            return tuple(sorted(grants))
        return self.approval_policy.allowed_grants(grants)

    def resume(
        self, session_id: str, interrupt_id: str, value: Any, by: str = ANONYMOUS, roles: frozenset[str] = frozenset()
    ) -> SessionStatus:
        """``answer``'s status: the one this left the session in."""
        return self.answer(session_id, interrupt_id, value, by, roles).status

    def answer(
        self, session_id: str, interrupt_id: str, value: Any, by: str = ANONYMOUS, roles: frozenset[str] = frozenset()
    ) -> Answered:
        """Answer one pending interrupt on behalf of ``by`` (a key's name, with ``roles``);
        returns ``Answered``: the status this left the session in, and where a quorum
        stands if this was one approval of several. An interrupt whose payload names who
        may answer it (``motus.api.approvers``) refuses anyone else with ``NotAnApprover``
        (403), changing nothing. One that needs a quorum of approvals records each approval
        before the last (``_approve_partly_locked``) and stays pending; the last approval, or
        any rejection, resolves it. A turn whose worker runs on another instance gets
        the value from that instance (it reads the answer from the store); one whose instance
        is gone is taken over here and replayed."""

        def resume(session: Session, after: After) -> Answered:
            turn = session.turn
            pending = turn.pending() if turn is not None and session.status is SessionStatus.INTERRUPTED else []
            entry = next((e for e in pending if e.ref == interrupt_id), None)
            if entry is None or turn is None:
                raise self._not_pending(session, interrupt_id)
            take = turn.state is TurnState.ELSEWHERE and not self.replicas.owner_alive(session.owner)
            if take:
                # Journal records do not change the row's version: the copy here may lack
                # some the gone instance wrote (a step, a started tool). Replay from the store's.
                self.replicas.refresh_locked(session, after, force=True)
                turn = session.turn
                pending = turn.pending() if turn is not None and session.status is SessionStatus.INTERRUPTED else []
                entry = next((e for e in pending if e.ref == interrupt_id), None)
                if entry is None or turn is None:
                    raise self._not_pending(session, interrupt_id)
                take = turn.state is TurnState.ELSEWHERE
            override = self.override_for(entry.payload)
            why = refusal(entry.payload, by, roles, turn.by, override)
            if why is not None:
                raise NotAnApprover(f"Forbidden: {why}")
            why = unrememberable(entry.payload, value, override)
            if why is not None:
                raise Unprocessable(why)
            quorum, given = self.quorum_state(entry.payload, turn.approvals.get(interrupt_id, ()), turn.by)
            refused = quorum_refusal(entry.payload, value, by, [a.get("by") for a in given], quorum)
            if refused is not None:
                status, why = refused
                raise NotAnApprover(f"Forbidden: {why}") if status == 403 else Unprocessable(why)
            if quorum > 1 and is_approval(entry.payload, value) and len(given) + 1 < quorum:
                return self._approve_partly_locked(session, turn, entry, value, by, quorum, given, after)
            return Answered(self._resolve_locked(session, turn, entry, len(pending) == 1, value, by, after, take=take))

        return self._attempt(session_id, resume)

    def _approve_partly_locked(
        self, session: Session, turn: Turn, entry: JournalEntry, value: Any, by: str, quorum: int,
        given_before: list[Any], after: After,
    ) -> Answered:
        """One approval towards a quorum, not the last: committed in the turn's row (so a
        restart, a replay or another instance keeps it) with its audit record and an
        ``approval`` event; the interrupt stays pending and the turn waits on.
        ``given_before``: the approvals given before that still count (``quorum_state``)."""
        now = self._clock()
        interrupt_id = entry.ref or ""
        mine = {"by": by, "at": now}
        approvals = {**turn.approvals, interrupt_id: (*turn.approvals.get(interrupt_id, ()), mine)}
        given = [*given_before, mine]
        names = [a["by"] for a in given]
        events = [session.event("approval", now, interrupt_id=interrupt_id, type=entry.label, by=by, approvals=names,
                                quorum=quorum, progress=progress(quorum, names), turn_id=turn.turn_id)]
        audit = [AuditRecord(session.session_id, "approval", now, by, {
            "interrupt_id": interrupt_id, "type": entry.label, "payload": entry.payload, "value": value,
            "approvals": [approval_record(a) for a in given], "quorum": quorum,
            "turn_id": turn.turn_id, "history_at": len(session.state),
        })]
        self._save(session, session.record(touched=now, turn=turn.record(approvals)), (), events, audit)
        turn.approvals = approvals
        session.touched = now
        after.publish.append(session.session_id)
        return Answered(SessionStatus.INTERRUPTED, quorum - len(given), progress(quorum, names))

    def _resolve_locked(
        self, session: Session, turn: Turn, entry: JournalEntry, last: bool, value: Any, by: str, after: After,
        expired: bool = False, take: bool = False,
    ) -> SessionStatus:
        """One pending interrupt answered (by a person, or by its timeout with its default):
        commit the answer with its audit record, its events and any grant it gives, then
        pass the value on (now, or when the turn gets a slot, or by replay). Under a quorum
        the audit record lists the approvals that counted (``approvals``, this answer's too
        when it approved) and those given that no longer did (``not_counted``)."""
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
            # Where the turn's messages start in the history (which changes only when a turn
            # ends): a client places the record among that turn's messages, not an earlier one's.
            "turn_id": turn.turn_id, "history_at": len(session.state),
        })]
        raw = turn.approvals.get(interrupt_id, ())
        quorum, given = self.quorum_state(entry.payload, raw, turn.by)
        approvals = {ref: a for ref, a in turn.approvals.items() if ref != interrupt_id}
        if quorum > 1:
            again = any(a.get("by") == by for a in given)  # a quorum met already, completed by one who gave it
            every = [*given, {"by": by, "at": now}] if not expired and not again and is_approval(entry.payload, value) else list(given)
            audit[0].data["approvals"] = [approval_record(a) for a in every]
            dropped = [approval_record(a) for a in raw if a not in given]
            if dropped:
                audit[0].data["not_counted"] = dropped
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
        record = session.record(status=status, touched=now, grants=grants, owner=owner, turn=turn.record(approvals))
        self._save(session, record, [answered], events, audit)
        turn.journal[answered.seq] = answered
        turn.approvals = approvals
        session.touched, session.grants, session.owner = now, grants, owner
        session.retire(interrupt_id, EXPIRED if expired else already_resumed(by, now))
        if take:
            self._adopt_locked(session, turn, after)
        self._deliver_locked(session, turn, Resume(interrupt_id=interrupt_id, value=value), last, after)
        # Last, as it may raise: the answer is committed, so it must reach the turn first.
        self.metrics.interrupt_answered(reason, now - entry.created_at if entry.created_at is not None else None)
        return status

    def _shown_interrupt(self, entry: JournalEntry) -> dict[str, Any]:
        """An interrupt as events and webhooks show it: with the policy the server enforces
        (the operator's file's fields in place of the tool's)."""
        shown = interrupt_data(entry)
        shown["payload"] = self.shown_payload(shown["payload"])
        return shown

    def _deliver_locked(self, session: Session, turn: Turn, message: Resume, last: bool, after: After) -> None:
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
        self.replicas.learn_answer(session, interrupt_id)
        return InterruptNotPending(session.why_not_pending(interrupt_id))

    def _adopt_locked(self, session: Session, turn: Turn, after: After) -> None:
        """A stored turn becomes this instance's to run: parked while it waits on a person,
        queued for replay otherwise; its deadline and interrupt expiries are timed here."""
        pending = turn.pending()
        turn.move(TurnState.PARKED if pending else TurnState.QUEUED)
        if not pending:
            after.queued.append(turn)
        for entry in pending:
            if entry.expires_at is not None:
                self.timers.schedule(entry.expires_at, "expire", turn, arg=entry.seq)
        if turn.deadline is not None:
            self.timers.schedule(turn.deadline, "timeout", turn)

    # -- the pool's listener (manager thread) --------------------------------------------

    def worker_message(self, handle: Handle, message: object) -> None:
        """A message from a turn's process (``worker_messages`` with one)."""
        self.worker_messages(handle, [message])

    def worker_messages(self, handle: Handle, messages: list[object]) -> None:
        """Messages a turn's process wrote together, in order, applied under one hold of the
        session lock and published once: the interrupts of one ``asyncio.gather`` (written
        in one go, see ``motus.durable.interrupt``) are seen together, by a long poll or a
        read, never the first alone. If the store cannot take one now (locked, full), it
        waits in the turn's backlog, with every later message of that turn behind it, and
        is retried: a worker message is never dropped (see ``_retry_backlog``)."""
        session, turn = self._owner(handle)
        if session is None or turn is None:
            return
        after = After()
        try:
            with session.lock:
                for message in _together(messages):
                    if session.deleted or session.turn is not turn or turn.handle is not handle or turn.state is TurnState.ENDED:
                        return  # a message from a process this turn no longer owns
                    turn.last_heard = time.monotonic()
                    if turn.backlog:
                        turn.backlog.append(message)
                        continue
                    try:
                        self._apply_or_end_locked(session, turn, handle, message, after)
                    except ServerUnavailable as exc:
                        turn.backlog.append(message)
                        turn.backlog_since = time.monotonic()
                        log.warning("session %s: %s; the worker's message waits and is retried", session.session_id, exc.detail)
                        self.timers.schedule(time.monotonic() + STORE_RETRY_SECONDS, "retry", turn, monotonic=True)
        finally:
            self._finish(after)  # what was decided before a failure (a slot freed) still happens
        if self._stopped and any(isinstance(message, Interrupt) for message in messages):
            self._settle_for_shutdown(session)  # nobody can answer it before the next start

    def _apply_or_end_locked(self, session: Session, turn: Turn, handle: Handle, message: object, after: After) -> None:
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

    def _apply_locked(self, session: Session, turn: Turn, handle: Handle, message: object, after: After) -> None:
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
                self.replicas.fresh_locked(session, after)
                if session.deleted or session.turn is not turn or turn.handle is not handle or turn.state is TurnState.ENDED:
                    return
        raise TryAgain(f"Session {session.session_id} kept changing on other instances; try again")

    def _apply_once_locked(
        self, session: Session, turn: Turn, handle: Handle, message: object, after: After, whole_history: bool = False
    ) -> None:
        problem = message.problem(turn) if isinstance(message, Together) else message_problem(message) or turn.conflict(message)
        if problem is not None:  # the session stays as it was; the process is stopped
            log.warning("session %s: its worker sent a malformed %s", session.session_id, problem)
            self._end_locked(session, turn, error=f"Worker sent a malformed {problem}", after=after)
            return
        if isinstance(message, Interrupt):
            self._interrupted_locked(session, turn, [message], after)
        elif isinstance(message, Together):
            self._interrupted_locked(session, turn, message.interrupts, after)
        elif isinstance(message, Record):
            entry = message.entry
            if entry.kind == MODEL and entry.done and turn.pending():
                # What the agent says beside its interrupts is their inbox items' agent_text:
                # committed with a "said" event, so that every instance's kept inbox
                # (``SharedStore.changed_since``) and an open Inbox view learn of it.
                now = self._clock()
                said = agent_text([*turn.replies(), entry])
                self._save(session, session.record(touched=now), [entry],
                           [session.event("said", now, turn_id=turn.turn_id, agent_text=said)])
                session.touched = now
                after.publish.append(session.session_id)
            else:
                self._commit(lambda: self.store.save_entries(session.session_id, turn.turn_id, [entry]))
            turn.journal[entry.seq] = entry
            # (A record applied from the backlog after its process ended has no one to tell.)
            if message.ack and handle is not None:
                after.sends.append((handle, Ack(entry.seq)))
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

    def _retry_backlog(self, turn: Turn) -> None:
        """Apply a turn's waiting worker messages in order (housekeeping thread). After
        ``STORE_GIVE_UP_SECONDS`` of failures the turn ends in error: its process is stopped,
        and the store keeps what it last accepted (replayed at the next start if durable)."""
        session = self._lookup(turn.session_id)
        if session is None:
            return
        after = After()
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
                        self.timers.schedule(time.monotonic() + STORE_RETRY_SECONDS, "retry", turn, monotonic=True)
                    else:
                        log.error("session %s: giving up on the store after %.0f s: %s", session.session_id, STORE_GIVE_UP_SECONDS, exc.detail)
                        turn.backlog.clear()
                        error = f"Could not save the turn to the session store: {exc.detail}"
                        session.error = error
                        self._stop_turn_locked(turn, after)
                        session.turn = None
                        session.store_behind = True  # the row still waits: its next save changes the inbox
                        after.publish.append(session.session_id)  # an inbox change: its view gains "store#behind"
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

    def _interrupted_locked(self, session: Session, turn: Turn, messages: list[Interrupt], after: After) -> None:
        """The turn waits on ``messages`` (one interrupt, or those of one ``asyncio.gather``):
        committed in one save, then published once, so nobody sees some of them alone."""
        now = self._clock()
        entries: list[JournalEntry] = []
        fresh: list[JournalEntry] = []
        events: list[Event] = []
        for message in messages:
            known = turn.journal.get(message.seq)
            if known is not None and known.kind == INTERRUPT and known.ref == message.interrupt_id:
                entries.append(known)  # a replay waits again on an interrupt it had raised before
                continue
            kind = message.payload.get("type")
            timeout = message.timeout if message.timeout is not None and message.timeout > 0 else None
            entry = JournalEntry(
                seq=message.seq, kind=INTERRUPT, key=canonical_payload(message.payload),
                label=storable_text(kind) if isinstance(kind, str) else "unknown", ref=message.interrupt_id, payload=message.payload,
                parent=message.parent, created_at=now,
                expires_at=now + timeout if timeout is not None else None,
                default=pack(("ok", message.default)) if timeout is not None else None,
            )
            entries.append(entry)
            fresh.append(entry)
            events.append(session.event("interrupt", now, **self._shown_interrupt(entry)))
        if session.status is not SessionStatus.INTERRUPTED:
            events.append(session.event("status", now, status=SessionStatus.INTERRUPTED.value))
        self._save(session, session.record(status=SessionStatus.INTERRUPTED, touched=now), entries, events)
        for entry in entries:
            turn.journal[entry.seq] = entry
        session.touched = now
        for entry in fresh:
            self.metrics.interrupt_raised()
            if entry.expires_at is not None:
                self.timers.schedule(entry.expires_at, "expire", turn, arg=entry.seq)
        if fresh and webhook_wants(turn.webhook, "interrupted"):  # one delivery for what came together
            after.ended.append(TurnEnd(
                session_id=session.session_id, status=SessionStatus.INTERRUPTED, response=None, error=None,
                messages=[], webhook=turn.webhook, interrupts=[self._shown_interrupt(e) for e in turn.pending()],
            ))
        if turn.state is TurnState.RESUMING:
            after.sends.extend((turn.handle, value) for value in turn.queued_values)  # type: ignore[misc]
            turn.queued_values.clear()
        after.freed += turn.move(TurnState.WAITING)
        after.publish.append(session.session_id)
        after.inbox_touched.append(session.session_id)  # even if answered before it is announced
        if self.park_after is not None:
            self.timers.schedule(time.monotonic() + max(self.park_after, PARK_SETTLE_SECONDS), "park", turn, monotonic=True)
            if self.max_live_turns:
                after.budget.append(turn)

    def _end_locked(
        self,
        session: Session,
        turn: Turn,
        after: After,
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
        senders = session.senders if state is None else _senders(session, turn, new_state)
        events = [
            session.event("error", now, error=error) if error is not None else session.event("message", now, response=response),
            session.event("status", now, status=status.value),
        ]
        self._save(session, session.record(status=status, response=response, error=error, state=new_state, touched=now, turn=None,
                                           owner=None, kept=kept if state is not None else 0, senders=senders), events=events)
        if error is not None:
            lines = error.strip().splitlines()
            why = f"its turn ended with an error ({lines[-1] if lines else 'no message'})"
        else:
            why = "its turn has already finished"
        for entry in turn.pending():
            session.retire(entry.ref or "", why)
        session.response, session.error, session.state, session.touched = response, error, new_state, now
        session.owner, session.senders = None, senders
        self._stop_turn_locked(turn, after)
        session.turn = None  # its journal goes with it; late messages from it are ignored
        after.publish.append(session.session_id)
        if error is not None:
            after.failed.append((session.session_id, error))
        if webhook_wants(turn.webhook, status.value):  # only then is anything kept for a webhook
            include = bool(turn.webhook.get("include_messages"))  # type: ignore[union-attr]
            after.ended.append(
                TurnEnd(session_id=session.session_id, status=status, response=response, error=error,
                        messages=new_state if include else [], webhook=turn.webhook)
            )
        self.metrics.turn_ended(OUTCOMES.get(error, "error"), time.monotonic() - turn.started)  # last: it may raise

    def _stop_turn_locked(self, turn: Turn, after: After) -> None:
        after.freed += turn.move(TurnState.ENDED)
        turn.queued_values.clear()
        if turn.handle is not None:
            after.stop.append(turn.handle)
            turn.handle = None

    # -- slots ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand free compute slots to queued turns (any thread, no session lock held)."""
        if self.pool is None:
            return
        self.slots.dispatch(self._grant)

    def _grant(self, turn: Turn) -> bool:
        session = self._lookup(turn.session_id)
        if session is None:
            return False
        after = After()
        with session.lock:
            if session.deleted or session.turn is not turn or self._draining_done:
                return False  # gone, moved on, or past the shutdown grace: start nothing new
            if turn.state is TurnState.QUEUED:
                job = Job(
                    session_id=turn.session_id, turn_id=turn.turn_id, message=turn.message, state=list(session.state),
                    max_interrupts=self.max_interrupts, journal=tuple(sorted(turn.journal.values(), key=lambda e: e.seq)),
                    # A tool the operator's policy covers is asked every time (see
                    # unrememberable), also in a turn that began before the policy did.
                    grants=self._allowed_grants(turn.grants),
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

    def _finish(self, after: After) -> None:
        """Do what a transition decided, with no session lock held: pool actions, slot
        release, queueing, publishing, webhooks, the live-turn budget."""
        if after.budget:
            self._park_over_budget(after.budget)
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
            self.slots.release(after.freed, after.queued)
            # Before waking the watchers: a resumed turn gets its slot and its value first,
            # rather than after every open event stream has had the GIL.
            self._dispatch()
        for session_id in after.publish:
            self._announce(session_id, session_id in after.inbox_touched)
        for session_id, error in after.failed:
            log.info("turn of session %s failed: %s", session_id, last_line(error))
        for end in after.ended:
            self._on_end(end)

    def _record_inbox(self, session_id: str, pending: dict[str, str]) -> dict[str, str]:
        """Record what the inbox shows of a session now; returns what it showed before.
        ``_inboxed_lock`` is taken inside a session's lock or the registry (never the other
        way round) and nothing is taken inside it."""
        with self._inboxed_lock:
            before = self._inboxed.get(session_id, {})
            if pending:
                self._inboxed[session_id] = pending
            else:
                self._inboxed.pop(session_id, None)
        return before

    def _announce(self, session_id: str, touched: bool = False) -> None:
        """Publish a committed change of a session (no lock held). Inbox long polls are woken
        only when the session's pending interrupts changed, and only those watching every
        type or the types that came or went: a turn's other steps (running, a record, its
        end without one) do not make every approver's poll run again.

        ``touched``: the change was one the inbox may have shown even if what it shows now
        is what it showed at the last announce (an interrupt that came, then was answered
        before this ran: a reader between the two kept it, found by attack). Such a change
        always counts as an inbox change of the session, so the kept inbox reads it again."""
        session = self._lookup(session_id)
        pending: dict[str, str] = {}
        if session is None:
            # Deleted, or forgotten (``_trim``): what it showed goes. Decided under the
            # registry, which ``_hold`` registers a copy under before it records what that
            # shows: a copy held again meanwhile is announced as held, never forgotten after
            # its record (its next answer then looked like no change: found by attack).
            with self._registry:
                session = self._sessions.get(session_id)
                if session is None:
                    before = self._record_inbox(session_id, pending)
        if session is not None:
            # Read and recorded under the session's lock, so that two announces of one session
            # (a resume's on its request thread, the worker's next interrupt's on the manager
            # thread) record what they read in the order they read it: recorded the other way
            # round, the older read hid a pending interrupt from ``_inboxed``, and its answer
            # later looked like no change (no inbox publish: the cached inbox kept it).
            with session.lock:
                pending = _inbox_view(session)
                before = self._record_inbox(session_id, pending)
        kinds = {kind for key, kind in pending.items() if key not in before}
        kinds.update(kind for key, kind in before.items() if key not in pending)
        if touched and not kinds:
            kinds = {""}  # an inbox change no long poll of a type waits for
        self.events.publish(session_id, inbox=kinds)

    def _save(
        self,
        session: Session,
        record: SessionRecord,
        entries: list[JournalEntry] | tuple[JournalEntry, ...] = (),
        events: list[Event] | tuple[Event, ...] = (),
        audit: list[AuditRecord] | tuple[AuditRecord, ...] = (),
    ) -> None:
        self._commit(lambda: self.store.save(record, entries, events, audit))
        session.version = session.saved_here = record.version
        session.store_behind = False

    def _park_over_budget(self, began: list[Turn]) -> None:
        """More turns wait on a person with a process than ``max_live_turns``: the ones
        waiting longest (whose worker was heard from least recently) park now instead of
        after ``park_after``. Read without their locks, so only a choice: ``_park`` looks at
        each again under its lock (and still lets its worker settle).

        The candidates are the turns that began to wait since (``_live_waiting``, pruned of
        those that no longer wait with a process), not every session: with the budget kept,
        they are about ``max_live_turns`` however many sessions there are."""
        with self._live_waiting_lock:
            for turn in began:
                self._live_waiting[turn] = None
            waiting = [turn for turn in self._live_waiting if turn.state is TurnState.WAITING and turn.handle is not None]
            self._live_waiting = dict.fromkeys(waiting)
        excess = len(waiting) - self.max_live_turns
        if excess <= 0:
            return
        waiting.sort(key=lambda turn: turn.last_heard)
        now = time.monotonic()
        for turn in waiting[:excess]:
            self.timers.schedule(now, "park now", turn, monotonic=True)

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
            raise TryAgain(f"Could not save the change to the session store: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Together:
    """Interrupts a worker wrote in one go (the branches of one ``asyncio.gather``), applied
    as one message: one save, one publish (``Machine._interrupted_locked``)."""

    interrupts: list[Interrupt]

    def problem(self, turn: Turn) -> str | None:
        """``message_problem`` and ``Turn.conflict`` of each, and of each against the others
        (no two may share a seq or an id: the turn's journal does not hold them yet)."""
        for interrupt in self.interrupts:
            problem = message_problem(interrupt) or turn.conflict(interrupt)
            if problem is not None:
                return problem
        if len({interrupt.seq for interrupt in self.interrupts}) < len(self.interrupts):
            return "interrupt: two raised together share a seq"
        if len({interrupt.interrupt_id for interrupt in self.interrupts}) < len(self.interrupts):
            return "interrupt: two raised together share an id"
        return None


def _together(messages: list[object]) -> list[object]:
    """``messages`` with each run of two or more interrupts made one ``Together``."""
    grouped: list[object] = []
    run: list[Interrupt] = []
    for message in [*messages, None]:
        if isinstance(message, Interrupt):
            run.append(message)
            continue
        if run:
            grouped.append(run[0] if len(run) == 1 else Together(run))
            run = []
        if message is not None:
            grouped.append(message)
    return grouped


#: How many senders of messages a session remembers (the newest).
SENDERS_KEPT = 200


def _senders(session: Session, turn: Turn, new_state: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Who sent which user message, once ``turn`` ended with history ``new_state``: those
    known of messages the agent kept where they were, and this turn's sender for its message
    if the agent stored it where the turn began (an agent owns its history: one that
    rewrites it loses what cannot be matched, never gains a wrong name)."""
    old = session.state
    kept = {index: sender for index, sender in session.senders.items()
            if index < len(old) and index < len(new_state) and new_state[index] == old[index]}
    at = len(old)
    stored = new_state[at] if at < len(new_state) else None
    if turn.by is not None and isinstance(stored, dict) and stored.get("role") == "user" and stored.get("content") == turn.message.get("content"):
        kept[at] = {"by": turn.by, "at": turn.started_at}
    return dict(sorted(kept.items())[-SENDERS_KEPT:])


def _inbox_view(session: Session) -> dict[str, str]:
    """What the inbox shows of a session (under its lock), as keys that change when it
    does: its pending interrupts' ids (with the approvals each has towards a quorum) and
    types; beside them, how many of its turn's model calls have finished (the items'
    ``agent_text``); and whether the store may show what this copy does not
    (``Session.store_behind``). A key that comes or goes publishes an inbox change, and
    the kept inbox reads the session again (``Queries.inbox``): a change of what it shows
    that no key tracked would stay in the kept inbox until the session's interrupts change.
    The title is published by ``retitle`` itself. Extra keys have the type "" (no inbox
    long poll waits for that type)."""
    view: dict[str, str] = {"store#behind": ""} if session.store_behind and not session.deleted else {}
    turn = session.turn
    if session.deleted or turn is None:
        return view
    # An approval towards a quorum changes what the inbox shows of an interrupt: its key
    # changes with the count, so the inbox is read again (and its long polls woken).
    interrupts = session.view().interrupts
    view.update((f"{item.interrupt_id}#{len(item.approvals)}", item.type) for item in interrupts)
    if interrupts:
        view[f"said#{len(turn.replies())}"] = ""
    return view
