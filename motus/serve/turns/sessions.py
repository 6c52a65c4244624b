"""Turns: all sessions of this server and the life of their turns; this module holds the
sessions' own lifecycle (create, delete, the TTL sweep, a remembered approval revoked) and the
server's start and stop (recover from the store, start, shut down).

``Turns`` is assembled from one concern a module:

- ``motus.serve.turns.state``: ``Turn`` and its states, ``Session`` (its status derived
  from its turn), the records the API and webhooks see.
- ``motus.serve.turns.machine``: the transitions, the worker messages, the effects after
  the lock (``Machine``, the base).
- ``motus.serve.turns.queries``: the reads (``Queries``).
- ``motus.serve.turns.timers``: deadlines, expiries, parking, retries (``TimedMoves``) and
  the housekeeping thread (``Timers``).
- ``motus.serve.turns.slots``: the compute slots (``Slots``).
- ``motus.serve.turns.replicas``: the other instances on a shared store, or none
  (``Replicas``).

Guarantees (the machine's hold here too: commit, then apply, then publish; effects after the
lock):

- A session id exists at most once; ``--max-sessions`` caps how many exist; a session that
  could not be saved does not exist.
- Shutdown: turns waiting on a person are parked (durable store: they wait in the store for
  the next start) or cancelled (memory); running turns get the shutdown grace; afterwards
  they are left to be replayed (durable) or cancelled (memory). A quick stop (``hurry``) cuts
  the grace short.
- The TTL sweep removes only idle and error sessions nothing has written to for ``ttl``.

Threads: request threads create, delete, revoke; the server's thread recovers, starts and
shuts down; the housekeeping thread sweeps. Lock order is the machine's.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from operator import attrgetter
from typing import Any

from motus.api.titles import first_title
from motus.serve.errors import GrantNotFound, ServerUnavailable, SessionConflict, SessionLimitReached, SessionNotFound
from motus.serve.pool import WorkerPool
from motus.serve.store import AuditRecord, DurableStore, Event, SharedStore, StaleSession
from motus.serve.turns.machine import Machine
from motus.serve.turns.queries import Queries
from motus.serve.turns.replicas import ask_store
from motus.serve.turns.state import ANONYMOUS, CANCELLED, After, Session, SessionStatus, SessionView, Turn, TurnState, busy
from motus.serve.turns.timers import TimedMoves

log = logging.getLogger(__name__)


class Turns(Queries, TimedMoves, Machine):
    """All sessions of this server and the life of their turns (see the module docstrings)."""

    # -- start and stop ------------------------------------------------------------------

    def recover(self) -> int:
        """Take up the live turns the store holds (before serving): interrupted turns come
        back parked with the same interrupt ids, running ones are queued to be replayed.
        Returns how many turns will be replayed. Sessions are read from the store when
        used; only those a restart must act on are read now (``Replicas.recover``). On a
        shared store every live turn is first seen as another instance's: those whose
        instance is gone are taken over by ``start`` (``claim_orphans``), each by one
        instance."""
        return self.replicas.recover()

    def start(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.replicas.start()
        self._housekeeper = threading.Thread(target=self._housekeep, name="motus-housekeeper", daemon=True)
        self._housekeeper.start()
        self._dispatch()

    def busy(self) -> bool:
        """Whether any turn is running code (the pool refills its spares when not)."""
        return self.slots.busy()

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
        noted: set[tuple[str, int]] = set()  # turns whose wait was logged
        while True:
            settled = True
            for session in self._all():
                turn = session.turn
                if turn is not None and turn.backlog:
                    self._retry_backlog(turn)  # the housekeeper fires no timer now: retried here
                settled &= self._settle_for_shutdown(session, noted=noted)  # waiting turns park (or are cancelled) as soon as they can
            if settled and not any(busy(s.turn) for s in self._all()):
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if self._hurried or (remaining is not None and remaining <= 0):
                break
            self.slots.wait(0.1 if remaining is None else min(0.1, remaining))
        self._draining_done = True
        for session in self._all():
            self._settle_for_shutdown(session, force=True)
        self.timers.wake()
        if self._housekeeper is not None:
            self._housekeeper.join()

    def _settle_for_shutdown(self, session: Session, force: bool = False, noted: set[tuple[str, int]] | None = None) -> bool:
        """Park (durable store) or cancel a turn that waits on a person, or any turn with
        ``force``. False when a waiting turn's worker, stopped to be looked at, still had
        something to say (``WorkerPool.hold_if_quiet``, as parking does): it is looked at
        again while the shutdown waits, so a call it had just started is not cut short."""
        held = None
        with session.lock:
            turn = session.turn
            if turn is None or turn.state in (TurnState.ENDED, TurnState.ELSEWHERE):
                return True
            if not (force or _quiet_waiting(turn) or turn.state is TurnState.PARKED):
                return True  # still doing work: it gets the shutdown grace (``busy``)
            if self.store.durable and not force and turn.state is TurnState.WAITING and turn.handle is not None:
                held = turn.handle
        pool = self.pool
        if held is not None and pool is not None and not pool.hold_if_quiet(held):
            if noted is not None and (session.session_id, turn.turn_id) not in noted:
                noted.add((session.session_id, turn.turn_id))  # said once, not at every pass
                log.info("session %s: its waiting turn's worker has said something not applied yet; "
                         "it is parked once that is applied", session.session_id)
            return False
        after = After()
        with session.lock:
            if held is not None and (session.turn is not turn or turn.handle is not held or not _quiet_waiting(turn)):
                if pool is not None:
                    pool.let_go(held)
                return False  # a request changed it meanwhile: looked at again
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
        return True

    # -- sessions ------------------------------------------------------------------------

    def create(
        self, session_id: str | None = None, state: list[dict[str, Any]] | None = None, title: str | None = None
    ) -> SessionView:
        """A new idle session, with a preloaded history; its title is ``title`` or the
        history's first user message's."""
        if session_id is not None:
            # Read as any session is (from the store if it is not held here), so that the
            # check below finds it; and on a shared store the copy here may be of a row
            # another instance deleted since (the listener can load a session just before
            # its delete commits), which is then forgotten rather than a 409.
            try:
                self._read(session_id, lambda _session: None)
            except SessionNotFound:
                pass
        # Counted before the registry's lock is taken (a store's count is a query): creates
        # at the same moment may pass the cap by a few.
        existing = len(self) if self.max_sessions else 0
        session = Session(
            session_id=session_id or str(uuid.uuid4()), touched=self._clock(), state=list(state or []),
            title=title or first_title(state or []),
        )
        with session.lock:
            with self._registry:
                if self._closing:
                    raise ServerUnavailable("Server is shutting down")
                if session.session_id in self._sessions:
                    raise SessionConflict(f"Session {session.session_id} already exists")
                if self.max_sessions and existing >= self.max_sessions:
                    raise SessionLimitReached(
                        f"Session limit reached ({self.max_sessions}); delete a session or raise --max-sessions"
                    )
                self._sessions[session.session_id] = session
            try:
                if session_id is not None and self._stored_elsewhere(session_id):
                    raise SessionConflict(f"Session {session.session_id} already exists")
                self._save(session, session.record(state=session.state), events=[session.event("status", session.touched, status="idle")])
            except (ServerUnavailable, StaleSession, SessionConflict) as exc:
                session.forgotten = True  # a thread that found this copy looks again (the stored one, or none)
                with self._registry:
                    if self._sessions.get(session.session_id) is session:
                        del self._sessions[session.session_id]
                if isinstance(exc, StaleSession):  # created on another instance meanwhile
                    raise SessionConflict(f"Session {session.session_id} already exists") from None
                raise
        self._trim()
        return session.view()

    def _stored_elsewhere(self, session_id: str) -> bool:
        """Whether a client-chosen id is a session of one process's durable store that is
        not held in memory (forgotten to keep within the cache). Asked with the new copy
        registered and locked, so nobody reads the stored one in meanwhile. A shared store
        refuses the create itself (``StaleSession``)."""
        if not isinstance(self.store, DurableStore) or isinstance(self.store, SharedStore):
            return False
        store = self.store
        return ask_store(lambda: store.load_one(session_id)) is not None

    def delete(self, session_id: str) -> None:
        """Remove the session; a live turn ends (its process gets ``EOFError`` and a grace)."""
        def delete(session: Session, after: After) -> None:
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
        self._commit(lambda: self.replicas.delete_row(session, events))

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove idle and error sessions nothing has written to for ``ttl`` seconds, all of
        them (``sweep_batch`` without a limit)."""
        return self.sweep_batch(now)[0]

    def sweep_batch(self, now: float | None = None, limit: int | None = None) -> tuple[list[str], bool]:
        """``sweep`` of at most ``limit`` candidates, the oldest first; with whether to go
        on at once (a full batch, some of it removed). The candidates are the store's (durable) or the memory's; each is
        looked at again under its lock on its current row, as any change is (another
        instance may have written or swept it meanwhile). The housekeeper sweeps a batch at
        a time, its timers and the lease's renewal in between: thousands of sessions expiring
        at once took it tens of seconds, long enough for a healthy instance's lease to lapse."""
        if not self.ttl:
            return [], False
        cutoff = (self._clock() if now is None else now) - self.ttl
        store = self.store
        if isinstance(store, DurableStore):
            try:
                candidates = ask_store(lambda: store.expired_ids(cutoff, limit))
            except ServerUnavailable as exc:
                log.warning("TTL sweep: %s", exc.detail)
                return [], False
        else:
            # What the stores' query takes: a session waiting on a person or running never
            # expires, and a batch of them first would stop the sweep before the idle ones.
            ended = (SessionStatus.IDLE, SessionStatus.ERROR)
            expired = (s for s in self._all() if s.touched <= cutoff and s.status in ended)
            touched = attrgetter("touched")
            old = sorted(expired, key=touched) if limit is None else heapq.nsmallest(limit, expired, key=touched)
            candidates = [session.session_id for session in old]
        removed: list[str] = []

        def expire(session: Session, after: After) -> None:
            if session.status not in (SessionStatus.IDLE, SessionStatus.ERROR) or session.touched > cutoff:
                return
            self._delete_row(session, [session.event("status", self._clock(), status="deleted", reason="ttl")])
            session.deleted = True
            with self._registry:
                self._sessions.pop(session.session_id, None)
            removed.append(session.session_id)
            after.publish.append(session.session_id)

        for session_id in candidates:
            try:
                self._attempt(session_id, expire)
            except SessionNotFound:
                continue  # deleted meanwhile
            except ServerUnavailable as exc:
                # The store is away or locked (each write waited for it): the rest of this
                # sweep waits for the next period, rather than each waiting in turn.
                log.warning("TTL sweep could not delete session %s: %s", session_id, exc.detail)
                return removed, False
        # More only when this batch removed some: one whose sessions all changed meanwhile
        # (or were deleted) waits for the next period rather than being looked at again.
        return removed, limit is not None and len(candidates) >= limit and bool(removed)

    def revoke(self, session_id: str, tool_name: str, by: str = ANONYMOUS) -> None:
        """Forget a remembered approval. A turn already running keeps the grants it started
        with (a replay must see what the first run saw); the next turn asks again."""
        def revoke(session: Session, after: After) -> None:
            if self._closing:  # a turn the shutdown cut short is not in the row any more
                raise ServerUnavailable("Server is shutting down")
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

    def retitle(self, session_id: str, title: str, by: str = ANONYMOUS) -> None:
        """Give the session the title a client chose (checked by the request schema), in
        any status: a title is for people and changes nothing of a turn."""
        def retitle(session: Session, after: After) -> set[str]:
            if self._closing:
                raise ServerUnavailable("Server is shutting down")
            now = self._clock()
            self._save(session, session.record(title=title, touched=now),
                       events=[session.event("title", now, title=title, by=by)])
            session.title, session.touched = title, now
            after.publish.append(session_id)
            return {item.type for item in session.view().interrupts}

        shown = self._attempt(session_id, retitle)
        if shown:  # its items in the inbox carry the title: the kept inbox is stale, and its polls learn it
            self.events.publish(session_id, inbox=shown)


def _quiet_waiting(turn: Turn) -> bool:
    """Waiting on a person, with no call inside its body and no worker message waiting for
    the store: what may be parked or cancelled without the shutdown grace."""
    return turn.state is TurnState.WAITING and not turn.under_way()
