"""Agents that attack the interrupts of one ``asyncio.gather`` (written in one go by the
worker, committed and published as one by the server)."""

from __future__ import annotations

import asyncio

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt


async def many_large(message: ChatMessage, state: list[ChatMessage]):
    """``"<count> <size>"``: one gather of ``count`` approvals, each with ``size`` characters
    of tool arguments (a file to write, say): within --max-interrupts and the 16 KiB limit."""
    count, size = (int(word) for word in (message.content or "").split())
    values = await asyncio.gather(*(
        interrupt({"type": "tool_approval", "tool_name": "write_file", "tool_args": {"n": n, "text": "x" * size}})
        for n in range(count)
    ))
    response = ChatMessage.assistant_message(content=f"{len(values)} answered")
    return response, state + [message, response]


async def gather_raises(message: ChatMessage, state: list[ChatMessage]):
    """``"first"``/``"last"``: a gather whose other branch raises before it could interrupt
    (listed first or last); ``"kept"``: the same with ``return_exceptions=True``, so the turn
    goes on waiting on the one interrupt that was raised."""

    async def boom() -> None:
        raise ValueError("boom before its interrupt")

    asked = interrupt({"type": "tool_approval", "tool_name": "a", "tool_args": {}})
    if message.content == "first":
        await asyncio.gather(boom(), asked)
    elif message.content == "last":
        await asyncio.gather(asked, boom())
    else:
        values = await asyncio.gather(boom(), asked, return_exceptions=True)
        response = ChatMessage.assistant_message(content=f"{values[1]!r}")
        return response, state + [message, response]
    raise AssertionError("unreachable")
