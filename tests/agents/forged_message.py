"""An agent for ``tests/integration/serve/workers/test_forged_messages.py`` that writes messages of
its own to the worker's pipe (through the channel ``motus.durable.interrupt`` installed for the
turn), as an agent's process can, then waits the way a worker of ours would after sending
such a message: for an answer, or for the ``Ack`` of a record it asked to be acknowledged.

``forger`` reads ``forge KIND`` from the message (anything else is an echo turn):

- ``interrupt-payload``: an ``Interrupt`` whose payload is ``5``;
- ``interrupt-id``: an ``Interrupt`` whose id is ``5``;
- ``interrupt-not-json``: an ``Interrupt`` whose payload holds a set;
- ``interrupt-timeout``: an ``Interrupt`` whose timeout is ``"5"``;
- ``record-none``: ``Record(None, ack=True)`` (sent as it is: the channel's own wait for an
  ack needs the entry's seq);
- ``record-kind``: a record of kind ``interrupt`` (the server journals those itself), acked;
- ``record-fields``: a tool record that sets an interrupt's ``answered_by``, acked;
- ``record-over-interrupt``: a real ``interrupt()`` is raised first, then a finished tool
  record with the interrupt's seq.

If the server ever lets such a turn go on, the agent returns after ``WAIT_SECONDS`` with the
reply ``done: <message>``: a test sees that as the session leaving ``running`` far too late.
"""

from __future__ import annotations

import asyncio

from motus.models import ChatMessage
from motus.durable import interrupt as interrupt_module
from motus.serve.interrupt import interrupt
from motus.durable.records import TOOL, Interrupt, JournalEntry, Record

WAIT_SECONDS = 30.0

_INTERRUPTS = {
    "interrupt-payload": Interrupt(interrupt_id="forged-1", payload=5, seq=1),  # type: ignore[arg-type]
    "interrupt-id": Interrupt(interrupt_id=5, payload={"type": "question"}, seq=1),  # type: ignore[arg-type]
    "interrupt-not-json": Interrupt(interrupt_id="forged-1", payload={"type": "question", "options": {1, 2}}, seq=1),
    "interrupt-timeout": Interrupt(interrupt_id="forged-1", payload={"type": "question"}, seq=1, timeout="5"),  # type: ignore[arg-type]
}
_RECORD_NONE = Record(None, ack=True)  # type: ignore[arg-type]
_RECORDS = {
    "record-kind": Record(JournalEntry(seq=1, kind="interrupt", key="k", label="question"), ack=True),
    "record-fields": Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", answered_by="mallory"), ack=True),
}


async def forger(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ")
    reply = ChatMessage(role="assistant", content=f"done: {message.content}")
    if words[0] == "forge":
        channel = interrupt_module._channel
        assert channel is not None
        kind = words[1]
        if kind in _INTERRUPTS:
            channel.send(_INTERRUPTS[kind])
        elif kind == "record-none":
            channel.send(_RECORD_NONE)
        elif kind in _RECORDS:
            await asyncio.wait_for(channel.send_and_wait_ack(_RECORDS[kind]), WAIT_SECONDS)
        elif kind == "record-over-interrupt":
            asked = asyncio.ensure_future(interrupt({"type": "question", "question": "which?"}))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_SECONDS
            while not channel._pending and loop.time() < deadline:  # the interrupt is on the pipe
                await asyncio.sleep(0.001)
            channel.send(Record(JournalEntry(seq=1, kind=TOOL, key="t:{}", label="t", done=True, value=b"forged")))
            await asyncio.wait_for(asked, WAIT_SECONDS)
        else:
            raise ValueError(f"unknown forgery {kind!r}")
        await asyncio.sleep(WAIT_SECONDS)
    return reply, [*state, message, reply]
