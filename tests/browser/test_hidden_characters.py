"""Characters that hide or reorder text (bidi overrides, controls) are marked in the cards,
and the values sent back are still exactly the agent's."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.agents.hidden_characters import APPROVAL, ASK, CUSTOM, PATH, QUESTION

pytestmark = pytest.mark.browser

AGENT = "tests.agents.hidden_characters:agent"
RLO = "\u202e"


@pytest.fixture
def hidden_server(shared_server):
    """One server for the module: each test works in a session of its own."""
    return shared_server(AGENT)


def test_an_approval_card_marks_a_right_to_left_override_in_the_path(open_chat, hidden_server):
    chat = open_chat(hidden_server).open()
    chat.send("approve")
    card = chat.card("Approve this tool call?")
    expect(card).to_be_visible()

    args = card.locator("pre.args")
    # JSON escapes for every hidden character; a literal backslash-u typed by the agent
    # stays plain text ("\\u202e" in JSON), only real characters are marked.
    expect(args).to_have_text(
        '{\n  "path": "invoice\\u202egnp.exe",\n  "note": "line\\r\\u001b[2Kfake\\u0085",\n  "plain": "a \\\\u202e b"\n}'
    )
    marks = args.locator(".ctl")
    expect(marks).to_have_text(["\\u202e", "\\r", "\\u001b", "\\u0085"])
    expect(marks.first).to_have_attribute("title", "U+202E RIGHT-TO-LEFT OVERRIDE")
    expect(marks.first).to_be_visible()
    # The mark is styled apart from the text around it.
    assert marks.first.evaluate("e => getComputedStyle(e).backgroundColor") != args.evaluate("e => getComputedStyle(e).backgroundColor")
    expect(card.locator(".tool-name")).to_have_text("delete_file⟨U+202E⟩")
    expect(card.locator(".tool-name .ctl")).to_have_attribute("title", "U+202E RIGHT-TO-LEFT OVERRIDE")
    assert RLO not in card.text_content() and "\x1b" not in card.text_content()
    chat.shot("hidden-characters-marked")

    # The editor starts from the same valid JSON: approving it unchanged sends the
    # arguments exactly as the agent proposed them, override included.
    card.get_by_role("button", name="Edit arguments").click()
    editor = card.get_by_label("Arguments (JSON object)")
    value = editor.input_value()
    assert RLO not in value and "\\u202e" in value
    assert json.loads(value) == APPROVAL["tool_args"]
    card.get_by_role("button", name="Approve with these arguments").click()
    expect(chat.cards()).to_have_count(0)
    assert chat.resume_posts()[0]["value"] == {"approved": True, "tool_args": APPROVAL["tool_args"]}
    assert chat.resume_posts()[0]["value"]["tool_args"]["path"] == PATH


def test_custom_payloads_and_question_options_are_marked_and_answered_verbatim(open_chat, hidden_server):
    chat = open_chat(hidden_server).open()
    chat.send("custom")
    card = chat.card("The agent is waiting")
    expect(card.get_by_role("heading")).to_contain_text("pick⟨U+2067⟩")
    expect(card.locator(".card-prompt")).to_have_text("Open ⟨U+202E⟩fdp.exe?")
    expect(card.locator("pre.payload .ctl")).to_have_text(["\\u2067", "\\u202e", "\\u202e"])
    assert RLO not in card.text_content()
    assert json.loads(card.locator("pre.payload").text_content()) == CUSTOM
    card.get_by_label("Your answer (JSON)").fill('"ok"')
    card.get_by_role("button", name="Send answer").click()
    expect(chat.reply('got "ok"')).to_be_visible()

    chat.send("ask")
    card = chat.card("The agent has a question")
    keep = card.get_by_role("button", name="Keep⟨U+202E⟩")
    expect(keep.locator(".ctl")).to_have_text("⟨U+202E⟩")
    expect(card.locator(".option-desc").first).to_have_text("leave ⟨U+2066⟩it⟨U+2069⟩")
    assert RLO not in card.text_content()
    chat.shot("hidden-characters-question")
    keep.click()
    card.get_by_role("button", name="Send answer").click()
    expect(chat.cards()).to_have_count(0)
    label = ASK["questions"][0]["options"][0]["label"]
    assert [post["value"] for post in chat.resume_posts()] == ["ok", {"answers": {QUESTION: label}}]
    expect(chat.reply("got " + json.dumps({"answers": {QUESTION: label}}))).to_be_visible()
