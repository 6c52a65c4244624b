"""The kept inbox (``Queries.inbox``): read whole once, then brought up to date at each
change by reading again only the sessions published since (``Events.inbox_changes``).

An open Inbox view reads ``GET /interrupts`` at every change it hears of; with 20,000
approvals pending, reading the whole inbox again at each change held the store's lock and the
GIL ~0.8 s, and two such views took a server from 112 gated cycles a second to 1
(``bench/inbox_bench.py``). The oracle here is a whole read (``_read_inbox``): whatever
happens, the kept inbox is what a whole read would give, and an entry of a session that did
not change is the very object read before (not read again).

Real SQLite files and the memory store; the pool is the recording stand-in of ``test_turns``.
"""

from __future__ import annotations

import random
from collections import Counter
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from motus.durable.journal import pack
from motus.durable.records import MODEL, Interrupt, JournalEntry, Record, Result
from motus.serve.events import ALL, INBOX_CHANGES_KEPT, Events
from motus.serve.store import MemoryStore, Store, store_from_url
from motus.serve.store.sqlite import SqliteStore
from motus.serve.turns import Turns, queries
from tests.unit.serve.test_turns import MESSAGE, REPLY, MakeTurns, RecordingPool, make_turns  # noqa: F401

QUESTION = {"type": "user_input", "question": "Which colour?"}
APPROVAL = {"type": "tool_approval", "tool": "delete_db"}


@pytest.fixture(params=["sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made = store_from_url(f"sqlite:///{tmp_path}/sessions.sqlite3") if request.param == "sqlite" else MemoryStore()
    made.open()
    yield made
    made.close()


def ids(entries: list) -> list[tuple[str, str, str | None]]:
    return [(e.session_id, e.item.interrupt_id, e.context.title) for e in entries]


def said(entries: list) -> list[tuple[str, str, str | None, str | None]]:
    return [(*row, e.context.agent_text) for row, e in zip(ids(entries), entries)]


def ask(turns: Turns, pool: RecordingPool, session_id: str, *payloads: dict) -> list[str]:
    """Start a turn on ``session_id`` whose worker raises one interrupt per payload."""
    turns.start_turn(session_id, MESSAGE)
    handle = pool.handle(session_id)
    made = []
    for seq, payload in enumerate(payloads, start=1):
        interrupt_id = f"{session_id[:8]}-{len(pool.launched)}-{seq}"
        turns.worker_message(handle, Interrupt(interrupt_id=interrupt_id, payload=payload, seq=seq))
        made.append(interrupt_id)
    return made


def test_a_change_reads_again_only_the_sessions_it_concerns(store: Store, make_turns: MakeTurns) -> None:
    turns, pool = make_turns(store=store)
    a, b, c = (turns.create().session_id for _ in range(3))
    ask(turns, pool, a, APPROVAL)
    ask(turns, pool, b, QUESTION, APPROVAL)
    before = turns.inbox()
    assert turns.inbox("user_input") == [e for e in before if e.item.type == "user_input"]
    ask(turns, pool, c, APPROVAL)  # a change of c: a's and b's entries are kept, c's read
    after = turns.inbox()
    assert ids(after) == ids(turns._read_inbox(None))  # noqa: SLF001
    assert [e.session_id for e in after].count(c) == 1
    kept = {(e.session_id, e.item.interrupt_id): e for e in before}
    assert all(kept[e.session_id, e.item.interrupt_id] is e for e in after if e.session_id != c)
    turns.retitle(b, "Invoices")  # the title is in b's items: b is read again
    retitled = turns.inbox()
    assert {e.context.title for e in retitled if e.session_id == b} == {"Invoices"}
    assert all(e is next(x for x in after if x.item.interrupt_id == e.item.interrupt_id) for e in retitled if e.session_id != b)
    assert ids(turns.inbox("tool_approval")) == ids(turns._read_inbox("tool_approval"))  # noqa: SLF001


def test_a_type_asked_alone_is_patched_alone(store: Store, make_turns: MakeTurns) -> None:
    turns, pool = make_turns(store=store)
    a, b = turns.create().session_id, turns.create().session_id
    ask(turns, pool, a, QUESTION)
    questions = turns.inbox("user_input")
    ask(turns, pool, b, APPROVAL, QUESTION)
    assert ids(turns.inbox("user_input")) == ids(turns._read_inbox("user_input"))  # noqa: SLF001
    assert turns.inbox("user_input")[0] is questions[0]
    assert turns._inbox_cache.whole is None  # noqa: SLF001  # no whole inbox was read for it
    assert ids(turns.inbox()) == ids(turns._read_inbox(None))  # noqa: SLF001


def test_whatever_happens_the_kept_inbox_is_what_a_whole_read_gives(store: Store, make_turns: MakeTurns) -> None:
    """Turns asked, answered one interrupt at a time, ended, retitled and deleted at random,
    model calls finishing beside their interrupts, the inbox (whole, and of each type) read
    between; each read equals a whole read."""
    turns, pool = make_turns(store=store, max_workers=64)
    rng = random.Random(27)
    sessions = [turns.create().session_id for _ in range(12)]
    waiting: dict[str, list[str]] = {}
    for step in range(400):
        sid = rng.choice(sessions)
        if sid not in sessions:
            continue
        pending = waiting.get(sid)
        move = rng.random()
        if move < 0.1:
            turns.retitle(sid, f"title {step}")
        elif move < 0.15:
            turns.delete(sid)
            sessions.remove(sid)
            waiting.pop(sid, None)
            sessions.append(turns.create().session_id)
        elif move < 0.25 and pending:  # a model call beside the interrupts finishes: the items' agent_text
            reply = {"choices": [{"message": {"content": f"said at step {step}"}}]}
            turns.worker_message(pool.handle(sid), Record(JournalEntry(seq=100 + step, kind=MODEL, key=f"m{step}", label="Own.chat",
                                                                       done=True, value=pack(("ok", reply)))))
        elif not pending and turns.get(sid).status.value == "idle":
            waiting[sid] = ask(turns, pool, sid, *rng.sample([APPROVAL, QUESTION, APPROVAL], rng.randint(1, 3)))
        elif pending:
            turns.resume(sid, pending.pop(rng.randrange(len(pending))), True, by="bob")
            if not pending:
                turns.worker_message(pool.handle(sid), Result(response=REPLY, state=[MESSAGE, REPLY]))
                del waiting[sid]
        kind = rng.choice([None, None, "tool_approval", "user_input"])
        whole = turns._read_inbox(kind)  # noqa: SLF001
        assert said(turns.inbox(kind)) == said(whole), f"step {step}"
        answer = turns.inbox_answer(kind, None, lambda found, counts: (said(found), {k: v for k, v in counts.items() if v}))
        assert answer == (said(whole), dict(Counter(e.session_id for e in whole))), f"step {step}"
    assert sum(len(p) for p in waiting.values()) == len(turns.inbox())


def test_the_changes_since_a_generation_are_the_sessions_published_since() -> None:
    events = Events()
    events.publish("a")
    events.publish("b", inbox=False)  # no inbox change: no generation
    events.publish("c", inbox={"user_input"})
    assert events.inbox_generation == 2
    assert events.inbox_changes(0) == {"a", "c"} and events.inbox_changes(1) == {"c"} and events.inbox_changes(2) == set()
    events.publish(ALL)
    assert events.inbox_changes(2) is None  # anything may have changed
    assert events.inbox_changes(3) == set()
    for n in range(INBOX_CHANGES_KEPT):
        events.publish(f"s{n}")
    assert events.inbox_changes(3) == {f"s{n}" for n in range(INBOX_CHANGES_KEPT)}  # every one still kept
    events.publish("one more")
    assert events.inbox_changes(3) is None  # older than the changes kept: read it whole
    assert events.inbox_changes(4) == {f"s{n}" for n in range(1, INBOX_CHANGES_KEPT)} | {"one more"}
    assert events.inbox_changes(events.inbox_generation + 1) is None  # a generation not reached yet


def test_what_the_agent_says_while_an_interrupt_waits_is_not_kept_stale(store: Store, make_turns: MakeTurns) -> None:
    """A model reply finished beside a waiting interrupt is in a whole read (agent_text); the
    kept inbox kept the old entry (a Record published no inbox change for its session)."""
    turns, pool = make_turns(store=store, max_workers=4)
    a, b = turns.create().session_id, turns.create().session_id
    ask(turns, pool, a, QUESTION)
    assert [e.context.agent_text for e in turns.inbox()] == [None]
    said = JournalEntry(seq=2, kind=MODEL, key="m", label="Own.chat", done=True,
                        value=pack(("ok", {"choices": [{"message": {"content": "Meanwhile I looked it up."}}]})))
    turns.worker_message(pool.handle(a), Record(said))  # a's model call, beside its interrupt, finishes
    ask(turns, pool, b, APPROVAL)  # any change of the inbox
    fresh = {e.item.interrupt_id: e.context.agent_text for e in turns._read_inbox(None)}  # noqa: SLF001
    assert fresh[f"{a[:8]}-1-1"] == "Meanwhile I looked it up."
    assert {e.item.interrupt_id: e.context.agent_text for e in turns.inbox()} == fresh


class FlakySqlite(SqliteStore):
    """A SQLite store whose journal writes fail while ``failing`` is set (a full disk)."""

    failing = False

    def save_entries(self, session_id: str, turn_id: int, entries: Any) -> None:
        if self.failing:
            raise OSError("disk full")
        super().save_entries(session_id, turn_id, entries)


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[FlakySqlite]:
    path = f"{tmp_path}/sessions.sqlite3"
    made = FlakySqlite(f"sqlite:///{path}", path)
    made.open()
    yield made
    made.close()


def test_an_item_the_store_no_longer_shows_after_a_turn_given_up_on_is_not_kept(flaky: FlakySqlite, make_turns: MakeTurns) -> None:
    """After a backlog given up on, memory shows nothing but the store the question; the
    session's next write drops it from the store (it published no inbox change: memory
    showed nothing before and after)."""
    turns, pool = make_turns(store=flaky, max_workers=4)
    a, b = turns.create().session_id, turns.create().session_id
    [asked] = ask(turns, pool, a, QUESTION)
    flaky.failing = True
    turns.worker_message(pool.handle(a), Record(JournalEntry(seq=2, kind=MODEL, key="m", label="Own.chat")))  # waits in the backlog
    turn = turns._session(a).turn  # noqa: SLF001
    assert turn is not None and turn.backlog
    turn.backlog_since = time.monotonic() - 3600  # the store has been away past STORE_GIVE_UP_SECONDS
    turns._retry_backlog(turn)  # noqa: SLF001
    assert turns.get(a).status.value == "error"
    assert [e.item.interrupt_id for e in turns.inbox()] == [asked] == [e.item.interrupt_id for e in turns._read_inbox(None)]  # noqa: SLF001
    flaky.failing = False
    turns.start_turn(a, MESSAGE)  # the row is the session's again: running, no question
    ask(turns, pool, b, APPROVAL)  # any change of the inbox
    assert asked not in [e.item.interrupt_id for e in turns._read_inbox(None)]  # noqa: SLF001
    assert ids(turns.inbox()) == ids(turns._read_inbox(None))  # noqa: SLF001


def test_an_answer_is_made_once_a_change_for_every_reader(store: Store, make_turns: MakeTurns) -> None:
    """``inbox_answer``: the open views and the polls one change wakes read one answer,
    made from the kept inbox once; a change, another type or another key makes it anew."""
    turns, pool = make_turns(store=store)
    a, b = turns.create().session_id, turns.create().session_id
    ask(turns, pool, a, APPROVAL)
    made: list[tuple[str | None, int | None, list[str]]] = []

    def render(kind: str | None, limit: int | None):  # noqa: ANN202
        def made_now(found: list, counts: dict) -> list[str]:
            assert counts == Counter(e.session_id for e in found)
            made.append((kind, limit, [e.item.interrupt_id for e in found]))
            return [e.item.interrupt_id for e in found][:limit]
        return made_now

    first = turns.inbox_answer(None, None, render(None, None))
    assert turns.inbox_answer(None, None, render(None, None)) is first and len(made) == 1
    assert turns.inbox_answer(None, 1, render(None, 1)) == first and len(made) == 2  # another key
    assert turns.inbox_answer("user_input", None, render("user_input", None)) == [] and len(made) == 3
    ask(turns, pool, b, QUESTION)  # a change: made anew, with it
    again = turns.inbox_answer(None, None, render(None, None))
    assert len(made) == 4 and again == [e.item.interrupt_id for e in turns._read_inbox(None)] and len(again) == 2  # noqa: SLF001
    for limit in range(20):  # keys from clients' queries: a few answers are kept, the others made each time
        turns.inbox_answer(None, limit + 2, render(None, limit + 2))
    assert len(turns._inbox_cache.answers) <= 8  # noqa: SLF001


def test_the_answers_kept_hold_a_bounded_number_of_bytes(store: Store, make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole inbox of 50,000 is ~35 MB of text; kept with its type's beside the entries
    they were joined from, it took a server with 100,000 sessions past 250 MiB. An answer
    past the budget is made for each reader; small ones are still made once a change."""
    monkeypatch.setattr(queries, "INBOX_ANSWER_BYTES", 100)
    turns, pool = make_turns(store=store)
    ask(turns, pool, turns.create().session_id, APPROVAL)
    made: list[int] = []

    def render(size: int):  # noqa: ANN202
        def made_now(found: list, counts: dict) -> bytes:
            made.append(size)
            return b"x" * size
        return made_now

    for _ in range(2):
        turns.inbox_answer(None, "big", render(150), size=len)
    assert made == [150, 150]  # past the budget: made for each reader
    for _ in range(2):
        turns.inbox_answer(None, "small", render(60), size=len)
        turns.inbox_answer(None, "another", render(60), size=len)
    assert made == [150, 150, 60, 60, 60]  # the first fits, the second would not
    assert turns._inbox_cache.answer_bytes == [60]  # noqa: SLF001


def test_the_byte_budget_holds_when_a_type_is_asked_while_an_answer_is_made(
    store: Store, make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack: a type asked for the first time makes a new kept inbox that shares
    the answers with the old one. An answer still being made on the old one (another thread)
    was counted there only, and the new one took more past the budget. (The second request
    is made inside the first one's render, to get that interleaving.)"""
    monkeypatch.setattr(queries, "INBOX_ANSWER_BYTES", 100)
    turns, pool = make_turns(store=store)
    ask(turns, pool, turns.create().session_id, APPROVAL)

    def first(found: list, counts: dict) -> bytes:
        turns.inbox_answer("tool_approval", "second", lambda found, counts: b"b" * 60, size=len)
        return b"a" * 60

    turns.inbox_answer(None, "first", first, size=len)
    turns.inbox_answer("tool_approval", "third", lambda found, counts: b"c" * 30, size=len)
    kept = turns._inbox_cache.answers  # noqa: SLF001
    assert sum(len(answer) for answer in kept.values()) <= 100, {key: len(answer) for key, answer in kept.items()}


def test_an_interrupt_answered_before_its_coming_was_announced_is_not_kept(
    store: Store, make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn asks twice in a row (one tool call, then the next). The manager thread commits
    the second question and releases the session's lock, then announces it (``_finish``).
    Meanwhile the approver, who just answered the first, reads the inbox (the session
    changed: it is read again, and shows the second question) and answers it at once. Both
    announces then find what the inbox showed before (nothing) and publish no inbox change:
    the kept inbox keeps the answered question until the session changes again."""
    turns, pool = make_turns(store=store)
    a = turns.create().session_id
    [first] = ask(turns, pool, a, APPROVAL)
    assert [e.item.interrupt_id for e in turns.inbox()] == [first]
    turns.resume(a, first, True, by="bob")  # the approver answers the first question
    announce = turns._announce  # noqa: SLF001
    raced: list[str] = []

    def late_announce(session_id: str, touched: bool = False) -> None:
        if not raced and turns.get(session_id).status.value == "interrupted":
            [entry] = turns.inbox()  # the approver's next read, before the question was announced
            raced.append(entry.item.interrupt_id)
            turns.resume(session_id, entry.item.interrupt_id, True, by="bob")  # answered at once
        announce(session_id, touched)

    monkeypatch.setattr(turns, "_announce", late_announce)
    turns.worker_message(pool.handle(a), Interrupt(interrupt_id="second", payload=APPROVAL, seq=2))
    assert raced == ["second"] and turns.get(a).status.value == "running"
    assert ids(turns._read_inbox(None)) == []  # noqa: SLF001
    assert ids(turns.inbox()) == []


def test_a_session_held_again_while_its_change_is_announced_keeps_what_the_inbox_showed(
    store: Store, make_turns: MakeTurns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change's announce found the session gone from memory (forgotten past the cache)
    while another thread held it again before the announce recorded that: what the inbox
    showed of it was dropped, so its answer looked like no change and the kept inbox kept
    the answered interrupt. The announce now decides under the registry."""
    turns, pool = make_turns(store=store)
    a = turns.create().session_id
    [asked] = ask(turns, pool, a, APPROVAL)
    assert [e.item.interrupt_id for e in turns.inbox()] == [asked]
    held = turns._lookup  # noqa: SLF001
    missed: list[str] = []

    def lookup(session_id: str):  # noqa: ANN202 - the announce's look finds it forgotten, once
        if session_id == a and not missed:
            missed.append(session_id)
            return None
        return held(session_id)

    monkeypatch.setattr(turns, "_lookup", lookup)
    turns._announce(a)  # noqa: SLF001  # some change of a, announced as it is held again
    monkeypatch.undo()
    assert missed == [a]
    assert [e.item.interrupt_id for e in turns.inbox()] == [asked]  # a reader keeps the session as it is
    turns.resume(a, asked, True, by="bob")
    assert ids(turns._read_inbox(None)) == []  # noqa: SLF001
    assert ids(turns.inbox()) == []
