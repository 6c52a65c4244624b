"""An agent for ``tests/integration/serve/workers/test_forged_message_attacks.py``: its process writes
messages of its own to the worker's pipe (through the channel ``motus.durable.interrupt``
installed for the turn, or as raw bytes on the pipe's descriptor), as any agent's process
can, alone or around real ``interrupt()`` calls. Served as
``tests.agents.forged_message_attack:attacker``.

``attacker`` reads ``COMMAND [GATE]`` from the message; anything else is an echo turn that
replies ``done: <message>``. Where a command waits, it waits for ``release-GATE`` in
``$MOTUS_EXAMPLE_DIR`` (writing ``started-GATE`` first), at most ``WAIT_SECONDS``, so a
failing test never leaves a worker blocked for ever. Where said, a finished step record
``marker`` (seq 99) follows the forgeries: once a test sees it in the turn's journal, the
server has applied everything before it (it reads a pipe in order). Commands:

- ``partial GATE``: writes the 4-byte length header of a 4 KiB frame and its first byte on
  the raw pipe, waits, then writes the rest of the frame (a pickled ``None`` padded out) and
  returns normally;
- ``sysexit``: sends an object whose unpickling calls ``sys.exit`` (a ``SystemExit`` in
  whichever server thread reads it), then returns normally;
- ``unreadable``: sends an object whose unpickling raises ``ValueError``, then returns;
- ``unexpected``: sends ``None``, an ``Ack``, a ``Resume``, a ``Job`` and a bare ``int``,
  then returns normally;
- ``deep GATE``: an ``Interrupt`` whose payload nests 300 levels deep (a worker of ours
  refuses more than 64), then waits;
- ``malformed GATE1 GATE2``: waits at ``GATE1``, then sends an ``Interrupt`` whose payload is
  ``5`` (refused by ``message_problem``), then waits at ``GATE2``;
- ``intkey GATE``: an ``Interrupt`` whose payload has an int key (a worker of ours sends
  only str keys), then waits;
- ``mixedkeys GATE``: an ``Interrupt`` whose payload has a str and an int key, then waits;
- ``badrole``: a ``Result`` whose response and history hold a message of role ``villain``;
- ``surrogate-failure``: a ``Failure`` whose error holds a lone surrogate;
- ``huge-seq GATE``: a started tool ``Record`` with ``ack`` at seq ``2**64`` (past what
  SQLite's INTEGER holds), then waits (a worker of ours would wait for the ``Ack``);
- ``raise-surrogate``: the agent itself raises ``ValueError("bad \\ud800")`` (no forgery);
- ``surrogate-type GATE``: a real ``interrupt({"type": "\\ud800"})`` (no forgery), answered
  by the test;
- ``resend-answered GATE``: a real ``interrupt()`` (the test answers it with its own id),
  then the same ``Interrupt`` (id and seq) sent again, then ``marker``, then waits;
- ``dup-id GATE``: two ``Interrupt``s with one id and two seqs, then ``marker``, then waits;
- ``replace-pending GATE``: a real ``interrupt()``; writes its id in ``started-GATE``;
  then an ``Interrupt`` with another id (``replacer``) and the real one's seq, then
  ``marker``, then waits for the real answer (bounded; no release needed);
- ``many N GATE``: ``N`` valid ``Interrupt``s with distinct ids and seqs, then ``marker``,
  then waits;
- ``deep-record GATE``: a finished tool ``Record`` whose value is a list nested 300 deep,
  then waits;
- ``args-bomb GATE``: a finished model ``Record`` whose reply's tool-call arguments are
  100,000 ``[``, then waits;
- ``exit-record GATE``: a finished tool ``Record`` whose value unpickles by calling
  ``sys.exit``, then waits;
- ``edge``: no forgery, a worker's own messages at the edges of what it allows: an
  ``interrupt()`` whose payload nests 64 levels (the worker's limit) with a timeout and a
  default nested 100 deep (the worker does not bound a default's depth), then one the
  agent gives up on after 0.3 s (``asyncio.wait_for``), then another; replies
  ``answer: <first> <third>``;
- ``ack-twice``: the same started tool ``Record`` with ``ack`` twice (both acked), then a
  ``Record`` for seq 1 finishing it, then a real ``interrupt()``-free echo;
- ``record-then-interrupt GATE``: a finished tool ``Record`` at seq 1 (the seq a real
  interrupt raised next gets), then a real ``interrupt()``; replies with the answer;
- ``after-result``: a ``Result`` of its own (reply ``forged``), then a ``Failure``, an
  ``Interrupt`` and a ``Record``, then returns normally.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import time
from pathlib import Path
from typing import Any

from motus.models import ChatMessage
from motus.durable import interrupt as interrupt_module
from motus.serve.interrupt import interrupt
from motus.durable.journal import pack
from motus.durable.records import MODEL, STEP, TOOL, Ack, Failure, Interrupt, Job, JournalEntry, Record, Result, Resume

WAIT_SECONDS = 30.0


class _Exit:
    """Unpickles by calling ``sys.exit`` (pickle names any importable callable)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (sys.exit, ("forged exit",))


class _Raises:
    """Unpickles by calling ``int("not a number")``: a ``ValueError``."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("not a number",))


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _root() -> Path:
    return Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")


def _say_started(gate: str, text: str) -> None:
    """Write ``started-GATE`` whole (then renamed), so a test that sees it can read it."""
    root = _root()
    partial = root / f".started-{gate}.{os.getpid()}"
    partial.write_text(text)
    os.replace(partial, root / f"started-{gate}")


async def _gate(gate: str) -> None:
    """Say ``started-GATE``, then wait for ``release-GATE``, at most ``WAIT_SECONDS``."""
    root = _root()
    _say_started(gate, str(os.getpid()))
    deadline = time.monotonic() + WAIT_SECONDS
    while not (root / f"release-{gate}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _marker() -> None:
    """A finished step ``marker`` at seq 99: the server reads a pipe in order, so once the
    test sees it in the turn's journal, everything sent before it was applied."""
    _channel().send(Record(JournalEntry(seq=99, kind=STEP, key="marker", label="marker", done=True, value=pack(("ok", None)))))


def _channel() -> Any:
    channel = interrupt_module._channel
    assert channel is not None
    return channel


async def _on_pipe(channel: Any) -> None:
    """Until the real interrupt just raised is on the pipe."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while not channel._pending and loop.time() < deadline:
        await asyncio.sleep(0.001)


async def attacker(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    command = words[0]
    reply = ChatMessage(role="assistant", content=f"done: {message.content}")
    if command == "partial":
        frame = pickle.dumps(None, protocol=2).ljust(4096, b"\0")  # pickle stops at its STOP
        fd = _channel()._conn.fileno()
        os.write(fd, struct.pack("!i", len(frame)) + frame[:1])
        await _gate(words[1])
        os.write(fd, frame[1:])
    elif command == "sysexit":
        _channel().send(_Exit())
    elif command == "unreadable":
        _channel().send(_Raises())
    elif command == "unexpected":
        for forged in (None, Ack(1), Resume(interrupt_id="x", value=1), Job(session_id="x", turn_id=1, message={}, state=[]), 7):
            _channel().send(forged)
    elif command == "deep":
        _channel().send(Interrupt(interrupt_id="deep-1", payload={"type": "question", "data": _nested_dict(300)}, seq=1))
        await _gate(words[1])
    elif command == "malformed":
        await _gate(words[1])
        _channel().send(Interrupt(interrupt_id="malformed-1", payload=5, seq=1))  # type: ignore[arg-type]
        await _gate(words[2])
    elif command == "intkey":
        _channel().send(Interrupt(interrupt_id="intkey-1", payload={1: "one"}, seq=1))  # type: ignore[dict-item]
        await _gate(words[1])
    elif command == "mixedkeys":
        _channel().send(Interrupt(interrupt_id="mixed-1", payload={"type": "question", 1: "one"}, seq=1))  # type: ignore[dict-item]
        await _gate(words[1])
    elif command == "badrole":
        villain = {"role": "villain", "content": "x"}
        _channel().send(Result(response=villain, state=[message.model_dump(mode="json"), villain]))
    elif command == "surrogate-failure":
        _channel().send(Failure(error="bad \ud800 error"))
    elif command == "huge-seq":
        _channel().send(Record(JournalEntry(seq=2**64, kind=TOOL, key="t:{}", label="t"), ack=True))
        await _gate(words[1])
    elif command == "raise-surrogate":
        raise ValueError("bad \ud800")
    elif command == "surrogate-type":
        answer = await asyncio.wait_for(interrupt({"type": "\ud800", "question": "odd type"}), WAIT_SECONDS)
        reply = ChatMessage(role="assistant", content=f"answer: {answer}")
    elif command == "resend-answered":
        payload = {"type": "question", "question": "once?"}
        answered_id = await asyncio.wait_for(interrupt(payload), WAIT_SECONDS)  # the test answers with its id
        _channel().send(Interrupt(interrupt_id=answered_id, payload=payload, seq=1))  # seq 1: the turn's first record
        _marker()
        await _gate(words[1])
    elif command == "dup-id":
        _channel().send(Interrupt(interrupt_id="dup", payload={"type": "question", "n": 1}, seq=1))
        _channel().send(Interrupt(interrupt_id="dup", payload={"type": "question", "n": 2}, seq=2))
        _marker()
        await _gate(words[1])
    elif command == "replace-pending":
        asked = asyncio.ensure_future(interrupt({"type": "question", "question": "real"}))
        await _on_pipe(_channel())
        _say_started(words[1], next(iter(_channel()._pending)))  # the real interrupt's id
        _channel().send(Interrupt(interrupt_id="replacer", payload={"type": "question", "question": "forged"}, seq=1))
        _marker()
        try:
            answer = await asyncio.wait_for(asked, WAIT_SECONDS)
        except asyncio.TimeoutError:
            answer = "never answered"
        reply = ChatMessage(role="assistant", content=f"answer: {answer}")
    elif command == "many":
        for n in range(int(words[1])):
            _channel().send(Interrupt(interrupt_id=f"many-{n}", payload={"type": "question", "n": n}, seq=n + 1))
        _marker()
        await _gate(words[2])
    elif command == "deep-record":
        entry = JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=pack(("ok", _nested(300))))
        _channel().send(Record(entry))
        await _gate(words[1])
    elif command == "args-bomb":
        reply_data = {"choices": [{"message": {"content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000}}]}}]}
        _channel().send(Record(JournalEntry(seq=1, kind=MODEL, key="d", label="chat", done=True, value=pack(("ok", reply_data)))))
        await _gate(words[1])
    elif command == "exit-record":
        value = pickle.dumps(("ok", _Exit()))
        _channel().send(Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=value)))
        await _gate(words[1])
    elif command == "edge":
        # No forgery: what a worker of ours sends at the edges of what it allows.
        deepest = {"type": "deepest", "data": _nested_dict(63)}  # 64 levels: the worker's limit
        first = await asyncio.wait_for(interrupt(deepest, timeout=WAIT_SECONDS, default=_nested(100)), WAIT_SECONDS)
        try:  # given up by the agent: the server still shows it, the worker no longer counts it
            await asyncio.wait_for(interrupt({"type": "question", "q": "abandoned"}), 0.3)
        except asyncio.TimeoutError:
            pass
        second = await asyncio.wait_for(interrupt({"type": "question", "q": "kept"}), WAIT_SECONDS)
        reply = ChatMessage(role="assistant", content=f"answer: {first} {second}")
    elif command == "ack-twice":
        started = JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t")
        await asyncio.wait_for(_channel().send_and_wait_ack(Record(started, ack=True)), WAIT_SECONDS)
        await asyncio.wait_for(_channel().send_and_wait_ack(Record(started, ack=True)), WAIT_SECONDS)
        _channel().send(Record(started.finished(pack(("ok", "ran")))))
    elif command == "record-then-interrupt":
        _channel().send(Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=pack(("ok", 1)))))
        answer = await asyncio.wait_for(interrupt({"type": "question", "question": "after a forged record"}), WAIT_SECONDS)
        reply = ChatMessage(role="assistant", content=f"answer: {answer}")
    elif command == "after-result":
        forged = ChatMessage(role="assistant", content="forged")
        _channel().send(Result(response=forged.model_dump(mode="json"), state=[message.model_dump(mode="json"), forged.model_dump(mode="json")]))
        _channel().send(Failure(error="after the result"))
        _channel().send(Interrupt(interrupt_id="late", payload={"type": "question"}, seq=1))
        _channel().send(Record(JournalEntry(seq=2, kind=TOOL, key="t:{}", label="t", done=True, value=pack(("ok", 1)))))
    return reply, [*state, message, reply]


