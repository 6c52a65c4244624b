"""``protocol.message_problem``: what the server refuses from a worker's pipe, and that it
never refuses what a worker of ours sends."""

from __future__ import annotations

import math

import pytest

from motus.durable.journal import pack
from motus.durable.records import INTERRUPT, MODEL, STEP, TOOL, Ack, Failure, Interrupt, JournalEntry, Record, Result, message_problem

PAYLOAD = {"type": "tool_approval", "tool_name": "delete_file", "arguments": {"path": "a"}}


@pytest.mark.parametrize(
    "message",
    [
        Interrupt(interrupt_id="0f0e", payload=PAYLOAD, seq=0),
        Interrupt(interrupt_id="0f0e", payload=PAYLOAD, seq=3, parent=2, timeout=1.5, default={"approved": False}),
        Interrupt(interrupt_id="0f0e", payload={}, seq=1, timeout=30, default=None),
        Interrupt(interrupt_id="0f0e", payload={}, seq=1, default=object()),  # no timeout: the default is never used
        Record(JournalEntry(seq=1, kind=TOOL, key="delete_file:{}", label="delete_file"), ack=True),
        Record(JournalEntry(seq=2, kind=MODEL, key="d1g", label="chat", done=True, value=pack(("ok", {"a": 1})), parent=1)),
        Record(JournalEntry(seq=9, kind=STEP, key="s:x", label="s", done=True, value=pack(("raise", ValueError("x"))))),
        Result(response={"role": "assistant", "content": "hi"}, state=[{"role": "user", "content": "hi"}], kept=0),
        Failure(error="Traceback ...\nValueError: x"),
        Ack(1),  # not a worker's message at all: ignored (and logged) by the server, not refused here
    ],
)
def test_what_a_worker_sends_is_never_refused(message: object) -> None:
    assert message_problem(message) is None


def entry(**changes: object) -> JournalEntry:
    fields: dict[str, object] = {"seq": 1, "kind": TOOL, "key": "t:{}", "label": "t"}
    fields.update(changes)
    return JournalEntry(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message, why",
    [
        (Interrupt(interrupt_id=5, payload=PAYLOAD), "interrupt: its id is not a non-empty str"),  # type: ignore[arg-type]
        (Interrupt(interrupt_id="", payload=PAYLOAD), "interrupt: its id is not a non-empty str"),
        (Interrupt(interrupt_id="i", payload=[1]), "interrupt: its payload is not a dict (list)"),  # type: ignore[arg-type]
        (Interrupt(interrupt_id="i", payload=PAYLOAD, seq=True), "interrupt: its seq is not an int >= 0"),
        (Interrupt(interrupt_id="i", payload=PAYLOAD, seq=-1), "interrupt: its seq is not an int >= 0"),
        (Interrupt(interrupt_id="i", payload=PAYLOAD, parent="1"), "interrupt: its parent is not an int"),  # type: ignore[arg-type]
        (Interrupt(interrupt_id="i", payload=PAYLOAD, timeout="5"), "interrupt: its timeout is not a finite number of seconds > 0"),  # type: ignore[arg-type]
        (Interrupt(interrupt_id="i", payload=PAYLOAD, timeout=math.nan), "interrupt: its timeout is not a finite number of seconds > 0"),
        (Interrupt(interrupt_id="i", payload=PAYLOAD, timeout=0), "interrupt: its timeout is not a finite number of seconds > 0"),
        (Interrupt(interrupt_id="i", payload={"a": {1, 2}}), "interrupt: it is not JSON: TypeError: Object of type set is not JSON serializable"),
        (Interrupt(interrupt_id="i", payload={"a": math.inf}), "interrupt: it is not JSON: ValueError: Out of range float values are not JSON compliant"),
        (Interrupt(interrupt_id="i", payload=PAYLOAD, timeout=1, default=b"x"), "interrupt: it is not JSON: TypeError: Object of type bytes is not JSON serializable"),
        (Interrupt(interrupt_id="i", payload={"a": [{"\udc80": 1}]}),
         "interrupt: its payload has an object key holding a lone surrogate (no view of it could show it)"),
        (Record(None), "record: its entry is not a JournalEntry (NoneType)"),  # type: ignore[arg-type]
        (Record(entry(), ack=1), "record: its ack is not a bool"),  # type: ignore[arg-type]
        (Record(entry(kind=INTERRUPT)), "record: its kind is not one a worker records ('interrupt')"),
        (Record(entry(seq=0)), "record: its seq is not an int >= 1"),
        (Record(entry(seq="1")), "record: its seq is not an int >= 1"),
        (Record(entry(key=None)), "record: its key, label or done has the wrong type"),
        (Record(entry(done=1)), "record: its key, label or done has the wrong type"),
        (Record(entry(value="ok")), "record: its value is not bytes"),
        (Record(entry(parent=1.0)), "record: its parent is not an int"),
        (Record(entry(ref="an-interrupt-id")), "record: it sets fields only the server sets (an interrupt's)"),
        (Record(entry(answered_by="mallory")), "record: it sets fields only the server sets (an interrupt's)"),
        (Result(response=None, state=[]), "result: its response is not a dict (NoneType)"),  # type: ignore[arg-type]
        (Failure(error=5), "failure: its error is not a str (int)"),  # type: ignore[arg-type]
    ],
)
def test_a_forged_message_is_refused_with_what_is_wrong(message: object, why: str) -> None:
    assert message_problem(message) == why
