"""Tool approval cards, against the example agent's offline fallback in a real browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until

pytestmark = pytest.mark.browser


def test_approve_runs_the_tool(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")

    card = chat.card("Approve this tool call?")
    expect(card).to_be_visible()
    expect(card.get_by_role("heading")).to_contain_text("delete_file")
    expect(card.locator("pre.args")).to_have_text('{\n  "path": "old_logs.txt"\n}')
    expect(chat.status()).to_have_text("Waiting for your answer")
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    assert chat.unlabelled_controls() == []
    chat.shot("approval-card")

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(chat.reply("delete_file: Deleted old_logs.txt")).to_be_visible()
    expect(chat.cards()).to_have_count(0)
    expect(chat.status()).to_have_text("Ready")
    assert chat.resume_posts()[0]["value"] == {"approved": True}
    assert not (example_server.extra["sandbox"] / "old_logs.txt").exists()
    # The tool call and its result are in the conversation, folded.
    tool_result = chat.page.locator(".msg.tool details")
    expect(tool_result).to_have_count(1)
    expect(tool_result).not_to_have_attribute("open", "")
    chat.shot("approved")


def test_reject_with_a_reason(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    card = chat.card("Approve this tool call?")
    card.get_by_label("Reason if you reject (optional)").fill("keep them for the audit")
    chat.shot("rejecting")
    card.get_by_role("button", name="Reject").click()

    expect(chat.reply("User rejected delete_file: keep them for the audit")).to_be_visible()
    assert chat.resume_posts() == [{"interrupt_id": chat.resume_posts()[0]["interrupt_id"], "value": {"approved": False, "reason": "keep them for the audit"}}]
    assert (example_server.extra["sandbox"] / "old_logs.txt").exists()
    chat.shot("rejected")


def test_edit_arguments_refuses_bad_json_in_the_page(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    card = chat.card("Approve this tool call?")
    card.get_by_role("button", name="Edit arguments").click()
    editor = card.get_by_label("Arguments (JSON object)")
    expect(editor).to_be_focused()
    expect(editor).to_have_value('{\n  "path": "old_logs.txt"\n}')

    editor.fill('{"path": "notes.txt"')
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(card.get_by_role("alert")).to_contain_text("not valid JSON")
    expect(editor).to_have_attribute("aria-invalid", "true")
    chat.shot("invalid-arguments")

    editor.fill('["notes.txt"]')
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(card.get_by_role("alert")).to_contain_text("must be a JSON object")
    assert chat.resume_posts() == []
    assert example_server.get(f"/sessions/{chat.session_id}").json()["status"] == "interrupted"

    editor.fill('{"path": "notes.txt"}')
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(chat.reply("Deleted notes.txt")).to_be_visible()
    assert [post["value"] for post in chat.resume_posts()] == [{"approved": True, "tool_args": {"path": "notes.txt"}}]
    assert (example_server.extra["sandbox"] / "old_logs.txt").exists()
    assert not (example_server.extra["sandbox"] / "notes.txt").exists()
    chat.shot("edited")


def test_two_pending_interrupts_are_answered_independently(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete and move both")
    expect(chat.cards()).to_have_count(2)
    delete = chat.card("delete_file")
    move = chat.card("move_file")
    delete.get_by_label("Reason if you reject (optional)").fill("half-typed reason")
    chat.shot("two-cards")

    move.get_by_role("button", name="Approve", exact=True).click()
    expect(move).to_have_count(0)
    expect(chat.cards()).to_have_count(1)
    # The other card survived the refresh, with what was typed into it.
    expect(delete.get_by_label("Reason if you reject (optional)")).to_have_value("half-typed reason")
    expect(chat.status()).to_have_text("Waiting for your answer")
    assert example_server.get(f"/sessions/{chat.session_id}").json()["status"] == "interrupted"
    chat.shot("one-card-left")

    delete.get_by_role("button", name="Reject").click()
    expect(chat.reply("move_file: Moved notes.txt to archive/notes.txt")).to_be_visible()
    expect(chat.reply("User rejected delete_file: half-typed reason")).to_be_visible()
    expect(chat.cards()).to_have_count(0)
    chat.shot("both-answered")


def test_an_interrupt_answered_elsewhere_is_reported_and_refreshed(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    card = chat.card("Approve this tool call?")
    expect(card).to_be_visible()
    # Hold the page's own refreshes, so that it learns of the other answer from the 404.
    held = []
    session_url = re.compile(r"/sessions/[0-9a-f-]{36}(\?.*)?$")
    chat.page.route(session_url, lambda route: held.append(route))
    session = example_server.get(f"/sessions/{chat.session_id}").json()
    (interrupt,) = session["interrupts"]
    answered = example_server.post(f"/sessions/{chat.session_id}/resume", json={"interrupt_id": interrupt["interrupt_id"], "value": {"approved": False, "reason": "from another client"}})
    assert answered.status_code == 200

    card.get_by_role("button", name="Approve", exact=True).click()
    notice = chat.page.locator("#notice")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("(404)")
    expect(notice).to_contain_text("another tab")
    assert held, "the page did not try to refresh"
    chat.page.unroute(session_url)  # lets the held requests through
    expect(chat.cards()).to_have_count(0)
    expect(chat.reply("User rejected delete_file: from another client")).to_be_visible()
    chat.shot("answered-elsewhere")


def test_reload_and_a_second_tab_show_the_same_pending_interrupt(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    expect(chat.card("Approve this tool call?")).to_be_visible()
    url, session_id = chat.page.url, chat.session_id
    interrupt_id = chat.cards().get_attribute("data-interrupt-id")

    chat.page.reload()
    assert chat.page.url == url
    card = chat.card("Approve this tool call?")
    expect(card).to_have_attribute("data-interrupt-id", interrupt_id)
    # The message sent from this tab is still shown while its turn is pending.
    expect(chat.page.locator(".msg.user.pending .text")).to_have_text("delete the old logs file")
    chat.shot("after-reload")

    other = open_chat(example_server).open(session_id)
    expect(other.card("Approve this tool call?")).to_have_attribute("data-interrupt-id", interrupt_id)
    other.shot("second-tab")

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(chat.reply("Deleted old_logs.txt")).to_be_visible()
    # The second tab catches up as soon as its user looks at it again.
    other.come_back()
    expect(other.cards()).to_have_count(0)
    expect(other.reply("Deleted old_logs.txt")).to_be_visible()
    wait_until(lambda: example_server.get(f"/sessions/{session_id}").json()["status"] == "idle", what="the turn to end")
