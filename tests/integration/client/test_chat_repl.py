"""``motus serve chat`` in a real pseudo-terminal against a real server.

Each test types into the chat the way a person would and asserts both what the person
sees and what the agent received (``tests.agents.client:hitl`` replies ``got <value>``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from motus.cli import main
from motus.models import ChatMessage
from motus.serve.interrupt import interrupt

from tests.conftest import ROOT, Server, refused_url, server_env, server_factory, wait_until
from tests.integration.client.terminal import Terminal

AGENT = "tests.agents.client:hitl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("chat")) as start:
        yield start(AGENT, "--workers", "2")


#: A tool call crafted to lie on a terminal: the carriage return would overprint the real path
#: with a harmless one, the OSC sequence would retitle the window, the CSI one clear the screen,
#: and the right-to-left override would show "exe.txt" as "txt.exe".
SPOOFED_APPROVAL = {
    "type": "tool_approval",
    "tool_name": "delete_file\x1b[8m",
    "tool_args": {"path": "important.db\r  path: old_logs.txt", "note": "\x1b]0;owned\x07\x1b[2Jrun \u202etxt.exe"},
}


async def spoofing(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    """The agent of ``spoof_server`` (the server imports it from this module): asks for the
    approval above, then replies with text that tries to move the cursor and erase a line."""
    value = await interrupt(SPOOFED_APPROVAL)
    reply = ChatMessage.assistant_message(content="done\r\x1b[1A\x1b[2Kall fine " + json.dumps(value) + "\n\u202egnp.exe")
    return reply, [*state, message, reply]


@pytest.fixture(scope="module")
def spoof_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("spoof")) as start:
        yield start("tests.integration.client.test_chat_repl:spoofing")


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(*args: str, env: dict[str, str] | None = None) -> Terminal:
        term = Terminal("serve", "chat", *args, env=env)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def got(value: object) -> str:
    return "got " + json.dumps(value, sort_keys=True)


def session_ids(server: Server) -> set[str]:
    response = server.get("/sessions")
    assert response.status_code == 200
    return {row["session_id"] for row in response.json()}


def exists(server: Server, session_id: str) -> bool:
    status = server.get(f"/sessions/{session_id}").status_code
    assert status in (200, 404)
    return status == 200


def banner(chat: Terminal) -> str:
    """Wait for the REPL's banner; return the id of the session it chats in."""
    return chat.expect(r"\(session ([0-9a-f-]+)\)\. Type /quit or press Ctrl-D to leave; the session is kept\.").group(1)


def pending_ids(server: Server, session_id: str) -> list[str]:
    """The ids of the session's pending interrupts; the session must be ``interrupted``."""
    session = server.get(f"/sessions/{session_id}").json()
    assert session["status"] == "interrupted", session
    return [item["interrupt_id"] for item in session["interrupts"]]


def kept(chat: Terminal, server: Server, session_id: str) -> None:
    """The chat said the session is kept and how to rejoin it, and it is there."""
    chat.expect_literal(f"Session kept: {session_id}.")
    chat.expect_literal(f"Rejoin it with: motus serve chat {server.url} --session {session_id}")
    assert exists(server, session_id)


def quit_keeping(chat: Terminal, server: Server, session_id: str) -> None:
    """At the prompt, ``/quit``: the chat says the session is kept (``kept``) and exits 0."""
    chat.expect_literal("> ")
    chat.send("/quit")
    kept(chat, server, session_id)
    assert chat.wait_exit() == 0


def approve_the_pair(chat: Terminal) -> None:
    """At the first of two approvals raised together (its prompt next): approve both; the
    second is numbered "2 of 2", and the agent got both answers."""
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal("Approval 2 of 2\n\nThe agent wants to run: ")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal(got([{"approved": True}, {"approved": True}]))


#: Readline keys, as a terminal sends them: erase the character before the cursor.
BACKSPACE = "\x7f"


def test_approve_reject_with_reason_and_edit_arguments(server, terminal) -> None:
    chat = terminal(server.url)
    session_id = banner(chat)
    assert exists(server, session_id)

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

    # Editing starts from the current arguments on the line (readline), so changing one
    # value is a few keys; the merged arguments are shown, then sent.
    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("e")
    chat.expect_literal("keys you give replace the agent's, the others keep its values.")
    chat.expect_literal('Arguments (Enter keeps them): {"path": "/tmp/old_logs.txt", "force": true}')
    chat.send(BACKSPACE * len("true}") + "false}")
    chat.expect_literal("With your edits it runs with:\n  path: /tmp/old_logs.txt\n  force: false\n")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("e")
    # Keys typed replace the agent's; the others keep their values (as the server merges).
    chat.expect_literal("Arguments (Enter keeps them): ")
    chat.send("\x15" + '{"path": "/tmp/new.txt"}')  # Ctrl-U empties the line first
    chat.expect_literal("With your edits it runs with:\n  path: /tmp/new.txt\n  force: false\n")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal(got({"approved": True, "tool_args": {"path": "/tmp/new.txt", "force": False}}))

    # History: the up arrow brings back an earlier line at the prompt.
    chat.expect_literal("> ")
    chat.send("echo this")
    chat.expect_literal(got({"content": "echo this", "user_params": None}))
    chat.expect_literal("> ")
    chat.send("\x10")  # Ctrl-P (the up arrow): the previous line, sent again
    chat.expect_literal(got({"content": "echo this", "user_params": None}))

    quit_keeping(chat, server, session_id)
    assert b"| working" in chat.raw, "the spinner never showed on the terminal"
    assert "Traceback" not in chat.text()
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_an_answer_given_after_someone_else_answered_is_told_it_did_not_count(server, terminal) -> None:
    """alice is at ``Approve? [y/N]`` while bob rejects over HTTP; alice's late ``y`` is
    refused (404): the chat says her answer did not count, and that it was already resumed
    and when, then shows the turn as bob's answer ended it."""
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("Approve? [y/N] ")
    [interrupt_id] = pending_ids(server, session_id)
    rejected = server.post(f"/sessions/{session_id}/resume", json={"interrupt_id": interrupt_id, "value": {"approved": False, "reason": "bob: no"}})
    assert rejected.status_code == 200, rejected.text
    chat.send("y")
    late = chat.expect(r"\[info\] your answer did not count: [^\n]*it was already resumed at (\S+)\)?\s*\n")
    assert late.group(1).startswith("20"), late.group(0)
    chat.expect_literal(got({"approved": False, "reason": "bob: no"}))
    quit_keeping(chat, server, session_id)
    assert "Traceback" not in chat.text()


def test_an_approval_whose_arguments_cannot_be_edited_offers_no_edit(server, terminal) -> None:
    """``"editable": false`` (an OpenAI Agents SDK tool): the prompt offers no ``e``, an ``e``
    typed anyway is explained and asks again, and ``y`` approves the arguments as they are."""
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send("approve fixed")
    chat.expect_literal("(y = approve, n or Enter = reject; this tool's arguments cannot be edited)")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("e")
    chat.expect_literal("This tool's arguments cannot be edited: approve or reject them as they are.")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal(got({"approved": True}))
    quit_keeping(chat, server, session_id)
    assert "e = edit" not in chat.text()


def test_a_session_deleted_from_elsewhere_is_not_offered_for_rejoining(server, terminal) -> None:
    """bob deletes alice's session while her chat waits at the prompt; her next message gets
    the 404, and the chat says the session no longer exists instead of "Session kept ...
    Rejoin it with"."""
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    assert server.delete(f"/sessions/{session_id}").status_code == 204
    chat.send("hello")
    chat.expect(r"Error: 404 Not Found: [^\n]*\n")
    chat.expect_literal(f"[info] session {session_id} no longer exists (deleted from elsewhere, or expired)")
    assert chat.wait_exit() == 1
    assert "Session kept" not in chat.text() and "Rejoin it" not in chat.text()
    assert "Traceback" not in chat.text()


def test_control_and_bidi_characters_from_the_agent_are_shown_escaped(spoof_server, terminal) -> None:
    chat = terminal(spoof_server.url, "go")
    chat.expect_literal("The agent wants to run: delete_file\\x1b[8m\n")
    chat.expect_literal("  path: important.db\\r  path: old_logs.txt\n")
    chat.expect_literal("  note: \\x1b]0;owned\\x07\\x1b[2Jrun \\u202etxt.exe\n")
    chat.expect_literal("Approve? [y/N] ")
    # The arguments offered for editing are escaped JSON too, and Enter keeps them as they are.
    chat.send("e")
    chat.expect_literal(
        'Arguments (Enter keeps them): {"path": "important.db\\r  path: old_logs.txt", '
        '"note": "\\u001b]0;owned\\u0007\\u001b[2Jrun \\u202etxt.exe"}'
    )
    chat.send("")
    chat.expect_literal("Unchanged: it runs with the agent's arguments:\n  path: important.db\\r  path: old_logs.txt\n")
    chat.expect_literal("Approve? [y/N] ")
    chat.send("y")
    chat.expect_literal('done\\r\\x1b[1A\\x1b[2Kall fine {"approved": true}\n\\u202egnp.exe')
    assert chat.wait_exit() == 0
    # The raw bytes on the terminal: none of the agent's sequences, only the chat's own
    # (the spinner's frames and "\r\x1b[K", and the pty's "\r\n" line ends).
    raw = re.sub(rb"\r[|/\\-] working", b"", chat.raw).replace(b"\r\x1b[K", b"").replace(b"\r\n", b"\n")
    for sequence in (b"\x1b]0;owned", b"\x1b[2J", b"\x1b[8m", b"\x1b[1A", b"\x07", b"\r", "\u202e".encode()):
        assert sequence not in raw, sequence
    assert b"important.db\\r  path: old_logs.txt" in raw


def test_pick_option_several_options_and_other_answers(server, terminal) -> None:
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


def test_custom_interrupt_answered_with_plain_text_and_two_pending_interrupts(server, terminal) -> None:
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send("custom")
    # The payload's own prompt first, no warning: a custom interrupt is a normal thing.
    chat.expect_literal("[color_picker] Pick a brand color\n{")
    chat.expect_literal('"presets": [')
    chat.expect_literal("Your answer (JSON, or plain text to send as a string; Enter to leave it unanswered): ")
    chat.send('{"hex": "#4ECDC4"')  # starts like JSON: a typo, so asked again
    chat.expect_literal("Not valid JSON")
    chat.expect_literal("Your answer (JSON, or plain text")
    chat.send("teal, please")
    chat.expect_literal('(Not JSON, so it is sent as the string "teal, please".)')
    chat.expect_literal(got("teal, please"))

    chat.expect_literal("> ")
    chat.send("custom")
    chat.expect_literal("Your answer (JSON, or plain text")
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
    assert "unknown interrupt type" not in chat.text()

    # Skipping leaves the turn paused; the next message asks again before it is sent.
    chat.expect_literal("> ")
    chat.send("custom")
    chat.expect_literal("Your answer (JSON, or plain text")
    chat.send("")
    chat.expect_literal("[info] interrupt left unanswered")
    chat.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s); press Enter to answer now, or your next message asks again")
    chat.expect_literal("> ")
    chat.send("hello")
    chat.expect_literal("[info] the previous turn is still waiting; finishing it first")
    chat.expect_literal("Your answer (JSON, or plain text")
    chat.send("null")
    chat.expect_literal(got(None))
    chat.expect_literal(got({"content": "hello", "user_params": None}))

    quit_keeping(chat, server, session_id)
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_several_pending_approvals_are_numbered(server, terminal) -> None:
    """Two approvals pending before the chat looks: "Approval 1 of 2", then "2 of 2"."""
    session_id = server.create_session()
    server.send(session_id, "two")
    wait_until(lambda: len(server.get(f"/sessions/{session_id}").json().get("interrupts") or []) == 2, what="both interrupts")

    chat = terminal(server.url, "--session", session_id)
    chat.expect_literal("[info] finishing the turn in progress first")
    chat.expect_literal("Approval 1 of 2\n\nThe agent wants to run: ")
    approve_the_pair(chat)
    quit_keeping(chat, server, session_id)
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_approvals_raised_together_are_numbered_every_time(server, terminal) -> None:
    """A message whose turn raises two approvals at once (one ``asyncio.gather``): the chat's
    first prompt is "Approval 1 of 2" every time. The server used to show the turn
    interrupted with only the first of them, and the chat then asked it without a number."""
    chat = terminal(server.url)
    session_id = banner(chat)
    for _ in range(12):
        chat.expect_literal("> ")
        chat.send("two")
        first = chat.expect(r"\n(Approval 1 of 2\n\n)?The agent wants to run: ")
        assert first.group(1), "the first approval was asked without its number"
        approve_the_pair(chat)
    quit_keeping(chat, server, session_id)
    assert server.delete(f"/sessions/{session_id}").status_code == 204


#: Every question the chat can be at when Ctrl-C comes: the message, what is typed at
#: which prompt before it, the prompt itself, and the prompt that Enter brings back.
PROMPTS = {
    "approve": ("approve", [], "Approve? [y/N] ", "Approve? [y/N] "),
    "reason": ("approve", [("Approve? [y/N] ", "n")], "Reason (optional, Enter to skip): ", "Approve? [y/N] "),
    "edit": ("approve", [("Approve? [y/N] ", "e")], "Arguments (Enter keeps them): ", "Approve? [y/N] "),
    "choice": ("ask", [], "Choice: ", "Choice: "),
    "other": ("ask", [("Choice: ", "4")], "Your answer: ", "Choice: "),
    "custom": ("custom", [], "Your answer (JSON, or plain text", "Your answer (JSON, or plain text"),
}


@pytest.mark.parametrize("where", list(PROMPTS))
def test_ctrl_c_at_a_question_answers_nothing_and_keeps_the_session(server, terminal, where) -> None:
    message, keys, prompt, again = PROMPTS[where]
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send(message)
    for before, key in keys:
        chat.expect_literal(before)
        chat.send(key)
    chat.expect_literal(prompt)
    waiting = pending_ids(server, session_id)
    chat.ctrl_c_at_prompt()
    chat.expect_literal("[info] not answered: the agent is still waiting for it.")
    chat.expect_literal("> ")
    assert pending_ids(server, session_id) == waiting, "Ctrl-C answered the interrupt"

    # Enter goes back to the question; this time Ctrl-C twice leaves, and still answers nothing.
    chat.send("")
    chat.expect_literal(again)
    chat.ctrl_c_at_prompt()
    chat.expect_literal("> ")
    chat.ctrl_c_at_prompt()
    kept(chat, server, session_id)
    assert chat.wait_exit() == 0
    assert "Traceback" not in chat.text()
    assert pending_ids(server, session_id) == waiting
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_ctrl_c_at_the_idle_prompt_cancels_and_a_second_one_leaves(server, terminal) -> None:
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send("hello")
    chat.expect_literal(got({"content": "hello", "user_params": None}))
    chat.expect_literal("> ")
    chat.ctrl_c_at_prompt()
    chat.expect_literal("[info] press Ctrl-C again or Ctrl-D to leave (the session is kept), or type a message")
    chat.expect_literal("> ")
    chat.send("still here")  # the chat goes on, and the count starts again
    chat.expect_literal(got({"content": "still here", "user_params": None}))
    chat.expect_literal("> ")
    chat.ctrl_c_at_prompt()
    chat.expect_literal("[info] press Ctrl-C again")
    chat.expect_literal("> ")
    chat.ctrl_c_at_prompt()
    kept(chat, server, session_id)
    assert chat.wait_exit() == 0
    assert server.get(f"/sessions/{session_id}/messages").json()[-1]["content"] == got({"content": "still here", "user_params": None})
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_ctrl_c_while_the_agent_works_stops_waiting_only(server, terminal, tmp_path) -> None:
    gate = tmp_path / "gate"
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send(f"gate {gate}")
    chat.read_raw_until(b" working")  # the turn is running: the spinner shows
    chat.ctrl_c()
    chat.expect_literal("[info] stopped waiting; the turn goes on in the session. Press Enter to wait for it again")
    chat.expect_literal("> ")
    assert server.get(f"/sessions/{session_id}").json()["status"] == "running"
    gate.touch()
    chat.send("")  # wait for it again: the turn ended meanwhile, or ends now
    chat.expect_literal(got("opened"))
    chat.expect_literal("> ")
    chat.send_eof()
    kept(chat, server, session_id)
    assert chat.wait_exit() == 0
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_the_reply_of_a_turn_waited_for_again_starts_on_a_clean_line(server, terminal, tmp_path) -> None:
    """Waiting again for an unfinished turn (Enter after a Ctrl-C, or joining it with
    --session) shows the spinner; its reply is printed once the spinner's line is erased,
    never glued after "| working"."""
    gate = tmp_path / "gate"
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send(f"gate {gate}")
    chat.read_raw_until(b" working")
    chat.ctrl_c()
    chat.expect_literal("> ")
    chat.send("")  # wait for it again: the spinner runs until the turn ends
    chat.read_raw_until(b" working", after=len(chat.raw))
    gate.touch()
    chat.expect_literal(got("opened"))
    reply = chat.raw.rindex(got("opened").encode())
    assert chat.raw[:reply].endswith((b"\x1b[K", b"\n")), chat.raw[reply - 40:reply + 20]
    chat.expect_literal("> ")
    chat.send_eof()
    kept(chat, server, session_id)
    assert chat.wait_exit() == 0
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_delete_is_explicit_and_asks_while_a_turn_waits(server, terminal) -> None:
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send("approve")
    chat.expect_literal("Approve? [y/N] ")
    chat.ctrl_c_at_prompt()
    chat.expect_literal("> ")
    chat.send("/delete")
    chat.expect_literal("A turn is waiting for an answer; deleting the session cancels it. Delete it? [y/N] ")
    chat.send("")
    chat.expect_literal("[info] the session is kept")
    assert pending_ids(server, session_id)
    chat.expect_literal("> ")
    chat.send("/delete")
    chat.expect_literal("Delete it? [y/N] ")
    chat.send("y")
    chat.expect_literal(f"Deleted session {session_id}.")
    assert chat.wait_exit() == 0
    assert "Session kept" not in chat.text()
    assert not exists(server, session_id)


def test_leaving_without_sending_deletes_the_empty_session(server, terminal) -> None:
    chat = terminal(server.url)
    session_id = banner(chat)
    chat.expect_literal("> ")
    chat.send_eof()
    chat.expect_literal(f"[info] nothing was sent, so the empty session {session_id} was deleted")
    assert chat.wait_exit() == 0
    assert not exists(server, session_id)


def test_one_shot_ctrl_c_keeps_the_session_and_answers_nothing(server, terminal, tmp_path) -> None:
    before = session_ids(server)
    chat = terminal(server.url, "approve")
    chat.expect_literal("Approve? [y/N] ")
    [session_id] = session_ids(server) - before
    waiting = pending_ids(server, session_id)
    chat.ctrl_c_at_prompt()
    chat.expect_literal("Interrupted.")
    kept(chat, server, session_id)
    assert chat.wait_exit() == 130
    assert "Traceback" not in chat.text()
    assert pending_ids(server, session_id) == waiting

    # While the agent works: the turn goes on, the session stays.
    gate = tmp_path / "gate"
    chat = terminal(server.url, f"gate {gate}")
    chat.read_raw_until(b" working")
    [running] = session_ids(server) - before - {session_id}
    chat.ctrl_c()
    chat.expect_literal("Interrupted.")
    kept(chat, server, running)
    assert chat.wait_exit() == 130
    assert server.get(f"/sessions/{running}").json()["status"] == "running"
    for sid in (session_id, running):
        assert server.delete(f"/sessions/{sid}").status_code == 204


def test_skipped_interrupt_is_answered_later_by_joining_with_session(server, terminal) -> None:
    first = terminal(server.url, "custom")
    first.expect_literal("Your answer (JSON, or plain text")
    first.send("")
    first.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s)")
    session_id = first.expect(r"Session kept: ([0-9a-f-]+)\. A turn is still in progress in it\.").group(1)
    first.expect_literal(f"Rejoin it with: motus serve chat {server.url} --session {session_id}")
    assert first.wait_exit() == 1

    joined = terminal(server.url, "--session", session_id)
    joined.expect_literal("[info] finishing the turn in progress first")
    joined.expect_literal("[color_picker] Pick a brand color")
    joined.expect_literal("Your answer (JSON, or plain text")
    joined.send('"#FFE66D"')
    joined.expect_literal(got("#FFE66D"))
    joined.expect_literal("> ")
    joined.send("hello")
    joined.expect_literal(got({"content": "hello", "user_params": None}))
    joined.expect_literal("> ")
    joined.send("/quit")
    kept(joined, server, session_id)
    assert joined.wait_exit() == 0
    assert server.delete(f"/sessions/{session_id}").status_code == 204


def test_a_second_approver_is_told_what_the_turn_is_about_and_has_history(start_server, terminal) -> None:
    """``bob`` joins a session ``alice`` started: before the approval he sees her message
    (named, with its time), then answers; ``/history`` lists the stored messages."""
    keyed = start_server(AGENT, "--api-key", "alice=SECRET1", "--api-key", "bob=SECRET2")
    alice = keyed.with_headers({"Authorization": "Bearer SECRET1"})
    session_id = alice.create_session()
    alice.send(session_id, "approve")
    alice.wait_for_status(session_id, "interrupted")

    bob = terminal(keyed.url, "--session", session_id, env={"MOTUS_API_KEY": "SECRET2"})
    bob.expect(r"\[turn in progress\] alice asked at 20\d\d-[0-9T:.-]+Z:\n  approve\n")
    bob.expect_literal("[info] finishing the turn in progress first")
    bob.expect_literal("Approve? [y/N] ")
    bob.send("y")
    bob.expect_literal(got({"approved": True}))
    bob.expect_literal("> ")
    bob.send("/history")
    bob.expect_literal("user: approve\n")
    bob.expect_literal("assistant: " + got({"approved": True}))
    bob.expect_literal("> ")
    bob.send("/quit")
    assert bob.wait_exit() == 0
    audit = alice.get(f"/sessions/{session_id}/audit").json()
    assert [(entry["kind"], entry["by"]) for entry in audit] == [("resolved", "bob")]


def approve_elsewhere_then_look_again(other: Server, chat: Terminal, reply: str) -> dict:
    """``other`` (a key's HTTP client) approves the one session's pending interrupt; Enter in
    ``chat``, paused on it, then shows ``reply``, and the chat quits. Returns the item approved."""
    [session] = other.get("/sessions").json()
    [item] = other.get(f"/sessions/{session['session_id']}").json()["interrupts"]
    answered = other.post(f"/sessions/{session['session_id']}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}})
    assert answered.status_code == 200, answered.text
    other.wait_for_status(session["session_id"], "idle")
    chat.send("")
    chat.expect_literal(reply)
    chat.expect_literal("> ")
    chat.send("/quit")
    assert chat.wait_exit() == 0
    return item


def test_an_answer_the_policy_refuses_is_not_asked_and_the_request_waits_for_someone_who_may(start_server, terminal, tmp_path) -> None:
    """``wire_money`` names ``approvers=["finance"]`` and forbids the sender: alice, who sent
    the message and has no role, is not asked; she is told why (the server's own reason) and
    that the turn is paused; bob (finance) approves over HTTP, and Enter in alice's chat
    shows the reply."""
    keyed = start_server("tests.agents.approval:calls", "--api-key", "alice=SECRET1", "--api-key", "bob=SECRET2:finance",
                         env={"MOTUS_EXAMPLE_DIR": str(tmp_path)})
    bob = keyed.with_headers({"Authorization": "Bearer SECRET2"})
    alice = terminal(keyed.url, env={"MOTUS_API_KEY": "SECRET1"})
    alice.expect_literal("> ")
    alice.send("wire_money 7")
    # Not asked at all: the chat knows its key (GET /whoami) and that the server would refuse it.
    alice.expect_literal("[info] your key cannot answer this: the approval of wire_money needs a key with the role "
                         "'finance'; API key 'alice' has none of them; it waits for someone who may answer it")
    alice.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s)")
    alice.expect_literal("> ")
    approve_elsewhere_then_look_again(bob, alice, "wired 7")


def test_a_two_person_approval_says_where_it_stands_and_waits_for_the_second(start_server, terminal, tmp_path) -> None:
    """``release_funds`` needs two keys with the role finance: bob's approval in the terminal
    counts and he is told "1 of 2 approvals: bob" and that the turn is paused; Enter does not
    ask him again; carol approves over HTTP, and Enter in bob's chat shows the reply."""
    keyed = start_server("tests.agents.approval:calls", "--api-key", "bob=SECRET2:finance", "--api-key", "carol=SECRET3:finance",
                         env={"MOTUS_EXAMPLE_DIR": str(tmp_path)})
    carol = keyed.with_headers({"Authorization": "Bearer SECRET3"})
    bob = terminal(keyed.url, env={"MOTUS_API_KEY": "SECRET2"})
    bob.expect_literal("> ")
    bob.send("release_funds 9")
    bob.expect_literal("Who may approve: 2 different keys with the role finance")
    bob.expect_literal("(y = approve, n or Enter = reject; this tool's arguments cannot be edited)")
    bob.expect_literal("Approve? [y/N] ")
    bob.send("y")
    bob.expect_literal("[info] your approval counted: 1 of 2 approvals: bob; the call waits for 1 more from another key")
    bob.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s)")
    bob.expect_literal("> ")
    bob.send("")  # looking again: bob is not asked to approve a second time, only whether to reject
    bob.expect_literal("You approved this already (1 of 2 approvals: bob); it waits for another key's approval.")
    bob.expect_literal("Reject it instead? [y/N] ")
    bob.send("")
    bob.expect_literal("[info] the turn is paused on 1 unanswered interrupt(s)")
    bob.expect_literal("> ")
    item = approve_elsewhere_then_look_again(carol, bob, "released 9")
    assert [a["by"] for a in item["approvals"]] == ["bob"], item


def test_one_shot_without_a_terminal(server) -> None:
    """The installed command with pipes instead of a terminal: plain output, no spinner."""
    before = session_ids(server)
    result = subprocess.run(
        [sys.executable, "-m", "motus", "serve", "chat", server.url, "hello",
         "--param", "n=3", "--param", "ratio=0.5", "--param", "debug=true", "--param", "name=Bob"],
        capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == got({"content": "hello", "user_params": {"debug": True, "n": 3, "name": "Bob", "ratio": 0.5}}) + "\n"
    assert result.stderr == "", "no spinner or notices when the turn simply completes"
    assert session_ids(server) == before, "one-shot chats delete their sessions"


def test_a_refused_key_is_said_once_and_no_rejoin_is_offered(start_server) -> None:
    """A wrong or missing key: one error line, saying "Unauthorized" once, and nothing about
    keeping or rejoining a session the key may not use."""
    keyed = start_server(AGENT, "--api-key", "alice=SECRET1")
    session_id = keyed.with_headers({"Authorization": "Bearer SECRET1"}).create_session()

    def run(*args: str, key: str | None) -> Result:
        env = {"MOTUS_API_KEY": key}
        return CliRunner(env=env).invoke(main, ["serve", "chat", keyed.url, *args], input="hello\n", catch_exceptions=False)

    for args, key, carried in [((), "WRONG", "a wrong"), (("--session", session_id), "WRONG", "a wrong"), (("--session", session_id), None, "no")]:
        result = run(*args, key=key)
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"Error: 401 Unauthorized: this server requires an API key and the request carried {carried} API key; "
            "send 'Authorization: Bearer <key>' (set --api-key or MOTUS_API_KEY)\n"
        ), result.stderr


def test_one_shot_answers_errors_and_exit_statuses(server) -> None:
    """In-process (CliRunner, so no terminal): every way a one-shot chat ends."""

    def run(*args: str, stdin: str = "") -> Result:
        return CliRunner(env={"MOTUS_API_KEY": None}).invoke(main, ["serve", "chat", *args], input=stdin, catch_exceptions=False)

    before = session_ids(server)
    result = run(server.url, "approve", stdin="y\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("Approve? [y/N] " + got({"approved": True}) + "\n")

    result = run(server.url, "fail")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", "Error: ValueError: boom\n")

    assert session_ids(server) == before, "one-shot chats delete their sessions once the turn ended"

    # Input that ends at a question leaves the approval unanswered, and the session kept.
    result = run(server.url, "approve", stdin="")
    assert result.exit_code == 1
    [kept_id] = session_ids(server) - before
    assert result.stderr == (
        "\nError: input ended while an answer was expected.\n"
        f"Session kept: {kept_id}. A turn is still in progress in it. Rejoin it with: "
        f"motus serve chat {server.url} --session {kept_id}\n"
    )
    assert server.get(f"/sessions/{kept_id}").json()["status"] == "interrupted"
    assert server.delete(f"/sessions/{kept_id}").status_code == 204

    result = run(server.url, "hi", "--session", "no-such-session")
    assert result.exit_code == 1 and result.stderr.startswith("Error: 404 Not Found: ")

    result = run(server.url, "hi", "--param", "oops")
    assert result.exit_code == 2 and "KEY=VALUE" in result.stderr

    with refused_url() as url:
        result = run(url, "hi")
    assert (result.exit_code, result.stderr) == (1, f"Error: Could not connect to {url}\n")


def test_example_requests_client(server) -> None:
    """``examples/chat_client.py`` runs the same loop with plain requests."""

    def run(message: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "examples" / "chat_client.py"), server.url, message],
            input=stdin, capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60,
        )

    before = session_ids(server)
    result = run("approve", "y\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("Approve? [y/N] " + got({"approved": True}) + "\n")
    result = run("ask", "3\n1 3\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(got({"answers": {
        "How would you like to organize the files?": "By size",
        "Which folders should be included?": "Downloads, Documents",
    }}) + "\n")
    result = run("two", "y\ny\n")
    assert result.stdout.endswith(got([{"approved": True}, {"approved": True}]) + "\n")
    result = run("custom", '{"hex": "#000"}\n')
    assert "Pick a brand color" in result.stdout
    assert result.stdout.endswith(got({"hex": "#000"}) + "\n")
    result = run("custom", "teal\n")
    assert result.stdout.endswith(got("teal") + "\n")
    result = run("fail", "")
    assert result.returncode == 1 and result.stderr.rstrip().endswith("ValueError: boom")
    assert session_ids(server) == before, "the example deletes its session"
