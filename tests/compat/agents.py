"""Agents written as the reference product's guides write them.

``guide_agent`` is served with ``AgentServer(agent_fn=guide_agent)`` by
``tests.compat.serve_agent_fn``; it drives the real approval gate and the real
``ask_user_question`` tool, as a model would (``Tool.invoke``), so every pause goes through
the same code a ``ReActAgent`` turn does. The first word that matches picks the flow:

- ``delete``: ``delete_file`` (``@tool(requires_approval=True)``) asks for approval;
  the answer reads "Deleted /tmp/test.txt" or the rejection the model would see;
- ``ask``: ``ask_user_question`` asks one question; the answer reads "You chose: ...";
- ``two``: two gated calls at once (``asyncio.gather``): two pending interrupts;
- ``color``: the guide's custom ``color_picker`` interrupt;
- ``shape``: returns a bare string, which is not a (response, state) tuple;
- anything else: "No action taken."

The other names here are agents no worker may load, for the start-up refusals.
"""

from __future__ import annotations

import asyncio
import threading

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt
from motus.tools import tool
from motus.tools.builtins.ask_user import ask_user_question

QUESTION = {
    "question": "Which option?",
    "header": "Option",
    "multiSelect": False,
    "options": [{"label": "A", "description": "Option A"}, {"label": "B", "description": "Option B"}],
}


@tool(requires_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file at the given path (this one only says it did)."""
    return f"Deleted {path}"


async def guide_agent(message: ChatMessage, state: list[ChatMessage]):
    content = (message.content or "").lower()
    if "delete" in content:
        text = await delete_file.invoke({"path": "/tmp/test.txt"})
    elif "ask" in content:
        text = f"You chose: {await ask_user_question.invoke({'questions': [QUESTION]})}"
    elif "two" in content:
        first, second = await asyncio.gather(delete_file.invoke({"path": "a"}), delete_file.invoke({"path": "b"}))
        text = f"{first} | {second}"
    elif "color" in content:
        choice = await interrupt(
            {"type": "color_picker", "prompt": "Pick a brand color for the export", "presets": ["#FF6B6B", "#4ECDC4", "#FFE66D"]}
        )
        text = f"Using {choice.get('hex', '#000000')} for the export."
    elif "shape" in content:
        return "just a string"
    else:
        text = "No action taken."
    response = ChatMessage.assistant_message(content=text)
    return response, state + [message, response]


def _make_nested():
    def nested(message: ChatMessage, state: list[ChatMessage]):
        return ChatMessage.assistant_message(content="nested"), state

    return nested


#: A function defined inside another function: refused, as the reference refuses it.
nested_agent = _make_nested()

#: A lambda: refused.
lambda_agent = lambda message, state: (message, state)  # noqa: E731 - the point of the test


class LockedAgent:
    """A servable object that holds a lock, so it cannot be pickled (fine by import path)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]):
        response = ChatMessage.assistant_message(content="locked")
        return response, state + [message, response]


locked_agent = LockedAgent()


class FragileAgent:
    """Pickles in the server but cannot be restored in a worker (as an object whose state
    needs something only the server process has would fail)."""

    def __init__(self) -> None:
        self.secret = "only here"

    def __setstate__(self, state: dict) -> None:
        raise RuntimeError("this agent cannot be restored outside the server")

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]):
        raise AssertionError("never runs")


fragile_agent = FragileAgent()
