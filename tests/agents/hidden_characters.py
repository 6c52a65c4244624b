"""The agent of the browser test of hidden characters (``test_hidden_characters.py``): its
interrupts carry bidi overrides and control characters in every field a card shows.
Served as ``tests.agents.hidden_characters:agent``; the first word of the message picks:

- ``approve``: a ``tool_approval`` whose path holds a right-to-left override;
- ``custom``: an interrupt of a type the page has no form for;
- ``ask``: a ``user_input`` question whose option label holds an override;

and the reply is ``got <the resume value as ASCII JSON>``.
"""

from __future__ import annotations

import json
from typing import Any

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt

#: Shown raw, U+202E reverses what follows it: this reads "invoiceexe.png", a harmless picture.
PATH = "invoice\u202egnp.exe"

APPROVAL: dict[str, Any] = {
    "type": "tool_approval",
    "tool_name": "delete_file\u202e",
    "tool_args": {"path": PATH, "note": "line\r\x1b[2Kfake\x85", "plain": "a \\u202e b"},
}

CUSTOM: dict[str, Any] = {"type": "pick\u2067", "prompt": "Open \u202efdp.exe?", "path": PATH}

QUESTION = "Keep the file?"
ASK: dict[str, Any] = {
    "type": "user_input",
    "questions": [
        {
            "question": QUESTION,
            "header": "File",
            "multiSelect": False,
            "options": [{"label": "Keep\u202e", "description": "leave \u2066it\u2069"}, {"label": "Delete", "description": "remove it"}],
        }
    ],
}


async def agent(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    word = (message.content or "").strip().split(" ")[0].lower()
    payload = {"approve": APPROVAL, "custom": CUSTOM, "ask": ASK}.get(word)
    value = await interrupt(payload) if payload else None
    reply = ChatMessage.assistant_message(content="got " + json.dumps(value, sort_keys=True))
    return reply, [*state, message, reply]
