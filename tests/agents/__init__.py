"""Agents the serving tests run (imported by the server subprocess as ``tests.agents:...``).

This package holds every test agent: the general ones here, and one module per behaviour
area beside them (``tests.agents.approval``, ``tests.agents.zygote``, ...; the framework
adapters' agents in ``tests.agents.frameworks``). See ``tests/README.md``."""

from __future__ import annotations

import asyncio
import os
import time

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt


async def echo(message: ChatMessage, state: list[ChatMessage]):
    response = ChatMessage.assistant_message(content=f"echo: {message.content}")
    return response, state + [message, response]


def sync_echo(message: ChatMessage, state: list[ChatMessage]):
    response = ChatMessage.assistant_message(content=f"sync echo: {message.content}")
    return response, state + [message, response]


class CountingAgent:
    """A ServableAgent object: counts the turns it has seen in the state."""

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]):
        turns = sum(1 for item in state if item.role == "user") + 1
        response = ChatMessage.assistant_message(content=f"turn {turns}: {message.content}")
        return response, state + [message, response]


counting = CountingAgent()


async def approval(message: ChatMessage, state: list[ChatMessage]):
    """Asks for approval, then reports the value it got back."""
    value = await interrupt({"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": message.content}})
    approved = isinstance(value, dict) and value.get("approved") is True
    response = ChatMessage.assistant_message(content=f"approved={approved} value={value!r}")
    return response, state + [message, response]


async def question(message: ChatMessage, state: list[ChatMessage]):
    value = await interrupt(
        {
            "type": "user_input",
            "questions": [
                {
                    "question": "How would you like to organize the files?",
                    "header": "Strategy",
                    "multiSelect": False,
                    "options": [
                        {"label": "By date", "description": "Group files by year and month"},
                        {"label": "By type", "description": "Group files by extension"},
                    ],
                }
            ],
        }
    )
    response = ChatMessage.assistant_message(content=f"answers={value['answers']!r}")
    return response, state + [message, response]


async def two_interrupts(message: ChatMessage, state: list[ChatMessage]):
    first, second = await asyncio.gather(
        interrupt({"type": "tool_approval", "tool_name": "a", "tool_args": {}}),
        interrupt({"type": "tool_approval", "tool_name": "b", "tool_args": {}}),
    )
    response = ChatMessage.assistant_message(content=f"first={first!r} second={second!r}")
    return response, state + [message, response]


async def sequential(message: ChatMessage, state: list[ChatMessage]):
    """Two interrupts one after the other in the same turn."""
    first = await interrupt({"type": "step", "n": 1})
    second = await interrupt({"type": "step", "n": 2})
    response = ChatMessage.assistant_message(content=f"{first}+{second}")
    return response, state + [message, response]


async def oversize(message: ChatMessage, state: list[ChatMessage]):
    await interrupt({"type": "big", "blob": "x" * (17 * 1024)})
    raise AssertionError("unreachable")


async def eof_reporter(message: ChatMessage, state: list[ChatMessage]):
    """Waits on an interrupt; when cancelled, writes what it saw to the file named by the message."""
    try:
        await interrupt({"type": "wait"})
    except EOFError as exc:
        with open(message.content, "w") as handle:
            handle.write(f"{type(exc).__name__}: {exc}")
        raise
    raise AssertionError("unreachable")


async def crash(message: ChatMessage, state: list[ChatMessage]):
    raise ValueError(f"agent blew up on {message.content!r}")


async def hard_exit(message: ChatMessage, state: list[ChatMessage]):
    os._exit(7)


async def wrong_type(message: ChatMessage, state: list[ChatMessage]):
    return "just a string"


async def hang(message: ChatMessage, state: list[ChatMessage]):
    await asyncio.Event().wait()


def busy_hang(message: ChatMessage, state: list[ChatMessage]):
    """A sync agent that never yields (ignores cancellation): only a kill ends it."""
    while True:
        time.sleep(0.05)


async def custom(message: ChatMessage, state: list[ChatMessage]):
    """The spec's color picker example."""
    user_choice = await interrupt(
        {"type": "color_picker", "prompt": "Pick a brand color for the export", "presets": ["#FF6B6B", "#4ECDC4", "#FFE66D"]}
    )
    color = user_choice.get("hex", "#000000")
    response = ChatMessage.assistant_message(content=f"Using {color} for the export.")
    return response, state + [message, response]


async def dispatch(message: ChatMessage, state: list[ChatMessage]):
    """One agent, many behaviours: the message content picks which of the above runs."""
    name, _, rest = (message.content or "").partition(" ")
    target = {
        "echo": echo,
        "approval": approval,
        "question": question,
        "two": two_interrupts,
        "crash": crash,
        "exit": hard_exit,
        "hang": hang,
        "custom": custom,
    }.get(name, echo)
    return await target(message.model_copy(update={"content": rest or message.content}), state)


async def three_at_once(message: ChatMessage, state: list[ChatMessage]):
    """Raises three interrupts at once (a server with --max-interrupts 2 refuses the third)."""
    values = await asyncio.gather(*(interrupt({"type": "step", "n": n}) for n in range(3)))
    response = ChatMessage.assistant_message(content=repr(values))
    return response, state + [message, response]


async def int_keys(message: ChatMessage, state: list[ChatMessage]):
    """A payload JSON can encode but not as-is (int keys, a tuple): the client sees it normalised."""
    value = await interrupt({"type": "odd", 1: "one", "pair": (1, 2)})
    response = ChatMessage.assistant_message(content=repr(value))
    return response, state + [message, response]


async def gil_hog(message: ChatMessage, state: list[ChatMessage]):
    """Waits on two interrupts while a C-level regex holds the GIL: the worker stops reading."""
    import re

    def hog() -> None:
        re.match(r"(a+)+$", "a" * 64 + "b")  # catastrophic backtracking, never releases the GIL

    gate = asyncio.gather(interrupt({"type": "a"}), interrupt({"type": "b"}))
    await asyncio.sleep(0)
    await asyncio.sleep(0.2)
    await asyncio.to_thread(hog)
    await gate


async def environment(message: ChatMessage, state: list[ChatMessage]):
    """Reports whether the agent can see an environment variable (keys must not leak in)."""
    response = ChatMessage.assistant_message(content=f"{message.content}={os.environ.get(message.content or '')!r}")
    return response, state + [message, response]
