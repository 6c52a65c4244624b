"""The session state machine and store, without a server."""

from __future__ import annotations

import threading
import time

import pytest
from freezegun import freeze_time

from motus.serve.sessions import (
    InterruptNotPending,
    PendingInterrupt,
    SessionConflict,
    SessionLimitReached,
    ServerUnavailable,
    SessionNotFound,
    SessionStatus,
    SessionStore,
)

MESSAGE = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}


def interrupt(interrupt_id: str, kind: object = "tool_approval") -> PendingInterrupt:
    return PendingInterrupt(interrupt_id=interrupt_id, payload={"type": kind})


def test_full_turn_with_two_interrupts() -> None:
    store = SessionStore()
    sid = store.create().session_id
    assert store.get(sid).status is SessionStatus.IDLE
    turn, state = store.start_turn(sid, MESSAGE)
    assert (turn, state) == (1, [])
    assert store.interrupt_turn(sid, turn, interrupt("a")) is True
    assert store.interrupt_turn(sid, turn, interrupt("b")) is False
    view = store.get(sid)
    assert view.status is SessionStatus.INTERRUPTED
    assert [i.interrupt_id for i in view.interrupts] == ["a", "b"]
    assert store.take_interrupt(sid, "b") == (1, False)
    assert store.get(sid).status is SessionStatus.INTERRUPTED
    assert store.take_interrupt(sid, "a") == (1, True)
    assert store.get(sid).status is SessionStatus.RUNNING
    end = store.complete_turn(sid, turn, REPLY, [MESSAGE, REPLY])
    assert end is not None and end.status is SessionStatus.IDLE
    assert store.messages(sid) == [MESSAGE, REPLY]
    assert store.get(sid).response == REPLY


def test_interrupt_type_defaults_to_unknown() -> None:
    assert interrupt("x", kind=None).type == "unknown"
    assert interrupt("x", kind=5).type == "unknown"
    assert interrupt("x", kind="color_picker").type == "color_picker"


def test_busy_sessions_refuse_messages() -> None:
    store = SessionStore()
    sid = store.create().session_id
    turn, _ = store.start_turn(sid, MESSAGE)
    with pytest.raises(SessionConflict, match="running"):
        store.start_turn(sid, MESSAGE)
    store.interrupt_turn(sid, turn, interrupt("a"))
    with pytest.raises(SessionConflict, match="interrupted"):
        store.start_turn(sid, MESSAGE)


def test_error_keeps_state_and_accepts_a_new_message() -> None:
    store = SessionStore()
    sid = store.create(state=[MESSAGE]).session_id
    turn, _ = store.start_turn(sid, MESSAGE)
    store.interrupt_turn(sid, turn, interrupt("a"))
    store.fail_turn(sid, turn, "Agent timed out")
    view = store.get(sid)
    assert (view.status, view.error, view.interrupts) == (SessionStatus.ERROR, "Agent timed out", ())
    assert store.messages(sid) == [MESSAGE]
    with pytest.raises(InterruptNotPending, match="^Session not actively waiting for resume"):
        store.take_interrupt(sid, "a")
    assert store.start_turn(sid, MESSAGE)[0] == 2
    assert store.get(sid).error is None


def test_stale_turn_events_are_ignored() -> None:
    store = SessionStore()
    sid = store.create().session_id
    turn, _ = store.start_turn(sid, MESSAGE)
    store.fail_turn(sid, turn, "boom")
    new_turn, _ = store.start_turn(sid, MESSAGE)
    assert store.interrupt_turn(sid, turn, interrupt("late")) is None
    assert store.complete_turn(sid, turn, REPLY, [REPLY]) is None
    assert store.get(sid).status is SessionStatus.RUNNING
    assert store.complete_turn(sid, new_turn, REPLY, [REPLY]) is not None
    store.delete(sid)
    assert store.fail_turn(sid, new_turn, "gone") is None


def test_resume_details() -> None:
    store = SessionStore()
    sid = store.create().session_id
    turn, _ = store.start_turn(sid, MESSAGE)
    store.interrupt_turn(sid, turn, interrupt("a"))
    store.interrupt_turn(sid, turn, interrupt("b"))
    store.take_interrupt(sid, "a")
    with pytest.raises(InterruptNotPending, match="already resumed"):
        store.take_interrupt(sid, "a")
    with pytest.raises(InterruptNotPending, match="not found"):
        store.take_interrupt(sid, "zzz")
    with pytest.raises(SessionNotFound):
        store.take_interrupt("nope", "a")


def test_session_limit_and_duplicate_ids() -> None:
    store = SessionStore(max_sessions=1)
    store.create(session_id="one")
    with pytest.raises(SessionConflict):
        store.create(session_id="one")
    with pytest.raises(SessionLimitReached):
        store.create()
    store.delete("one")
    store.create()


def test_ttl_sweeps_only_idle_and_error_sessions() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = SessionStore(ttl=60, clock=time.monotonic)
        idle = store.create().session_id
        failed = store.create().session_id
        turn, _ = store.start_turn(failed, MESSAGE)
        store.fail_turn(failed, turn, "boom")
        running = store.create().session_id
        store.start_turn(running, MESSAGE)
        waiting = store.create().session_id
        turn, _ = store.start_turn(waiting, MESSAGE)
        store.interrupt_turn(waiting, turn, interrupt("a"))

        clock.tick(59)
        assert store.sweep() == []
        store.get(idle)  # reading is not touching
        clock.tick(2)
        assert sorted(store.sweep()) == sorted([idle, failed])
        clock.tick(3600)
        assert store.sweep() == []
        assert {view.session_id for view in store.list()} == {running, waiting}


def test_ttl_counts_from_the_last_write() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = SessionStore(ttl=10, clock=time.monotonic)
        sid = store.create().session_id
        clock.tick(8)
        turn, _ = store.start_turn(sid, MESSAGE)
        store.complete_turn(sid, turn, REPLY, [MESSAGE, REPLY])
        clock.tick(8)
        assert store.sweep() == []
        clock.tick(3)
        assert store.sweep() == [sid]


def test_wait_returns_on_change_and_on_delete() -> None:
    store = SessionStore()
    sid = store.create().session_id
    turn, _ = store.start_turn(sid, MESSAGE)
    assert store.wait(sid, timeout=0.01).status is SessionStatus.RUNNING
    results: list[object] = []

    def waiter() -> None:
        results.append(store.wait(sid, timeout=30).status)

    thread = threading.Thread(target=waiter)
    thread.start()
    store.interrupt_turn(sid, turn, interrupt("a"))
    thread.join(10)
    assert results == [SessionStatus.INTERRUPTED]

    store.take_interrupt(sid, "a")

    def deleted_waiter() -> None:
        try:
            store.wait(sid, timeout=30)
        except SessionNotFound as exc:
            results.append(exc)

    thread = threading.Thread(target=deleted_waiter)
    thread.start()
    store.delete(sid)
    thread.join(10)
    assert isinstance(results[-1], SessionNotFound)


def test_close_releases_waiters_and_refuses_new_work() -> None:
    store = SessionStore()
    sid = store.create().session_id
    store.start_turn(sid, MESSAGE)
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(store.wait(sid, timeout=30).status))
    thread.start()
    store.close()
    thread.join(10)
    assert results == [SessionStatus.RUNNING]
    with pytest.raises(ServerUnavailable, match="shutting down"):
        store.create()
