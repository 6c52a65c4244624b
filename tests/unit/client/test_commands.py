"""Pure parts of the client commands: ``--param`` parsing and readable output."""

from __future__ import annotations

import click
import pytest

from motus.client import InterruptInfo, SessionResponse, SessionSummary
from motus.models import ChatMessage, FunctionCall, ToolCall
from motus.api.schemas import InboxContext, InboxItem
from motus.client.commands import ANSWER_HINT, coerce_value, format_inbox, format_message, format_session, format_sessions, parse_params


@pytest.mark.parametrize(
    ("text", "expected"),
    [("42", 42), ("-7", -7), ("1.5", 1.5), ("1e3", 1000.0), ("true", True), ("false", False),
     ("True", "True"), ("nan", "nan"), ("inf", "inf"), ("", ""), ("Bob", "Bob"), ("0x10", "0x10")],
)
def test_coerce_value(text: str, expected: object) -> None:
    value = coerce_value(text)
    assert value == expected and type(value) is type(expected)


def test_parse_params() -> None:
    assert parse_params(("n=3", "name=Bob", "expr=a=b", "n=4")) == {"n": 4, "name": "Bob", "expr": "a=b"}
    assert parse_params(()) is None
    for bad in ("novalue", "=3"):
        with pytest.raises(click.BadParameter, match="KEY=VALUE"):
            parse_params((bad,))


def test_format_session_shows_response_error_and_interrupts() -> None:
    session = SessionResponse(
        session_id="s1",
        status="interrupted",
        interrupts=[InterruptInfo(interrupt_id="i1", type="tool_approval", payload={"type": "tool_approval"})],
    )
    text = format_session(session)
    assert text.splitlines()[:2] == ["session_id: s1", "status: interrupted"]
    assert "interrupt i1 (tool_approval):" in text
    idle = format_session(SessionResponse(session_id="s1", status="idle", response=ChatMessage.assistant_message("hi\nthere")))
    assert "response:\n  assistant: hi\n    there" in idle
    failed = format_session(SessionResponse(session_id="s1", status="error", error="Traceback\nValueError: x"))
    assert "error:\n  Traceback\n  ValueError: x" in failed


def test_format_sessions_table() -> None:
    assert format_sessions([]) == "No sessions."
    table = format_sessions([SessionSummary(session_id="abc", total_messages=2, status="idle"),
                             SessionSummary(session_id="def", total_messages=0, status="running", title="Invoices \x1b[2J for ACME")])
    assert table.splitlines()[0].split() == ["SESSION", "ID", "STATUS", "MESSAGES", "TITLE"]
    assert table.splitlines()[1].split() == ["abc", "idle", "2"]
    assert table.splitlines()[2].split() == ["def", "running", "0", "Invoices", "\\x1b[2J", "for", "ACME"]


def test_format_inbox_groups_by_session_and_numbers_within_it() -> None:
    """One block a session: its title, the message that started the turn (who, when), what
    the agent said; its items numbered "1 of 2"; a session of one item is not numbered."""
    def item(session_id: str, interrupt_id: str, **context: object) -> InboxItem:
        return InboxItem(session_id=session_id, interrupt_id=interrupt_id, type="tool_approval", created_at="T0",
                         payload={"tool_name": "delete_file", "tool_args": {"path": interrupt_id}}, context=InboxContext(**context))

    shown = format_inbox([
        item("s1", "a", session_title="Clean up", message="delete a\nand b", sent_by="alice", sent_at="T", agent_text="I will delete both."),
        item("s2", "c", session_title="Other", message="delete c", sent_by="anonymous"),
        item("s1", "b", session_title="Clean up"),
    ])
    first, second, hint = shown.split("\n\n")
    assert first.splitlines() == [
        "Session s1: Clean up",
        "  message from alice at T: delete a and b",
        "  the agent said: I will delete both.",
        '  1 of 2: [tool_approval] approve delete_file {"path": "a"}',
        "    interrupt a  since T0",
        '  2 of 2: [tool_approval] approve delete_file {"path": "b"}',
        "    interrupt b  since T0",
    ]
    assert second.splitlines()[:3] == ["Session s2: Other", "  message: delete c", '  [tool_approval] approve delete_file {"path": "c"}']
    assert hint == ANSWER_HINT


def test_format_message_tool_calls_and_tool_results() -> None:
    call = ChatMessage.assistant_message(tool_calls=[ToolCall(id="c1", function=FunctionCall(name="delete_file", arguments='{"path": "/x"}'))])
    assert format_message(call) == 'assistant: -> delete_file({"path": "/x"})'
    assert format_message(ChatMessage.tool_message("Deleted", tool_call_id="c1", name="delete_file")) == "tool (delete_file): Deleted"
    assert format_message(ChatMessage.user_message("hi", user_params={"n": 1})) == 'user: hi\n  user_params: {"n": 1}'


def test_format_inbox_says_who_may_approve_and_where_a_quorum_stands() -> None:
    item = InboxItem(session_id="s1", interrupt_id="a", type="tool_approval", created_at="T0",
                     payload={"tool_name": "release_funds", "tool_args": {"amount": 5}, "approvers": ["finance"], "quorum": 2},
                     approvals=[{"by": "bob", "at": "T1"}], approvals_needed=1)
    block = format_inbox([item]).split("\n\n")[0]
    assert block.splitlines()[-2:] == ["    Who may approve: 2 different keys with the role finance", "    1 of 2 approvals: bob"]
