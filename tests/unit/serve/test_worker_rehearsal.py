"""The zygote's rehearsal turn (``worker.rehearse``), run in this process: it goes through an
interrupt and a resume, and leaves nothing behind that a forked child would inherit."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from motus.durable import interrupt as interrupt_module
from motus.durable import journal as journal_module
from motus.serve import worker
from motus.durable.interrupt import interrupt


def test_the_rehearsal_pauses_is_resumed_and_leaves_nothing_behind() -> None:
    descriptors = set(os.listdir("/proc/self/fd"))
    threads = threading.active_count()

    result = worker.rehearse()

    # The stand-in agent's interrupt was answered through the channel ("resumed") and the
    # turn's result went through the same checks as a real one.
    assert (result.response["role"], result.response["content"]) == ("assistant", "resumed: rehearsal")
    # The job's one message of history came back unchanged, so only what followed it was sent.
    assert result.kept == 1
    assert [item["role"] for item in result.state] == ["user", "assistant"]
    # Nothing a forked child would inherit: no channel, no journal, no loop, no socket, no thread.
    assert interrupt_module._channel is None
    assert journal_module._journal is None
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    assert set(os.listdir("/proc/self/fd")) == descriptors
    assert threading.active_count() == threads


def test_after_a_rehearsal_interrupt_outside_a_worker_still_refuses() -> None:
    worker.rehearse()
    with pytest.raises(RuntimeError) as info:
        asyncio.run(interrupt({"type": "confirm"}))
    assert str(info.value) == "interrupt() called outside motus serve worker subprocess"
