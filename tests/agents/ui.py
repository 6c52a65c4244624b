"""Agents for the browser tests of the web chat: what the example agent cannot trigger.

``tests.agents.ui:agent`` picks a behaviour by the first word of the message:

- ``color``: the spec's custom ``color_picker`` interrupt (with a ``title``); replies "Using <hex> for the export."
- ``survey``: one ``user_input`` interrupt with two questions, a multiSelect one (one option
  carries ``markdown``) and a single-select one; replies ``answers=<the answers as JSON>``.
- ``script``: replies with text that would run script if it were inserted as HTML.
- ``editable``: a ``tool_approval`` with a few arguments; replies ``approval=<the answer as JSON>``.
- ``fixed``: a ``tool_approval`` whose arguments cannot be edited (``"editable": false``, as
  an OpenAI Agents SDK tool's); replies ``approval=<the answer as JSON>``.
- ``policy``: a ``tool_approval`` that only a key with the role ``finance`` other than the
  sender may answer (``approvers``, ``self_approval``).
- ``fail``: raises, so the turn ends in ``error`` with a traceback.
- ``gate <path>``: keeps the turn running until ``<path>`` exists (so a test can look at
  the running state without racing it), then replies "gate opened".
- anything else: echoes the message.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt

#: A reply that would run code (and set ``window.pwned``) if the page inserted it as HTML.
SCRIPT_REPLY = (
    "<script>window.pwned = 1</script>"
    '<img src="x" onerror="window.pwned = 2">'
    "<b>not bold</b> & done"
)

SURVEY = {
    "type": "user_input",
    "questions": [
        {
            "question": "Which toppings do you want?",
            "header": "Toppings",
            "multiSelect": True,
            "options": [
                {"label": "Cheese", "description": "Extra mozzarella"},
                {"label": "Mushrooms", "description": "Sliced button mushrooms"},
                {"label": "Olives", "description": "Black olives", "markdown": "olives:\n  kind: kalamata\n  pitted: true"},
            ],
        },
        {
            "question": "Which size?",
            "header": "Size",
            "multiSelect": False,
            "options": [
                {"label": "Small", "description": "25 cm"},
                {"label": "Large", "description": "35 cm"},
            ],
        },
    ],
}

GATE_TIMEOUT_SECONDS = 60.0


def _reply(message: ChatMessage, state: list[ChatMessage], text: str) -> tuple[ChatMessage, list[ChatMessage]]:
    response = ChatMessage.assistant_message(content=text)
    return response, [*state, message, response]


async def _gate(path: str) -> None:
    """Wait for ``path`` to exist (a test creates it), failing the turn after a minute."""
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody created {path}")
        await asyncio.sleep(0.02)


async def agent(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    word, _, rest = (message.content or "").strip().partition(" ")
    word = word.lower()
    if word == "color":
        choice = await interrupt(
            {
                "type": "color_picker",
                "title": "Brand color",
                "prompt": "Pick a brand color for the export",
                "presets": ["#FF6B6B", "#4ECDC4", "#FFE66D"],
            }
        )
        color = choice.get("hex", "#000000") if isinstance(choice, dict) else "#000000"
        return _reply(message, state, f"Using {color} for the export.")
    if word == "survey":
        value = await interrupt(SURVEY)
        return _reply(message, state, "answers=" + json.dumps(value.get("answers"), sort_keys=True))
    if word == "editable":
        value = await interrupt({"type": "tool_approval", "tool_name": "send_invoice", "tool_args": {"to": "ACME", "lines": [{"item": "widget", "qty": 3}, {"item": "gadget", "qty": 1}], "note": "net 30"}})
        return _reply(message, state, "approval=" + json.dumps(value, sort_keys=True))
    if word == "fixed":
        value = await interrupt({"type": "tool_approval", "tool_name": "send_invoice", "tool_args": {"to": "ACME"}, "editable": False})
        return _reply(message, state, "approval=" + json.dumps(value, sort_keys=True))
    if word == "policy":
        value = await interrupt({"type": "tool_approval", "tool_name": "wire_money", "tool_args": {"amount": 5},
                                 "approvers": ["finance"], "self_approval": False})
        return _reply(message, state, "approval=" + json.dumps(value, sort_keys=True))
    if word == "script":
        return _reply(message, state, SCRIPT_REPLY)
    if word == "fail":
        raise ValueError(f"the turn failed on purpose: {rest}")
    if word == "gate":
        await _gate(rest.strip())
        return _reply(message, state, "gate opened")
    return _reply(message, state, f"echo: {message.content}")
