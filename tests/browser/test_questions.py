"""``user_input`` cards: buttons, multiSelect checkboxes, "Other", previews, keyboard use."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

QUESTION = "How would you like to organize the files?"


def test_answer_a_question_by_button_then_with_other(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("help me organize my downloads")
    card = chat.card("The agent has a question")
    expect(card).to_be_visible()
    group = card.get_by_role("group", name=f"Strategy {QUESTION}")
    expect(group.locator(".chip")).to_have_text("Strategy")
    expect(group.get_by_role("button")).to_have_text(["By date", "By type", "By size"])
    by_type = group.get_by_role("button", name="By type")
    expect(by_type).to_have_accessible_description("Group files by extension downloads/ jpg/holiday_photo.jpg pdf/invoice_2024.pdf dmg/installer.dmg")
    assert chat.unlabelled_controls() == []

    # The option's markdown preview shows in a monospace box on hover only.
    preview = card.locator(".preview")
    expect(preview).to_be_hidden()
    by_type.hover()
    expect(preview).to_be_visible()
    expect(preview).to_have_text("downloads/\n  jpg/holiday_photo.jpg\n  pdf/invoice_2024.pdf\n  dmg/installer.dmg")
    assert "mono" in preview.evaluate("e => getComputedStyle(e).fontFamily").lower()
    chat.shot("question-preview")

    by_type.click()
    expect(by_type).to_have_attribute("aria-pressed", "true")
    expect(by_type).to_have_accessible_name("By type")
    chat.shot("question-chosen")
    card.get_by_role("button", name="Send answer").click()
    expect(chat.reply(f"you answered {QUESTION} -> By type.")).to_be_visible()

    # "Other": typing your own answer replaces the chosen option.
    chat.send("help me organize my downloads")
    card.get_by_role("button", name="By date").click()
    other = card.get_by_label("Other (type your own answer)")
    other.fill("By project")
    expect(card.get_by_role("button", name="By date")).to_have_attribute("aria-pressed", "false")
    chat.shot("other-typed")
    other.press("Enter")
    expect(chat.reply(f"you answered {QUESTION} -> By project.")).to_be_visible()

    assert [post["value"] for post in chat.resume_posts()] == [{"answers": {QUESTION: "By type"}}, {"answers": {QUESTION: "By project"}}]
    chat.shot("question-answered")


def test_multiselect_and_every_question_needs_an_answer(open_chat, ui_server):
    chat = open_chat(ui_server).open()
    chat.send("survey")
    card = chat.card("The agent has 2 questions")
    toppings = card.get_by_role("group", name="Toppings Which toppings do you want?")
    expect(toppings.get_by_role("checkbox")).to_have_count(3)
    toppings.get_by_role("checkbox", name="Cheese").check()
    olives = toppings.get_by_role("checkbox", name="Olives")
    olives.focus()
    expect(card.locator(".preview")).to_have_text("olives:\n  kind: kalamata\n  pitted: true")
    olives.check()
    toppings.get_by_label("Other (added to your choices)").fill("Basil")
    chat.shot("multiselect")

    card.get_by_role("button", name="Send answers").click()
    expect(card.get_by_role("alert")).to_have_text('Answer every question first: "Size" has no answer yet.')
    expect(card.get_by_role("button", name="Small")).to_be_focused()
    assert chat.resume_posts() == []
    chat.shot("unanswered-question")

    card.get_by_role("button", name="Large").click()
    card.get_by_role("button", name="Send answers").click()
    expected = {"Which toppings do you want?": "Cheese, Olives, Basil", "Which size?": "Large"}
    expect(chat.reply("answers=" + json.dumps(expected, sort_keys=True))).to_be_visible()
    assert [post["value"] for post in chat.resume_posts()] == [{"answers": expected}]


def test_keyboard_alone_is_enough(open_chat, example_server):
    chat = open_chat(example_server).open()
    page = chat.page
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to the message box")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Message to the agent")).to_be_focused()
    page.keyboard.type("help me organize my downloads")
    page.keyboard.press("Enter")

    # Focus moves to the card when it arrives; Tab walks its options.
    card = chat.card("The agent has a question")
    expect(card.get_by_role("heading")).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="By date")).to_be_focused()
    page.keyboard.press("Tab")
    by_type = card.get_by_role("button", name="By type")
    expect(by_type).to_be_focused()
    expect(card.locator(".preview")).to_be_visible()
    page.keyboard.press("Space")
    expect(by_type).to_have_attribute("aria-pressed", "true")
    chat.shot("keyboard-choice")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(card.get_by_label("Other (type your own answer)")).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Send answer")).to_be_focused()
    page.keyboard.press("Enter")
    expect(chat.reply(f"{QUESTION} -> By type.")).to_be_visible()
    # With the card gone, focus returns to the message box.
    expect(page.get_by_label("Message to the agent")).to_be_focused()
