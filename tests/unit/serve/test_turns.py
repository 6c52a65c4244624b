"""The turn state machine and its sessions (``motus.serve.turns``), without a server.

These are unit tests of the state machine, so no worker process is ever started:
``Turns.start()`` is given ``RecordingPool``, a small stand-in for ``WorkerPool`` with just
the four calls ``Turns`` makes (``launch``, ``send``, ``stop``, ``kill``), which records
them. What a worker process would report is fed in by calling ``turns.worker_message`` with
the handle the stand-in received in ``launch``. The integration tests
(``tests/integration/serve``) drive the same code with real worker processes.

Every ``Turns`` here is made by the ``make_turns`` fixture, which ends the turns still
running and calls ``turns.shutdown(0)`` after the test, so the housekeeper thread never
outlives it (the autouse ``no_leaks`` fixture fails tests that leak threads).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from freezegun.api import FrozenDateTimeFactory

from motus.serve.errors import (
    InterruptNotPending,
    InvalidTransition,
    ServerUnavailable,
    SessionConflict,
    SessionLimitReached,
    SessionNotFound,
)
from motus.serve.events import Events
from motus.serve.metrics import Hooks
from motus.serve.pool import Handle
from motus.serve.journal import pack, unpack
from motus.serve.protocol import STEP, TOOL, Ack, Failure, Interrupt, JournalEntry, Record, Result, Resume
from motus.serve.store import MemoryStore, SessionRecord, Store, store_from_url
from motus.serve.turns import timers
from motus.serve.turns import (
    _MOVES,
    CANCELLED,
    MESSAGE_FAILED,
    NOT_WAITING,
    OUTCOME_FAILED,
    TIMED_OUT,
    PendingInterrupt,
    SessionStatus,
    SessionView,
    Turn,
    TurnEnd,
    Turns,
    TurnState,
)

MESSAGE = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}
APPROVAL = {"type": "tool_approval", "tool": "delete_db"}

RUNNING, INTERRUPTED, IDLE, ERROR = (
    SessionStatus.RUNNING,
    SessionStatus.INTERRUPTED,
    SessionStatus.IDLE,
    SessionStatus.ERROR,
)


# -- the stand-ins ---------------------------------------------------------------------------


class RecordingPool:
    """Stands in for ``WorkerPool``: records what ``Turns`` asks of worker processes."""

    def __init__(self) -> None:
        self.launched: list[Handle] = []
        self.sent: list[tuple[Handle, object]] = []
        self.stopped: list[Handle] = []
        self.killed: list[Handle] = []
        self.let_go_of: list[Handle] = []
        self.any_killed = threading.Event()

    def launch(self, handle: Handle) -> None:
        self.launched.append(handle)

    def send(self, handle: Handle, message: object) -> None:
        self.sent.append((handle, message))

    def stop(self, handle: Handle) -> None:
        self.stopped.append(handle)

    def kill(self, handle: Handle) -> None:
        self.killed.append(handle)
        self.any_killed.set()

    def hold_if_quiet(self, handle: Handle) -> bool:
        return True  # no process: nothing unsaid

    def let_go(self, handle: Handle) -> None:
        self.let_go_of.append(handle)

    def handle(self, session_id: str) -> Handle:
        """The latest process launched for ``session_id``."""
        handles = [h for h in self.launched if h.session_id == session_id]
        assert handles, f"no process was launched for session {session_id}"
        return handles[-1]

    def sent_to(self, handle: Handle) -> list[object]:
        return [message for h, message in self.sent if h is handle]


class FailingStore(MemoryStore):
    """A store whose writes fail while ``failing`` is set (a full disk, say)."""

    kind = "failing"
    durable = False

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.saved: list[SessionRecord] = []

    def save(self, record: SessionRecord, entries: Sequence[JournalEntry] = (), events=(), audit=()) -> int:  # type: ignore[no-untyped-def]
        if self.failing:
            raise OSError("disk full")
        self.saved.append(record)
        return super().save(record, entries, events, audit)

    def save_entries(self, session_id: str, turn_id: int, entries: Sequence[JournalEntry]) -> None:
        if self.failing:
            raise OSError("disk full")

    def delete(self, session_id: str, events=()) -> int:  # type: ignore[no-untyped-def]
        if self.failing:
            raise OSError("disk full")
        return super().delete(session_id, events)


MakeTurns = Callable[..., tuple[Turns, RecordingPool]]


@pytest.fixture
def make_turns() -> Iterator[MakeTurns]:
    """``make_turns(max_workers=2, store=None, start=True, **Turns options) -> (turns, pool)``;
    with ``start=False`` the test calls ``turns.start(pool)`` itself (after ``recover``)."""
    made: list[tuple[Turns, RecordingPool]] = []

    def make(max_workers: int = 2, store: Store | None = None, start: bool = True, **options: Any) -> tuple[Turns, RecordingPool]:
        turns = Turns(store if store is not None else MemoryStore(), Events(), max_workers=max_workers, **options)
        pool = RecordingPool()
        if start:
            turns.start(pool)
        made.append((turns, pool))
        return turns, pool

    yield make
    for turns, pool in made:
        # shutdown(0) waits as long as running turns take: end them the way a worker would.
        # Ending one may hand its slot to a queued turn, which then gets a process too.
        reported: list[Handle] = []
        while fresh := [h for h in pool.launched if not any(h is r for r in reported)]:
            for handle in fresh:
                reported.append(handle)
                turns.worker_message(handle, Failure(error="the test is over"))
        turns.shutdown(0)


def state_of(turns: Turns, session_id: str) -> TurnState | None:
    """The state of the session's live turn (None when it has none)."""
    turn = turns._session(session_id).turn
    return None if turn is None else turn.state


def slots_in_use(turns: Turns) -> int:
    return turns.counts()["running_workers"]


def interrupted(turns: Turns, pool: RecordingPool, session_id: str, *ids: str) -> Handle:
    """Start a turn on ``session_id`` and have its worker raise the interrupts ``ids``."""
    turns.start_turn(session_id, MESSAGE)
    handle = pool.handle(session_id)
    for seq, interrupt_id in enumerate(ids, start=1):
        turns.worker_message(handle, Interrupt(interrupt_id=interrupt_id, payload=APPROVAL, seq=seq))
    return handle


def pending_ids(turns: Turns, session_id: str) -> list[str]:
    return [i.interrupt_id for i in turns.get(session_id).interrupts]


# -- the diagram -----------------------------------------------------------------------------

Q, R, W, RS, P, E = (TurnState.QUEUED, TurnState.RUNNING, TurnState.WAITING, TurnState.RESUMING, TurnState.PARKED, TurnState.ENDED)

#: The module docstring's diagram, edge by edge.
DIAGRAM = {
    (Q, R),  # compute slot
    (R, W),  # Interrupt
    (W, W),  # partial resume (value sent now); another interrupt of the same gather
    (W, RS),  # last resume: the values wait for a slot
    (W, P),  # park-after
    (P, P),  # partial resume of a parked turn (recorded only)
    (P, Q),  # last resume: replay
    (RS, R),  # compute slot: queued values sent
    (RS, W),  # Interrupt: queued values sent at once
    (TurnState.ELSEWHERE, P),  # another instance's turn, adopted here while it waits on a person
    (TurnState.ELSEWHERE, Q),  # ... or to be replayed
    *((state, E) for state in TurnState if state is not E),  # Result | Failure | exit | delete | timeout | shutdown
}


def test_the_move_table_is_the_diagram() -> None:
    assert {(old, new) for old, targets in _MOVES.items() for new in targets} == DIAGRAM
    assert set(_MOVES) == set(TurnState)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(TurnState, TurnState)), ids=lambda s: s.value)
def test_turn_move_allows_exactly_the_moves_of_the_table(old: TurnState, new: TurnState) -> None:
    turn = Turn(session_id="s", turn_id=3, message=MESSAGE, webhook=None, deadline=None, state=old)
    if new in _MOVES[old]:
        freed = turn.move(new)
        assert turn.state is new
        assert freed is (old is R and new is not R)  # a slot is held exactly while RUNNING
    else:
        with pytest.raises(InvalidTransition, match=f"^turn 3 of session s: {old.value} -> {new.value}$"):
            turn.move(new)
        assert turn.state is old


# -- a turn's life ---------------------------------------------------------------------------


def test_full_turn_with_two_interrupts(make_turns: MakeTurns) -> None:
    ends: list[TurnEnd] = []
    turns, pool = make_turns(on_end=ends.append)
    sid = turns.create().session_id
    assert turns.get(sid).status is IDLE

    turns.start_turn(sid, MESSAGE, {"url": "http://hook.test/", "include_messages": True})
    view = turns.get(sid)
    assert (view.status, view.turn_id, view.response, view.error) == (RUNNING, 1, None, None)
    handle = pool.handle(sid)
    assert (handle.job.message, handle.job.state, handle.job.journal) == (MESSAGE, [], ())
    assert state_of(turns, sid) is R and slots_in_use(turns) == 1

    turns.worker_message(handle, Interrupt(interrupt_id="a", payload=APPROVAL, seq=1))
    turns.worker_message(handle, Interrupt(interrupt_id="b", payload={"type": "color_picker", "n": 2}, seq=2))
    view = turns.get(sid)
    assert view.status is INTERRUPTED
    assert view.interrupts == (PendingInterrupt("a", APPROVAL), PendingInterrupt("b", {"type": "color_picker", "n": 2}))
    assert [i.type for i in view.interrupts] == ["tool_approval", "color_picker"]
    assert state_of(turns, sid) is W and slots_in_use(turns) == 0

    assert turns.resume(sid, "b", "blue") is INTERRUPTED
    assert pool.sent_to(handle) == [Resume("b", "blue")]  # a partial resume is sent at once
    assert pending_ids(turns, sid) == ["a"] and turns.get(sid).status is INTERRUPTED

    assert turns.resume(sid, "a", True) is RUNNING
    assert pool.sent_to(handle) == [Resume("b", "blue"), Resume("a", True)]
    assert turns.get(sid).status is RUNNING and turns.get(sid).interrupts == ()
    assert state_of(turns, sid) is R and slots_in_use(turns) == 1

    turns.worker_message(handle, Result(response=REPLY, state=[MESSAGE, REPLY]))
    view = turns.get(sid)
    assert (view.status, view.response, view.error, view.total_messages) == (IDLE, REPLY, None, 2)
    assert turns.messages(sid) == [MESSAGE, REPLY]
    assert pool.stopped == [handle] and slots_in_use(turns) == 0
    assert [(e.session_id, e.status, e.response, e.messages) for e in ends] == [(sid, IDLE, REPLY, [MESSAGE, REPLY])]


def test_interrupt_type_defaults_to_unknown(make_turns: MakeTurns) -> None:
    assert PendingInterrupt("x", {"type": None}).type == "unknown"
    assert PendingInterrupt("x", {"type": 5}).type == "unknown"
    assert PendingInterrupt("x", {}).type == "unknown"
    assert PendingInterrupt("x", {"type": "color_picker"}).type == "color_picker"

    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_message(handle, Interrupt(interrupt_id="a", payload={"type": 5}, seq=1))
    turns.worker_message(handle, Interrupt(interrupt_id="b", payload={"question": "?"}, seq=2))
    assert [i.type for i in turns.get(sid).interrupts] == ["unknown", "unknown"]
    assert [e.label for e in turns._session(sid).turn.pending()] == ["unknown", "unknown"]  # type: ignore[union-attr]


def test_busy_sessions_refuse_messages(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    with pytest.raises(SessionConflict) as running:
        turns.start_turn(sid, MESSAGE)
    assert running.value.status_code == 409
    assert running.value.detail == "Session is running; wait for the turn to finish or delete the session"

    turns.worker_message(pool.handle(sid), Interrupt(interrupt_id="a", payload=APPROVAL, seq=1))
    with pytest.raises(SessionConflict) as waiting:
        turns.start_turn(sid, MESSAGE)
    assert waiting.value.status_code == 409
    assert waiting.value.detail == "Session is interrupted; resume its pending interrupts or delete the session"

    turns.resume(sid, "a", True)
    with pytest.raises(SessionConflict, match="^Session is running"):
        turns.start_turn(sid, MESSAGE)
    assert len(pool.launched) == 1


def test_error_keeps_state_and_accepts_a_new_message(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create(state=[MESSAGE]).session_id
    first = interrupted(turns, pool, sid, "a")
    assert first.job.state == [MESSAGE]

    turns.worker_message(first, Failure(error="Traceback ...\nValueError: boom"))
    view = turns.get(sid)
    assert (view.status, view.error, view.interrupts, view.response) == (ERROR, "Traceback ...\nValueError: boom", (), None)
    assert turns.messages(sid) == [MESSAGE]
    assert pool.stopped == [first] and slots_in_use(turns) == 0
    with pytest.raises(InterruptNotPending, match=f"^{NOT_WAITING}"):
        turns.resume(sid, "a", True)

    turns.start_turn(sid, MESSAGE)
    view = turns.get(sid)
    assert (view.status, view.error, view.turn_id) == (RUNNING, None, 2)
    second = pool.handle(sid)
    assert second is not first and (second.turn_id, second.job.state) == (2, [MESSAGE])


def test_record_messages_join_the_journal_and_are_acknowledged_when_asked(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    started = JournalEntry(seq=1, kind=TOOL, key="delete_db:{}", label="delete_db")
    turns.worker_message(handle, Record(started, ack=True))
    assert pool.sent_to(handle) == [Ack(1)]
    assert turns._session(sid).turn.calls_in_flight()  # type: ignore[union-attr]
    turns.worker_message(handle, Record(started.finished(b"done")))
    assert pool.sent_to(handle) == [Ack(1)]  # no ack unless asked
    turn = turns._session(sid).turn
    assert turn is not None and turn.journal == {1: started.finished(b"done")} and not turn.calls_in_flight()


# -- messages from processes the turn no longer owns ------------------------------------------


def test_stale_worker_events_are_ignored(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    old = pool.handle(sid)
    turns.worker_message(old, Failure(error="boom"))
    turns.start_turn(sid, MESSAGE)
    new = pool.handle(sid)
    assert new is not old

    turns.worker_message(old, Interrupt(interrupt_id="late", payload=APPROVAL, seq=1))
    turns.worker_message(old, Result(response=REPLY, state=[REPLY]))
    turns.worker_exited(old)
    view = turns.get(sid)
    assert (view.status, view.interrupts, view.turn_id, view.error) == (RUNNING, (), 2, None)
    assert state_of(turns, sid) is R and slots_in_use(turns) == 1

    turns.worker_message(new, Result(response=REPLY, state=[REPLY]))
    assert turns.get(sid).status is IDLE and turns.messages(sid) == [REPLY]
    turns.worker_message(new, Failure(error="too late"))  # the turn is over
    assert turns.get(sid).status is IDLE and turns.get(sid).error is None

    turns.delete(sid)
    turns.worker_message(new, Failure(error="gone"))
    turns.worker_exited(new)
    with pytest.raises(SessionNotFound):
        turns.get(sid)


def test_a_deleted_running_turn_frees_its_slot_and_its_late_messages_are_ignored(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.delete(sid)
    assert pool.stopped == [handle] and slots_in_use(turns) == 0
    turns.worker_message(handle, Interrupt(interrupt_id="a", payload=APPROVAL, seq=1))
    turns.worker_message(handle, Result(response=REPLY, state=[REPLY]))
    assert len(turns) == 0 and slots_in_use(turns) == 0
    other = turns.create().session_id
    turns.start_turn(other, MESSAGE)  # the one slot is free
    assert state_of(turns, other) is R


def test_a_parked_turn_ignores_its_killed_process_and_replays_in_a_new_one(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(park_after=0)
    sid = turns.create().session_id
    first = interrupted(turns, pool, sid, "a", "b")
    assert pool.any_killed.wait(10), "the waiting turn was never parked"
    assert pool.killed == [first] and state_of(turns, sid) is P
    assert turns.get(sid).status is INTERRUPTED and pending_ids(turns, sid) == ["a", "b"]
    assert turns.counts() == {"running_workers": 0, "live_turns": 0, "parked_turns": 1}

    turns.worker_message(first, Result(response=REPLY, state=[REPLY]))  # the killed process
    turns.worker_exited(first)
    assert state_of(turns, sid) is P and pending_ids(turns, sid) == ["a", "b"]

    assert turns.resume(sid, "b", 2) is INTERRUPTED
    assert state_of(turns, sid) is P and pool.sent == [] and len(pool.launched) == 1  # recorded only
    assert turns.resume(sid, "a", 1) is RUNNING
    replay = pool.handle(sid)
    assert replay is not first and state_of(turns, sid) is R
    assert [(e.seq, e.ref, e.done) for e in replay.job.journal] == [(1, "a", True), (2, "b", True)]
    assert pool.sent == []  # the answers travel in the journal, not as Resume messages

    turns.worker_message(first, Failure(error="still dead"))
    assert state_of(turns, sid) is R
    turns.worker_message(replay, Result(response=REPLY, state=[MESSAGE, REPLY]))
    assert turns.get(sid).status is IDLE and turns.get(sid).response == REPLY


# -- resume ----------------------------------------------------------------------------------


def test_resume_404_details_say_why(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(clock=lambda: 1767225600.0)
    sid = turns.create().session_id
    with pytest.raises(InterruptNotPending) as idle:
        turns.resume(sid, "a", True)
    assert idle.value.status_code == 404 and idle.value.detail == NOT_WAITING

    handle = interrupted(turns, pool, sid, "a", "b")
    turns.resume(sid, "a", True, by="bob")
    with pytest.raises(InterruptNotPending) as again:
        turns.resume(sid, "a", True, by="alice")
    # A late answer is told whose answer counted, and when.
    assert again.value.detail == "Interrupt a is not pending: it was already resumed by bob at 2026-01-01T00:00:00.000Z"
    with pytest.raises(InterruptNotPending) as unknown:
        turns.resume(sid, "zzz", True)
    assert unknown.value.detail == "Interrupt zzz not found among the session's pending interrupts"
    with pytest.raises(SessionNotFound) as no_session:
        turns.resume("nope", "a", True)
    assert no_session.value.status_code == 404 and no_session.value.detail == "Session nope not found"

    turns.resume(sid, "b", True)
    with pytest.raises(InterruptNotPending) as running:
        turns.resume(sid, "b", True)
    assert running.value.detail == f"{NOT_WAITING} (interrupt b: it was already resumed at 2026-01-01T00:00:00.000Z)"  # no keys: nobody named
    with pytest.raises(InterruptNotPending) as never:
        turns.resume(sid, "zzz", True)
    assert never.value.detail == NOT_WAITING

    turns.worker_message(handle, Interrupt(interrupt_id="c", payload=APPROVAL, seq=3))
    turns.worker_message(handle, Result(response=REPLY, state=[REPLY]))
    with pytest.raises(InterruptNotPending) as finished:
        turns.resume(sid, "c", True)
    assert finished.value.detail == f"{NOT_WAITING} (interrupt c: its turn has already finished)"

    failed = interrupted(turns, pool, sid, "d")
    turns.worker_message(failed, Failure(error="Traceback (most recent call last):\n  ...\nRuntimeError: quota"))
    with pytest.raises(InterruptNotPending) as errored:
        turns.resume(sid, "d", True)
    assert errored.value.detail == f"{NOT_WAITING} (interrupt d: its turn ended with an error (RuntimeError: quota))"


def test_an_interrupt_is_answered_exactly_once_even_by_racing_resumes(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a", "b")
    outcomes: list[object] = []
    barrier = threading.Barrier(8)

    def racer(value: int) -> None:
        barrier.wait()
        try:
            outcomes.append(turns.resume(sid, "a", value))
        except InterruptNotPending as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert [o for o in outcomes if o is INTERRUPTED] == [INTERRUPTED]
    assert len([o for o in outcomes if isinstance(o, InterruptNotPending)]) == 7
    assert len(pool.sent_to(handle)) == 1 and pending_ids(turns, sid) == ["b"]


def inbox_ids(turns: Turns) -> list[str]:
    return [entry.item.interrupt_id for entry in turns.inbox()]


def test_the_inbox_stays_true_when_a_resume_and_the_next_interrupt_announce_out_of_order(make_turns: MakeTurns) -> None:
    """A resume publishes on its request thread; the worker's next interrupt, which the
    resume's value may bring at once, on the manager thread. Here the resume's announce is
    preempted between reading the session and recording what it read, and the interrupt's
    announce runs meanwhile: what the inbox last showed must end as the session is (i2
    pending), or i2's answer later looks like no change and the cached inbox keeps it."""
    turns, pool = make_turns()
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "i1")
    assert inbox_ids(turns) == ["i1"]
    real = turns._inboxed_lock
    worker = threading.Thread(
        target=turns.worker_message, args=(handle, Interrupt(interrupt_id="i2", payload=APPROVAL, seq=2)), name="manager",
    )

    class Preempted:
        """The first time the resume's thread takes the lock, the worker's interrupt comes
        first (where the read and its record are one step, it waits for them instead)."""

        armed = True

        def __enter__(self) -> None:
            if Preempted.armed and threading.current_thread() is threading.main_thread():
                Preempted.armed = False
                worker.start()
                worker.join(1.0)
            real.__enter__()

        def __exit__(self, *exc: object) -> None:
            real.__exit__(*exc)

    turns._inboxed_lock = Preempted()  # type: ignore[assignment]
    turns.resume(sid, "i1", True)
    worker.join(10)
    turns._inboxed_lock = real
    assert pending_ids(turns, sid) == ["i2"] and inbox_ids(turns) == ["i2"]
    turns.resume(sid, "i2", True)
    assert pending_ids(turns, sid) == [] and inbox_ids(turns) == []


# -- sessions --------------------------------------------------------------------------------


def test_session_limit_and_duplicate_ids(make_turns: MakeTurns) -> None:
    turns, _ = make_turns(max_sessions=1)
    assert turns.create(session_id="one").session_id == "one"
    with pytest.raises(SessionConflict) as duplicate:
        turns.create(session_id="one")
    assert duplicate.value.status_code == 409 and duplicate.value.detail == "Session one already exists"
    with pytest.raises(SessionLimitReached) as full:
        turns.create()
    assert full.value.status_code == 503
    assert full.value.detail == "Session limit reached (1); delete a session or raise --max-sessions"
    assert len(turns) == 1
    turns.delete("one")
    with pytest.raises(SessionNotFound):
        turns.delete("one")
    assert turns.create().session_id != "one"


def frozen_clock() -> tuple[FrozenDateTimeFactory, Callable[[], float]]:
    """A wall clock that only moves when ticked (freezegun's factory, nothing patched)."""
    factory = FrozenDateTimeFactory(datetime(2026, 1, 1))
    return factory, lambda: factory().replace(tzinfo=timezone.utc).timestamp()


def test_ttl_sweeps_only_idle_and_error_sessions(make_turns: MakeTurns) -> None:
    frozen, clock = frozen_clock()
    turns, pool = make_turns(max_workers=4, ttl=60, clock=clock)
    idle = turns.create().session_id
    failed = turns.create().session_id
    turns.start_turn(failed, MESSAGE)
    turns.worker_message(pool.handle(failed), Failure(error="boom"))
    running = turns.create().session_id
    turns.start_turn(running, MESSAGE)
    waiting = turns.create().session_id
    interrupted(turns, pool, waiting, "a")

    frozen.tick(59)
    assert turns.sweep(now=clock()) == []
    turns.get(idle)  # reading is not touching
    turns.messages(failed)
    turns.list()
    frozen.tick(2)
    assert sorted(turns.sweep(now=clock())) == sorted([idle, failed])
    with pytest.raises(SessionNotFound):
        turns.get(idle)
    frozen.tick(3600)
    assert turns.sweep(now=clock()) == []
    assert {view.session_id for view in turns.list()} == {running, waiting}


def test_ttl_counts_from_the_last_write(make_turns: MakeTurns) -> None:
    frozen, clock = frozen_clock()
    turns, pool = make_turns(ttl=600, clock=clock)
    sid = turns.create().session_id
    frozen.tick(480)
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    frozen.tick(480)
    turns.worker_message(handle, Result(response=REPLY, state=[MESSAGE, REPLY]))  # the last write
    frozen.tick(599)
    assert turns.sweep(now=clock()) == []
    frozen.tick(2)
    assert turns.sweep(now=clock()) == [sid]


@pytest.mark.parametrize("durable", [False, True])
def test_the_housekeeper_sweeps_a_batch_at_a_time_oldest_first_and_logs_the_whole_sweep_once(
    make_turns: MakeTurns, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Thousands of sessions expiring at once took the housekeeping thread tens of seconds in
    one sweep, and nothing else it does (a shared store's lease, parking, timeouts) ran
    meanwhile: a healthy instance's lease lapsed and its turns were taken over."""
    monkeypatch.setattr(timers, "SWEEP_BATCH", 2)
    frozen, clock = frozen_clock()
    store = store_from_url(f"sqlite:///{tmp_path}/s.sqlite3") if durable else None
    if store is not None:
        store.open()
    try:
        turns, _ = make_turns(ttl=60, clock=clock, store=store)
        made = []
        for _ in range(5):
            made.append(turns.create().session_id)
            frozen.tick(1)
        frozen.tick(60)
        caplog.set_level(logging.INFO, logger=timers.__name__)
        batches = []
        while True:
            before = {view.session_id for view in turns.list()}
            more = turns._sweep_now()
            batches.append(sorted(before - {view.session_id for view in turns.list()}, key=made.index))
            if not more:
                break
        assert batches == [made[0:2], made[2:4], made[4:5]]
        assert [r.getMessage() for r in caplog.records if "TTL sweep" in r.getMessage()] == ["TTL sweep removed 5 idle or errored sessions"]
    finally:
        if store is not None:
            turns.shutdown(0)
            store.close()


def test_a_sweep_batch_the_store_refuses_whole_waits_for_the_next_period(make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the store away every delete fails and the same oldest sessions come first
    again: going on at once would spin the housekeeper, a warning a session each time."""
    monkeypatch.setattr(timers, "SWEEP_BATCH", 2)
    frozen, clock = frozen_clock()
    store = FailingStore()
    turns, _ = make_turns(ttl=60, clock=clock, store=store)
    for _ in range(3):
        turns.create()
    frozen.tick(61)
    store.failing = True
    assert turns._sweep_now() is False and len(turns) == 3
    store.failing = False
    assert turns._sweep_now() is True and len(turns) == 1
    assert turns._sweep_now() is False and len(turns) == 0


def test_a_batch_of_old_sessions_waiting_on_a_person_does_not_stop_the_sweep_of_idle_ones(
    make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack: with the memory store every session touched before the cutoff
    was a candidate, whatever its status. The oldest batch waiting on people removed
    nothing, so the sweep stopped there, and idle sessions behind it stayed for ever."""
    monkeypatch.setattr(timers, "SWEEP_BATCH", 2)
    frozen, clock = frozen_clock()
    turns, pool = make_turns(max_workers=4, ttl=60, clock=clock)
    for name in ("w1", "w2"):
        interrupted(turns, pool, turns.create().session_id, name)  # waits for approval: never swept
        frozen.tick(1)
    idle = {turns.create().session_id for _ in range(3)}
    frozen.tick(3600)
    while turns._sweep_now():
        pass
    assert not idle & {view.session_id for view in turns.list()}


class AuditAway(MemoryStore):
    """A store whose audit reads fail while ``away`` (the database restarting, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False

    def audit(self, session_id: str) -> list:  # type: ignore[override]
        if self.away:
            raise OSError("could not connect to server: Connection refused")
        return super().audit(session_id)


def test_an_audit_read_the_store_refuses_is_a_503_that_says_when_to_ask_again(make_turns: MakeTurns) -> None:
    """Found by an attack: the audit read the store bare, so with the store away
    ``GET /sessions/{id}/audit`` was a 500 where every other read is a 503."""
    store = AuditAway()
    turns, _ = make_turns(store=store)
    sid = turns.create().session_id
    store.away = True
    with pytest.raises(ServerUnavailable) as caught:
        turns.audit(sid)
    assert caught.value.headers == {"Retry-After": "1"}
    store.away = False
    assert turns.audit(sid) == []


def test_a_housekeeping_job_done_in_batches_lets_the_timers_due_fire_between_them() -> None:
    """``Timers.run``: an action that returns True has more to do; it runs again, but only
    after the timers due by then have fired."""
    done = threading.Event()
    timers_ = timers.Timers(time.time, done.is_set)
    order: list[str] = []
    turn = object()

    def job() -> bool:
        order.append("batch")
        if len(order) == 1:
            timers_.schedule(time.time(), "timeout", turn)  # due now, while the job has more to do
            return True
        if len(order) >= 5:
            done.set()
            return False
        return True

    thread = threading.Thread(target=timers_.run, args=(lambda kind, t, arg: order.append(kind), [(0.01, job)]))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert order[:3] == ["batch", "timeout", "batch"] and order.count("timeout") == 1


def test_no_ttl_sweeps_nothing(make_turns: MakeTurns) -> None:
    frozen, clock = frozen_clock()
    turns, _ = make_turns(clock=clock)
    turns.create()
    frozen.tick(10**9)
    assert turns.sweep(now=clock()) == [] and len(turns) == 1


# -- long polls and shutdown -----------------------------------------------------------------


def test_wait_returns_on_change_and_on_delete(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    assert turns.wait(sid, timeout=30).status is IDLE  # not running: at once
    turns.start_turn(sid, MESSAGE)
    assert turns.wait(sid, timeout=0.01).status is RUNNING  # times out, still running
    results: list[object] = []

    def waiter() -> None:
        results.append(turns.wait(sid, timeout=30).status)

    thread = threading.Thread(target=waiter)
    thread.start()
    turns.worker_message(pool.handle(sid), Interrupt(interrupt_id="a", payload=APPROVAL, seq=1))
    thread.join(10)
    assert not thread.is_alive() and results == [INTERRUPTED]

    turns.resume(sid, "a", True)
    assert turns.get(sid).status is RUNNING

    def deleted_waiter() -> None:
        try:
            turns.wait(sid, timeout=30)
        except SessionNotFound as exc:
            results.append(exc)

    thread = threading.Thread(target=deleted_waiter)
    thread.start()
    turns.delete(sid)
    thread.join(10)
    assert not thread.is_alive() and isinstance(results[-1], SessionNotFound)


def test_begin_shutdown_releases_waiters_and_refuses_new_work(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    idle = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(turns.wait(sid, timeout=30).status))
    thread.start()
    turns.begin_shutdown()
    thread.join(10)
    assert not thread.is_alive() and results == [RUNNING]
    assert turns.wait(sid, timeout=30).status is RUNNING  # at once while closing

    with pytest.raises(ServerUnavailable, match="^Server is shutting down$"):
        turns.create()
    with pytest.raises(ServerUnavailable, match="^Server is shutting down$"):
        turns.start_turn(idle, MESSAGE)
    assert turns.get(idle).status is IDLE and len(pool.launched) == 1
    turns._session(idle).grants = {"delete_file": {"by": "anonymous", "at": 0.0}}
    with pytest.raises(ServerUnavailable, match="^Server is shutting down$"):  # its write would drop a cut turn
        turns.revoke(idle, "delete_file")
    assert list(turns.grants(idle)) == ["delete_file"]

    turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[REPLY]))  # running turns still finish
    assert turns.get(sid).status is IDLE


def test_shutdown_with_a_memory_store_cancels_waiting_turns(make_turns: MakeTurns) -> None:
    turns, pool = make_turns()
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a")
    turns.shutdown(0)
    view = turns.get(sid)
    assert (view.status, view.error, view.interrupts) == (ERROR, CANCELLED, ())
    assert pool.stopped == [handle]
    turns.shutdown(0)  # idempotent


def test_shutdown_waits_for_running_turns_and_queued_turns_still_start_in_the_grace(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    running = turns.create().session_id
    queued = turns.create().session_id
    turns.start_turn(running, MESSAGE)
    turns.start_turn(queued, MESSAGE)
    assert state_of(turns, queued) is Q
    stopper = threading.Thread(target=turns.shutdown, args=(0,))
    stopper.start()
    try:
        turns.worker_message(pool.handle(running), Result(response=REPLY, state=[REPLY]))
        assert state_of(turns, queued) is R  # the freed slot goes to the queued turn
        assert stopper.is_alive()
        turns.worker_message(pool.handle(queued), Result(response=REPLY, state=[REPLY]))
        stopper.join(10)
        assert not stopper.is_alive(), "shutdown(0) kept waiting after every turn had ended"
    finally:
        for handle in pool.launched:  # if it failed: end every turn, so shutdown returns
            turns.worker_message(handle, Failure(error="the test is over"))
        stopper.join(10)
    assert turns.get(running).status is IDLE and turns.get(queued).status is IDLE


def test_shutdown_grace_over_cancels_running_and_queued_turns_with_a_memory_store(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    running = turns.create().session_id
    queued = turns.create().session_id
    turns.start_turn(running, MESSAGE)
    turns.start_turn(queued, MESSAGE)
    turns.shutdown(0.05)
    assert [turns.get(sid).error for sid in (running, queued)] == [CANCELLED, CANCELLED]
    assert pool.handle(running) in pool.stopped and slots_in_use(turns) == 0


def test_no_process_is_launched_once_the_shutdown_grace_is_over(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    running = turns.create().session_id
    queued = turns.create().session_id
    turns.start_turn(running, MESSAGE)
    turns.start_turn(queued, MESSAGE)
    turns.shutdown(0.05)
    assert [h.session_id for h in pool.launched] == [running]


# -- compute slots ---------------------------------------------------------------------------


def test_a_resume_queued_for_a_turn_that_interrupts_again_never_keeps_the_slot(make_turns: MakeTurns) -> None:
    """Issue 9: the deadlock of the first release, step by step with one compute slot."""
    turns, pool = make_turns(max_workers=1)
    a = turns.create().session_id
    b = turns.create().session_id

    handle_a = interrupted(turns, pool, a, "a")  # turn A waits on `a`
    assert state_of(turns, a) is W and slots_in_use(turns) == 0
    turns.start_turn(b, MESSAGE)  # turn B takes the slot
    handle_b = pool.handle(b)
    assert state_of(turns, b) is R and slots_in_use(turns) == 1

    assert turns.resume(a, "a", "yes") is RUNNING  # no slot: A is RESUMING, its value queued
    assert state_of(turns, a) is RS and pool.sent_to(handle_a) == []
    assert turns.get(a).status is RUNNING and slots_in_use(turns) == 1

    turns.worker_message(handle_a, Interrupt(interrupt_id="b", payload=APPROVAL, seq=2))
    assert state_of(turns, a) is W
    assert pool.sent_to(handle_a) == [Resume("a", "yes")]  # the queued value is sent at once
    assert turns.get(a).status is INTERRUPTED and pending_ids(turns, a) == ["b"]
    assert slots_in_use(turns) == 1  # still B's

    turns.worker_message(handle_b, Result(response=REPLY, state=[REPLY]))  # B finishes
    assert turns.get(b).status is IDLE
    assert state_of(turns, a) is W and slots_in_use(turns) == 0, "the slot stayed with A, which waits on a person"
    assert not turns.busy()

    assert turns.resume(a, "b", "ok") is RUNNING  # A gets the slot
    assert state_of(turns, a) is R and slots_in_use(turns) == 1
    assert pool.sent_to(handle_a) == [Resume("a", "yes"), Resume("b", "ok")]

    turns.worker_message(handle_a, Result(response=REPLY, state=[REPLY]))
    assert turns.get(a).status is IDLE
    assert slots_in_use(turns) == 0 and turns.slots.free == 1
    assert pool.launched == [handle_a, handle_b]

    c = turns.create().session_id
    turns.start_turn(c, MESSAGE)  # the slot really is free
    assert state_of(turns, c) is R


def test_a_resumed_turn_waits_for_a_slot_and_gets_the_next_one(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    a = turns.create().session_id
    b = turns.create().session_id
    handle_a = interrupted(turns, pool, a, "a")
    turns.start_turn(b, MESSAGE)
    turns.resume(a, "a", 1)
    assert state_of(turns, a) is RS and pool.sent_to(handle_a) == []
    turns.worker_message(pool.handle(b), Result(response=REPLY, state=[REPLY]))
    assert state_of(turns, a) is R and pool.sent_to(handle_a) == [Resume("a", 1)] and slots_in_use(turns) == 1


def test_queued_turns_start_in_order_as_slots_free(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    sids = [turns.create().session_id for _ in range(3)]
    for sid in sids:
        turns.start_turn(sid, MESSAGE)
    assert [state_of(turns, sid) for sid in sids] == [R, Q, Q]
    assert turns.get(sids[2]).status is RUNNING  # queued looks running from outside
    turns.worker_message(pool.handle(sids[0]), Result(response=REPLY, state=[REPLY]))
    assert [state_of(turns, sid) for sid in sids[1:]] == [R, Q]
    turns.delete(sids[2])  # a queued turn deleted never gets a process
    turns.worker_message(pool.handle(sids[1]), Result(response=REPLY, state=[REPLY]))
    assert [h.session_id for h in pool.launched] == sids[:2] and slots_in_use(turns) == 0


# -- the store fails -------------------------------------------------------------------------


def test_a_failing_store_makes_start_turn_a_503_that_changed_nothing(make_turns: MakeTurns) -> None:
    store = FailingStore()
    turns, pool = make_turns(store=store)
    sid = turns.create(state=[MESSAGE]).session_id
    before = turns.get(sid)
    store.failing = True
    with pytest.raises(ServerUnavailable) as failed:
        turns.start_turn(sid, MESSAGE)
    assert failed.value.status_code == 503
    assert failed.value.detail == "Could not save the change to the session store: OSError: disk full"
    assert failed.value.headers == {"Retry-After": "1"}  # it passes: the client is told when to ask again
    assert turns.get(sid) == before and state_of(turns, sid) is None
    assert pool.launched == [] and slots_in_use(turns) == 0

    store.failing = False
    turns.start_turn(sid, MESSAGE)
    assert turns.get(sid).turn_id == before.turn_id + 1 and pool.handle(sid).turn_id == 1


def test_a_failing_store_makes_resume_a_503_that_changed_nothing(make_turns: MakeTurns) -> None:
    store = FailingStore()
    turns, pool = make_turns(store=store, max_workers=1)
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a", "b")
    before = turns.get(sid)
    assert before.status is INTERRUPTED and len(before.interrupts) == 2

    store.failing = True
    for interrupt_id in ("a", "b"):  # a partial resume
        with pytest.raises(ServerUnavailable, match="^Could not save the change to the session store"):
            turns.resume(sid, interrupt_id, True)
        assert turns.get(sid) == before and state_of(turns, sid) is W
    assert pool.sent == []
    store.failing = False
    assert turns.resume(sid, "a", True) is INTERRUPTED  # not "already resumed"
    after_partial = turns.get(sid)

    store.failing = True
    with pytest.raises(ServerUnavailable):  # the last resume
        turns.resume(sid, "b", True)
    assert turns.get(sid) == after_partial and pending_ids(turns, sid) == ["b"]
    assert state_of(turns, sid) is W and slots_in_use(turns) == 0
    store.failing = False
    assert turns.resume(sid, "b", False) is RUNNING
    assert pool.sent_to(handle) == [Resume("a", True), Resume("b", False)]  # each value sent once
    assert state_of(turns, sid) is R


def test_a_failing_store_makes_create_a_503_that_leaves_no_session(make_turns: MakeTurns) -> None:
    store = FailingStore()
    turns, _ = make_turns(store=store)
    store.failing = True
    with pytest.raises(ServerUnavailable):
        turns.create(session_id="x")
    store.failing = False
    assert len(turns) == 0 and turns.list() == []
    assert turns.create(session_id="x").session_id == "x"


def test_every_change_is_saved_before_anyone_can_see_it(make_turns: MakeTurns) -> None:
    store = FailingStore()
    turns, pool = make_turns(store=store)
    sid = turns.create().session_id
    interrupted(turns, pool, sid, "a")
    turns.resume(sid, "a", True)
    turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[MESSAGE, REPLY]))
    assert [r.status for r in store.saved] == ["idle", "running", "interrupted", "running", "idle"]
    assert [r.turn is not None for r in store.saved] == [False, True, True, True, False]
    assert store.saved[-1].state == [MESSAGE, REPLY] and store.saved[-1].response == REPLY
    assert store.saved[1].turn is not None and store.saved[1].turn.message == MESSAGE


# -- deadlines and restarts ------------------------------------------------------------------


def test_a_deadline_ends_a_turn_waiting_on_a_person(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(timeout=0.05)
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a")

    def errored() -> SessionView | None:
        view = turns.get(sid)
        return view if view.status is ERROR else None

    view = turns.events.wait(sid, errored, timeout=10)
    assert view is not None and (view.error, view.interrupts) == (TIMED_OUT, ())
    assert pool.stopped == [handle]
    with pytest.raises(InterruptNotPending, match=r"\(interrupt a: its turn ended with an error \(Agent timed out\)\)$"):
        turns.resume(sid, "a", True)


def test_a_durable_store_brings_back_waiting_turns_parked_and_running_turns_replayed(
    make_turns: MakeTurns, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/sessions.sqlite3"
    store = store_from_url(url)
    store.open()
    try:
        turns, pool = make_turns(store=store)
        waiting = turns.create().session_id
        interrupted(turns, pool, waiting, "a", "b")
        turns.resume(waiting, "b", "B")
        running = turns.create(state=[REPLY]).session_id
        turns.start_turn(running, MESSAGE)
        step = JournalEntry(seq=1, kind=STEP, key="charge:x", label="charge", done=True, value=pack(("ok", 7)))
        turns.worker_message(pool.handle(running), Record(step))
        turns.shutdown(0.01)  # the waiting turn is parked, the running one left to be replayed
        assert turns.get(waiting).error is None and turns.get(running).error is None
        assert pool.killed == [pool.handle(waiting), pool.handle(running)] and pool.stopped == []
    finally:
        store.close()

    store = store_from_url(url)
    store.open()
    try:
        turns, pool = make_turns(store=store, start=False)
        assert turns.recover() == 1
        assert state_of(turns, waiting) is P and state_of(turns, running) is Q
        view = turns.get(waiting)
        assert view.status is INTERRUPTED and view.interrupts == (PendingInterrupt("a", APPROVAL),)
        assert turns.get(running).status is RUNNING
        turns.start(pool)
        replayed = pool.handle(running)
        assert (replayed.job.message, replayed.job.state, replayed.job.journal) == (MESSAGE, [REPLY], (step,))
        assert state_of(turns, running) is R and state_of(turns, waiting) is P

        assert turns.resume(waiting, "a", "A") is RUNNING
        resumed = pool.handle(waiting)
        assert [(e.ref, unpack(e.value)) for e in resumed.job.journal] == [("a", "A"), ("b", "B")]
        for sid in (running, waiting):
            turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[REPLY]))
        assert {v.status for v in turns.list()} == {IDLE}
        assert [(r.status, r.turn) for r in store.load()] == [("idle", None), ("idle", None)]
    finally:
        turns.shutdown(0)
        store.close()


def test_only_a_turn_that_asked_for_a_webhook_leaves_an_end_and_only_with_messages_if_asked(make_turns: MakeTurns) -> None:
    """A queued webhook must not keep a copy of the whole history it will not send."""
    ends: list[TurnEnd] = []
    turns, pool = make_turns(on_end=ends.append)
    for webhook in (None, {"url": "http://hook.test/"}):
        sid = turns.create().session_id
        turns.start_turn(sid, MESSAGE, webhook)
        turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[MESSAGE, REPLY]))
    assert [(e.webhook, e.messages) for e in ends] == [({"url": "http://hook.test/"}, [])]


# -- applying an outcome fails -----------------------------------------------------------------


class _RaisingHooks(Hooks):
    """A metrics hook with a bug: ``turn_ended`` raises (it runs once the turn has ended)."""

    def turn_ended(self, outcome: str, seconds: float) -> None:
        raise RuntimeError("a metrics backend with a bug")


def test_a_failure_after_the_turn_ended_still_frees_its_slot_and_wakes_its_waiters(make_turns: MakeTurns) -> None:
    turns, pool = make_turns(max_workers=1)
    turns.metrics = _RaisingHooks()
    sid, other = turns.create().session_id, turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    turns.start_turn(other, MESSAGE)  # waits for the one compute slot
    assert [h.session_id for h in pool.launched] == [sid]
    turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[MESSAGE, REPLY]))
    view = turns.get(sid)
    assert (view.status, view.response) == (IDLE, REPLY)
    assert [h.session_id for h in pool.launched] == [sid, other]  # the slot went to the next turn


class _RaisingAnswerHooks(Hooks):
    """A metrics hook with a bug in ``interrupt_answered`` (it runs once the answer is committed)."""

    def interrupt_answered(self, reason: str, seconds: float | None) -> None:
        raise RuntimeError("a metrics backend with a bug")


@pytest.mark.parametrize("parked", [False, True], ids=["waiting", "parked"])
def test_a_failure_after_the_last_answer_is_committed_still_passes_it_on(make_turns: MakeTurns, parked: bool) -> None:
    """The answer is in the store (the session's row says ``running``) before the metrics
    hook runs. A hook that raises then (the resume is a 500) must not leave the turn
    waiting on an answer that is no longer pending: shown ``interrupted`` with nothing to
    answer (the derived status), or ``running`` for ever with the value never sent (the
    status assigned by hand before it was derived)."""
    turns, pool = make_turns(max_workers=1, park_after=0.0 if parked else None)
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a")
    if parked:
        assert pool.any_killed.wait(5) and state_of(turns, sid) is P
    turns.metrics = _RaisingAnswerHooks()
    with pytest.raises(RuntimeError, match="a metrics backend with a bug"):
        turns.resume(sid, "a", True)
    assert turns.get(sid).status is RUNNING and turns.get(sid).interrupts == ()
    if parked:  # replayed from its journal in a fresh process
        assert [h.session_id for h in pool.launched] == [sid, sid] and state_of(turns, sid) is R
    else:
        assert pool.sent_to(handle) == [Resume("a", True)] and state_of(turns, sid) is R


def test_an_outcome_that_cannot_be_applied_ends_the_turn_in_error(make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that raises while a result is applied, before the turn has ended. The pool has
    already finished the handle, so without this nothing would ever end the turn."""
    turns, pool = make_turns(max_workers=1)
    sid, other = turns.create(state=[MESSAGE]).session_id, turns.create().session_id
    real = Turns._end_locked
    calls: list[str | None] = []

    def end_locked(self: Turns, *args: Any, **kwargs: Any) -> None:
        calls.append(kwargs.get("error"))
        if len(calls) == 1:
            raise KeyError("a bug")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Turns, "_end_locked", end_locked)
    turns.start_turn(sid, MESSAGE)
    turns.start_turn(other, MESSAGE)
    turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[MESSAGE, MESSAGE, REPLY]))
    view = turns.get(sid)
    assert (view.status, view.error) == (ERROR, OUTCOME_FAILED)
    assert turns.messages(sid) == [MESSAGE]  # the history as it was
    assert [h.session_id for h in pool.launched] == [sid, other] and slots_in_use(turns) == 1


def test_an_interrupt_that_cannot_be_applied_ends_the_turn_and_stops_its_process(
    make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while an interrupt is applied. The worker waits for an answer nobody could give,
    so the pool's listener swallowing the exception (as it did) left the turn running, its
    slot taken, until its timeout if it had one. Now the turn ends in error and its process
    is stopped; the next turn gets the slot."""
    turns, pool = make_turns(max_workers=1)
    sid, other = turns.create(state=[MESSAGE]).session_id, turns.create().session_id

    def broken(self: Turns, *args: Any) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(Turns, "_interrupted_locked", broken)
    turns.start_turn(sid, MESSAGE)
    turns.start_turn(other, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_message(handle, Interrupt(interrupt_id="i1", payload=APPROVAL, seq=1))
    view = turns.get(sid)
    assert (view.status, view.error) == (ERROR, MESSAGE_FAILED)
    assert turns.messages(sid) == [MESSAGE]  # the history as it was
    assert handle in pool.stopped
    assert [h.session_id for h in pool.launched] == [sid, other] and slots_in_use(turns) == 1


def test_a_record_that_cannot_be_applied_from_the_backlog_ends_the_turn(make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same failure on the housekeeping thread, when a message waited in the turn's
    backlog for the store: the turn ends in error there too, instead of the retry raising
    into the housekeeper with the message stuck at the head of the backlog."""
    store = FailingStore()
    turns, pool = make_turns(max_workers=1, store=store)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    store.failing = True
    started = JournalEntry(seq=1, kind=TOOL, key="delete_db:{}", label="delete_db")
    turns.worker_message(handle, Record(started, ack=True))  # waits in the backlog
    turn = turns._session(sid).turn
    assert turn is not None and list(turn.backlog) == [Record(started, ack=True)]
    real = Turns._apply_locked

    def broken(self: Turns, session: Any, turn: Any, handle: Handle, message: object, after: Any) -> None:
        if isinstance(message, Record):
            raise KeyError("a bug")
        real(self, session, turn, handle, message, after)

    monkeypatch.setattr(Turns, "_apply_locked", broken)
    store.failing = False
    turns._retry_backlog(turn)
    view = turns.get(sid)
    assert (view.status, view.error) == (ERROR, MESSAGE_FAILED)
    assert handle in pool.stopped and pool.sent_to(handle) == [] and slots_in_use(turns) == 0


@pytest.mark.parametrize(
    "forged, why",
    [
        (Interrupt(interrupt_id="i1", payload=5, seq=1), "Worker sent a malformed interrupt: its payload is not a dict (int)"),  # type: ignore[arg-type]
        (Record(JournalEntry(seq=1, kind="interrupt", key="k", label="l"), ack=True),
         "Worker sent a malformed record: its kind is not one a worker records ('interrupt')"),
        (Record(None, ack=True), "Worker sent a malformed record: its entry is not a JournalEntry (NoneType)"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_message_ends_the_turn_in_error_with_what_was_wrong(make_turns: MakeTurns, forged: object, why: str) -> None:
    turns, pool = make_turns(max_workers=1)
    sid = turns.create(state=[MESSAGE]).session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_message(handle, forged)
    view = turns.get(sid)
    assert (view.status, view.error, view.interrupts) == (ERROR, why, ())
    assert turns.messages(sid) == [MESSAGE] and handle in pool.stopped and slots_in_use(turns) == 0


@pytest.mark.parametrize(
    "together, why",
    [
        ([Interrupt(interrupt_id="i1", payload=APPROVAL, seq=1), Interrupt(interrupt_id="i1", payload=APPROVAL, seq=2)],
         "Worker sent a malformed interrupt: two raised together share an id"),
        ([Interrupt(interrupt_id="i1", payload=APPROVAL, seq=1), Interrupt(interrupt_id="i2", payload=APPROVAL, seq=1)],
         "Worker sent a malformed interrupt: two raised together share a seq"),
        ([Interrupt(interrupt_id="i1", payload=APPROVAL, seq=1), Interrupt(interrupt_id="i2", payload=5, seq=2)],  # type: ignore[arg-type]
         "Worker sent a malformed interrupt: its payload is not a dict (int)"),
    ],
    ids=["same-id", "same-seq", "one-malformed"],
)
def test_interrupts_written_together_are_checked_against_each_other(make_turns: MakeTurns, together: list[Interrupt], why: str) -> None:
    """Interrupts one read of the pipe held are applied as one (one save, one publish), before
    any of them is in the turn's journal: two that would collide there are refused, and none
    of them is shown."""
    turns, pool = make_turns(max_workers=1)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_messages(handle, together)
    view = turns.get(sid)
    assert (view.status, view.error, view.interrupts) == (ERROR, why, ())
    assert handle in pool.stopped


def test_interrupts_written_together_are_committed_and_shown_together(make_turns: MakeTurns) -> None:
    """One save for both: the status event follows both interrupt events, so a client that
    reacts to "interrupted" has both already."""
    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    seen = turns.store.events_after(0, sid)[-1].seq if turns.store.events_after(0, sid) else 0
    handle = pool.handle(sid)
    turns.worker_messages(handle, [Interrupt(interrupt_id="a", payload=APPROVAL, seq=1), Interrupt(interrupt_id="b", payload=APPROVAL, seq=2)])
    assert pending_ids(turns, sid) == ["a", "b"] and turns.get(sid).status is INTERRUPTED
    kinds = [(event.kind, event.data.get("interrupt_id") or event.data.get("status")) for event in turns.store.events_after(seen, sid)]
    assert kinds == [("interrupt", "a"), ("interrupt", "b"), ("status", "interrupted")], kinds


def test_a_record_may_not_take_the_seq_of_an_interrupt(make_turns: MakeTurns) -> None:
    """A journal record written over a pending interrupt's seq would replace it in the
    journal (and the store's row): the interrupt would vanish without an answer."""
    turns, pool = make_turns(max_workers=1)
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "i1")
    turns.worker_message(handle, Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=b"x")))
    view = turns.get(sid)
    assert (view.status, view.error) == (ERROR, "Worker sent a malformed record: its seq is the interrupt i1's")
    assert handle in pool.stopped


def test_interrupts_written_together_leave_one_interrupted_webhook_listing_them_all(make_turns: MakeTurns) -> None:
    """The interrupts of one ``asyncio.gather`` are published as one: a webhook that asked for
    "interrupted" gets one delivery listing both, not one per interrupt with the same list
    (a receiver that notifies a person per delivery would ask twice)."""
    ends: list[TurnEnd] = []
    turns, pool = make_turns(on_end=ends.append)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE, {"url": "http://hook.test/", "events": ["interrupted"]})
    turns.worker_messages(pool.handle(sid), [Interrupt(interrupt_id="a", payload=APPROVAL, seq=1), Interrupt(interrupt_id="b", payload=APPROVAL, seq=2)])
    assert pending_ids(turns, sid) == ["a", "b"]
    listed = [[i["interrupt_id"] for i in end.interrupts] for end in ends if end.status is INTERRUPTED]
    assert listed == [["a", "b"]], listed


def test_interrupts_written_together_wait_in_the_backlog_as_one_and_are_shown_together(make_turns: MakeTurns) -> None:
    """The store refuses the gather's save: nothing is shown, both wait in the backlog as one,
    and the retry commits and shows both (interrupt, interrupt, status)."""
    store = FailingStore()
    turns, pool = make_turns(max_workers=1, store=store)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    seen = turns.store.events_after(0, sid)[-1].seq
    store.failing = True
    turns.worker_messages(handle, [Interrupt(interrupt_id="a", payload=APPROVAL, seq=1), Interrupt(interrupt_id="b", payload=APPROVAL, seq=2),
                                   Record(JournalEntry(seq=3, kind=TOOL, key="t:{}", label="t"), ack=True)])
    turn = turns._session(sid).turn
    assert turn is not None and len(turn.backlog) == 2 and turns.get(sid).status is RUNNING and pending_ids(turns, sid) == []
    store.failing = False
    turns._retry_backlog(turn)
    assert pending_ids(turns, sid) == ["a", "b"] and turns.get(sid).status is INTERRUPTED and not turn.backlog
    kinds = [(event.kind, event.data.get("interrupt_id") or event.data.get("status")) for event in turns.store.events_after(seen, sid)]
    assert kinds == [("interrupt", "a"), ("interrupt", "b"), ("status", "interrupted")], kinds
    assert pool.sent_to(handle) == [Ack(3)]


def test_an_interrupt_and_a_record_with_its_seq_in_one_read_end_the_turn(make_turns: MakeTurns) -> None:
    """A forged read: an interrupt, then a record over the interrupt's seq. The interrupt is
    applied first; the record would replace it, and is refused."""
    turns, pool = make_turns(max_workers=1)
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_messages(handle, [Interrupt(interrupt_id="a", payload=APPROVAL, seq=1),
                                   Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=b"x"))])
    view = turns.get(sid)
    assert (view.status, view.error) == (ERROR, "Worker sent a malformed record: its seq is the interrupt a's")
    assert handle in pool.stopped and slots_in_use(turns) == 0


def test_interrupts_written_together_with_timeouts_each_expire_with_their_own_default(make_turns: MakeTurns) -> None:
    """Each interrupt of a gather keeps its own expiry timer: both resolve by timeout, each
    with its own default, each sent to the worker once."""
    from tests.conftest import wait_until

    turns, pool = make_turns()
    sid = turns.create().session_id
    turns.start_turn(sid, MESSAGE)
    handle = pool.handle(sid)
    turns.worker_messages(handle, [Interrupt(interrupt_id="a", payload=APPROVAL, seq=1, timeout=0.05, default="A"),
                                   Interrupt(interrupt_id="b", payload=APPROVAL, seq=2, timeout=0.1, default="B")])
    assert pending_ids(turns, sid) == ["a", "b"]
    wait_until(lambda: len(pool.sent_to(handle)) == 2, timeout=10, what="both interrupts to expire")
    assert sorted(pool.sent_to(handle), key=lambda r: r.interrupt_id) == [Resume("a", "A"), Resume("b", "B")]  # type: ignore[attr-defined]
    assert turns.get(sid).status is RUNNING and pending_ids(turns, sid) == []
