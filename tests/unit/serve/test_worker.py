"""``worker._run_on`` with ``exiting``: a zygote's child skips asyncio's clean-up before its
``os._exit`` only when the turn left nothing for the clean-up to do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from motus.serve import worker


def _loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


def _close(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(None)
    if not loop.is_closed():
        loop.close()


async def _plain() -> str:
    await asyncio.sleep(0)
    return "done"


def test_an_exiting_worker_skips_the_clean_up_when_nothing_is_left() -> None:
    loop = _loop()
    try:
        assert worker._run_on(loop, _plain(), exiting=True) == "done"
        assert not loop.is_closed()  # skipped: the process's exit releases what the loop holds
    finally:
        _close(loop)


def test_a_worker_that_is_not_exiting_always_cleans_up() -> None:
    loop = _loop()
    try:
        assert worker._run_on(loop, _plain()) == "done"
        assert loop.is_closed()
    finally:
        _close(loop)


def test_a_task_left_running_is_cancelled_before_the_exit() -> None:
    loop = _loop()
    left: list[asyncio.Task[None]] = []

    async def main() -> None:
        left.append(asyncio.get_running_loop().create_task(asyncio.Event().wait()))
        await asyncio.sleep(0)

    try:
        worker._run_on(loop, main(), exiting=True)
        assert loop.is_closed()
        assert left[0].cancelled()
    finally:
        _close(loop)


def test_a_paused_async_generator_is_closed_before_the_exit() -> None:
    loop = _loop()
    seen: list[str] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            seen.append("closed")

    kept: list[AsyncIterator[int]] = []

    async def main() -> None:
        generator = numbers()
        kept.append(generator)
        await generator.__anext__()

    try:
        worker._run_on(loop, main(), exiting=True)
        assert loop.is_closed()
        assert seen == ["closed"]
    finally:
        _close(loop)


def test_work_in_the_default_executor_is_waited_for_before_the_exit() -> None:
    loop = _loop()
    seen: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().run_in_executor(None, seen.append, "ran")

    try:
        worker._run_on(loop, main(), exiting=True)
        assert loop.is_closed()
        assert seen == ["ran"]
    finally:
        _close(loop)


def test_a_failing_main_still_cleans_up() -> None:
    loop = _loop()

    async def main() -> None:
        raise ValueError("the agent's own failure")

    try:
        with pytest.raises(ValueError):
            worker._run_on(loop, main(), exiting=True)
        assert loop.is_closed()
    finally:
        _close(loop)
