"""Tool approval cards, against the example agent's offline fallback in a real browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until

pytestmark = pytest.mark.browser

REASON = "Reason if you reject (optional)"


def test_reject_edit_and_approve_a_tool_call(open_chat, example_server):
    sandbox = example_server.extra["sandbox"]
    chat = open_chat(example_server).open()

    # Reject, with a reason.
    chat.send("delete the old logs file")
    card = chat.card("Approve this tool call?")
    expect(card).to_be_visible()
    expect(card.get_by_role("heading")).to_contain_text("delete_file")
    expect(card.locator("pre.args")).to_have_text('{\n  "path": "old_logs.txt"\n}')
    expect(chat.status()).to_have_text("Waiting for your answer")
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    assert chat.unlabelled_controls() == []
    card.get_by_label(REASON).fill("keep them for the audit")
    chat.shot("approval-card")
    card.get_by_role("button", name="Reject").click()
    expect(chat.reply("User rejected delete_file: keep them for the audit")).to_be_visible()
    expect(chat.cards()).to_have_count(0)
    assert (sandbox / "old_logs.txt").exists()
    chat.shot("rejected")

    # Edit the arguments: JSON that is invalid, or not an object, never leaves the page.
    chat.send("delete the old logs file")
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
    assert len(chat.resume_posts()) == 1
    assert example_server.get(f"/sessions/{chat.session_id}").json()["status"] == "interrupted"
    editor.fill('{"path": "notes.txt"}')
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(chat.reply("Deleted notes.txt")).to_be_visible()
    assert (sandbox / "old_logs.txt").exists()
    assert not (sandbox / "notes.txt").exists()

    # Approve as proposed.
    chat.send("delete the old logs file")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(chat.reply("delete_file: Deleted old_logs.txt")).to_be_visible()
    expect(chat.cards()).to_have_count(0)
    expect(chat.status()).to_have_text("Ready")
    assert not (sandbox / "old_logs.txt").exists()

    assert [post["value"] for post in chat.resume_posts()] == [
        {"approved": False, "reason": "keep them for the audit"},
        {"approved": True, "tool_args": {"path": "notes.txt"}},
        {"approved": True},
    ]
    # Each tool call and its result are in the conversation, folded.
    tool_results = chat.page.locator(".msg.tool details")
    expect(tool_results).to_have_count(3)
    for index in range(3):
        expect(tool_results.nth(index)).not_to_have_attribute("open", "")
    chat.shot("approved")


def test_an_approval_whose_arguments_cannot_be_edited_has_no_edit_button(open_chat, shared_ui_server):
    """``"editable": false`` (an OpenAI Agents SDK tool): the card offers approve and reject,
    no "Edit arguments" that the agent would refuse."""
    chat = open_chat(shared_ui_server).open()
    chat.send("fixed")
    card = chat.card("Approve this tool call?")
    expect(card.get_by_role("heading")).to_contain_text("send_invoice")
    expect(card.get_by_role("button", name="Approve")).to_be_visible()
    expect(card.get_by_role("button", name="Reject")).to_be_visible()
    expect(card.get_by_role("button", name="Edit arguments")).to_have_count(0)
    chat.shot("approval-not-editable")
    card.get_by_role("button", name="Approve").click()
    expect(chat.reply('approval={"approved": true}')).to_be_visible()


def test_an_approval_with_approvers_says_who_may_approve_and_shows_a_refusal(open_chat, shared_ui_server):
    """A tool that names its approvers: the card says who may approve. This server has no
    keys, so nobody has the role: the card says so and offers no buttons. Where the page
    cannot learn who it is (``GET /whoami`` missing, as on an older server), it offers them,
    and the server's refusal is shown on the card, which stays, waiting."""
    chat = open_chat(shared_ui_server).open()
    chat.send("policy")
    card = chat.card("Approve this tool call?")
    expect(card.locator(".card-policy")).to_have_text(
        "Who may approve: a key with the role finance, not the key that sent the message"
    )
    expect(card.locator(".card-cannot")).to_have_text(
        "This server has no API keys, so it cannot tell who answers: nobody may answer this here."
    )
    expect(card.get_by_role("button", name="Approve")).to_be_hidden()
    expect(card.get_by_label(re.compile("Remember for this session"))).to_have_count(0)  # never remembered

    session_id = chat.session_id
    older = open_chat(shared_ui_server)
    older.page.route("**/whoami", lambda route: route.fulfill(status=404, content_type="application/json",
                                                               body='{"detail": "Not found: no route for GET /whoami"}'))
    older.open(session_id)
    card = older.card("Approve this tool call?")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_contain_text("needs a key with the role 'finance'")
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()
    assert shared_ui_server.get(f"/sessions/{session_id}").json()["status"] == "interrupted"
    older.shot("approval-with-approvers")


def test_two_pending_interrupts_one_answered_elsewhere(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete and move both")
    expect(chat.cards()).to_have_count(2)
    delete = chat.card("delete_file")
    move = chat.card("move_file")
    delete.get_by_label(REASON).fill("half-typed reason")
    chat.shot("two-cards")

    move.get_by_role("button", name="Approve", exact=True).click()
    expect(move).to_have_count(0)
    expect(chat.cards()).to_have_count(1)
    # The other card survived the refresh, with what was typed into it.
    expect(delete.get_by_label(REASON)).to_have_value("half-typed reason")
    expect(chat.status()).to_have_text("Waiting for your answer")
    chat.shot("one-card-left")

    # Another client answers the remaining interrupt; the page's own refreshes are held
    # back so that it learns of it from the server's 404 when its user clicks.
    held = []
    session_url = re.compile(r"/sessions/[0-9a-f-]{36}(\?.*)?$")
    chat.page.route(session_url, lambda route: held.append(route))
    (pending,) = example_server.get(f"/sessions/{chat.session_id}").json()["interrupts"]
    assert pending["payload"]["tool_name"] == "delete_file"
    answered = example_server.post(
        f"/sessions/{chat.session_id}/resume",
        json={"interrupt_id": pending["interrupt_id"], "value": {"approved": False, "reason": "from another client"}},
    )
    assert answered.status_code == 200
    delete.get_by_role("button", name="Approve", exact=True).click()
    notice = chat.page.locator("#notice")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("(404)")
    expect(notice).to_contain_text("another tab")
    assert held, "the page did not try to refresh"
    chat.page.unroute(session_url)  # lets the held requests through

    expect(chat.cards()).to_have_count(0)
    expect(chat.reply("move_file: Moved notes.txt to archive/notes.txt")).to_be_visible()
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


def _uncovered(page, locator) -> bool:
    """Whether the element's centre is inside the viewport and the element itself (or a
    child) is what a click there would reach: not scrolled away, not under the composer."""
    return page.evaluate(
        """(el) => {
            const r = el.getBoundingClientRect();
            const x = r.left + r.width / 2, y = r.top + r.height / 2;
            if (y < 0 || y > window.innerHeight || x < 0 || x > window.innerWidth) return false;
            const hit = document.elementFromPoint(x, y);
            return hit === el || el.contains(hit);
        }""",
        locator.element_handle(),
    )


def test_after_edit_arguments_the_approve_button_is_not_under_the_message_box(open_chat, shared_ui_server):
    """At 1280x900, opening the editor of a card at the bottom of the conversation leaves its
    "Approve with these arguments" button where it can be clicked (issue 28, item 8)."""
    chat = open_chat(shared_ui_server, 1280, 900).open()
    for n in range(6):
        chat.send(f"hello {n}")  # a conversation long enough that the card is at the bottom
        expect(chat.reply(f"echo: hello {n}")).to_be_visible()
    chat.send("editable")
    card = chat.card("Approve this tool call?")
    card.get_by_role("button", name="Edit arguments").click()
    approve = card.get_by_role("button", name="Approve with these arguments")
    expect(approve).to_be_visible()
    wait_until(lambda: _uncovered(chat.page, approve), timeout=5, what="the button in view and uncovered")
    chat.shot("edit-arguments-1280x900")


def test_the_audit_panel_shows_its_records_without_cutting_them(open_chat, shared_ui_server):
    """At 1280x900 the session's audit panel gives its records room (issue 28, item 8: it was a
    130 px box that cut them): with several decisions it is taller than that, and what it
    cannot show at once it scrolls, never clips."""
    chat = open_chat(shared_ui_server, 1280, 900).open()
    for n in range(4):
        chat.send("editable")
        card = chat.card("Approve this tool call?")
        if n % 2:
            card.get_by_label(REASON).fill(f"not now {n}")
        card.get_by_role("button", name="Reject" if n % 2 else "Approve", exact=True).click()
        expect(chat.cards()).to_have_count(0)
    chat.page.get_by_role("button", name="Audit").click()
    panel = chat.page.locator("#audit-view")
    expect(panel.locator("#audit-list > li")).to_have_count(4)
    box = panel.bounding_box()
    assert box is not None and box["height"] > 200, box
    clipped = chat.page.evaluate(
        """() => {
            const panel = document.getElementById("audit-view");
            const style = getComputedStyle(panel);
            return panel.scrollHeight > panel.clientHeight + 1 && style.overflowY !== "auto" && style.overflowY !== "scroll";
        }"""
    )
    assert not clipped, "the audit panel cuts its content"
    chat.shot("audit-panel-1280x900")
