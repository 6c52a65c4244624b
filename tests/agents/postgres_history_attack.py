"""Agents for ``tests/integration/serve/instances/test_postgres_history_attacks.py``, served as
``tests.agents.postgres_history_attack:NAME``.

``stamped`` returns ``[*state, message, reply]`` with the reply
``done: <message> pid=<its process id>``, so a history shows which run of a turn (the
first one, or a replay on another instance) wrote it. A message ``gate ID ...`` first
writes ``started-ID`` (holding the pid) in ``$MOTUS_EXAMPLE_DIR`` and waits for
``release-ID`` there (with a limit, so a failing test never leaves a worker waiting for
ever); ``edit ...`` also rewrites the last message of the state in place (`` +edited``).
"""

from __future__ import annotations

import os

from motus.models import ChatMessage
from tests.agents.history_attack import wait_at_gate


async def stamped(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    if words[0] == "gate":
        await wait_at_gate(words[1])
    if "edit" in words and state:
        state[-1].content = f"{state[-1].content} +edited"
    reply = ChatMessage.assistant_message(content=f"done: {message.content} pid={os.getpid()}")
    return reply, [*state, message, reply]
