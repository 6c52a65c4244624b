"""Agents the benchmark serves. Timestamps use time.time(): client and server share a clock."""

from __future__ import annotations

import time

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt


async def echo(message: ChatMessage, state: list[ChatMessage]):
    response = ChatMessage.assistant_message(content=message.content)
    return response, state + [message, response]


async def timed_interrupt(message: ChatMessage, state: list[ChatMessage]):
    """Interrupts once; records when interrupt() was called and when the resume arrived."""
    value = await interrupt({"type": "tool_approval", "tool_name": "bench", "tool_args": {}, "called_at": time.time()})
    resumed_at = time.time()
    response = ChatMessage.assistant_message(content=f"{resumed_at!r}", user_params={"value": value})
    return response, state + [message, response]


async def mixed(message: ChatMessage, state: list[ChatMessage]):
    if message.content == "wait":
        return await timed_interrupt(message, state)
    return await echo(message, state)


async def approve_once(message: ChatMessage, state: list[ChatMessage]):
    """Interrupts once with a fixed payload, so a replay after parking raises the very same
    interrupt and matches the journal (``timed_interrupt`` stamps its payload with the clock,
    which a replay would see as a divergence). Code after the ``interrupt()`` runs once, in
    the process that gets the value, so the reply can stamp when the value reached the agent."""
    value = await interrupt({"type": "tool_approval", "tool_name": "bench", "tool_args": {}})
    resumed_at = time.time()
    response = ChatMessage.assistant_message(content=f"{resumed_at!r}", user_params={"value": value})
    return response, state + [message, response]


async def waiters(message: ChatMessage, state: list[ChatMessage]):
    """For ``bench/waiters_bench.py``: ``wait`` interrupts with a tool approval and
    ``question`` with a question, each stamped with when ``interrupt()`` was called;
    anything else is echoed."""
    if message.content in ("wait", "question"):
        kind = "tool_approval" if message.content == "wait" else "user_input"
        value = await interrupt({"type": kind, "tool_name": "bench", "tool_args": {}, "called_at": time.time()})
        response = ChatMessage.assistant_message(content=repr(value))
        return response, state + [message, response]
    return await echo(message, state)
