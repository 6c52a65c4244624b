"""Sessions in the page: create, list, switch, reload, delete; phone width; API keys."""

from __future__ import annotations

import secrets

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.conftest import PHONE, UI_AGENT

pytestmark = pytest.mark.browser


def test_create_list_switch_reload_and_delete_sessions(open_chat, ui_server):
    chat = open_chat(ui_server).open()
    page = chat.page
    expect(page.get_by_text("Type a message below to start a new chat")).to_be_visible()
    expect(page.get_by_role("button", name="Delete session")).to_be_hidden()
    chat.shot("empty")

    # Sending without a session creates one, and the URL names it.
    chat.send("first")
    expect(chat.reply("echo: first")).to_be_visible()
    first = chat.session_id

    page.get_by_role("button", name="New chat").click()
    expect(page).not_to_have_url(chat.page.url.split("#")[0] + f"#/sessions/{first}")
    expect(page.locator("#messages li")).to_have_count(0)
    expect(page.get_by_label("Message to the agent")).to_be_focused()
    chat.send("second")
    expect(chat.reply("echo: second")).to_be_visible()
    second = chat.session_id
    assert second != first

    sessions = page.get_by_role("navigation", name="Sessions").locator("#session-list").get_by_role("link")
    expect(sessions).to_have_count(2)
    expect(page.locator('.session-list a[aria-current="page"]')).to_have_attribute("data-sid", second)
    chat.shot("two-sessions")

    page.get_by_role("link", name=first[:8]).click()
    expect(page).to_have_url(f"{ui_server.url}/ui/#/sessions/{first}")
    expect(chat.reply("echo: first")).to_be_visible()
    expect(chat.reply("echo: second")).to_have_count(0)

    page.go_back()
    expect(chat.reply("echo: second")).to_be_visible()
    page.reload()
    expect(chat.reply("echo: second")).to_be_visible()
    assert chat.session_id == second

    # An idle session is deleted at once: there is nothing in progress to lose.
    page.get_by_role("button", name="Delete session").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(sessions).to_have_count(1)
    expect(page).to_have_url(f"{ui_server.url}/ui/")
    expect(page.get_by_text("Type a message below to start a new chat")).to_be_visible()
    assert ui_server.get(f"/sessions/{second}").status_code == 404
    assert [s["session_id"] for s in ui_server.get("/sessions").json()] == [first]
    chat.shot("deleted")


def test_deleting_a_session_that_waits_for_an_answer_asks_first(open_chat, ui_server):
    chat = open_chat(ui_server).open()
    page = chat.page
    chat.send("survey")
    expect(chat.card("The agent has 2 questions")).to_be_visible()
    sid = chat.session_id
    delete = page.get_by_role("button", name="Delete session")

    delete.click()
    dialog = page.get_by_role("dialog", name="Delete this session?")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("The agent is waiting for your answer in this session.")
    expect(dialog.get_by_role("button", name="Keep the session")).to_be_focused()
    chat.shot("delete-confirmation")
    dialog.get_by_role("button", name="Keep the session").click()
    expect(dialog).to_be_hidden()
    expect(delete).to_be_focused()
    assert ui_server.get(f"/sessions/{sid}").json()["status"] == "interrupted"
    expect(chat.card("The agent has 2 questions")).to_be_visible()

    # Escape keeps it too; "Delete anyway" deletes.
    delete.click()
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert ui_server.get(f"/sessions/{sid}").status_code == 200
    delete.click()
    dialog.get_by_role("button", name="Delete anyway").click()
    expect(page).to_have_url(f"{ui_server.url}/ui/")
    assert ui_server.get(f"/sessions/{sid}").status_code == 404
    deletes = [r for r in chat.requests if r.method == "DELETE" and r.url.endswith(sid)]
    assert len(deletes) == 1, 'only "Delete anyway" sent a DELETE'


def test_a_session_deleted_elsewhere_is_reported(open_chat, ui_server):
    chat = open_chat(ui_server).open()
    chat.send("hello")
    expect(chat.reply("echo: hello")).to_be_visible()
    assert ui_server.delete(f"/sessions/{chat.session_id}").status_code == 204
    # The page finds out on its next refresh, says so, and leaves the session.
    chat.come_back()
    expect(chat.page.get_by_role("alert").filter(has_text="no longer exists")).to_be_visible()
    expect(chat.page).to_have_url(f"{ui_server.url}/ui/")
    chat.shot("deleted-elsewhere")


def test_phone_width(open_chat, example_server):
    chat = open_chat(example_server, *PHONE).open()
    page = chat.page
    chat.send("delete and move both")
    expect(chat.cards()).to_have_count(2)
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone"
    expect(chat.cards().first.get_by_role("button", name="Approve", exact=True)).to_be_in_viewport()
    assert chat.unlabelled_controls() == []
    chat.shot("phone-two-cards")

    # The session list folds away behind a button on a narrow screen.
    toggle = page.get_by_role("button", name="Sessions")
    nav = page.get_by_role("navigation", name="Sessions")
    expect(nav).to_be_hidden()
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(nav.locator("#session-list").get_by_role("link")).to_have_count(1)
    expect(nav.get_by_role("link", name="Inbox")).to_be_visible()
    chat.shot("phone-sessions")


@pytest.fixture
def keyed_server(start_server):
    key = secrets.token_urlsafe(16)
    server = start_server(UI_AGENT, "--api-key", key)
    server.extra["key"] = key
    return server


def test_api_key_is_asked_once_and_kept_for_the_tab(open_chat, keyed_server):
    key = keyed_server.extra["key"]
    assert requests.get(keyed_server.url + "/sessions", timeout=5).status_code == 401
    chat = open_chat(keyed_server)
    page = chat.page
    page.goto(keyed_server.url + "/ui/")  # the page itself needs no key
    form = page.get_by_role("dialog", name="API key needed")
    expect(form).to_be_visible()
    field = form.get_by_label("API key")
    expect(field).to_be_focused()
    chat.shot("key-form")

    field.fill("wrong-key")
    field.press("Enter")
    expect(form.get_by_role("alert")).to_have_text("The server refused that key. Check it and enter it again.")
    field.fill(key)
    form.get_by_role("button", name="Use this key").click()
    expect(form).to_be_hidden()

    chat.send("with a key")
    expect(chat.reply("echo: with a key")).to_be_visible()
    api_calls = [r for r in chat.requests if "/sessions" in r.url]
    assert api_calls[-1].all_headers()["authorization"] == f"Bearer {key}"
    assert page.evaluate("() => sessionStorage.getItem('motus.apiKey')") == key

    # A reload in the same tab keeps the key: no second question.
    page.reload()
    expect(chat.reply("echo: with a key")).to_be_visible()
    expect(form).to_be_hidden()
    chat.shot("with-key")
    # The page and its files were fetched without a key, and are public.
    assert all("authorization" not in r.all_headers() for r in chat.requests if "/ui/" in r.url)
    assert requests.get(keyed_server.url + "/ui/app.js", timeout=5).status_code == 200


def test_a_session_opened_before_its_key_is_entered_is_read_by_one_loop(open_chat, start_server):
    """Opening a session's address on a keyed server asks for the key; once it is given the
    session is read by one request loop (the conftest's check: never two reads of a session
    at once), not by the loop of the first navigation too."""
    server = start_server("tests.agents.ui:agent", "--api-key", "alice=s3cret-alice")
    alice = server.with_headers({"Authorization": "Bearer s3cret-alice"})
    session_id = alice.post("/sessions", json={}).json()["session_id"]
    alice.post(f"/sessions/{session_id}/messages", json={"content": "hello"}).raise_for_status()
    chat = open_chat(server).open_with_key("s3cret-alice", f"/sessions/{session_id}")
    expect(chat.reply("echo: hello")).to_be_visible()
    chat.send("again")
    expect(chat.reply("echo: again")).to_be_visible()
