"""Agents for ``tests/integration/serve/test_pg_history_attacks.py``, served as
``tests.pg_history_attack_agents:NAME``.

``stamped`` returns ``[*state, message, reply]`` with the reply
``done: <message> pid=<its process id>``, so a history shows which run of a turn (the
first one, or a replay on another instance) wrote it. A message ``gate ID ...`` first
writes ``started-ID`` (holding the pid) in ``$MOTUS_EXAMPLE_DIR`` and waits for
``release-ID`` there (with a limit, so a failing test never leaves a worker waiting for
ever); ``edit ...`` also rewrites the last message of the state in place (`` +edited``).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from motus.models import ChatMessage

GATE_LIMIT_SECONDS = 30.0


async def stamped(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    if words[0] == "gate":
        root = Path(os.environ["MOTUS_EXAMPLE_DIR"])
        # Written whole, then renamed: a test that sees the file can read the pid at once.
        partial = root / f".started-{words[1]}.{os.getpid()}"
        partial.write_text(str(os.getpid()))
        os.replace(partial, root / f"started-{words[1]}")
        deadline = time.monotonic() + GATE_LIMIT_SECONDS
        while not (root / f"release-{words[1]}").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    if "edit" in words and state:
        state[-1].content = f"{state[-1].content} +edited"
    reply = ChatMessage.assistant_message(content=f"done: {message.content} pid={os.getpid()}")
    return reply, [*state, message, reply]
