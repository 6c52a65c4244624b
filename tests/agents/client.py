"""Agents for the client and chat tests: every interrupt shape the chat must answer.

``hitl`` picks its behaviour from the message content and replies ``got <json>`` with the
resume value(s) it received (keys sorted), so a test can assert exactly what arrived:

- ``approve``: one ``tool_approval`` for ``delete_file``.
- ``ask``: one ``user_input`` with a single-choice question (options with ``markdown``
  previews) and a ``multiSelect`` question.
- ``custom``: an interrupt of a type no client knows (``color_picker``).
- ``two``: two ``tool_approval`` interrupts at once (``tool_a`` and ``tool_b``).
- ``malformed``: a ``user_input`` without questions.
- ``hang``: waits forever (until the session is deleted).
- ``gate <path>``: runs until the file ``path`` exists (the test decides when it ends).
- ``fail``: raises ``ValueError("boom")``.
- anything else: echoes the content and ``user_params`` without interrupting.

They call the raw ``interrupt`` primitive only, so they depend on nothing but the server.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt

APPROVAL = {
    "type": "tool_approval",
    "tool_name": "delete_file",
    "tool_args": {"path": "/tmp/old_logs.txt", "force": True},
}

QUESTIONS = {
    "type": "user_input",
    "questions": [
        {
            "question": "How would you like to organize the files?",
            "header": "Strategy",
            "multiSelect": False,
            "options": [
                {"label": "By date", "description": "Group files by year and month", "markdown": "2024/\n  01/\n  02/"},
                {"label": "By type", "description": "Group files by extension"},
                {"label": "By size", "description": "Move large files into a separate folder"},
            ],
        },
        {
            "question": "Which folders should be included?",
            "header": "Folders",
            "multiSelect": True,
            "options": [
                {"label": "Downloads", "description": "~/Downloads"},
                {"label": "Desktop", "description": "~/Desktop"},
                {"label": "Documents", "description": "~/Documents"},
            ],
        },
    ],
}

CUSTOM = {"type": "color_picker", "prompt": "Pick a brand color", "presets": ["#FF6B6B", "#4ECDC4"]}


def _reply(message: ChatMessage, state: list[ChatMessage], value: Any) -> tuple[ChatMessage, list[ChatMessage]]:
    response = ChatMessage.assistant_message(content="got " + json.dumps(value, sort_keys=True))
    return response, [*state, message, response]


async def hitl(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    text = message.content or ""
    value: Any
    if text == "approve":
        value = await interrupt(APPROVAL)
    elif text == "approve fixed":  # a tool whose arguments cannot be edited (an SDK's)
        value = await interrupt({**APPROVAL, "editable": False})
    elif text == "ask":
        value = await interrupt(QUESTIONS)
    elif text == "custom":
        value = await interrupt(CUSTOM)
    elif text == "two":
        first = {"type": "tool_approval", "tool_name": "tool_a", "tool_args": {"n": 1}}
        second = {"type": "tool_approval", "tool_name": "tool_b", "tool_args": {"n": 2}}
        value = list(await asyncio.gather(interrupt(first), interrupt(second)))
    elif text == "malformed":
        value = await interrupt({"type": "user_input", "questions": "not a list"})
    elif text == "hang":
        await asyncio.Event().wait()
        value = None
    elif text.startswith("gate "):
        path = text.removeprefix("gate ")
        while not os.path.exists(path):  # the test creates the file when it wants the turn to end
            await asyncio.sleep(0.01)
        value = "opened"
    elif text == "fail":
        raise ValueError("boom")
    else:
        value = {"content": text, "user_params": message.user_params}
    return _reply(message, state, value)
