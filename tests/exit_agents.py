"""An agent whose module registers an ``atexit`` handler at import, as some SDKs do.

The handler appends the pid of the process running it to ``$MOTUS_TEST_EXIT_RECORD``, so a
test can tell which of the server's processes ran it at exit.
"""

from __future__ import annotations

import atexit
import os

from motus.models import ChatMessage


def _record_exit() -> None:
    path = os.environ.get("MOTUS_TEST_EXIT_RECORD")
    if path:
        with open(path, "a") as record:
            record.write(f"{os.getpid()}\n")


atexit.register(_record_exit)


async def echo(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    reply = ChatMessage(role="assistant", content=f"echo: {message.content}")
    return reply, [*state, message, reply]
