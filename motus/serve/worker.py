"""The code that runs inside a worker process: one process, one turn.

A worker is started ahead of need (warm) by the pool with the agent already loaded (forked
from the zygote, which loaded it once; a ``multiprocessing`` worker loads it itself, an import
its forkserver has already done), then blocks on its pipe until the pool hands it exactly
one ``Job``. It runs the turn on a fresh asyncio loop, with ``interrupt()`` wired to the
pipe, sends one ``Result`` or ``Failure`` and exits. A worker whose pipe reaches EOF before
a job arrives (the pool is shutting down, or the server died) exits quietly.

Guarantees:

- The only traceback a session ever shows is the agent's own unhandled exception, with the
  worker's frames trimmed off so it starts at the agent's code.
- A return value of the wrong shape fails the turn with a ``TypeError`` line naming it.
- An agent the process cannot load fails the turn with one line saying so.
- The process runs in its own process group, so the pool can end everything the agent
  started when the turn is cancelled.
- A ``Result`` carries the messages after the longest run of leading messages the agent
  left exactly as they came (as JSON, compared with a copy of the job the agent never
  reached), and how many those are (``kept``): the server puts the whole history back
  together from the job's, and stores only what changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import TracebackType
from typing import Any

from motus.durable import interrupt as interrupt_module
from motus.durable import journal as journal_module
from motus.durable.interrupt import interrupt as _interrupt  # taken now: an agent's import may replace the module's name
from motus.durable.journal import Journal
from motus.durable.records import Ack, Failure, Interrupt, Job, Record, Result, Resume, unchanged_prefix
from motus.models import ChatMessage
from motus.serve.agents import check_turn_result, load_agent, run_agent_turn

log = logging.getLogger(__name__)


def worker_main(conn: Connection, agent_path: str | None, agent_blob: bytes | None = None) -> None:
    """Process entry point of a ``multiprocessing`` worker (the fallback where the zygote
    cannot run, see ``motus.serve.processes``): load the agent here, then run one turn."""
    agent, load_error = load(agent_path, agent_blob)
    run_worker(conn, agent, load_error)


def load(agent_path: str | None, agent_blob: bytes | None) -> tuple[Any, str | None]:
    """The agent, by import path or pickled (``agent_blob``), or the one line that says why
    it could not be loaded. It is unpickled here, not by ``multiprocessing``, so an agent
    that cannot be loaded fails its turns with that line instead of killing the process."""
    try:
        if agent_path is not None:
            return load_agent(agent_path), None
        if agent_blob is not None:
            return pickle.loads(agent_blob), None
        raise RuntimeError("the worker was given no agent")
    except Exception as exc:  # reported with each job, so the session shows it
        return None, f"Could not load the agent in the worker process: {type(exc).__name__}: {exc}"


def run_worker(conn: Connection, agent: Any, load_error: str | None, forked_by_zygote: bool = False) -> None:
    """Run the one turn this process is for: wait for its ``Job``, run it, send the outcome.

    ``forked_by_zygote``: the zygote has rehearsed a turn already, so there is no first-time
    work left to warm up, and it ends what outlives a dead server, so the loop can read the
    pipe itself (no reader thread, see ``interrupt._Channel.start``).
    """
    os.setpgrp()
    # Ctrl-C in a terminal is the server's business: it cancels turns itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        loop = asyncio.new_event_loop()
    except Exception as exc:  # the agent's import broke asyncio: every turn says so, in one line
        loop = None
        load_error = load_error or f"Could not create the worker's event loop: {type(exc).__name__}: {exc}"
    if loop is not None and forked_by_zygote:
        asyncio.set_event_loop(loop)
        # Every turn pickles at least its result, and the first pickle of a fresh child
        # copies the pages pickling writes to. Doing that while waiting for the job keeps
        # it off the turn's clock (measured: job to result ~0.25 ms sooner, for about 15
        # more page copies a turn).
        ForkingPickler.dumps(_PICKLE_PRIMER)  # what Connection.send uses
    elif loop is not None:
        _warm_up(loop)
    try:
        sent = conn.recv_bytes()
    except (EOFError, OSError):
        if loop is not None:
            loop.close()
        return  # never given a job: the pool is closing
    job = ForkingPickler.loads(sent)  # what Connection.recv does; the bytes are kept (_as_sent)
    if not isinstance(job, Job):
        conn.send(Failure(error=f"Worker expected a Job, got {type(job).__name__}"))
        return
    if load_error is not None:
        conn.send(Failure(error=load_error))
        return
    assert loop is not None  # missing only with a load_error, answered above
    try:
        # A zygote's child exits with os._exit as soon as this returns, which releases all
        # the loop holds; so when the turn left nothing to clean up, the clean-up is skipped.
        _run_on(loop, _run_and_report(conn, agent, job, sent, reader_thread=not forked_by_zygote), exiting=forked_by_zygote)
    finally:
        channel = interrupt_module._channel
        interrupt_module._install(None)
        journal_module._install(None)
        if channel is not None and channel.pipe_closed:
            # The server closed our pipe (cancelled, parked, or done with a turn whose result
            # it has read) or died (kill -9): nobody will reap what the agent started, so end
            # the whole process group, this process last.
            interrupt_module.end_group()


#: How long the rehearsal may wait (``rehearse``); it takes a few milliseconds.
REHEARSAL_SECONDS = 5.0


def rehearse() -> Result:
    """In the zygote, before it forks anyone: run the worker's own path once, so its children
    inherit every lazy first-time initialisation done. The rehearsal is a real turn through
    ``run_worker``'s steps (a job over a socket pair, the channel, the journal, one
    ``interrupt()`` answered, a result checked, pickled and sent, the loop's clean-up) with a
    stand-in agent of ours: never the user's agent, whose tools act on the world. Rehearsing
    the interrupt too is what keeps a child's first ``interrupt()`` from paying for it.

    Returns the rehearsal's result. Raises if it failed or waited more than
    ``REHEARSAL_SECONDS`` (the agent's import can have changed what the path relies on); it
    is only a warm-up, so the zygote then serves without it (see ``zygote.main``)."""
    started = time.monotonic()
    server_end, worker_end = socket.socketpair()
    outcomes: list[object] = []
    with Connection(server_end.detach()) as server, Connection(worker_end.detach()) as conn:
        server.send(Job(session_id="rehearsal", turn_id=1, message=_REHEARSAL_MESSAGE, state=[_REHEARSAL_MESSAGE]))
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            loop.add_reader(server.fileno(), _answer_as_server, loop, server, outcomes)
            sent = conn.recv_bytes()
            turn = _run_and_report(conn, _rehearsal_agent, ForkingPickler.loads(sent), sent, reader_thread=False)
            _run_on(loop, asyncio.wait_for(turn, REHEARSAL_SECONDS))
        finally:
            interrupt_module._install(None)
            journal_module._install(None)
            if not loop.is_closed():
                asyncio.set_event_loop(None)
                loop.close()
        if not outcomes and server.poll(0):
            outcomes.append(server.recv())
    outcome = outcomes[0] if outcomes else None
    if not isinstance(outcome, Result):
        if time.monotonic() - started >= REHEARSAL_SECONDS:
            raise TimeoutError(f"the worker's rehearsal turn took more than {REHEARSAL_SECONDS:g} s")
        lines = outcome.error.strip().splitlines() if isinstance(outcome, Failure) else []
        detail = lines[-1] if lines else repr(outcome)
        raise RuntimeError(f"the worker's rehearsal turn failed: {detail}")
    traceback.format_exception(ValueError, ValueError("rehearsal"), None)
    return outcome


_REHEARSAL_MESSAGE = {"role": "user", "content": "rehearsal"}
_PICKLE_PRIMER = Interrupt(interrupt_id="00000000-0000-0000-0000-000000000000", payload={"type": "rehearsal"}, seq=1)


async def _rehearsal_agent(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    """The zygote's stand-in agent: one pause, answered by ``_answer_as_server``, then an echo."""
    answer = await _interrupt({"type": "rehearsal"})
    reply = ChatMessage.model_validate({"role": "assistant", "content": f"{answer}: {message.content}"})
    return reply, [*state, message, reply]


def _answer_as_server(loop: asyncio.AbstractEventLoop, server: Connection, outcomes: list[object]) -> None:
    """The server's side of a rehearsal, on the rehearsal's loop: answer the interrupt,
    acknowledge records, keep the outcome."""
    message = server.recv()
    if isinstance(message, Interrupt):
        server.send(Resume(interrupt_id=message.interrupt_id, value="resumed"))
    elif isinstance(message, Record):
        server.send(Ack(seq=message.entry.seq))
    else:
        loop.remove_reader(server.fileno())
        outcomes.append(message)


async def _run_and_report(conn: Connection, agent: Any, job: Job, sent: bytes, reader_thread: bool = True) -> None:
    """Send the outcome from inside the loop, before the loop's clean-up (which joins the
    default executor's threads) so the client does not wait for it. ``sent``: the job as it
    came over the pipe (see ``_as_sent``)."""
    outcome = await _run_job(conn, agent, job, sent, reader_thread)
    try:
        conn.send(outcome)
    except OSError:
        pass  # the pool closed the pipe: the turn was cancelled, nobody wants the outcome


def _warm_up(loop: asyncio.AbstractEventLoop) -> None:
    """Do, before the job arrives, the first-time work every turn would otherwise pay for.

    A freshly forked process pays for copy-on-write page faults and lazy initialisation the
    first time it runs the loop, validates a message and pickles a result. The process is
    idle until its job comes, so it does that work now, off the turn's clock.
    """
    sample = ChatMessage.model_validate({"role": "user", "content": "warm-up"})

    async def rehearse() -> Result:
        await asyncio.sleep(0)
        return Result(response=sample.model_dump(mode="json"), state=[sample.model_dump(mode="json")])

    asyncio.set_event_loop(loop)
    pickle.dumps(loop.run_until_complete(rehearse()), protocol=pickle.HIGHEST_PROTOCOL)
    traceback.format_exception(ValueError, ValueError("warm-up"), None)


def _run_on(loop: asyncio.AbstractEventLoop, main: Any, exiting: bool = False) -> Any:
    """``asyncio.run`` on a loop created in advance (same clean-up as ``asyncio.run``).

    ``exiting``: the process ends with ``os._exit`` right after, so the clean-up is skipped
    when ``main`` returned and left nothing behind for it (``_nothing_to_clean_up``). It runs
    the loop three more times and closes it, for nothing the exit does not do too: 0.0 to
    0.45 ms of CPU a turn, ~0.2 ms on average (old and new zygotes side by side, 400-600
    echo turns each, nine runs)."""
    returned = False
    try:
        result = loop.run_until_complete(main)
        returned = True
        return result
    finally:
        if not (exiting and returned and _nothing_to_clean_up(loop)):
            _clean_up(loop)


def _nothing_to_clean_up(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``asyncio.run``'s clean-up would find nothing to do: no task still running
    (the agent's background tasks get their cancellation), no callback queued and no timer
    due (the clean-up's passes of the loop would run them: a done callback, a
    ``call_soon_threadsafe`` from the agent's thread), no async generator alive (its
    ``finally`` must run) and no default executor (its running work is waited for). All but
    the first are private attributes of asyncio's loop; where one is missing, this says
    False and the clean-up runs."""
    if any(not task.done() for task in asyncio.all_tasks(loop)):
        return False
    if getattr(loop, "_ready", True):
        return False
    now = loop.time()
    if any(not timer.cancelled() and timer.when() <= now for timer in getattr(loop, "_scheduled", [None])):
        return False
    return not getattr(loop, "_asyncgens", True) and getattr(loop, "_default_executor", True) is None


def _clean_up(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does after its main coroutine: cancel what is left, close async
    generators, shut the default executor down, close the loop."""
    try:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def _run_job(conn: Connection, agent: Any, job: Job, sent: bytes, reader_thread: bool = True) -> Result | Failure:
    channel = interrupt_module._Channel(conn, asyncio.get_running_loop(), job.max_interrupts, grants=job.grants)
    journal = Journal(job.journal, channel)
    interrupt_module._install(channel)
    journal_module._install(journal)
    channel.start(journal, reader_thread)
    try:
        message = ChatMessage.model_validate(job.message)
        state = [ChatMessage.model_validate(item) for item in job.state]
        returned = await run_agent_turn(agent, message, state)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the agent's own failure (SystemExit too): show its traceback
        if journal.diverged is not None:
            return Failure(error=str(journal.diverged))
        return Failure(error=format_agent_traceback(exc))
    journal.finish()
    if journal.diverged is not None:  # the agent caught it, or never reached a record
        return Failure(error=str(journal.diverged))
    try:
        response, new_state = check_turn_result(returned)
    except TypeError as exc:
        return Failure(error=f"TypeError: {exc}")
    state = [item.model_dump(mode="json") for item in new_state]
    kept = unchanged_prefix(_as_sent(job, sent), state)
    return Result(response=response.model_dump(mode="json"), state=state[kept:], kept=kept)


def _as_sent(job: Job, sent: bytes) -> list[dict[str, Any]]:
    """The job's history as the server sent it, in objects the agent never reached. A model
    validated from a message may hold the very lists and dicts nested in it (pydantic copies
    a dict field, not what is inside it), so an agent's edit in place shows on ``job.state``
    too, and comparing with that would keep the old message. Unpickling the bytes again
    costs ~0.25 ms for 500 KB of history, paid only by a turn that has one."""
    if not job.state:
        return []
    return ForkingPickler.loads(sent).state


def format_agent_traceback(exc: BaseException) -> str:
    """The exception's traceback, starting at the first frame outside motus' worker code."""
    tb: TracebackType | None = exc.__traceback__
    ours = {__file__, interrupt_module.__file__.replace(".pyc", ".py")}
    agents_file = os.path.join(os.path.dirname(__file__), "agents.py")
    ours.add(agents_file)
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n")
