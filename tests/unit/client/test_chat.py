"""The chat's pure parts: choice parsing, rendering, and answering from scripted input."""

from __future__ import annotations

import io
import json

import pytest

from motus.client import SKIP, ClientError, InterruptInfo, NotFound, Unauthorized
from motus.client.chat import (
    OTHER_LABEL,
    Console,
    answer_interrupt,
    boxed,
    describe_error,
    error_summary,
    format_arguments,
    format_question,
    parse_choices,
)
from tests.agents.client import APPROVAL, CUSTOM, QUESTIONS


def scripted(*lines: str) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Console(io.StringIO("".join(line + "\n" for line in lines)), out, err), out, err


def info(payload: dict) -> InterruptInfo:
    return InterruptInfo(interrupt_id="i-1", type=payload.get("type", "unknown"), payload=payload)


@pytest.mark.parametrize(
    ("text", "multi", "expected"),
    [("2", False, [2]), (" 4 ", False, [4]), ("1,3", True, [1, 3]), ("3, 1 3", True, [3, 1]), ("2", True, [2])],
)
def test_parse_choices_accepts(text: str, multi: bool, expected: list[int]) -> None:
    assert parse_choices(text, 4, multi) == expected


@pytest.mark.parametrize(("text", "multi"), [("", False), ("0", False), ("5", False), ("x", True), ("1,3", False), ("1,9", True), ("-1", False)])
def test_parse_choices_rejects_with_a_message(text: str, multi: bool) -> None:
    with pytest.raises(ValueError, match="Please enter a number from 1 to 4"):
        parse_choices(text, 4, multi)


def test_format_question_numbers_options_boxes_markdown_and_adds_other() -> None:
    text = format_question(QUESTIONS["questions"][0])
    assert text.splitlines()[0] == "[Strategy] How would you like to organize the files?"
    assert "  1. By date - Group files by year and month" in text
    assert "     │ 2024/" in text and "     │   01/" in text
    assert text.splitlines()[-1] == f"  4. {OTHER_LABEL}"
    multi = format_question(QUESTIONS["questions"][1])
    assert "one or more" in multi


def test_boxed_falls_back_to_ascii() -> None:
    assert boxed("a\nbb", unicode=False) == ["+--------", "| a", "| bb", "+--------"]


def test_format_arguments_is_one_line_per_argument() -> None:
    assert format_arguments({"path": "/tmp/x", "force": True, "n": [1, 2]}) == '  path: /tmp/x\n  force: true\n  n: [1, 2]'
    # A multi-line value is a marked block: no line of it can pass for another argument.
    assert format_arguments({"text": "a\n  force: false"}) == "  text: (2 lines)\n    | a\n    |   force: false"
    assert format_arguments({}) == "  (no arguments)"
    assert format_arguments(None) == "  (no arguments)"
    assert format_arguments([1]) == "  [1]"


def test_tool_approval_yes_no_reason_and_edit() -> None:
    console, out, _ = scripted("y")
    assert answer_interrupt(info(APPROVAL), console) == {"approved": True}
    assert "The agent wants to run: delete_file" in out.getvalue()
    assert "  path: /tmp/old_logs.txt" in out.getvalue()
    assert "Approve? [y/N] " in out.getvalue()

    console, _, _ = scripted("", "")
    assert answer_interrupt(info(APPROVAL), console) == {"approved": False}

    console, _, _ = scripted("n", "too risky")
    assert answer_interrupt(info(APPROVAL), console) == {"approved": False, "reason": "too risky"}

    # Edits are merged over the agent's arguments, shown merged, and sent merged.
    console, out, _ = scripted("e", "not json", "[1]", '{"path": "/tmp/new.txt"}', "yes")
    merged = {"path": "/tmp/new.txt", "force": True}
    assert answer_interrupt(info(APPROVAL), console) == {"approved": True, "tool_args": merged}
    shown = out.getvalue()
    assert "Not valid JSON" in shown and "must be a JSON object" in shown
    assert 'Current arguments: {"path": "/tmp/old_logs.txt", "force": true}\n' in shown
    assert "With your edits it runs with:\n  path: /tmp/new.txt\n  force: true\n" in shown

    # An edit that changes nothing approves the agent's own arguments.
    console, out, _ = scripted("e", '{"force": true}', "y")
    assert answer_interrupt(info(APPROVAL), console) == {"approved": True}
    assert "Unchanged: it runs with the agent's arguments:" in out.getvalue()


def test_several_pending_interrupts_are_numbered() -> None:
    console, out, _ = scripted("y")
    answer_interrupt(info(APPROVAL), console, (1, 2))
    assert "\nApproval 1 of 2\n\nThe agent wants to run: delete_file" in out.getvalue()
    console, out, _ = scripted("1", "1")
    answer_interrupt(info(QUESTIONS), console, (2, 3))
    assert out.getvalue().startswith("\nQuestion 2 of 3\n")
    console, out, _ = scripted('"x"')
    answer_interrupt(info(CUSTOM), console, (3, 3))
    assert out.getvalue().startswith("\nRequest 3 of 3\n")
    # Alone, an interrupt is not numbered.
    console, out, _ = scripted("y")
    answer_interrupt(info(APPROVAL), console, (1, 1))
    assert " of " not in out.getvalue()


SPOOFED_PATH = "important.db\r  path: old_logs.txt"


def test_tool_approval_shows_control_and_bidi_characters_escaped() -> None:
    payload = {
        "type": "tool_approval",
        "tool_name": "delete_file\x1b[8m",
        "tool_args": {"path": SPOOFED_PATH, "title\x1b]0;pwned\x07": "txt.\u202egnp", "meta": {"note": "\u2067x\x9b"}},
    }
    console, out, _ = scripted("y")
    assert answer_interrupt(info(payload), console) == {"approved": True}
    shown = out.getvalue()
    assert "The agent wants to run: delete_file\\x1b[8m\n" in shown
    assert "  path: important.db\\r  path: old_logs.txt\n" in shown
    assert "  title\\x1b]0;pwned\\x07: txt.\\u202egnp\n" in shown
    assert '  meta: {"note": "\\u2067x\\u009b"}\n' in shown
    assert not any(c in shown for c in "\r\x1b\x07\x9b\u202e\u2067")

    # Editing starts from the arguments as JSON that still decodes to the same values.
    console, out, _ = scripted("e", "", "y")
    assert answer_interrupt(info(payload), console) == {"approved": True}
    line = out.getvalue().split("Current arguments: ", 1)[1].split("\n", 1)[0]
    assert json.loads(line) == payload["tool_args"]
    assert "\\u202e" in line and "\u202e" not in line


def test_questions_and_custom_payloads_are_escaped() -> None:
    questions = {
        "type": "user_input",
        "questions": [
            {
                "question": "Keep the files?\n  1. No - delete everything",
                "header": "Files\x1b[2J",
                "options": [
                    {"label": "Yes\u202e", "description": "keep\rthem", "markdown": "a\x1b[31m\nb\u2028c"},
                    {"label": "No", "description": "delete"},
                ],
            }
        ],
    }
    console, out, _ = scripted("1")
    # The answer is the label as the agent sent it; only the display is escaped.
    assert answer_interrupt(info(questions), console) == {"answers": {"Keep the files?\n  1. No - delete everything": "Yes\u202e"}}
    shown = out.getvalue()
    assert "[Files\\x1b[2J] Keep the files?\\n  1. No - delete everything\n" in shown
    assert "  1. Yes\\u202e - keep\\rthem\n" in shown
    assert "| a\\x1b[31m\n" in shown and "| b\\u2028c\n" in shown
    assert not any(c in shown for c in "\r\x1b\u202e\u2028")

    custom = {"type": "color\x1b]8;;http://evil\x07", "title": "T\u2066\nx", "prompt": "pick\u202e\x85\nnext"}
    console, out, err = scripted('"x"')
    assert answer_interrupt(info(custom), console) == "x"
    shown = out.getvalue()
    assert "[color\\x1b]8;;http://evil\\x07] T\\u2066\\nx\npick\\u202e\\x85\nnext\n{" in shown
    assert json.loads("{" + shown.split("\n{", 1)[1].split("Your answer")[0]) == custom
    assert not any(c in shown + err.getvalue() for c in "\x1b\x07\u202e\u2066\x85")


def test_user_input_single_multi_and_other() -> None:
    console, out, _ = scripted("9", "1", "1,3")
    value = answer_interrupt(info(QUESTIONS), console)
    assert value == {
        "answers": {
            "How would you like to organize the files?": "By date",
            "Which folders should be included?": "Downloads, Documents",
        }
    }
    assert "'9' is not a choice" in out.getvalue()
    assert out.getvalue().count("Choice: ") == 3

    console, out, _ = scripted("4", "", "By colour", "2,4", "Music")
    value = answer_interrupt(info(QUESTIONS), console)
    assert value["answers"] == {
        "How would you like to organize the files?": "By colour",
        "Which folders should be included?": "Desktop, Music",
    }
    assert out.getvalue().count("Your answer: ") == 3


def test_custom_interrupt_shows_its_prompt_and_takes_json_text_or_skips() -> None:
    # Text that is meant as JSON (it starts like JSON) is asked again, not sent as text.
    console, out, err = scripted('{"hex": "#4ECDC4"', '{"hex": "#4ECDC4"}')
    assert answer_interrupt(info(CUSTOM), console) == {"hex": "#4ECDC4"}
    assert err.getvalue() == "", "a custom interrupt is not a warning"
    assert out.getvalue().startswith("\n[color_picker] Pick a brand color\n{\n")
    assert '"presets": [' in out.getvalue()
    assert "Not valid JSON (Expecting ',' delimiter); fix it, or answer with plain text." in out.getvalue()

    # Plain text is sent as a string, and the chat says so; JSON scalars stay JSON.
    console, out, _ = scripted("blue please")
    assert answer_interrupt(info(CUSTOM), console) == "blue please"
    assert '(Not JSON, so it is sent as the string "blue please".)' in out.getvalue()
    console, _, _ = scripted("42")
    assert answer_interrupt(info(CUSTOM), console) == 42

    console, out, _ = scripted("ok")
    assert answer_interrupt(info({"type": "confirm_export"}), console) == "ok"
    assert out.getvalue().startswith("\n[confirm_export] The agent is waiting for an answer.\n")

    console, _, err = scripted("")
    assert answer_interrupt(info(CUSTOM), console) is SKIP
    assert "[info] interrupt left unanswered" in err.getvalue()


def test_malformed_user_input_falls_back_to_json() -> None:
    console, _, err = scripted('"fine"')
    payload = {"type": "user_input", "questions": "not a list"}
    assert answer_interrupt(info(payload), console) == "fine"
    assert "malformed user_input" in err.getvalue()


def test_end_of_input_is_eof_error() -> None:
    console, _, _ = scripted()
    with pytest.raises(EOFError):
        answer_interrupt(info(APPROVAL), console)


def test_error_summary_keeps_the_last_traceback_line() -> None:
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: boom\n'
    assert error_summary(traceback) == "ValueError: boom"
    assert error_summary("Agent timed out") == "Agent timed out"
    assert error_summary(None) == "the turn failed"


def test_describe_error() -> None:
    assert describe_error(NotFound("Session not found", 404)) == "404 Not Found: Session not found"
    assert describe_error(NotFound("gone\r\x1b[2Kfine", 404)) == "404 Not Found: gone\\r\\x1b[2Kfine"
    assert describe_error(ClientError("no\u202eway")) == "no\\u202eway"
    assert describe_error(Unauthorized("Invalid API key", 401)).endswith("(set --api-key or MOTUS_API_KEY)")
    assert describe_error(ClientError("boom")) == "boom"


def test_an_approval_with_approvers_says_who_may_approve_before_asking() -> None:
    console, out, _ = scripted("y")
    payload = {**APPROVAL, "approvers": ["finance", "ops"], "self_approval": False}
    assert answer_interrupt(info(payload), console) == {"approved": True}
    assert "Who may approve: a key with the role finance or ops, not the key that sent the message" in out.getvalue()
    console, out, _ = scripted("y")
    answer_interrupt(info(APPROVAL), console)
    assert "Who may approve" not in out.getvalue()  # no policy, no line
    console, out, _ = scripted("y")
    answer_interrupt(info({**APPROVAL, "approvers": ["finance"], "quorum": 2}), console)
    assert "Who may approve: 2 different keys with the role finance" in out.getvalue()
    assert "e = edit" not in out.getvalue()  # every approver approves the same call
