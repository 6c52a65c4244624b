"""What the terminal clients print of untrusted text: ``visible``, ``visible_json`` and the
readable output of the client commands (``motus serve get/messages/sessions ...``)."""

from __future__ import annotations

import json
import unicodedata

import pytest
from click.testing import CliRunner

from motus.cli import main
from motus.client import InterruptInfo, SessionResponse, SessionSummary
from motus.models import ChatMessage
from motus.models.messages import FunctionCall, ToolCall
from motus.client.chat import visible, visible_json
from motus.client.commands import format_message, format_session, format_sessions
from tests.integration.client.stub_http import StubServer

#: Every character that must never reach a terminal raw.
C0 = [chr(c) for c in range(0x20)]
C1_AND_DEL = [chr(c) for c in range(0x7F, 0xA0)]
BIDI = [chr(c) for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
SEPARATORS = ["\u2028", "\u2029"]
UNSAFE = C0 + C1_AND_DEL + BIDI + SEPARATORS

#: Text that must come through unchanged: printable ASCII, accents, CJK, Arabic and Hebrew
#: letters, emoji (with a zero-width joiner), box drawing.
SAFE = "".join(chr(c) for c in range(0x20, 0x7F)) + "é ñ ß 日本語 العربية עברית 👩‍💻 │┌└ ⟨⟩"

#: What a terminal would act on: CSI, OSC (window title, hyperlink), a carriage return.
ATTACKS = ["\x1b[2J", "\x1b]0;owned\x07", "\x1b]8;;http://evil/\x1b\\", "\x9b31m", "\r", "\x08\x08\x08"]


def raw_unsafe(text: str) -> list[str]:
    return [char for char in text if char in UNSAFE]


@pytest.mark.parametrize("char", UNSAFE, ids=lambda c: f"U+{ord(c):04X}")
def test_every_unsafe_character_becomes_a_visible_escape(char: str) -> None:
    shown = visible(f"a{char}b")
    assert raw_unsafe(shown) == []
    assert shown.startswith("a\\") and shown.endswith("b") and len(shown) > 3
    expected = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}"
    )
    assert shown == f"a{expected}b"


def test_named_examples() -> None:
    assert visible("important.db\r  path: old_logs.txt") == "important.db\\r  path: old_logs.txt"
    assert visible("\x1b]0;owned\x07title") == "\\x1b]0;owned\\x07title"
    assert visible("txt.\u202egnp") == "txt.\\u202egnp"
    assert visible("\u2066isolated\u2069") == "\\u2066isolated\\u2069"
    assert visible("lone \ud800 surrogate") == "lone \\ud800 surrogate"
    assert visible(42) == "42" and visible(None) == "None"


def test_safe_text_is_unchanged_in_both_modes() -> None:
    assert visible(SAFE) == SAFE
    assert visible(SAFE, multiline=True) == SAFE
    assert not any(unicodedata.category(c) == "Cc" for c in SAFE)


def test_multiline_keeps_line_feeds_and_tabs_only() -> None:
    text = "line 1\n\tline 2\r\n" + "".join(ATTACKS)
    shown = visible(text, multiline=True)
    assert shown.startswith("line 1\n\tline 2\\r\n")
    assert [c for c in shown if c in UNSAFE] == ["\n", "\t", "\n"]
    assert visible("a\nb") == "a\\nb"  # one-line fields escape the line feed too


def test_visible_json_is_safe_and_decodes_to_the_same_value() -> None:
    value = {"all": "".join(UNSAFE), "safe": SAFE, "attacks": ATTACKS, "lone": "\udfff", "nested": [{"k\u202e": 1}]}
    for indent in (None, 2):
        text = visible_json(value, indent=indent)
        assert json.loads(text) == value
        allowed = ["\n"] if indent else []
        assert set(raw_unsafe(text)) <= set(allowed)
        assert SAFE.replace("\\", "\\\\").replace('"', '\\"') in text  # readable, not \u-escaped
    assert "\\u202e" in visible_json("\u202e") and "\\u0085" in visible_json("\x85")


# -- the client commands' readable output ---------------------------------------------------


def test_format_session_escapes_everything_the_server_sent() -> None:
    session = SessionResponse(
        session_id="s\x1b[2J",
        status="interrupted",
        response=ChatMessage.assistant_message("done\r\x1b[1Afaked\nsecond line"),
        error="Traceback\n  boom\x1b]0;x\x07",
        interrupts=[InterruptInfo(interrupt_id="i\u202e1", type="tool_approval", payload={"tool_args": {"path": "a\rb\u202e"}})],
    )
    shown = format_session(session)
    assert raw_unsafe(shown.replace("\n", "")) == []
    assert "session_id: s\\x1b[2J" in shown
    assert "  assistant: done\\r\\x1b[1Afaked\n    second line" in shown
    assert "  boom\\x1b]0;x\\x07" in shown
    assert "interrupt i\\u202e1 (tool_approval):" in shown
    assert '"path": "a\\rb\\u202e"' in shown


def test_format_message_and_sessions_escape_names_calls_and_params() -> None:
    message = ChatMessage.assistant_message(
        None, tool_calls=[ToolCall(id="c", function=FunctionCall(name="rm\x1b[8m", arguments='{"p": "x"}\r\u202e'))]
    )
    assert format_message(message) == 'assistant: -> rm\\x1b[8m({"p": "x"}\\r\\u202e)'
    tool = ChatMessage.tool_message("ok", tool_call_id="c", name="t\x07")
    assert format_message(tool) == "tool (t\\x07): ok"
    user = ChatMessage.user_message("hi", user_params={"k": "\u2067v"})
    assert format_message(user) == 'user: hi\n  user_params: {"k": "\\u2067v"}'
    rows = [SessionSummary(session_id="\x1b[31mred\r", status="idle", total_messages=2)]
    table = format_sessions(rows)
    assert table.splitlines()[1].split() == ["\\x1b[31mred\\r", "idle", "2"]
    assert raw_unsafe(table.replace("\n", "")) == []


def test_get_command_text_and_json_against_a_server_that_sends_escapes() -> None:
    reply = {
        "session_id": "abc",
        "status": "interrupted",
        "interrupts": [{"interrupt_id": "i-1", "type": "x\x1b]0;t\x07", "payload": {"path": "a\r\u202eb"}}],
    }
    with StubServer(reply=reply) as stub:
        runner = CliRunner(env={"MOTUS_API_KEY": None})
        text = runner.invoke(main, ["serve", "get", stub.url, "abc"], catch_exceptions=False)
        as_json = runner.invoke(main, ["serve", "get", stub.url, "abc", "--json"], catch_exceptions=False)
    assert text.exit_code == 0 and as_json.exit_code == 0
    assert "interrupt i-1 (x\\x1b]0;t\\x07):" in text.stdout
    assert raw_unsafe(text.stdout.replace("\n", "")) == []
    # --json stays JSON that decodes to exactly what the server sent.
    assert json.loads(as_json.stdout)["interrupts"][0]["payload"] == {"path": "a\r\u202eb"}
    assert json.loads(as_json.stdout)["interrupts"][0]["type"] == "x\x1b]0;t\x07"
    assert raw_unsafe(as_json.stdout.replace("\n", "")) == []


def test_http_error_details_are_escaped() -> None:
    with StubServer(status=404, reply={"detail": "Session not found\r\x1b[2KOK"}) as stub:
        result = CliRunner(env={"MOTUS_API_KEY": None}).invoke(main, ["serve", "get", stub.url, "x"], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr == "Error: 404 Not Found: Session not found\\r\\x1b[2KOK\n"
