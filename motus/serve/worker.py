"""The code that runs inside a worker process: one process, one turn.

A worker is started ahead of need (warm) by the pool, loads the agent (already imported in
the forkserver, so this is cheap), then blocks on its pipe until the pool hands it exactly
one ``Job``. It runs the turn on a fresh asyncio loop, with ``interrupt()`` wired to the
pipe, sends one ``Result`` or ``Failure`` and exits. A worker whose pipe reaches EOF before
a job arrives (the pool is shutting down, or the server died) exits quietly.

Guarantees:

- The only traceback a session ever shows is the agent's own unhandled exception, with the
  worker's frames trimmed off so it starts at the agent's code.
- A return value of the wrong shape fails the turn with a ``TypeError`` line naming it.
- The process runs in its own process group, so the pool can end everything the agent
  started when the turn is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import traceback
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from motus.models import ChatMessage
from motus.serve import interrupt as interrupt_module
from motus.serve.agents import check_turn_result, load_agent, run_agent_turn
from motus.serve.interrupt import Failure, Job, Result

log = logging.getLogger(__name__)


def worker_main(conn: Connection, agent_path: str | None, agent_obj: Any = None) -> None:
    """Process entry point (``multiprocessing`` target)."""
    os.setpgrp()
    # Ctrl-C in a terminal is the server's business: it cancels turns itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        agent = agent_obj if agent_path is None else load_agent(agent_path)
        load_error = None
    except Exception as exc:  # reported with the job, so the session shows it
        agent, load_error = None, f"{type(exc).__name__}: {exc}"
    try:
        job = conn.recv()
    except (EOFError, OSError):
        return  # never given a job: the pool is closing
    if not isinstance(job, Job):
        conn.send(Failure(error=f"Worker expected a Job, got {type(job).__name__}"))
        return
    if load_error is not None:
        conn.send(Failure(error=load_error))
        return
    outcome = asyncio.run(_run_job(conn, agent, job))
    try:
        conn.send(outcome)
    except OSError:
        pass  # the pool closed the pipe: the turn was cancelled, nobody wants the outcome
    finally:
        interrupt_module._install(None)


async def _run_job(conn: Connection, agent: Any, job: Job) -> Result | Failure:
    channel = interrupt_module._Channel(conn, asyncio.get_running_loop())
    interrupt_module._install(channel)
    channel.start()
    try:
        message = ChatMessage.model_validate(job.message)
        state = [ChatMessage.model_validate(item) for item in job.state]
        returned = await run_agent_turn(agent, message, state)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the agent's own failure (SystemExit too): show its traceback
        return Failure(error=format_agent_traceback(exc))
    try:
        response, new_state = check_turn_result(returned)
    except TypeError as exc:
        return Failure(error=f"TypeError: {exc}")
    return Result(
        response=response.model_dump(mode="json"),
        state=[item.model_dump(mode="json") for item in new_state],
    )


def format_agent_traceback(exc: BaseException) -> str:
    """The exception's traceback, starting at the first frame outside motus' worker code."""
    tb: TracebackType | None = exc.__traceback__
    ours = {__file__, interrupt_module.__file__.replace(".pyc", ".py")}
    agents_file = os.path.join(os.path.dirname(__file__), "agents.py")
    ours.add(agents_file)
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n")
