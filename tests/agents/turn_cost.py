"""Agents for the attacks on the per-turn cost changes (``tests/integration/serve/workers/
test_pool_manager_attacks.py`` and ``test_worker_exit_attacks.py``,
``serve/hardening/test_host_check_attacks.py``; served as ``tests.agents.turn_cost:agent``, and
run by an in-process ``WorkerPool``). The first word of the
message picks what the turn does; ``TAG`` names the file ``$COST_SANDBOX/TAG.done`` that a
callback, a ``finally`` or a function left running writes when it runs:

- ``echo TEXT``: replies ``echo: TEXT``;
- ``size``: replies ``size C S``, the length of the message's content and of the state;
- ``gate TAG``: records its pid (``TAG.pid``), waits (polling, up to 30 s) until ``TAG.go``
  exists, then replies;
- ``call_soon_chain TAG``: ``loop.call_soon(loop.call_soon, mark)``, then replies;
- ``thread_done_cb TAG``: a future resolved by a thread (``call_soon_threadsafe``), with a
  done callback that marks; the thread has posted before the reply;
- ``executor_done_cb TAG``: work in an executor of its own (not the loop's default), with a
  done callback on the asyncio future that marks; the work has ended before the reply;
- ``timer_chain TAG``: ``loop.call_soon(loop.call_later, 0, mark)``, then replies;
- ``custom_default TAG``: ``loop.set_default_executor`` with an executor of its own, work
  in it that takes 0.3 s and marks at its end, then replies at once;
- ``subprocess TAG``: ``asyncio.create_subprocess_exec("sleep", "300")``, records its pid
  (``TAG.pid``) and replies without waiting for it;
- ``thread TAG``: starts a non-daemon thread that sleeps for ever, records the worker's pid
  (``TAG.pid``), replies;
- ``print TAG``: prints ``TAG-printed`` to stdout without flushing, then replies;
- ``stop_loop``: ``loop.stop()``, then replies in the same step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from pathlib import Path

from motus.models import ChatMessage


def _sandbox() -> Path:
    return Path(os.environ["COST_SANDBOX"])


def _mark(tag: str, text: str) -> None:
    path = _sandbox() / f"{tag}.done"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.rename(path)


def _record(tag: str, pid: int) -> None:
    path = _sandbox() / f"{tag}.pid"
    temporary = path.with_suffix(".pidtmp")
    temporary.write_text(str(pid))
    temporary.rename(path)


def _reply(message: ChatMessage, state: list[ChatMessage], text: str):
    response = ChatMessage.assistant_message(content=text)
    return response, state + [message, response]


_KEPT: list[object] = []  # what a turn leaves behind, referenced until the process ends


def _slow_then_mark(tag: str) -> None:
    time.sleep(0.3)
    _mark(tag, "finished")


async def agent(message: ChatMessage, state: list[ChatMessage]):
    word, _, rest = (message.content or "").partition(" ")
    tag = rest.strip() or "t"
    loop = asyncio.get_running_loop()
    if word == "echo":
        return _reply(message, state, f"echo: {rest}")
    if word == "size":
        return _reply(message, state, f"size {len(message.content or '')} {len(state)}")
    if word == "gate":
        _record(tag, os.getpid())
        gate = _sandbox() / f"{tag}.go"
        deadline = time.monotonic() + 30
        while not gate.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return _reply(message, state, f"gate {tag} {'opened' if gate.exists() else 'timed out'}")
    if word == "call_soon_chain":
        loop.call_soon(loop.call_soon, _mark, tag, "ran")
        return _reply(message, state, "scheduled")
    if word == "thread_done_cb":
        future = loop.create_future()
        future.add_done_callback(lambda done: _mark(tag, f"callback {done.result()}"))
        poster = threading.Thread(target=loop.call_soon_threadsafe, args=(future.set_result, "ran"))
        poster.start()
        poster.join()  # posted: asyncio.run would run the callback before closing the loop
        return _reply(message, state, "posted")
    if word == "executor_done_cb":
        executor = concurrent.futures.ThreadPoolExecutor(1)
        work = loop.run_in_executor(executor, sum, [1, 2, 3])
        work.add_done_callback(lambda done: _mark(tag, f"callback {done.result()}"))
        executor.shutdown(wait=True)  # the work has ended and told the loop
        return _reply(message, state, "worked")
    if word == "timer_chain":
        loop.call_soon(loop.call_later, 0, _mark, tag, "timer")
        return _reply(message, state, "timer set")
    if word == "custom_default":
        executor = concurrent.futures.ThreadPoolExecutor(1)
        loop.set_default_executor(executor)
        loop.run_in_executor(None, _slow_then_mark, tag)
        return _reply(message, state, "left work in a custom default executor")
    if word == "subprocess":
        process = await asyncio.create_subprocess_exec("sleep", "300", stdin=asyncio.subprocess.DEVNULL)
        _KEPT.append(process)
        _record(tag, process.pid)
        return _reply(message, state, "started")
    if word == "thread":
        threading.Thread(target=time.sleep, args=(300,), name="cost-agent-sleeper").start()
        _record(tag, os.getpid())
        return _reply(message, state, "thread started")
    if word == "print":
        print(f"{tag}-printed", end="")  # no newline, no flush: only the exit's flush sends it
        return _reply(message, state, "printed")
    if word == "stop_loop":
        loop.stop()
        return _reply(message, state, "stopped the loop")
    return _reply(message, state, f"unknown {word}")
