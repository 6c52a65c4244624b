"""The session cache (``--session-cache``, issue 27 item 4): with a store that outlives the
process the server holds at most that many sessions in memory beyond those it must, reads the
rest from the store when used, and answers lists, counts, the inbox and the TTL sweep from
the store. A forgotten session behaves exactly as a held one; a session with a process, a
timer, or a change in progress is never forgotten.

Real SQLite files; the pool is the recording stand-in of ``test_turns``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from motus.durable.journal import unpack
from motus.durable.records import Interrupt, Result
from motus.serve.errors import InterruptNotPending, SessionConflict, SessionNotFound
from motus.serve.store import Store, store_from_url
from motus.serve.turns import PendingInterrupt, SessionStatus, TurnState
from motus.serve.turns import machine, timers
from tests.conftest import wait_until
from tests.unit.serve.test_turns import APPROVAL, MESSAGE, REPLY, MakeTurns, interrupted, make_turns, state_of  # noqa: F401

IDLE, INTERRUPTED, RUNNING = SessionStatus.IDLE, SessionStatus.INTERRUPTED, SessionStatus.RUNNING


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Store]:
    store = store_from_url(f"sqlite:///{tmp_path}/sessions.sqlite3")
    store.open()
    yield store
    store.close()


def held(turns: object) -> list[str]:
    return list(turns._sessions)  # type: ignore[attr-defined]  # noqa: SLF001


def test_sessions_past_the_cache_are_forgotten_and_read_back_whole_when_used(sqlite: Store, make_turns: MakeTurns) -> None:
    turns, _ = make_turns(store=sqlite, session_cache=2)
    ids = [turns.create(state=[MESSAGE] * (n + 1)).session_id for n in range(5)]
    assert held(turns) == ids[3:]  # the least recently used went first
    assert len(held(turns)) == 2
    assert len(turns) == 5  # counted in the store
    assert [(s.session_id, s.total_messages, s.status) for s in turns.list()] == [(sid, n + 1, "idle") for n, sid in enumerate(ids)]
    first = turns.get(ids[0])  # read back from the store
    assert (first.session_id, first.total_messages, first.status) == (ids[0], 1, IDLE)
    assert turns.messages(ids[0]) == [MESSAGE]
    assert ids[0] in held(turns) and len(held(turns)) == 2
    turns.delete(ids[1])  # forgotten, deleted all the same
    with pytest.raises(SessionNotFound):
        turns.get(ids[1])
    assert len(turns) == 4


def test_a_forgotten_parked_turn_is_in_the_inbox_and_counts_and_resumes_by_replay(sqlite: Store, make_turns: MakeTurns) -> None:
    turns, pool = make_turns(store=sqlite, session_cache=1)
    waiting = turns.create().session_id
    interrupted(turns, pool, waiting, "a", "b")
    turns.resume(waiting, "b", "B")
    turns.shutdown(0.01)  # parked: its process is gone

    turns, pool = make_turns(store=sqlite, session_cache=1, start=False)
    assert turns.recover() == 0
    others = [turns.create().session_id for _ in range(3)]  # fill the cache: the parked session is not held
    assert waiting not in held(turns) and len(held(turns)) == 1
    assert turns.counts()["parked_turns"] == 1
    assert turns.interrupt_counts() == (1, 1)
    assert [(entry.session_id, entry.item.interrupt_id) for entry in turns.inbox()] == [(waiting, "a")]
    assert turns.inbox("tool_approval") == turns.inbox() and turns.inbox("user_input") == []
    turns.start(pool)
    view = turns.get(waiting)
    assert (view.status, view.interrupts) == (INTERRUPTED, (PendingInterrupt("a", APPROVAL),))
    assert state_of(turns, waiting) is TurnState.PARKED
    assert turns.resume(waiting, "a", "A") is RUNNING
    replay = pool.handle(waiting)
    assert [(e.ref, unpack(e.value)) for e in replay.job.journal] == [("a", "A"), ("b", "B")]
    turns.worker_message(replay, Result(response=REPLY, state=[MESSAGE, REPLY]))
    assert turns.get(waiting).status is IDLE and turns.inbox() == []
    assert {s.session_id for s in turns.list()} == {waiting, *others}


def test_the_inbox_of_one_type_is_the_whole_inbox_s_entries_and_only_the_latest_inbox_is_kept(sqlite: Store, make_turns: MakeTurns) -> None:
    """With 50,000 approvals pending, each type asked of the inbox held a copy of them read
    from the store again (+30 MiB a type for 20,000; 16 types were kept), and the inboxes of
    types not asked again stayed after every change. Now a type's inbox is filtered from the
    whole one when that was read (the same entries), and a change drops the types' lists
    (the whole one is patched: ``test_inbox_cache``)."""
    turns, pool = make_turns(store=sqlite)
    first, second = turns.create().session_id, turns.create().session_id
    interrupted(turns, pool, first, "a")
    whole = turns.inbox()
    typed = turns.inbox("tool_approval")
    assert [entry.item.interrupt_id for entry in whole] == ["a"] and typed == whole
    assert all(mine is theirs for mine, theirs in zip(typed, whole))  # no second copy
    assert turns.inbox("user_input") == [] and turns.inbox("other") == []
    kept = turns._inbox_cache  # noqa: SLF001
    assert kept.whole is not None and set(kept.kinds) == {"tool_approval", "user_input", "other"}

    interrupted(turns, pool, second, "b")  # a change: the whole one is patched, the types filtered again when asked
    assert [entry.item.interrupt_id for entry in turns.inbox("tool_approval")] == ["a", "b"]
    kept = turns._inbox_cache  # noqa: SLF001
    assert kept.whole is not None and set(kept.kinds) == {"tool_approval"}
    assert [entry.item.interrupt_id for entry in turns.inbox()] == ["a", "b"]
    assert turns.inbox("user_input") == []


def test_a_late_resume_of_a_forgotten_session_says_the_interrupt_was_answered(sqlite: Store, make_turns: MakeTurns) -> None:
    turns, pool = make_turns(store=sqlite, session_cache=1)
    sid = turns.create().session_id
    handle = interrupted(turns, pool, sid, "a", "b")
    turns.resume(sid, "a", True, by="bob")
    with pytest.raises(InterruptNotPending) as while_held:
        turns.resume(sid, "a", True, by="alice")
    turns.resume(sid, "b", True, by="bob")
    turns.worker_message(handle, Result(response=REPLY, state=[MESSAGE, REPLY]))
    with pytest.raises(InterruptNotPending) as after_the_turn:
        turns.resume(sid, "a", True, by="alice")
    turns.create()  # sid is forgotten, and with it what it remembered of its answers
    assert sid not in held(turns)
    with pytest.raises(InterruptNotPending) as forgotten:
        turns.resume(sid, "a", True, by="alice")
    # The audit says who answered, and when, as the copy held did.
    assert "it was already resumed by bob at " in while_held.value.detail
    assert forgotten.value.detail == after_the_turn.value.detail


def test_what_has_a_process_or_a_timer_is_never_forgotten(sqlite: Store, make_turns: MakeTurns, tmp_path: Path) -> None:
    turns, pool = make_turns(store=sqlite, session_cache=1, max_workers=4)
    running = turns.create().session_id
    turns.start_turn(running, MESSAGE)
    waiting = turns.create().session_id
    interrupted(turns, pool, waiting, "w")
    timed = turns.create().session_id
    turns.start_turn(timed, MESSAGE)
    turns.worker_message(pool.handle(timed), Interrupt(interrupt_id="t", payload=APPROVAL, seq=1, timeout=3600, default=False))
    for _ in range(3):
        turns.create()
    assert {running, waiting, timed} <= set(held(turns))
    assert len(held(turns)) == 4  # the three that must stay, and the newest
    turns.shutdown(0.01)  # the waiting ones park; the running one is left to be replayed

    turns, pool = make_turns(store=sqlite, session_cache=1, start=False)
    assert turns.recover() == 1
    # At a start the running turn is queued and the timed one is timed here; the untimed
    # parked one fits in the cache (taken up first: oldest write first) or waits in the store.
    assert running in held(turns) and timed in held(turns)
    assert state_of(turns, running) is TurnState.QUEUED and state_of(turns, timed) is TurnState.PARKED
    turns.start(pool)
    assert pool.handle(running).job.message == MESSAGE


def test_a_trim_looks_at_a_bounded_number_of_sessions_however_many_must_stay(
    sqlite: Store, make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of messages holds thousands of queued turns, none of which may be forgotten.
    Each read from the store trims the cache; a trim that looked at all of them made the
    burst cost the square of its size (10,000 messages: 90% of the server in ``_trim``).
    Once the turns end, the housekeeper brings the cache back to its size by itself (a
    request's trim follows only a read from the store). The bounds are made small here so
    that a few sessions show them."""
    monkeypatch.setattr(machine, "TRIM_LOOK", 4)
    monkeypatch.setattr(timers, "TRIM_EVERY_LOOK", 3)
    turns, pool = make_turns(store=sqlite, session_cache=1, max_workers=1)
    busy = [turns.create().session_id for _ in range(12)]
    for sid in busy:
        turns.start_turn(sid, MESSAGE)  # one runs, the rest wait for its slot
    assert set(busy) <= set(held(turns))
    asked: list[str] = []
    real = turns.replicas.may_forget
    here = threading.current_thread()  # the housekeeper trims too, on its own thread

    def may_forget(session: Any) -> bool:
        if threading.current_thread() is here:
            asked.append(session.session_id)
        return real(session)

    turns.replicas.may_forget = may_forget  # type: ignore[method-assign]
    turns.create()
    assert len(asked) == 4
    assert set(busy) <= set(held(turns))
    ended = 0
    while ended < len(pool.launched):  # each end hands the slot to the next waiting turn
        turns.worker_message(pool.launched[ended], Result(response=REPLY, state=[MESSAGE, REPLY]))
        ended += 1
    assert ended == len(busy)
    wait_until(lambda: len(held(turns)) == 1, what="the housekeeper to trim the cache to its size")


def test_a_thread_holding_a_forgotten_copy_uses_the_session_as_it_now_is(sqlite: Store, make_turns: MakeTurns) -> None:
    turns, _ = make_turns(store=sqlite, session_cache=1)
    sid = turns.create().session_id
    copy = turns._lookup(sid)  # noqa: SLF001
    turns.create()
    assert copy is not None and copy.forgotten and sid not in held(turns)
    turns.start_turn(sid, MESSAGE)  # on the copy read back, not the forgotten one
    fresh = turns._lookup(sid)  # noqa: SLF001
    assert fresh is not copy and fresh is not None and fresh.turn is not None and copy.turn is None


def test_a_client_chosen_id_of_a_forgotten_session_is_a_conflict_that_changes_nothing(sqlite: Store, make_turns: MakeTurns) -> None:
    turns, _ = make_turns(store=sqlite, session_cache=1)
    turns.create(session_id="mine", state=[MESSAGE, REPLY])
    turns.create()
    assert "mine" not in held(turns)
    with pytest.raises(SessionConflict, match="Session mine already exists"):
        turns.create(session_id="mine")
    assert turns.messages("mine") == [MESSAGE, REPLY]
    # The same when the store has it and memory does not, at the moment of the create: the
    # store is asked with the new copy held, so nobody reads the stored one meanwhile.
    turns.create()
    assert "mine" not in held(turns)
    assert turns._stored_elsewhere("mine") and not turns._stored_elsewhere("never")  # noqa: SLF001


def test_the_ttl_sweep_finds_forgotten_sessions_in_the_store(sqlite: Store, make_turns: MakeTurns) -> None:
    clock = [1000.0]
    turns, pool = make_turns(store=sqlite, session_cache=1, ttl=60, clock=lambda: clock[0])
    old = [turns.create().session_id for _ in range(3)]
    waiting = turns.create().session_id
    interrupted(turns, pool, waiting, "a")
    clock[0] += 61
    fresh = turns.create().session_id
    assert sorted(turns.sweep()) == sorted(old)
    assert {s.session_id for s in turns.list()} == {waiting, fresh}
