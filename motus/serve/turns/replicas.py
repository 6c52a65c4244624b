"""Replicas: what other server instances on the same store do to this one's sessions.

On a shared store (PostgreSQL, several instances) the store is the truth and each instance's
sessions are a cache of it; in one process (memory, SQLite) the working copy is the truth and
there is nobody else. ``Replicas`` is what the turn machine asks either way, so it never asks
which store it has: ``LocalReplicas`` for one process, ``SharedReplicas`` for several.

Guarantees of ``SharedReplicas``:

- Every write names the row version it was based on and is refused (``StaleSession``) if
  another instance wrote first; the machine then decides again on the row as it is. A request
  reads the row's version before it answers (``fresh_locked(verify=True)``), so it sees
  whatever another instance acknowledged before it.
- A live turn runs on the instance that owns it (``Session.owner``); answers given elsewhere
  reach it through the store's listener (``changed_elsewhere`` -> ``refresh_locked``), and a
  worker of a turn this instance lost (its lease lapsed, another took it) is stopped: two
  never run one turn.
- The lease is renewed three times a lease (``renew``, housekeeping thread); the live turns
  of an instance whose lease lapsed are taken over, each by exactly one instance; after an
  outage of this instance's own, nothing is taken over for one lease period.

Threads: request threads call ``load``, ``may_forget`` (under the session's lock), ``fresh_locked`` (under the session's
lock), ``owner_alive`` and ``learn_answer``; the store's listener thread calls
``changed_elsewhere`` and ``reconnected``; the housekeeping thread ``renew``. The sessions
are the machine's, guarded as it says; ``_lease_lost`` and ``_claim_after`` belong to the
housekeeping thread (and ``start``, before it runs).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from motus.serve.errors import ServerUnavailable, TryAgain
from motus.serve.events import ALL
from motus.durable.journal import unpack
from motus.durable.records import INTERRUPT, Resume
from motus.serve.store import DurableStore, Event, SessionRecord, SharedStore, Store
from motus.serve.turns.state import ALREADY_RESUMED, BY_TIMEOUT, EXPIRED, After, Session, TurnState, already_resumed, session_from

if TYPE_CHECKING:
    from motus.serve.turns.machine import Machine

log = logging.getLogger(__name__)

T = TypeVar("T")


class Replicas(ABC):
    """What the other instances on this store do, as the turn machine needs to know it."""

    #: This instance's name in the store: the owner of the turns it runs.
    instance: str

    @property
    @abstractmethod
    def lease_every(self) -> float | None:
        """How often the housekeeping thread calls ``renew`` (None: never)."""

    @abstractmethod
    def recover(self) -> int:
        """Before serving: make the live turns the store holds that this instance is to run
        its own (reading the sessions it must act on now). Returns how many will be replayed."""

    @abstractmethod
    def start(self) -> None:
        """Start following the other instances' changes (once the pool is up)."""

    @abstractmethod
    def load(self, session_id: str) -> Session | None:
        """A session not held in memory (created on another instance, or forgotten to keep
        within the session cache), read from the store into the registry, or None.
        ``ServerUnavailable`` when the store cannot be read."""

    @abstractmethod
    def may_forget(self, session: Session) -> bool:
        """Under the session's lock: whether its copy may be dropped from memory, the store
        holding all of it. Never a session with a process, a timer, or a turn this
        instance owns that only memory follows."""

    @abstractmethod
    def fresh_locked(self, session: Session, after: After, verify: bool = False) -> None:
        """Under the session's lock: bring the working copy up to the stored row if another
        instance changed it (``verify``: ask the store, rather than trust the listener)."""

    @abstractmethod
    def refresh_locked(self, session: Session, after: After, force: bool = False) -> None:
        """Under the session's lock: read the stored row again and make it the working copy
        (``force``: even at the same version, whose journal may have grown)."""

    @abstractmethod
    def owner_alive(self, owner: str | None) -> bool:
        """Whether the instance ``owner`` still runs its turns (else a resume takes over)."""

    @abstractmethod
    def learn_answer(self, session: Session, interrupt_id: str) -> None:
        """For the 404 of a resume of an interrupt that is not pending: retire it with why
        (expired, or already resumed) if another instance answered it."""

    @abstractmethod
    def delete_row(self, session: Session, events: Sequence[Event]) -> None:
        """Delete the session's row, with ``events`` (the machine commits it)."""

    @abstractmethod
    def renew(self) -> None:
        """Housekeeping: renew this instance's lease and take over the lapsed ones' turns."""


class LocalReplicas(Replicas):
    """One server process: there are no other instances. The working copy is the truth (the
    store only keeps it), so nothing is ever read back, and every live turn is this one's."""

    instance = "local"

    def __init__(self, store: Store, machine: Machine) -> None:
        self.store = store
        self.machine = machine

    @property
    def lease_every(self) -> float | None:
        return None  # no lease: nobody else could take a turn over

    def recover(self) -> int:
        """Every stored live turn is this process's: queued for replay if it was running,
        parked while it waits on a person. A parked turn with nothing timed is read from the
        store when used, once the session cache is full (the store says which are which
        without reading each: ``live_turns``)."""
        if not isinstance(self.store, DurableStore):
            return 0  # memory: nothing outlived the last process
        replayed = 0
        for live in ask_store(self.store.live_turns):
            cache = self.machine._cache_limit
            if live.status == "interrupted" and not live.timed and cache and len(self.machine._sessions) >= cache:
                continue
            session = self.load(live.session_id)
            turn = session.turn if session is not None else None
            replayed += turn is not None and turn.state is TurnState.QUEUED
        return replayed

    def start(self) -> None:
        """Nothing to follow: no other instance writes."""

    def load(self, session_id: str) -> Session | None:
        """From a durable store (a session forgotten to keep within the cache; its parked
        turn is adopted again); with memory every session is always in the registry."""
        if not isinstance(self.store, DurableStore):
            return None
        record = _read(self.store, session_id)
        return None if record is None else self.machine._hold(session_from(record), adopt=True)

    def may_forget(self, session: Session) -> bool:
        """No turn, or a parked one with no deadline and no expiring interrupt (those are
        timed in memory), and nothing waiting to be written."""
        turn = session.turn
        if turn is None:
            return True
        return (
            turn.state is TurnState.PARKED and turn.deadline is None and not turn.backlog
            and all(entry.expires_at is None for entry in turn.pending())
        )

    def fresh_locked(self, session: Session, after: After, verify: bool = False) -> None:
        """The working copy is the row: always fresh."""

    def refresh_locked(self, session: Session, after: After, force: bool = False) -> None:
        """The working copy is the row: nothing to read back."""

    def owner_alive(self, owner: str | None) -> bool:
        return True  # the only instance, alive

    def learn_answer(self, session: Session, interrupt_id: str) -> None:
        """Every answer was given here, and retired with its reason then; a copy read back
        from the store (forgotten meanwhile) asks the audit, as on a shared store."""
        if interrupt_id not in session.retired and isinstance(self.store, DurableStore):
            _learn_from_audit(self.store, session, interrupt_id)

    def delete_row(self, session: Session, events: Sequence[Event]) -> None:
        self.store.delete(session.session_id, events)

    def renew(self) -> None:
        """No lease to renew."""


class SharedReplicas(Replicas):
    """Several instances on one ``SharedStore`` (see the module docstring)."""

    def __init__(self, store: SharedStore, machine: Machine) -> None:
        self.store = store
        self.machine = machine
        self.instance = store.instance_id
        # Housekeeping thread: whether the last lease renewal failed, and until when
        # (monotonic) no other instance's turn is taken over.
        self._lease_lost = False
        self._claim_after = 0.0
        # Sessions claimed (``claim_orphans``) but not yet adopted here, because the store
        # could not be read: the row names this instance, so no instance would claim them
        # again; each renewal tries them until it succeeds.
        self._unadopted: set[str] = set()

    @property
    def lease_every(self) -> float | None:
        # Three times a lease, so one missed renewal never lets it lapse.
        return self.store.lease_seconds / 3

    def recover(self) -> int:
        """Every live turn is first seen as another instance's: those whose instance is
        gone are taken over by ``start`` (``claim_orphans``), each by one instance."""
        return 0

    def start(self) -> None:
        self.store.listen(self.changed_elsewhere, self.reconnected)
        self.renew()

    def load(self, session_id: str) -> Session | None:
        if "\x00" in session_id:  # (no text column holds a NUL)
            return None
        return self._load(session_id)

    def may_forget(self, session: Session) -> bool:
        """No turn, or a copy of another instance's: a turn this one owns is followed here
        (answers given elsewhere reach its worker through this copy)."""
        turn = session.turn
        return turn is None or (turn.state is TurnState.ELSEWHERE and session.owner != self.instance)

    def learn_answer(self, session: Session, interrupt_id: str) -> None:
        """An instance that learned of the answer from another's commit only knows it was
        answered, not by whom: the audit says whether it expired."""
        if session.retired.get(interrupt_id) in (None, ALREADY_RESUMED):
            _learn_from_audit(self.store, session, interrupt_id)

    def delete_row(self, session: Session, events: Sequence[Event]) -> None:
        self.store.delete(session.session_id, events, version=session.version)

    def _load(self, session_id: str) -> Session | None:
        """A session not held here, read from the store into the registry. Its live turn is
        another instance's (``ELSEWHERE``) until a refresh says otherwise, unless the row
        says this instance owns it: then it is adopted at once (a request thread that reads
        a turn just taken over, before ``renew`` does, must not leave it ``ELSEWHERE``:
        nothing would run it, and no instance claims a turn whose owner is alive)."""
        record = self._read(session_id)
        if record is None:
            return None
        return self.machine._hold(session_from(record), adopt=record.owner == self.instance)

    def _read(self, session_id: str) -> SessionRecord | None:
        return _read(self.store, session_id)

    def owner_alive(self, owner: str | None) -> bool:
        """For a resume: a live lease and a connection, asked of the store; an instance just
        back from an outage of its own takes nobody for gone (see ``renew``)."""
        if owner is None or owner == self.instance:
            return owner is not None
        if time.monotonic() < self._claim_after:
            return True  # just after an outage, nobody is taken for gone (see renew)
        try:
            return self.store.owner_alive(owner)
        except Exception as exc:
            raise TryAgain(f"Could not read the session store: {type(exc).__name__}: {exc}") from None

    def fresh_locked(self, session: Session, after: After, verify: bool = False) -> None:
        """Read the session again if another instance changed it. ``verify`` asks the
        store for the row's version rather than trusting the listener (a request must see
        what another instance acknowledged before it, whose notice may still be on its way)."""
        if session.deleted:
            return
        if verify and not session.stale:
            try:
                version = self.store.version_of(session.session_id)
            except Exception as exc:
                raise TryAgain(f"Could not read the session store: {type(exc).__name__}: {exc}") from None
            if version != session.version:
                session.stale = True  # never cleared here: a mark set while the store answered stands
        if session.stale:
            self.refresh_locked(session, after)

    def refresh_locked(self, session: Session, after: After, force: bool = False) -> None:
        """Bring the working copy up to the stored row another instance wrote.

        - The row is gone: the session was deleted; a worker of it here is stopped.
        - This instance runs the live turn: interrupts answered elsewhere are passed on to
          its worker (or, all answered, a parked turn is replayed), as a resume here would.
        - Otherwise the stored turn replaces ours: someone else's (``ELSEWHERE``), or one just
          taken over from a gone instance (adopted). A worker of a turn this instance lost
          (its lease lapsed and another took it) is stopped: two never run one turn."""
        record = self._read(session.session_id)
        session.stale = False
        turn = session.turn
        live = turn is not None and turn.state is not TurnState.ENDED
        if record is None:
            session.deleted = True
            if live:
                self.machine._stop_turn_locked(turn, after)  # type: ignore[arg-type]
                for entry in turn.pending():  # type: ignore[union-attr]
                    session.retire(entry.ref or "", "the session was deleted")
            with self.machine._registry:
                if self.machine._sessions.get(session.session_id) is session:
                    del self.machine._sessions[session.session_id]
            after.publish.append(session.session_id)
            return
        ours = record.owner == self.instance
        if record.version == session.version and not force and not (ours and live and turn.state is TurnState.ELSEWHERE):  # type: ignore[union-attr]
            return
        fresh = session_from(record)
        keep = live and ours and fresh.turn is not None and turn.turn_id == fresh.turn.turn_id and turn.state is not TurnState.ELSEWHERE  # type: ignore[union-attr]
        session.version, session.owner, session.touched = fresh.version, fresh.owner, fresh.touched
        session.response, session.error = fresh.response, fresh.error
        session.state, session.turn_id, session.grants, session.title = fresh.state, fresh.turn_id, fresh.grants, fresh.title
        session.senders = fresh.senders
        if keep:
            turn.approvals = dict(fresh.turn.approvals)  # type: ignore[union-attr]  # approvals of a quorum given elsewhere
            answered = []
            for entry in fresh.turn.journal.values():  # type: ignore[union-attr]
                known = turn.journal.get(entry.seq)  # type: ignore[union-attr]
                if known is not None and known.kind == INTERRUPT and not known.done and entry.done:
                    turn.journal[entry.seq] = entry  # type: ignore[union-attr]
                    answered.append(entry)
            for index, entry in enumerate(answered):
                session.retire(entry.ref or "", already_resumed(entry.answered_by, entry.answered_at))
                last = index == len(answered) - 1 and not turn.pending()  # type: ignore[union-attr]
                try:
                    value = unpack(entry.value)
                except Exception as exc:  # an answer is always a value; a default may not load here
                    value = {"error": f"could not read the stored answer: {exc}"}
                if turn.state in (TurnState.WAITING, TurnState.PARKED):  # type: ignore[union-attr]
                    self.machine._deliver_locked(session, turn, Resume(interrupt_id=entry.ref or "", value=value), last, after)  # type: ignore[arg-type]
                else:  # cannot happen: a turn with a pending interrupt waits; logged, never raised
                    log.warning("session %s: an answer given elsewhere found the turn %s", session.session_id, turn.state.value)  # type: ignore[union-attr]
        else:
            if live:
                for entry in turn.pending():  # type: ignore[union-attr]
                    session.retire(entry.ref or "", ALREADY_RESUMED)
                self.machine._stop_turn_locked(turn, after)  # type: ignore[arg-type]
            session.turn = fresh.turn
            if fresh.turn is not None and ours:
                self.machine._adopt_locked(session, fresh.turn, after)
        after.publish.append(session.session_id)

    def changed_elsewhere(self, session_id: str, version: int, new_events: bool = True) -> None:
        """The store's listener: a change was committed (by any instance). A session whose
        live turn runs here is read again at once (its worker may be owed an answer, or may
        have to stop); any other is marked to be read again when next used. Then the
        session's waiters are woken (its long polls, streams and the inbox)."""
        session = self.machine._lookup(session_id)
        if session is not None and version == session.version == session.saved_here and not new_events:
            return  # this instance's own change, already published when it was committed
        # A copy a request brought to this version by reading the row (``fresh_locked``, on
        # a read, publishes nothing: the listener is to) still owes its waiters this wake.
        if session is None:
            pass  # not held here: read from the store when used (lists and the inbox ask the store)
        elif version != session.version:
            session.stale = True
            turn = session.turn
            deleted = version == 0  # forgotten here at once: its id may be created again, it counts no more
            if deleted or session.owner == self.instance or (turn is not None and turn.state not in (TurnState.ENDED, TurnState.ELSEWHERE)):
                self.machine._refresh_now(session, publish=True)
        self.machine.events.publish(session_id)

    def reconnected(self) -> None:
        """The listener was away: anything may have changed. Everything is read again."""
        for session in self.machine._all():
            session.stale = True
        for session in self.machine._all():
            self.changed_elsewhere(session.session_id, -1)
        self.machine.events.publish(ALL)

    def renew(self) -> None:
        """Renew this instance's lease, then take over the live turns of instances whose
        lease lapsed (housekeeping thread, and once at start). The store gives each to
        exactly one instance; the new owner replays it, or keeps it parked."""
        try:
            self.store.renew_lease(fresh=self._lease_lost)  # not held up by the pool's reconnect backoff
        except Exception as exc:
            self._lease_lost = True
            log.warning("could not renew this instance's lease: %s", exc)
            return
        if self._lease_lost:
            # After an outage every lease may have lapsed, the live instances' too: take
            # nothing over until each has had a full lease to renew its own.
            self._lease_lost = False
            self._claim_after = time.monotonic() + self.store.lease_seconds
            log.info("the lease is renewed again; no turn is taken over for one lease period")
        if time.monotonic() < self._claim_after:
            return
        try:
            claimed = self.store.claim_orphans()
        except Exception as exc:
            log.warning("could not take over the turns of gone instances: %s", exc)
            return
        for session_id in claimed:
            log.info("taking over the turn of session %s from an instance whose lease lapsed", session_id)
        for session_id in [*self._unadopted, *claimed]:
            try:
                session = self.machine._lookup(session_id) or self.machine._load(session_id)
                if session is not None:
                    # The row is read again under the session's lock whatever its stale mark
                    # says (a request thread's version check may run at the same time), and
                    # its turn adopted. ``load``: a copy forgotten before its lock is taken
                    # (another instance's turn until now) is read again, adopted on that one.
                    self.machine._refresh_now(session, publish=True, load=True, reread=True)
            except ServerUnavailable as exc:
                self._unadopted.add(session_id)
                log.warning("session %s: %s; taking its turn over is tried again", session_id, exc.detail)
            else:
                self._unadopted.discard(session_id)


def ask_store(query: Callable[[], T]) -> T:
    """A query of the store; ``ServerUnavailable`` (a 503) when it cannot be read."""
    try:
        return query()
    except Exception as exc:
        raise TryAgain(f"Could not read the session store: {type(exc).__name__}: {exc}") from None


def _read(store: DurableStore, session_id: str) -> SessionRecord | None:
    return ask_store(lambda: store.load_one(session_id))


def _learn_from_audit(store: DurableStore, session: Session, interrupt_id: str) -> None:
    """For the 404 of a late resume: the audit says whether the interrupt expired or was
    answered (the copy here may not know: answered elsewhere, or read back from the store)."""
    try:
        records = store.audit(session.session_id)
    except Exception as exc:  # the 404 stands; only its reason is less precise
        log.warning("session %s: could not read the audit for a late resume: %s", session.session_id, exc)
        return
    for record in records:
        if record.kind == "resolved" and record.data.get("interrupt_id") == interrupt_id:
            session.retire(interrupt_id, EXPIRED if record.by == BY_TIMEOUT else already_resumed(record.by, record.at))


def replicas_for(store: Store, machine: Machine) -> Replicas:
    """The replicas of ``store``: shared when several instances can share it."""
    if isinstance(store, SharedStore):
        return SharedReplicas(store, machine)
    return LocalReplicas(store, machine)
