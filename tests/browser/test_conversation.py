"""The conversation itself: custom interrupts, running and failed turns, text never HTML."""

from __future__ import annotations

import threading

import pytest
import requests
from playwright.sync_api import expect

from tests.agents.ui import SCRIPT_REPLY
from tests.browser.conftest import UI_AGENT
from tests.conftest import wait_until

pytestmark = pytest.mark.browser


def test_custom_interrupt_answered_with_json(open_chat, shared_ui_server):
    chat = open_chat(shared_ui_server).open()
    chat.send("color")
    card = chat.card("The agent is waiting: color_picker")
    expect(card).to_be_visible()
    expect(card.locator(".card-custom-title")).to_have_text("Brand color")
    expect(card.locator(".card-prompt")).to_have_text("Pick a brand color for the export")
    expect(card.locator("pre.payload")).to_contain_text('"prompt": "Pick a brand color for the export"')
    expect(card.locator("pre.payload")).to_contain_text('"#4ECDC4"')
    answer = card.get_by_label("Your answer (JSON)")
    # The answer hint comes from the payload: its presets, each one click away.
    expect(card.locator(".hint")).to_contain_text('presets: "#FF6B6B", "#4ECDC4", "#FFE66D"')
    card.get_by_role("button", name='Use "#FFE66D"').click()
    expect(answer).to_have_value('"#FFE66D"')
    answer.fill("")

    card.get_by_role("button", name="Send answer").click()
    expect(card.get_by_role("alert")).to_have_text("Enter a JSON value.")
    answer.fill("{hex: #4ECDC4}")
    card.get_by_role("button", name="Send answer").click()
    expect(card.get_by_role("alert")).to_contain_text("not valid JSON")
    assert chat.resume_posts() == []
    chat.shot("custom-invalid")

    answer.fill('{"hex": "#4ECDC4"}')
    chat.shot("custom-card")
    card.get_by_role("button", name="Send answer").click()
    expect(chat.reply("Using #4ECDC4 for the export.")).to_be_visible()
    assert [post["value"] for post in chat.resume_posts()] == [{"hex": "#4ECDC4"}]
    chat.shot("custom-answered")


def test_agent_text_is_shown_as_text_never_as_html(open_chat, shared_ui_server):
    chat = open_chat(shared_ui_server).open()
    chat.send("script <i>mine</i>")
    reply = chat.reply("<script>")
    expect(reply).to_have_text(SCRIPT_REPLY)
    expect(chat.page.locator(".msg.user .text")).to_have_text("script <i>mine</i>")
    messages = chat.page.locator("#messages")
    expect(messages.locator("script, img, b, i")).to_have_count(0)
    assert chat.page.evaluate("() => window.pwned") is None
    chat.shot("script-as-text")


def test_running_state_waits_on_the_event_stream(open_chat, shared_ui_server, tmp_path):
    gate = tmp_path / "gate"
    chat = open_chat(shared_ui_server).open()
    with chat.page.expect_request(lambda request: request.url.endswith("/events")):
        chat.send(f"gate {gate}")
    expect(chat.status()).to_have_text("The agent is working…")
    expect(chat.page.locator("#running")).to_be_visible()
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    expect(chat.page.locator(".msg.user.pending .text")).to_have_text(f"gate {gate}")
    # While the turn runs, the page listens to its one event stream and never long-polls.
    streams = [r.url for r in chat.requests if r.url.endswith(f"/sessions/{chat.session_id}/events")]
    assert len(streams) == 1, streams
    assert not [r.url for r in chat.requests if "wait=true" in r.url]

    gate.touch()
    expect(chat.reply("gate opened")).to_be_visible()
    expect(chat.page.locator("#running")).to_be_hidden()
    expect(chat.status()).to_have_text("Ready")
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    assert not [r.url for r in chat.requests if "wait=true" in r.url]


def without_event_streams(chat) -> None:
    """Make the page see a server without event streams (the reference product): its
    events routes answer 404 exactly as an unknown route of this server does."""
    body = '{"detail": "Not found: no route for GET /events"}'
    chat.page.route(
        lambda url: url.endswith("/events") or "/events?" in url,
        lambda route: route.fulfill(status=404, content_type="application/json", body=body),
    )


def test_running_state_and_one_long_poll_without_event_streams(open_chat, shared_ui_server, tmp_path):
    gate = tmp_path / "gate"
    chat = open_chat(shared_ui_server)
    without_event_streams(chat)
    chat.open()
    with chat.page.expect_request(lambda request: "wait=true" in request.url):
        chat.send(f"gate {gate}")
    expect(chat.status()).to_have_text("The agent is working…")
    expect(chat.page.locator("#running")).to_be_visible()
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    expect(chat.page.locator(".msg.user.pending .text")).to_have_text(f"gate {gate}")
    chat.shot("running")
    # While the turn runs, the page waits on its one long poll instead of asking again.
    long_polls = [r.url for r in chat.requests if "wait=true" in r.url]
    assert len(long_polls) == 1, long_polls
    assert chat.most_concurrent_session_reads == 1

    gate.touch()
    expect(chat.reply("gate opened")).to_be_visible()
    expect(chat.page.locator("#running")).to_be_hidden()
    expect(chat.status()).to_have_text("Ready")
    expect(chat.page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    # It tried the stream once, then kept to long polls.
    assert len([r for r in chat.requests if "/events" in r.url]) == 1


def test_a_failed_turn_shows_its_error(open_chat, shared_ui_server):
    chat = open_chat(shared_ui_server).open()
    chat.send("fail on purpose")
    error = chat.page.get_by_role("region", name="The turn failed")
    expect(error).to_be_visible()
    expect(error.locator("pre")).to_contain_text("Traceback (most recent call last)")
    expect(error.locator("pre")).to_contain_text("ValueError: the turn failed on purpose: on purpose")
    expect(chat.status()).to_have_text("The turn failed")
    expect(chat.page.locator(".msg.user.pending.failed .text")).to_have_text("fail on purpose")
    chat.shot("failed-turn")

    # A session in error accepts a new message.
    chat.send("hello again")
    expect(chat.reply("echo: hello again")).to_be_visible()
    expect(error).to_be_hidden()


def test_a_busy_server_is_waited_out_not_reported_as_lost_contact(open_chat, start_server, tmp_path):
    """With the one stream slot and the one long-poll slot taken (``--max-waiting 0``: every
    wait on a thread), the page's stream and long polls get 503 with ``Retry-After``: it
    waits as told and asks again, says the server is busy (never that contact was lost), and
    shows the reply once a slot is free."""
    server = start_server(UI_AGENT, "--max-waiting", "0", "--threads", "10", "--max-streams", "1")
    stream = requests.get(server.url + "/events", stream=True, timeout=30)  # the stream slot
    assert stream.status_code == 200
    blocker_gate = tmp_path / "blocker"
    blocker = server.create_session()
    server.send(blocker, f"gate {blocker_gate}")
    held: list[requests.Response] = []
    poll = threading.Thread(target=lambda: held.append(server.get(f"/sessions/{blocker}", params={"wait": "true", "timeout": 30}, timeout=40)))
    poll.start()
    try:
        probe = server.create_session()
        server.send(probe, f"gate {blocker_gate}")
        wait_until(lambda: server.get(f"/sessions/{probe}", params={"wait": "true", "timeout": 0.05}).status_code == 503,
                   what="the long-poll slot taken")
        chat = open_chat(server).open()
        chat.page.evaluate("""() => {
            window.noticeLog = [];
            const text = document.getElementById("notice-text");
            new MutationObserver(() => window.noticeLog.push(text.textContent)).observe(text, {childList: true, characterData: true, subtree: true});
        }""")
        gate = tmp_path / "gate"
        chat.send(f"gate {gate}")
        notice = chat.page.locator("#notice")
        expect(notice).to_contain_text("busy")
        gate.touch()
        blocker_gate.touch()  # the held long poll answers: its slot is free again
        expect(chat.reply("gate opened")).to_be_visible()
        expect(notice).to_be_hidden()
        seen = chat.page.evaluate("() => window.noticeLog")
        assert seen and not [text for text in seen if "Lost contact" in text], seen
    finally:
        blocker_gate.touch()
        poll.join(40)
        stream.close()
    assert held and held[0].status_code == 200
