"""Agents for ``tests/integration/serve/history/test_history_attacks.py``: agents that do tricky or
hostile things to their state, served as ``tests.agents.history_attack:NAME``.

``tricky`` does to its state what the message's first word says, then returns
``(reply, new_state)`` with the reply ``done: <message>``. The test works out each expected
history itself (``expected_after`` there), from the JSON it last read, independently of
this code. Commands (``I``, ``N`` are integers):

- ``append``: ``[*state, message, reply]`` (the usual turn);
- ``reorder``: the state reversed, then message and reply;
- ``double``: ``state + state``, then message and reply;
- ``toolargs I TEXT``: ``state[I].tool_calls[0].function.arguments = TEXT``, in place;
- ``nested I TEXT``: ``state[I].user_params["tags"].append(TEXT)``, in place (a list
  nested in ``user_params``);
- ``param I TEXT``: ``state[I].user_params["top"] = TEXT``, in place;
- ``twice``: ``[*state, message, message, reply]``, the same object twice;
- ``shorter N``: the first ``N`` messages, then message and reply;
- ``empty``: ``[]``: no history at all, not even the message;
- ``last TEXT``: the same length as given: the last message's content becomes ``TEXT``
  (no message, no reply appended);
- ``many N``: ``N`` messages ``m0`` .. appended, then message and reply;
- ``weird``: appends one message whose content has non-ASCII, a lone surrogate and a NUL;
- ``retype I KEY KIND``: ``state[I].user_params[KEY]`` keeps its value but changes type:
  KIND ``bool`` (1 -> True, 0 -> False), ``float`` (1 -> 1.0), ``negzero`` (0.0 -> -0.0),
  ``int`` (True -> 1); no message, no reply appended, so the length stays;
- ``keyorder I``: ``state[I].user_params`` gets its keys in reverse order (same values).

``hostile`` writes a ``Result`` of its own to the worker's pipe (through the channel
``motus.durable.interrupt`` installed for the turn) before returning normally; the message is
``hostile KIND`` and the forged ``Result`` carries ``state=[message, reply]`` (only the
turn's own two messages) with ``kept`` bogus (``neg``, ``huge``, ``bool``, ``float``,
``str``, ``past`` = one past the job's state), or a ``state`` that is not a list of
messages (``dict``, ``none``, ``int``, ``str-state``, ``ints``, ``not-json``) and ``kept``
left at its default, or a response that is not a message (``response-none``,
``response-list``, ``response-not-json``); ``failure-int`` writes ``Failure(error=5)``. A plain
``append`` works as in ``tricky``.

``parker`` edits the last message of its state in place and appends ``before``, asks a person (``interrupt``),
then appends the answer, the message and the reply; a replay does it all again from the
stored state.

``gated`` appends as ``append`` does, but first waits for ``$MOTUS_EXAMPLE_DIR/release-<id>``
(``<id>`` the message's second word), writing ``started-<id>`` when it begins (its own
polling, with a limit, so a failing test never leaves a worker blocked for ever).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from motus.models import ChatMessage
from motus.durable import interrupt as interrupt_module
from motus.serve.interrupt import interrupt
from motus.durable.records import Failure, Result

GATE_LIMIT_SECONDS = 20.0


def _done(message: ChatMessage) -> ChatMessage:
    return ChatMessage.assistant_message(content=f"done: {message.content}")


def tricky(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    command = words[0]
    reply = _done(message)
    if command == "reorder":
        return reply, [*reversed(state), message, reply]
    if command == "double":
        return reply, [*state, *state, message, reply]
    if command == "toolargs":
        state[int(words[1])].tool_calls[0].function.arguments = " ".join(words[2:])  # type: ignore[index]
    elif command == "nested":
        state[int(words[1])].user_params["tags"].append(" ".join(words[2:]))  # type: ignore[index]
    elif command == "param":
        state[int(words[1])].user_params["top"] = " ".join(words[2:])  # type: ignore[index]
    elif command == "twice":
        return reply, [*state, message, message, reply]
    elif command == "shorter":
        state = state[: int(words[1])]
    elif command == "empty":
        return reply, []
    elif command == "last":
        state[-1].content = " ".join(words[1:])
        return reply, state
    elif command == "many":
        state = [*state, *(ChatMessage.user_message(f"m{i}") for i in range(int(words[1])))]
    elif command == "weird":
        state = [*state, ChatMessage.user_message("h\u00e9llo \ud800 \x00 \u4e16 \U0001f600")]
    elif command == "retype":
        params = state[int(words[1])].user_params
        key, kind = words[2], words[3]
        value = params[key]  # type: ignore[index]
        params[key] = {"bool": bool, "float": float, "negzero": lambda v: -0.0, "int": int}[kind](value)  # type: ignore[index]
        return reply, state
    elif command == "keyorder":
        message_i = state[int(words[1])]
        message_i.user_params = dict(reversed(list((message_i.user_params or {}).items())))
    return reply, [*state, message, reply]


_BOGUS_KEPT = {"neg": -1, "huge": 10**12, "bool": True, "float": 1.0, "str": "1"}
_BOGUS_STATE = {
    "dict": {"role": "user", "content": "not a list"},
    "none": None,
    "int": 5,
    "str-state": "abc",
    "ints": [1, 2],
    "not-json": [{"role": "user", "content": object()}],
}
_BOGUS_RESPONSE = {"response-none": None, "response-list": [], "response-not-json": {"role": "assistant", "content": {1, 2}}}


def hostile(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    reply = _done(message)
    if words[0] != "hostile":
        return reply, [*state, message, reply]
    kind = words[1]
    tail = [message.model_dump(mode="json"), reply.model_dump(mode="json")]
    if kind in _BOGUS_KEPT:
        forged = Result(response=reply.model_dump(mode="json"), state=tail, kept=_BOGUS_KEPT[kind])
    elif kind == "past":
        forged = Result(response=reply.model_dump(mode="json"), state=tail, kept=len(state) + 1)
    elif kind in _BOGUS_RESPONSE:
        forged = Result(response=_BOGUS_RESPONSE[kind], state=tail)  # type: ignore[arg-type]
    elif kind == "failure-int":
        forged = Failure(error=5)  # type: ignore[arg-type]
    else:
        forged = Result(response=reply.model_dump(mode="json"), state=_BOGUS_STATE[kind])  # type: ignore[arg-type]
    channel = interrupt_module._channel
    assert channel is not None
    channel.send(forged)
    return reply, [*state, message, reply]


async def parker(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    if message.content == "append":
        reply = _done(message)
        return reply, [*state, message, reply]
    if state:
        state[-1].content = f"{state[-1].content} +edited"
    state.append(ChatMessage.user_message("before"))
    answer = await interrupt({"type": "confirm", "question": message.content})
    reply = _done(message)
    return reply, [*state, ChatMessage.user_message(f"answer {answer}"), message, reply]


async def wait_at_gate(gate: str) -> None:
    """Write ``started-GATE`` (holding this process' pid) in ``$MOTUS_EXAMPLE_DIR``, then wait
    for ``release-GATE`` there, at most ``GATE_LIMIT_SECONDS`` (a failing test never leaves a
    worker waiting for ever)."""
    root = Path(os.environ["MOTUS_EXAMPLE_DIR"])
    # Written whole, then renamed: a test that sees the file can read the pid at once.
    partial = root / f".started-{gate}.{os.getpid()}"
    partial.write_text(str(os.getpid()))
    os.replace(partial, root / f"started-{gate}")
    deadline = time.monotonic() + GATE_LIMIT_SECONDS
    while not (root / f"release-{gate}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def gated(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    reply = _done(message)
    if words[0] == "gate":
        await wait_at_gate(words[1])
    return reply, [*state, message, reply]
