"""``motus serve chat`` in a real pseudo-terminal against a real server.

Each test types into the chat the way a person would and asserts both what the person
sees and what the agent received (``tests.client_agents:hitl`` replies ``got <value>``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ROOT, Server, free_port, server_env
from tests.integration.client.terminal import Terminal

AGENT = "tests.client_agents:hitl"


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(*args: str) -> Terminal:
        term = Terminal("serve", "chat", *args)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def got(value: object) -> str:
    return "got " + json.dumps(value, sort_keys=True)


def session_ids(server: Server) -> list[str]:
    response = server.get("/sessions")
    assert response.status_code == 200
    return [row["session_id"] for row in response.json()]


def test_approve_reject_with_reason_and_edit_arguments(start_server, terminal) -> None:
    server = start_server(AGENT)
    chat = terminal(server.url)
    chat.expect_literal("Type /quit or press Ctrl-D to leave.")
    created = session_ids(server)
    assert len(created) == 1

    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("The agent wants to run: delete_file")
    chat.expect_literal("  path: /tmp/old_logs.txt\n  force: true")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal(got({"approved": True}))

    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("n")
    chat.expect_literal("Reason (optional, Enter to skip): ")
    chat.send("too risky")
    chat.expect_literal(got({"approved": False, "reason": "too risky"}))

    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("e")
    chat.expect_literal("New arguments as a JSON object (Enter to keep): ")
    chat.send('{"path": "/tmp/new.txt"}')
    chat.expect_literal("Edited arguments:\n  path: /tmp/new.txt")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal(got({"approved": True, "tool_args": {"path": "/tmp/new.txt"}}))

    chat.expect_literal("> ")
    chat.send("/quit")
    assert chat.wait_exit() == 0
    assert b"| working" in chat.raw, "the spinner never showed on the terminal"
    assert "Traceback" not in chat.text()
    assert session_ids(server) == [], "the chat did not delete the session it created"


def test_pick_option_several_options_and_other_answers(start_server, terminal) -> None:
    server = start_server(AGENT)
    chat = terminal(server.url)
    chat.expect_literal("> ")
    chat.send("ask")
    chat.expect_literal("[Strategy] How would you like to organize the files?")
    chat.expect_literal("  1. By date - Group files by year and month\n     ┌")
    chat.expect_literal("     │ 2024/\n     │   01/\n     │   02/\n     └")
    chat.expect_literal("  4. (Other: type your own answer)\nChoice: ")
    chat.send("2")
    chat.expect_literal("[Folders] Which folders should be included?")
    chat.expect_literal("  4. (Other: type your own answer)\nChoice: ")
    chat.send("1,4")
    chat.expect_literal("Your answer: ")
    chat.send("Music")
    chat.expect_literal(got({"answers": {
        "How would you like to organize the files?": "By type",
        "Which folders should be included?": "Downloads, Music",
    }}))

    chat.expect_literal("> ")
    chat.send("ask")
    chat.expect_literal("Choice: ")
    chat.send("7")
    chat.expect_literal("'7' is not a choice. Please enter a number from 1 to 4.")
    chat.expect_literal("Choice: ")
    chat.send("4")
    chat.expect_literal("Your answer: ")
    chat.send("By colour")
    chat.expect_literal("Choice: ")
    chat.send("3, 1")
    chat.expect_literal(got({"answers": {
        "How would you like to organize the files?": "By colour",
        "Which folders should be included?": "Documents, Downloads",
    }}))
    chat.expect_literal("> ")
    chat.send("/quit")
    assert chat.wait_exit() == 0


def test_unknown_type_answered_with_json_and_two_pending_interrupts(start_server, terminal) -> None:
    server = start_server(AGENT)
    chat = terminal(server.url)
    chat.expect_literal("> ")
    chat.send("custom")
    chat.expect_literal("[warn] unknown interrupt type: color_picker")
    chat.expect_literal('"prompt": "Pick a brand color"')
    chat.expect_literal("Answer with a JSON value (Enter to skip): ")
    chat.send("blue")
    chat.expect_literal("Not valid JSON")
    chat.expect_literal("Answer with a JSON value (Enter to skip): ")
    chat.send('{"hex": "#4ECDC4"}')
    chat.expect_literal(got({"hex": "#4ECDC4"}))

    chat.expect_literal("> ")
    chat.send("two")
    answers = {"tool_a": {"approved": True}, "tool_b": {"approved": False}}
    asked = []
    for _ in range(2):
        tool = chat.expect(r"The agent wants to run: (tool_a|tool_b)").group(1)
        asked.append(tool)
        chat.expect_literal("Approve? [y/N] ")
        if answers[tool]["approved"]:
            chat.send("y")
        else:
            chat.send("n")
            chat.expect_literal("Reason (optional, Enter to skip): ")
            chat.send("")
    chat.expect_literal(got([answers["tool_a"], answers["tool_b"]]))
    assert sorted(asked) == ["tool_a", "tool_b"], "each pending interrupt is asked exactly once"
    assert chat.text().count("Approve? [y/N]") == 2

    chat.expect_literal("> ")
    chat.send("/quit")
    assert chat.wait_exit() == 0


def test_ctrl_c_during_a_turn_deletes_the_session_and_exits_cleanly(start_server, terminal) -> None:
    server = start_server(AGENT)
    chat = terminal(server.url)
    chat.expect_literal("> ")
    [session_id] = session_ids(server)
    chat.send("hang")
    chat.read_raw_until(b" working")  # the turn is running: the spinner shows
    chat.ctrl_c()
    chat.expect_literal("Interrupted.")
    chat.expect_literal(f"Deleted session {session_id}.")
    assert chat.wait_exit() == 130
    assert "Traceback" not in chat.text()
    assert server.get(f"/sessions/{session_id}").status_code == 404


def test_ctrl_c_at_a_prompt_with_keep_leaves_the_session(start_server, terminal) -> None:
    server = start_server(AGENT)
    chat = terminal(server.url, "approve", "--keep")
    chat.expect_literal("Approve? [y/N] ")
    [session_id] = session_ids(server)
    chat.ctrl_c()
    chat.expect_literal("Interrupted.")
    chat.expect_literal(f"Session kept: {session_id}")
    assert chat.wait_exit() == 130
    assert "Traceback" not in chat.text()
    assert server.get(f"/sessions/{session_id}").json()["status"] == "interrupted"


def test_skipped_interrupt_is_answered_later_by_joining_with_session(start_server, terminal) -> None:
    server = start_server(AGENT)
    first = terminal(server.url, "custom", "--keep")
    first.expect_literal("Answer with a JSON value (Enter to skip): ")
    first.send("")
    first.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s)")
    session_id = first.expect(r"Session kept: ([0-9a-f-]+)").group(1)
    assert first.wait_exit() == 1

    joined = terminal(server.url, "--session", session_id)
    joined.expect_literal("[info] finishing the turn in progress first")
    joined.expect_literal("[warn] unknown interrupt type: color_picker")
    joined.expect_literal("Answer with a JSON value (Enter to skip): ")
    joined.send('"#FFE66D"')
    joined.expect_literal(got("#FFE66D"))
    joined.expect_literal("> ")
    joined.send("hello")
    joined.expect_literal(got({"content": "hello", "user_params": None}))
    joined.expect_literal("> ")
    joined.send("/quit")
    assert joined.wait_exit() == 0
    assert session_ids(server) == [session_id], "a joined session must never be deleted"


def test_one_shot_with_params_and_errors_without_a_terminal(start_server) -> None:
    server = start_server(AGENT)

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "motus", "serve", "chat", *args],
            input=stdin, capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60,
        )

    result = run(server.url, "hello", "--param", "n=3", "--param", "ratio=0.5", "--param", "debug=true", "--param", "name=Bob")
    assert result.returncode == 0, result.stderr
    assert result.stdout == got({"content": "hello", "user_params": {"debug": True, "n": 3, "name": "Bob", "ratio": 0.5}}) + "\n"
    assert "working" not in result.stderr, "no spinner when stderr is not a terminal"

    result = run(server.url, "approve", stdin="y\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(got({"approved": True}) + "\n")

    result = run(server.url, "fail")
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: ValueError: boom"

    result = run(server.url, "approve", stdin="")
    assert result.returncode == 1
    assert "input ended while an answer was expected" in result.stderr
    assert "Traceback" not in result.stderr
    assert session_ids(server) == [], "one-shot chats delete their sessions"

    result = run(server.url, "hi", "--session", "no-such-session")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: 404 Not Found: ")

    result = run(server.url, "hi", "--param", "oops")
    assert result.returncode == 2 and "KEY=VALUE" in result.stderr

    url = f"http://127.0.0.1:{free_port()}"
    result = run(url, "hi")
    assert (result.returncode, result.stderr) == (1, f"Error: Could not connect to {url}\n")
