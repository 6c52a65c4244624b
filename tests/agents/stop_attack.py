"""Agents for ``tests/integration/serve/lifecycle/test_stop_attacks.py``.

- ``gated_import``: the module's import, in the zygote only (a fresh interpreter started with
  ``python -c``), writes its pid to ``$MOTUS_TEST_GATE_DIR/zygote.pid`` and then blocks until
  ``$MOTUS_TEST_GATE_DIR/open`` exists, so a test can stop the server while the zygote is
  still importing the agent.
- ``echo``: a plain echo agent; ``hang``: a turn that runs until cancelled.
- The module registers an ``atexit`` handler that appends the pid running it to
  ``$MOTUS_TEST_EXIT_RECORD``.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
import time

from motus.models import ChatMessage

_gate = os.environ.get("MOTUS_TEST_GATE_DIR")
if _gate and sys.argv and sys.argv[0] == "-c":  # the zygote, not the arbiter or its worker
    with open(os.path.join(_gate, "zygote.pid"), "w") as _record:
        _record.write(str(os.getpid()))
    while not os.path.exists(os.path.join(_gate, "open")):
        time.sleep(0.02)  # the agent's own slow import, not a test's synchronisation


async def echo(message: ChatMessage, state: list[ChatMessage]):
    response = ChatMessage.assistant_message(content=f"echo: {message.content}")
    return response, state + [message, response]


def _record_exit() -> None:
    path = os.environ.get("MOTUS_TEST_EXIT_RECORD")
    if path:
        with open(path, "a") as record:
            record.write(f"{os.getpid()}\n")


atexit.register(_record_exit)


async def hang(message: ChatMessage, state: list[ChatMessage]):
    """Runs until cancelled (a stop with a long --shutdown-timeout waits for it)."""
    await asyncio.Event().wait()
