"""An agent for ``tests/integration/serve/workers/test_pipe_read_attacks.py``: it writes raw bytes
(whole, partial, concatenated or malformed ``multiprocessing`` frames) on its worker's pipe,
to attack the pool manager's non-blocking reader (``motus.serve.pipes.Frames``). Served as
``tests.agents.pipe_read_attack:attacker``.

``attacker`` reads ``COMMAND ARGS...`` from the message; anything else is an echo turn that
replies ``done: <message>``. Where a command waits at a gate it writes ``started-GATE`` in
``$MOTUS_EXAMPLE_DIR`` and waits for ``release-GATE``, at most ``WAIT_SECONDS``. Commands:

- ``result-exit N``: writes a whole ``Result`` frame whose reply is ``N`` ``x`` characters
  (a ``-1`` + 8-byte header when over 2 GiB, else the 4-byte one), then ``os._exit(0)`` at
  once: the Result is the worker's last words;
- ``burst-result N``: ``N`` frames holding ``None`` and then a ``Result`` (reply ``burst``),
  all in one ``write``, then ``os._exit(0)``;
- ``burst N GATE``: ``N`` ``Interrupt`` frames (ids ``burst-0`` ...) in one ``write``, then
  waits;
- ``half-kill N GATE``: the first half of a ``Result`` frame of ``N`` bytes, waits, then
  ``SIGKILL``s itself;
- ``half-finish N GATE``: the first half of a ``Result`` frame (reply ``N`` ``y``), waits, then
  writes the rest and returns normally (its own Result follows, and is ignored);
- ``header SIZE GATE``: a 4-byte header claiming ``SIZE`` (may be negative; ``-1`` is followed
  by an 8-byte ``2**40``) and 100 bytes, then waits, then returns normally;
- ``grandchild-result``: forks a child that holds the pipe open (at most ``WAIT_SECONDS``),
  then returns normally (the worker sends its Result and exits);
- ``grandchild-flood SECONDS``: forks a child that writes ``None`` frames back to back for
  ``SECONDS`` (and creates ``flood-ended`` in ``$MOTUS_EXAMPLE_DIR`` only if it wrote for all
  of them, not when a closed pipe or a kill ended it early), and the worker exits at once
  without a Result.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
from pathlib import Path
from typing import Any

from multiprocessing.reduction import ForkingPickler

from motus.models import ChatMessage
from motus.durable import interrupt as interrupt_module
from motus.durable.records import JournalEntry, Record, STEP, Interrupt, Result
from motus.durable.journal import pack

WAIT_SECONDS = 30.0


def _root() -> Path:
    return Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")


def _say_started(gate: str) -> None:
    root = _root()
    partial = root / f".started-{gate}.{os.getpid()}"
    partial.write_text(str(os.getpid()))
    os.replace(partial, root / f"started-{gate}")


async def _gate(gate: str) -> None:
    root = _root()
    _say_started(gate)
    deadline = time.monotonic() + WAIT_SECONDS
    while not (root / f"release-{gate}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _fd() -> int:
    channel = interrupt_module._channel
    assert channel is not None
    return channel._conn.fileno()


def _frame(obj: Any) -> bytes:
    body = bytes(ForkingPickler.dumps(obj))
    if len(body) > 0x7FFFFFFF:
        return struct.pack("!i", -1) + struct.pack("!Q", len(body)) + body
    return struct.pack("!i", len(body)) + body


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _result(message: ChatMessage, content: str) -> Result:
    reply = ChatMessage(role="assistant", content=content).model_dump(mode="json")
    return Result(response=reply, state=[message.model_dump(mode="json"), reply])


def _marker(seq: int) -> bytes:
    return _frame(Record(JournalEntry(seq=seq, kind=STEP, key="marker", label="marker", done=True, value=pack(("ok", None)))))


async def attacker(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    command = words[0]
    reply = ChatMessage(role="assistant", content=f"done: {message.content}")
    if command == "result-exit":
        _write_all(_fd(), _frame(_result(message, "x" * int(words[1]))))
        os._exit(0)
    elif command == "burst-result":
        data = b"".join(_frame(None) for _ in range(int(words[1]))) + _frame(_result(message, "burst"))
        _write_all(_fd(), data)
        os._exit(0)
    elif command == "burst":
        frames = [_frame(Interrupt(interrupt_id=f"burst-{n}", payload={"type": "question", "n": n}, seq=n + 1)) for n in range(int(words[1]))]
        _write_all(_fd(), b"".join(frames) + _marker(len(frames) + 1))
        await _gate(words[2])
    elif command in ("half-kill", "half-finish"):
        frame = _frame(_result(message, "y" * int(words[1])))
        half = len(frame) // 2
        _write_all(_fd(), frame[:half])
        await _gate(words[2])
        if command == "half-kill":
            os.kill(os.getpid(), signal.SIGKILL)
        _write_all(_fd(), frame[half:])
    elif command == "header":
        size = int(words[1])
        head = struct.pack("!i", size) + (struct.pack("!Q", 2**40) if size == -1 else b"")
        _write_all(_fd(), head + b"\0" * 100)
        await _gate(words[2])
    elif command == "grandchild-result":
        if os.fork() == 0:
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline and not (_root() / "release-grandchild").exists():
                time.sleep(0.05)
            os._exit(0)
    elif command == "grandchild-flood":
        fd = _fd()
        if os.fork() == 0:
            chunk = _frame(None) * 4096
            deadline = time.monotonic() + float(words[1])
            try:
                while time.monotonic() < deadline:
                    os.write(fd, chunk)
                # For the test: the flood ran its whole length. Not written when the manager
                # closed the pipe (EPIPE) or killed the group, which end the flood early.
                (_root() / "flood-ended").touch()
            finally:
                os._exit(0)
        os._exit(0)
    return reply, [*state, message, reply]
