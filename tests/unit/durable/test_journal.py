"""The worker-side turn journal (``motus.durable.journal``) as a pure object, and ``motus.step``.

A ``Journal`` talks to the server only through its channel; here the channel is ``None`` or
``RecordingChannel``, a stand-in that records what would go over the pipe and acknowledges a
*started* mark at once. Replays are set up by handing the journal the entries a previous
run recorded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import motus
from motus.durable import journal as journal_module
from motus.durable.journal import Journal, OutcomeUnknown, ReplayDiverged, digest, pack, unpack
from motus.durable.records import INTERRUPT, MODEL, STEP, TOOL, JournalEntry, Record


class RecordingChannel:
    """Stands in for the worker's pipe: ``events`` is what happened, in order."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.sent: list[Record] = []  # finished records (results)
        self.started: list[Record] = []  # started marks sent without waiting for an ack
        self.acked: list[Record] = []
        self.events = events if events is not None else []

    def send(self, message: object) -> None:
        assert isinstance(message, Record)
        (self.sent if message.entry.done else self.started).append(message)
        self.events.append(f"{'send' if message.entry.done else 'start'} #{message.entry.seq}")

    async def send_and_wait_ack(self, record: Record) -> None:
        self.acked.append(record)
        self.events.append(f"ack #{record.entry.seq}")


def done(seq: int, kind: str, key: str, label: str, result: object) -> JournalEntry:
    return JournalEntry(seq=seq, kind=kind, key=key, label=label, done=True, value=pack(("ok", result)))


def failed(seq: int, kind: str, key: str, label: str, exc: Exception) -> JournalEntry:
    return JournalEntry(seq=seq, kind=kind, key=key, label=label, done=True, value=pack(("raise", exc)))


def never_called() -> object:
    raise AssertionError("a recorded call ran again")


async def never_awaited() -> object:
    raise AssertionError("a recorded call ran again")


def returning(value: object):  # noqa: ANN201 - a tiny async body
    async def body() -> object:
        return value

    return body


@pytest.fixture
def installed() -> Iterator[None]:
    """Restore ``journal.current()`` to "outside a worker" after a test installed one."""
    yield
    journal_module._install(None)


# -- first runs ------------------------------------------------------------------------------


def test_new_calls_run_and_are_recorded_in_seq_order() -> None:
    channel = RecordingChannel()
    journal = Journal((), channel)
    assert not journal.replaying
    assert journal.call_sync(MODEL, "req-1", "chat", lambda: {"content": "hi"}) == {"content": "hi"}
    assert asyncio.run(journal.call(STEP, "charge:abc", "charge", returning(42))) == 42
    with pytest.raises(ValueError, match="card declined"):
        asyncio.run(journal.call(TOOL, "pay:{}", "pay", _raises(ValueError("card declined"))))
    with pytest.raises(KeyError):
        journal.call_sync(MODEL, "req-2", "chat", lambda: {}["missing"])

    entries = [record.entry for record in channel.sent]
    assert [(e.seq, e.kind, e.key, e.label, e.done, e.ref) for e in entries] == [
        (1, MODEL, "req-1", "chat", True, None),
        (2, STEP, "charge:abc", "charge", True, None),
        (3, TOOL, "pay:{}", "pay", True, None),
        (4, MODEL, "req-2", "chat", True, None),
    ]
    assert not any(record.ack for record in channel.sent)
    assert unpack(entries[0].value) == {"content": "hi"} and unpack(entries[1].value) == 42
    with pytest.raises(ValueError, match="card declined"):
        unpack(entries[2].value)
    assert journal.new_seq() == 5
    journal.finish()
    assert journal.diverged is None


def test_a_journal_without_a_channel_just_runs() -> None:
    journal = Journal((), None)
    assert journal.call_sync(MODEL, "k", "chat", lambda: 1) == 1
    assert asyncio.run(journal.call(TOOL, "k", "delete_db", returning(2), gated=True)) == 2
    assert journal.new_seq() == 3


def test_new_seqs_continue_after_the_recorded_ones() -> None:
    channel = RecordingChannel()
    journal = Journal([done(7, MODEL, "old", "chat", "x"), done(3, STEP, "s", "s", "y")], channel)
    journal.call_sync(MODEL, "old", "chat", never_called)
    journal.call_sync(STEP, "s", "s", never_called)
    journal.call_sync(MODEL, "new", "other", lambda: "z")
    assert [r.entry.seq for r in channel.sent] == [8]


def test_an_unpicklable_exception_is_recorded_by_its_text() -> None:
    class Local(Exception):  # a class pickle cannot find by name
        pass

    channel = RecordingChannel()
    with pytest.raises(Local):
        Journal((), channel).call_sync(MODEL, "k", "chat", _raises_sync(Local("nope")))
    with pytest.raises(RuntimeError, match="^Local: nope$"):
        unpack(channel.sent[0].entry.value)


# -- replays ---------------------------------------------------------------------------------


def test_recorded_calls_return_their_recorded_results_without_running() -> None:
    channel = RecordingChannel()
    journal = Journal(
        [done(1, MODEL, "req", "chat", {"content": "recorded"}), done(2, STEP, "charge:abc", "charge", 42)], channel
    )
    assert journal.replaying
    assert journal.call_sync(MODEL, "req", "chat", never_called) == {"content": "recorded"}
    assert asyncio.run(journal.call(STEP, "charge:abc", "charge", never_awaited)) == 42
    assert not journal.replaying
    assert channel.sent == []  # nothing to record again
    journal.finish()
    assert journal.diverged is None


def test_a_recorded_exception_is_raised_again_without_running() -> None:
    journal = Journal(
        [failed(1, MODEL, "req", "chat", ConnectionError("rate limited")), failed(2, TOOL, "pay", "pay", ValueError("declined"))],
        RecordingChannel(),
    )
    with pytest.raises(ConnectionError, match="^rate limited$"):
        journal.call_sync(MODEL, "req", "chat", never_called)
    with pytest.raises(ValueError, match="^declined$"):
        asyncio.run(journal.call(TOOL, "pay", "pay", never_awaited))
    journal.finish()
    assert journal.diverged is None


def test_concurrent_calls_match_by_key_and_occurrence_whatever_their_order() -> None:
    journal = Journal(
        [
            done(1, TOOL, "lookup:1", "lookup", "one"),
            done(2, TOOL, "lookup:2", "lookup", "two"),
            done(3, TOOL, "lookup:1", "lookup", "one again"),
            done(4, MODEL, "req", "chat", "answer"),
        ],
        RecordingChannel(),
    )

    async def gather() -> list[object]:
        return await asyncio.gather(
            journal.call(TOOL, "lookup:2", "lookup", never_awaited),
            journal.call(TOOL, "lookup:1", "lookup", never_awaited),
            journal.call(TOOL, "lookup:1", "lookup", never_awaited),
        )

    assert asyncio.run(gather()) == ["two", "one", "one again"]
    assert journal.call_sync(MODEL, "req", "chat", never_called) == "answer"
    journal.finish()
    assert journal.diverged is None


def test_concurrent_threads_each_claim_a_different_record() -> None:
    journal = Journal([done(seq, MODEL, "same", "chat", seq) for seq in range(1, 9)], RecordingChannel())
    results: list[object] = []
    barrier = threading.Barrier(8)

    def call() -> None:
        barrier.wait()
        results.append(journal.call_sync(MODEL, "same", "chat", never_called))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == list(range(1, 9))  # type: ignore[type-var]


def test_concurrent_calls_of_one_label_replay_when_only_a_later_one_was_recorded() -> None:
    # first run: gather(fetch(2), fetch(1)); fetch(1) finished first and was recorded, then the
    # server was killed while fetch(2) was still running
    journal = Journal([done(1, STEP, "fetch:1", "fetch", "one")], RecordingChannel())

    async def gather() -> list[object]:
        return await asyncio.gather(
            journal.call(STEP, "fetch:2", "fetch", returning("two")),
            journal.call(STEP, "fetch:1", "fetch", never_awaited),
        )

    assert asyncio.run(gather()) == ["two", "one"]
    journal.finish()
    assert journal.diverged is None


def test_reaching_a_recorded_label_with_other_inputs_is_a_divergence() -> None:
    channel = RecordingChannel()
    journal = Journal([done(1, MODEL, "req", "chat", "a"), done(2, STEP, "charge:abc", "charge", 42)], channel)
    assert journal.call_sync(MODEL, "req", "chat", never_called) == "a"
    with pytest.raises(ReplayDiverged) as diverged:
        asyncio.run(journal.call(STEP, "charge:xyz", "charge", never_awaited))
    message = str(diverged.value)
    assert message.startswith("Replay diverged:")
    assert message == "Replay diverged: the agent reached step charge with other inputs than record #2 (step charge) in the journal"
    assert journal.diverged is diverged.value
    # it sticks, even if the agent caught it: every later call fails the same way
    with pytest.raises(ReplayDiverged) as again:
        journal.call_sync(MODEL, "anything", "other", never_called)
    assert again.value is diverged.value
    journal.finish()
    assert journal.diverged is diverged.value
    assert channel.sent == []


def test_the_same_kind_with_another_label_is_a_new_call_not_a_divergence() -> None:
    channel = RecordingChannel()
    journal = Journal([done(1, STEP, "charge:abc", "charge", 42)], channel)
    assert asyncio.run(journal.call(STEP, "email:abc", "email", returning("sent"))) == "sent"
    assert [r.entry.seq for r in channel.sent] == [2]
    assert journal.diverged is None
    assert asyncio.run(journal.call(STEP, "charge:abc", "charge", never_awaited)) == 42


def test_finishing_with_records_never_reached_is_a_divergence() -> None:
    journal = Journal([done(1, MODEL, "req", "chat", "a"), done(2, INTERRUPT, "{}", "tool_approval", True)], None)
    journal.call_sync(MODEL, "req", "chat", never_called)
    journal.finish()
    assert isinstance(journal.diverged, ReplayDiverged)
    assert str(journal.diverged) == (
        "Replay diverged: the turn ended without reaching record #2 (interrupt tool_approval) from the journal"
    )


def test_claim_returns_a_pending_record_for_an_unanswered_interrupt() -> None:
    pending = JournalEntry(seq=1, kind=INTERRUPT, key='{"type": "x"}', label="x", ref="id-1", payload={"type": "x"})
    journal = Journal([pending], None)
    assert journal.claim(INTERRUPT, '{"type": "x"}', "x") is pending
    assert journal.claim(INTERRUPT, '{"type": "x"}', "x") is None  # consumed: a second one is new
    journal.finish()
    assert journal.diverged is None


# -- gated tools -----------------------------------------------------------------------------


def test_a_gated_call_started_but_not_done_is_never_run_again() -> None:
    started = JournalEntry(seq=3, kind=TOOL, key="delete_db:{}", label="delete_db")
    channel = RecordingChannel()
    journal = Journal([started], channel)
    with pytest.raises(OutcomeUnknown) as unknown:
        asyncio.run(journal.call(TOOL, "delete_db:{}", "delete_db", never_awaited, gated=True))
    assert str(unknown.value) == "Outcome unknown: the server stopped while delete_db was running"
    assert channel.acked == []  # no new started mark
    [record] = channel.sent  # recorded, so later replays agree
    assert (record.entry.seq, record.entry.done, record.ack) == (3, True, False)
    with pytest.raises(OutcomeUnknown, match="^Outcome unknown: the server stopped while delete_db was running$"):
        unpack(record.entry.value)
    journal.finish()
    assert journal.diverged is None


def test_an_ungated_call_started_but_not_done_runs_again() -> None:
    started = JournalEntry(seq=1, kind=TOOL, key="search:{}", label="search")
    channel = RecordingChannel()
    journal = Journal([started], channel)
    assert asyncio.run(journal.call(TOOL, "search:{}", "search", returning("hits"))) == "hits"
    assert [(r.entry.seq, r.entry.done) for r in channel.sent] == [(1, True)]  # at least once, same record


def test_a_gated_new_call_has_its_started_mark_acknowledged_before_its_body_runs() -> None:
    events: list[str] = []
    channel = RecordingChannel(events)
    journal = Journal([done(1, MODEL, "req", "chat", "a")], channel)
    journal.call_sync(MODEL, "req", "chat", never_called)

    async def body() -> str:
        events.append("body")
        return "deleted"

    assert asyncio.run(journal.call(TOOL, "delete_db:{}", "delete_db", body, gated=True)) == "deleted"
    assert events == ["ack #2", "body", "send #2"]
    [mark] = channel.acked
    assert mark.ack is True
    assert (mark.entry.seq, mark.entry.kind, mark.entry.key, mark.entry.label, mark.entry.done, mark.entry.value) == (
        2, TOOL, "delete_db:{}", "delete_db", False, None,
    )
    [result] = channel.sent
    assert result.entry.done and unpack(result.entry.value) == "deleted"


def test_a_gated_call_that_raises_records_the_error_after_its_mark() -> None:
    events: list[str] = []
    channel = RecordingChannel(events)
    journal = Journal((), channel)
    with pytest.raises(PermissionError):
        asyncio.run(journal.call(TOOL, "rm:{}", "rm", _raises(PermissionError("no")), gated=True))
    assert events == ["ack #1", "send #1"]
    with pytest.raises(PermissionError, match="^no$"):
        unpack(channel.sent[0].entry.value)


def test_a_recorded_gated_call_replays_its_result() -> None:
    journal = Journal([done(1, TOOL, "delete_db:{}", "delete_db", "deleted")], RecordingChannel())
    assert asyncio.run(journal.call(TOOL, "delete_db:{}", "delete_db", never_awaited, gated=True)) == "deleted"


# -- motus.step ------------------------------------------------------------------------------


def test_step_outside_a_worker_just_runs_plain_and_async_functions() -> None:
    assert journal_module.current() is None
    calls: list[object] = []

    def charge(card: str, amount: int = 0) -> str:
        calls.append(("charge", card, amount))
        return f"charged {card} {amount}"

    async def refund(card: str) -> str:
        calls.append(("refund", card))
        return f"refunded {card}"

    assert asyncio.run(motus.step("charge card", charge, "c-1", amount=5)) == "charged c-1 5"
    assert asyncio.run(motus.step("refund", refund, "c-1")) == "refunded c-1"
    assert asyncio.run(motus.step("charge card", charge, "c-1", amount=5)) == "charged c-1 5"  # runs every time
    assert calls == [("charge", "c-1", 5), ("refund", "c-1"), ("charge", "c-1", 5)]


def test_step_as_a_decorator_outside_a_worker() -> None:
    calls: list[str] = []

    @motus.step("send email")
    def send(to: str) -> str:
        """Send it."""
        calls.append(to)
        return f"sent to {to}"

    @motus.step("fetch")
    async def fetch(url: str) -> str:
        calls.append(url)
        return f"fetched {url}"

    assert asyncio.iscoroutinefunction(send) and asyncio.iscoroutinefunction(fetch)
    assert (send.__name__, send.__doc__) == ("send", "Send it.")
    assert asyncio.run(send("ann")) == "sent to ann"
    assert asyncio.run(fetch(url="http://x")) == "fetched http://x"
    assert calls == ["ann", "http://x"]


def test_step_refuses_a_missing_name_or_a_bad_function() -> None:
    with pytest.raises(TypeError, match="needs a name"):
        motus.step("", print)
    with pytest.raises(TypeError, match="takes no arguments"):
        motus.step("name", None, 1)
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        motus.step("name", 5)


def test_step_inside_a_worker_is_journaled_and_replayed(installed: None) -> None:
    calls: list[int] = []

    def charge(card: str) -> str:
        calls.append(1)
        return f"charged {card}"

    channel = RecordingChannel()
    journal_module._install(Journal((), channel))
    assert asyncio.run(motus.step("charge card", charge, "c-1")) == "charged c-1"
    [record] = channel.sent
    assert (record.entry.kind, record.entry.label, record.entry.key) == (
        STEP, "charge card", f"charge card:{digest([('c-1',), {}])}",
    )

    replay = Journal([record.entry], RecordingChannel())
    journal_module._install(replay)
    assert asyncio.run(motus.step("charge card", charge, "c-1")) == "charged c-1"
    assert calls == [1]  # not charged twice

    journal_module._install(Journal([record.entry], RecordingChannel()))  # the code changed: another card
    with pytest.raises(ReplayDiverged, match=r"^Replay diverged: .*record #1 \(step charge card\)"):
        asyncio.run(motus.step("charge card", charge, "c-2"))
    assert calls == [1]


def _raises(exc: Exception):  # noqa: ANN202 - a tiny async body
    async def body() -> object:
        raise exc

    return body


def _raises_sync(exc: Exception):  # noqa: ANN202
    def body() -> object:
        raise exc

    return body


def test_every_new_call_is_marked_started_and_a_rerun_keeps_its_seq_and_children() -> None:
    """A call re-run after its process ended (started, never finished) keeps its seq, so the
    records its body made (a question asked inside a tool) still belong to it: replaying the
    finished call later consumes them, and the turn ends without a divergence."""
    channel = RecordingChannel()
    journal = Journal((), channel)

    async def tool_asking() -> str:
        inner = journal.new_seq()  # what interrupt() does for a new interrupt
        assert journal_module.current_parent() == 1
        channel.send(Record(JournalEntry(seq=inner, kind=INTERRUPT, key="q", label="user_input", parent=1)))
        return "answered"

    assert asyncio.run(journal.call(TOOL, "ask:1", "ask", tool_asking)) == "answered"
    assert [(r.entry.seq, r.entry.done) for r in channel.started] == [(1, False), (2, False)]  # the tool, its question
    question = channel.started[1].entry
    result = channel.sent[0].entry
    assert (question.seq, question.parent) == (2, 1) and (result.seq, result.done) == (1, True)

    # The process died inside the tool: only its started mark and the answered question are
    # on record. The re-run keeps seq 1 and claims the question.
    started = channel.started[0].entry
    answered = question.finished(pack(("ok", "by date")))
    rerun = Journal((started, answered), RecordingChannel())

    async def body_again() -> str:
        entry = await rerun.claim_async(INTERRUPT, "q", "user_input")
        assert entry is not None and entry.parent == 1 and journal_module.current_parent() == 1
        return unpack(entry.value)

    assert asyncio.run(rerun.call(TOOL, "ask:1", "ask", body_again)) == "by date"
    rerun.finish()
    assert rerun.diverged is None

    # Later replays get the tool's result and never reach the question: still no divergence.
    later = Journal((result, answered), None)
    assert asyncio.run(later.call(TOOL, "ask:1", "ask", never_awaited)) == "answered"
    later.finish()
    assert later.diverged is None


# -- tool_call: the one journaled tool call of @tool and the framework runners ------------------


def test_tool_call_is_one_tool_record_keyed_by_name_and_arguments_and_replays(installed: None) -> None:
    calls: list[int] = []

    async def lookup() -> dict[str, int]:
        calls.append(1)
        return {"found": 3}

    channel = RecordingChannel()
    journal_module._install(Journal((), channel))
    assert asyncio.run(journal_module.tool_call("lookup", {"q": "x"}, lookup, gated=False)) == {"found": 3}
    [started], [record] = channel.started, channel.sent
    assert (record.entry.kind, record.entry.key, record.entry.label) == (TOOL, f"lookup:{digest({'q': 'x'})}", "lookup")
    assert started.entry.seq == record.entry.seq and channel.acked == []

    journal_module._install(Journal([record.entry], RecordingChannel()))
    assert asyncio.run(journal_module.tool_call("lookup", {"q": "x"}, never_awaited, gated=False)) == {"found": 3}
    assert calls == [1]


def test_a_gated_tool_call_is_acknowledged_first_and_never_run_again_after_a_stop(installed: None) -> None:
    channel = RecordingChannel()
    journal_module._install(Journal((), channel))
    assert asyncio.run(journal_module.tool_call("delete", {"path": "a"}, returning("deleted"), gated=True)) == "deleted"
    [mark] = channel.acked
    assert (mark.entry.kind, mark.entry.done) == (TOOL, False)

    journal_module._install(Journal([mark.entry], RecordingChannel()))  # the server stopped inside the body
    with pytest.raises(OutcomeUnknown, match="^Outcome unknown: the server stopped while delete was running$"):
        asyncio.run(journal_module.tool_call("delete", {"path": "a"}, never_awaited, gated=True))


def test_an_unrecordable_tool_result_is_replaced_only_inside_a_turn(installed: None) -> None:
    """With ``unrecordable``, a result the journal cannot record is returned and recorded as
    its replacement, so a replay gets the same; outside a turn the result comes back as it is.
    Without it the result is returned, and a replay fails there, saying why."""
    lock = threading.Lock()  # cannot be pickled

    async def body() -> object:
        return lock

    assert asyncio.run(journal_module.tool_call("make", {}, body, gated=False, unrecordable=repr)) is lock

    channel = RecordingChannel()
    journal_module._install(Journal((), channel))
    assert asyncio.run(journal_module.tool_call("make", {}, body, gated=False, unrecordable=repr)) == repr(lock)
    assert unpack(channel.sent[0].entry.value) == repr(lock)

    plain = RecordingChannel()
    journal_module._install(Journal((), plain))
    assert asyncio.run(journal_module.tool_call("make", {}, body, gated=False)) is lock
    with pytest.raises(journal_module.Unrecordable, match="^make cannot be replayed: its result lock could not be recorded"):
        unpack(plain.sent[0].entry.value)
