"""``user_input`` cards: buttons, multiSelect checkboxes, "Other", previews, keyboard use."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

QUESTION = "How would you like to organize the files?"


def overlap(a: dict, b: dict) -> bool:
    """Whether two bounding boxes share any area."""
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


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

    # The option's markdown preview shows in a monospace box on hover only, and never over
    # the "Other" field.
    preview = card.locator(".preview")
    other = card.get_by_label("Other (type your own answer)")
    expect(preview).to_be_hidden()
    by_type.hover()
    expect(preview).to_be_visible()
    expect(preview).to_have_text("downloads/\n  jpg/holiday_photo.jpg\n  pdf/invoice_2024.pdf\n  dmg/installer.dmg")
    assert "mono" in preview.evaluate("e => getComputedStyle(e).fontFamily").lower()
    assert not overlap(preview.bounding_box(), other.bounding_box()), "the preview covers the Other field"
    chat.shot("question-preview")

    # Choosing closes it, though the pointer and the focus are still on the option.
    by_type.click()
    expect(by_type).to_have_attribute("aria-pressed", "true")
    expect(by_type).to_have_accessible_name("By type")
    expect(by_type).to_be_focused()
    expect(preview).to_be_hidden()
    # It says plainly that a choice is not sent until "Send answer".
    send = card.get_by_role("button", name="Send answer")
    expect(send).to_have_accessible_description("Choosing an option does not send it: press “Send answer”.")
    expect(card.get_by_text("Choosing an option does not send it")).to_be_visible()
    assert chat.resume_posts() == []
    chat.shot("question-chosen")
    # Once the pointer and the focus have left the option, hovering shows the preview again.
    other.click()
    by_type.hover()
    expect(preview).to_be_visible()
    assert not overlap(preview.bounding_box(), other.bounding_box())
    card.get_by_role("heading").hover()  # away from the option: the preview folds, Send stays put
    expect(preview).to_be_hidden()
    send.click()
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
    error = card.locator(".card-error")
    expect(error).to_have_text('Answer every question first: "Size" has no answer yet.')
    expect(card.get_by_role("button", name="Small")).to_be_focused()
    assert chat.resume_posts() == []
    chat.shot("unanswered-question")

    # The error follows the answers: it names what is still missing, and goes once nothing is.
    toppings.get_by_label("Other (added to your choices)").fill("")
    for box in toppings.get_by_role("checkbox").all():
        box.uncheck()
    expect(error).to_have_text('Answer every question first: "Toppings" has no answer yet.')
    toppings.get_by_role("checkbox", name="Cheese").check()
    expect(error).to_have_text('Answer every question first: "Size" has no answer yet.')
    card.get_by_role("button", name="Large").click()
    expect(error).to_be_empty()
    expect(error).to_be_hidden()
    expect(card.get_by_text("answer every question, then press “Send answers”")).to_be_visible()
    toppings.get_by_role("checkbox", name="Olives").check()
    toppings.get_by_label("Other (added to your choices)").fill("Basil")
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
    heading = card.get_by_role("heading")
    expect(heading).to_be_focused()
    # The focus shows around the whole card, not as a box around the heading's text (which
    # looks like a field to type into).
    assert heading.evaluate("e => getComputedStyle(e).outlineStyle") == "none"
    assert card.evaluate("e => getComputedStyle(e).boxShadow") != "none"
    chat.shot("keyboard-card-focus")
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


def test_the_record_of_a_question_answered_in_a_later_turn_stays_in_that_turn(open_chat, ui_server):
    """A question answered in turn 2 is recorded between turn 2's message and its reply,
    not inside turn 1 (before turn 1's reply), also once read back from the audit."""
    chat = open_chat(ui_server).open()
    chat.send("hello")
    expect(chat.reply("echo: hello")).to_be_visible()
    chat.send("survey")
    card = chat.card("The agent has 2 questions")
    card.get_by_role("group", name="Toppings Which toppings do you want?").get_by_role("checkbox", name="Cheese").check()
    card.get_by_role("button", name="Small").click()
    card.get_by_role("button", name="Send answers").click()
    answered = chat.reply("answers=")
    expect(answered).to_be_visible()

    for _ in ("live", "read back"):
        record = chat.page.locator(".msg.record")
        expect(record).to_have_count(1)
        asked = chat.page.locator(".msg.user .text", has_text="survey")
        first_reply = chat.reply("echo: hello")
        y = {name: box.bounding_box()["y"] for name, box in
             {"first reply": first_reply, "asked": asked, "record": record, "answered": answered}.items()}
        assert y["first reply"] < y["asked"] < y["record"] < y["answered"], y
        chat.page.reload()
        answered = chat.reply("answers=")
        expect(answered).to_be_visible()
