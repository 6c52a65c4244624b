"""``motus.serve.live``: the live turn an approver sees, built from a journal snapshot."""

from __future__ import annotations

from typing import Any

from motus.durable.journal import pack
from motus.durable.records import INTERRUPT, MODEL, STEP, TOOL, JournalEntry
from motus.serve.live import MAX_TEXT, describe_step, describe_turn, model_reply
from motus.serve.streams import isoformat

MESSAGE = {"role": "user", "content": "clean up"}
OPENAI = {"choices": [{"message": {"role": "assistant", "content": "I'll delete it.", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "delete_file", "arguments": '{"path": "old.txt"}'}}]}}]}
ANTHROPIC = {"content": [{"type": "text", "text": "Deleting."}, {"type": "tool_use", "id": "t1", "name": "delete_file", "input": {"path": "a"}}]}


def test_both_provider_shapes_are_read() -> None:
    assert model_reply(OPENAI) == {"text": "I'll delete it.", "tool_calls": [{"name": "delete_file", "arguments": {"path": "old.txt"}}]}
    assert model_reply(ANTHROPIC) == {"text": "Deleting.", "tool_calls": [{"name": "delete_file", "arguments": {"path": "a"}}]}
    assert model_reply({"choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "x", "arguments": "not json"}}]}}]}) == {
        "text": "", "tool_calls": [{"name": "x", "arguments": "not json"}]}
    for odd in (None, "text", [], {}, {"choices": []}, {"choices": ["x"]}, {"content": "plain"}):
        assert model_reply(odd) is None or model_reply(odd)["tool_calls"] == []


def test_a_turn_shows_the_message_model_tool_and_interrupts_in_order() -> None:
    journal = [
        JournalEntry(seq=3, kind=INTERRUPT, key="k", label="tool_approval", ref="i1", payload={"type": "tool_approval"},
                     created_at=100.0, parent=2),
        JournalEntry(seq=1, kind=MODEL, key="m", label="openai /chat/completions", done=True, value=pack(("ok", OPENAI))),
        JournalEntry(seq=2, kind=TOOL, key="t", label="delete_file"),
        JournalEntry(seq=4, kind=STEP, key="s", label="count", done=True, value=pack(("raise", ValueError("bad")))),
        JournalEntry(seq=5, kind=TOOL, key="t2", label="read", done=True, value=pack(("ok", "x" * (MAX_TEXT + 10)))),
        JournalEntry(seq=6, kind=INTERRUPT, key="k2", label="confirm", ref="i2", payload={}, done=True,
                     value=pack(("ok", {"approved": True})), answered_by="ops", answered_at=101.0),
    ]
    turn = describe_turn(7, MESSAGE, journal, isoformat)
    assert turn["turn_id"] == 7 and turn["message"] == MESSAGE
    steps = turn["steps"]
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert steps[0]["tool_calls"] == [{"name": "delete_file", "arguments": {"path": "old.txt"}}] and steps[0]["status"] == "done"
    assert steps[1] == {"seq": 2, "kind": TOOL, "label": "delete_file", "status": "running"}
    assert steps[2]["status"] == "pending" and steps[2]["interrupt_id"] == "i1" and steps[2]["created_at"].endswith("Z")
    assert steps[3]["status"] == "failed" and steps[3]["error"] == "ValueError: bad"
    assert len(steps[4]["result"]) < MAX_TEXT + 100 and "more characters" in steps[4]["result"]
    assert (steps[5]["status"], steps[5]["by"], steps[5]["value"]) == ("resolved", "ops", {"approved": True})


def test_unreadable_records_never_raise() -> None:
    journal = [JournalEntry(seq=1, kind=MODEL, key="m", label="x", done=True, value=b"not a pickle")]
    [step] = describe_turn(1, MESSAGE, journal, isoformat)["steps"]
    assert step["status"] == "failed" and "error" in step


_UNPICKLED: list[str] = []


def _counted(text: str) -> str:
    _UNPICKLED.append(text)
    return text


class _Counted:
    """Unpickles to its text, counting each unpickling."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _counted, (self.text,)


def test_a_finished_step_is_rendered_once_and_each_view_gets_its_own_copy() -> None:
    """A live view is read at every change of a running turn: a finished record, which
    never changes, is unpickled and rendered once, not at every read."""
    entry = JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=pack(("ok", _Counted("result one"))))
    other = JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=pack(("ok", _Counted("result two"))))
    _UNPICKLED.clear()  # (``pack`` reads a value back once, to know a later process can)
    first = describe_step(entry, str)
    first["result"] = "changed by a caller"
    second = describe_step(entry, str)
    assert second == {"seq": 1, "kind": TOOL, "label": "t", "status": "done", "result": "result one"}
    assert _UNPICKLED == ["result one"]
    # A record that differs in anything (here its value) is a new entry, rendered anew.
    assert describe_step(other, str)["result"] == "result two"
    assert _UNPICKLED == ["result one", "result two"]


def test_a_reply_journaled_twice_by_nested_clients_is_shown_and_said_once() -> None:
    """A client of the user's own around one of motus's: ReActAgent records the reply and
    the inner client records its HTTP request inside it. The live view and the inbox's
    ``agent_text`` show it once; the agent's texts are joined in order, the end kept."""
    from motus.serve.live import agent_text

    outer = JournalEntry(seq=1, kind=MODEL, key="a", label="Own.chat", done=True, value=pack(("ok", OPENAI)))
    inner = JournalEntry(seq=2, kind=MODEL, key="b", label="openai /chat/completions", done=True, value=pack(("ok", OPENAI)), parent=1)
    later = JournalEntry(seq=3, kind=MODEL, key="c", label="Own.chat", done=True,
                         value=pack(("ok", {"choices": [{"message": {"content": "And then this."}}]})))
    running = JournalEntry(seq=4, kind=MODEL, key="d", label="Own.chat")
    assert agent_text([later, inner, outer, running]) == "I'll delete it.\n\nAnd then this."
    steps = describe_turn(1, MESSAGE, [outer, inner, later], isoformat)["steps"]
    assert [step["seq"] for step in steps] == [1, 3]
    long = JournalEntry(seq=7, kind=MODEL, key="e", label="Own.chat", done=True,
                        value=pack(("ok", {"choices": [{"message": {"content": "x" * 1500 + "END"}}]})))
    again = JournalEntry(seq=6, kind=MODEL, key="f", label="Own.chat", done=True,
                         value=pack(("ok", {"choices": [{"message": {"content": "y" * 1500}}]})))
    said = agent_text([outer, again, long]) or ""
    assert said.endswith("END") and len(said) < MAX_TEXT + 60 and said.startswith("(")
    assert agent_text([running]) is None and agent_text([]) is None
