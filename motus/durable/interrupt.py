"""``interrupt()``: pause the running turn until a client posts a resume.

The wire messages live in ``motus.durable.records``. On a replay the
channel asks the turn's journal first: an interrupt that was answered before returns its
recorded value at once, and one still unanswered is announced again under its original id,
so a client never sees an interrupt id change.

Module state (``_channel``, of this module alone: ``motus.serve.interrupt`` only
re-exports it) is safe to keep globally: a worker process runs exactly one
turn, and the channel is installed before the agent starts. In any other process
``_channel`` is ``None`` and ``interrupt()`` raises the documented ``RuntimeError``.

Thread ownership inside the worker: the agent's event loop owns ``_Channel._pending``;
the channel's reader thread only touches it through ``loop.call_soon_threadsafe``.
Sends are serialised by ``_Channel._send_lock`` (the agent loop and a sync agent's
thread may both send).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import signal
import sys
import threading
import uuid
from multiprocessing.connection import Connection
from typing import Any

from motus.durable.journal import Journal, canonical_payload, current_parent, unpack
from motus.durable.jsonshape import MAX_JSON_DEPTH, json_depth_exceeds, lone_surrogate_key_problem
from motus.durable.records import INTERRUPT, Ack, Interrupt, Interrupts, Record, Resume

__all__ = ["interrupt", "was_asked", "session_grants", "flush_stdio", "end_group", "MAX_INTERRUPT_BYTES", "EXIT_GRACE_SECONDS"]

log = logging.getLogger(__name__)

#: Hard limit on one pickled outbound ``Interrupt`` message, as the spec states.
MAX_INTERRUPT_BYTES = 16 * 1024

#: How long a worker whose pipe closed may run its handlers before it ends itself.
EXIT_GRACE_SECONDS = 1.0


class _Channel:
    """The worker's end of the pipe while a turn runs."""

    def __init__(
        self, conn: Connection, loop: asyncio.AbstractEventLoop, max_interrupts: int = 0, grants: tuple[str, ...] = ()
    ) -> None:
        self._conn = conn
        #: Tools approved "for the session": the session's grants when the turn started,
        #: plus those granted by answers in this turn (a replay learns them again from the
        #: same recorded answers, so it sees what the first run saw).
        self.grants: set[str] = set(grants)
        self._max_interrupts = max_interrupts
        self._loop = loop
        self._send_lock = threading.Lock()
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._acks: dict[int, asyncio.Future[None]] = {}
        #: Interrupts raised in this pass of the loop, not yet sent (loop thread only): sent
        #: together by ``_send_interrupts``, each with its pickled form.
        self._outbox: list[tuple[Interrupt, bytes]] = []
        self._closed = False  # set on the loop thread once EOF is seen
        self.journal: Journal = Journal((), self)
        self._reader = threading.Thread(target=self._read_resumes, name="motus-resume-reader", daemon=True)

    def start(self, journal: Journal, reader_thread: bool = True) -> None:
        """Start delivering the server's messages. With ``reader_thread`` a thread reads the
        pipe, and on EOF ends the process after a grace period even if the loop is blocked.
        Without it (a zygote's child, whose zygote ends what outlives a dead server) the
        loop reads the pipe itself, which spares a turn the start of a thread (the first
        thread of a forked process costs about 0.7 ms)."""
        self.journal = journal
        if reader_thread:
            self._reader.start()
        else:
            self._loop.add_reader(self._conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        """On the loop: read what the server sent (a message is written whole, so a
        readable pipe rarely holds less than one)."""
        try:
            while True:
                self._dispatch(self._conn.recv())
                if not self._conn.poll():
                    return
        except (EOFError, OSError):
            self._loop.remove_reader(self._conn.fileno())
            self._fail_all()
            # As the reader thread does: the agent gets a moment for its handlers, then the
            # group ends. The server ends a group whose loop is too busy to get here.
            self._loop.call_later(EXIT_GRACE_SECONDS, end_group)

    def _dispatch(self, message: object) -> None:
        if isinstance(message, Resume):
            self._deliver(message)
        elif isinstance(message, Ack):
            self._acknowledge(message.seq)
        else:
            log.warning("worker ignored unexpected message %r", type(message).__name__)

    def send(self, message: object) -> None:
        with self._send_lock:
            self._conn.send(message)

    async def send_and_wait_ack(self, record: Record) -> None:
        """Send a record and wait until the server says it is committed."""
        if self._closed:
            raise EOFError("Worker pipe closed")
        future: asyncio.Future[None] = self._loop.create_future()
        self._acks[record.entry.seq] = future
        try:
            try:
                self.send(record)
            except OSError:
                raise EOFError("Worker pipe closed") from None
            await future
        finally:
            self._acks.pop(record.entry.seq, None)

    async def interrupt(self, payload: dict[str, Any], timeout: float | None = None, default: Any = None) -> Any:
        payload = _as_json_object(payload)
        timeout = _check_timeout(timeout)
        if timeout is not None:
            default = _as_json_value(default)
        if self._closed:
            raise EOFError("Worker pipe closed")
        kind = payload.get("type")
        recorded = await self.journal.claim_async(INTERRUPT, canonical_payload(payload), f"{kind if isinstance(kind, str) else 'unknown'}")
        if recorded is not None and recorded.done:
            return unpack(recorded.value)  # answered before this replay: no pause at all
        if self._max_interrupts and len(self._pending) >= self._max_interrupts:
            raise RuntimeError(
                f"Too many pending interrupts: this turn already waits on {len(self._pending)} "
                f"(the server allows {self._max_interrupts}, see --max-interrupts); "
                "wait for some to be resumed before raising more"
            )
        if recorded is not None:  # still unanswered: wait again under its original id
            message = Interrupt(interrupt_id=recorded.ref or str(uuid.uuid4()), payload=payload, seq=recorded.seq,
                                timeout=timeout, default=default)
        else:
            message = Interrupt(interrupt_id=str(uuid.uuid4()), payload=payload, seq=0, timeout=timeout, default=default)
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_INTERRUPT_BYTES:
            raise ValueError(
                f"Interrupt message too large: {len(data)} bytes pickled, the limit is "
                f"{MAX_INTERRUPT_BYTES} bytes. Upload large data elsewhere and pass a URL instead."
            )
        if recorded is None:
            message = Interrupt(
                interrupt_id=message.interrupt_id, payload=payload, seq=self.journal.new_seq(), parent=current_parent(),
                timeout=timeout, default=default,
            )
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[message.interrupt_id] = future
        if not self._outbox:
            self._loop.call_soon(self._send_interrupts)
        self._outbox.append((message, data))
        try:
            return await future
        finally:
            self._pending.pop(message.interrupt_id, None)

    def _send_interrupts(self) -> None:
        """On the loop, after every task that was ready with the first interrupt of this pass
        has run: send the interrupts they raised (the branches of one ``asyncio.gather``) as
        one message (``Interrupts``), so that the server takes them whole and publishes them
        together: a client is never shown the first of them alone, then the rest (``1 of
        2``). A send that fails fails each of them with ``EOFError``, as a closed pipe does."""
        outbox, self._outbox = self._outbox, []
        if len(outbox) == 1:
            data = outbox[0][1]
        else:
            data = pickle.dumps(Interrupts(tuple(message for message, _ in outbox)), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self._conn.send_bytes(data)
        except OSError:
            for message, _ in outbox:
                future = self._pending.get(message.interrupt_id)
                if future is not None and not future.done():
                    future.set_exception(EOFError("Worker pipe closed"))

    def _read_resumes(self) -> None:
        """Reader thread: deliver resumes and acks; on EOF fail every waiter and end the
        process."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._dispatch, message)
        try:
            self._loop.call_soon_threadsafe(self._fail_all)
        except RuntimeError:
            pass  # the loop already finished: the turn is over, nothing awaits a resume
        # The server closed our pipe: the turn was cancelled, timed out or parked. Give the
        # agent a moment to run its handlers (finally blocks, except EOFError), then end for
        # sure so no process outlives its turn even if the agent ignores the error.
        threading.Event().wait(EXIT_GRACE_SECONDS)
        end_group()

    def _deliver(self, message: Resume) -> None:
        future = self._pending.get(message.interrupt_id)
        if future is None or future.done():
            log.warning("resume for unknown interrupt %s ignored", message.interrupt_id)
            return
        future.set_result(message.value)

    def _acknowledge(self, seq: int) -> None:
        future = self._acks.get(seq)
        if future is not None and not future.done():
            future.set_result(None)

    @property
    def pipe_closed(self) -> bool:
        """Whether the server's end of the pipe closed while the turn ran."""
        return self._closed

    def _fail_all(self) -> None:
        self._closed = True
        for future in [*self._pending.values(), *self._acks.values()]:
            if not future.done():
                future.set_exception(EOFError("Worker pipe closed"))


def end_group() -> None:
    """The server may be gone (kill -9), so nobody else will end what the agent started:
    end the whole process group, this process last. What the agent printed and Python still
    buffers is flushed first, or the kill would lose it."""
    try:
        flush_stdio()
    finally:
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(1)


def flush_stdio() -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr`` before the process ends without the
    interpreter's shutdown (``os._exit``, SIGKILL). False if one could not be flushed (the
    agent closed it, or its reader is gone): what was in it is lost, and there is nowhere
    left to say so."""
    flushed = True
    for name in ("stdout", "stderr"):
        try:
            stream = getattr(sys, name, None)
            if stream is not None:
                stream.flush()
        except Exception:  # closed, broken, or replaced by the agent: the exit must still happen
            flushed = False
    return flushed


#: ``json.dumps(value, allow_nan=False)``, built once: a worker is a fresh fork, and every
#: object a call builds or touches for the first time costs it copied pages (~0.1 ms here).
_STRICT_JSON = json.JSONEncoder(allow_nan=False)


def _as_json_object(payload: Any) -> dict[str, Any]:
    """The payload exactly as a client will see it: a JSON object with string keys.

    Normalising here (tuples become lists, keys become strings) means a payload the API
    could not show never leaves the worker, so every pending interrupt can be read and
    resumed.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"interrupt() takes a dict payload, got {type(payload).__name__}")
    if json_depth_exceeds(payload):
        raise ValueError(f"Interrupt payload nested too deeply: the limit is {MAX_JSON_DEPTH} levels")
    try:
        shown = json.loads(_STRICT_JSON.encode(payload))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"interrupt() payload must be JSON-serializable: {exc}") from None
    problem = lone_surrogate_key_problem(shown, "interrupt() payload")
    if problem is not None:  # JSON escapes it, but no view of the interrupt could show it
        raise ValueError(problem)
    return shown


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"interrupt() timeout must be a number of seconds, got {type(timeout).__name__}")
    if not (timeout > 0) or timeout == float("inf"):
        raise ValueError(f"interrupt() timeout must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _as_json_value(value: Any) -> Any:
    """An interrupt's default exactly as a resume value would arrive: JSON."""
    try:
        return json.loads(_STRICT_JSON.encode(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"interrupt() default must be JSON-serializable: {exc}") from None


_channel: _Channel | None = None


def _install(channel: _Channel | None) -> None:
    """Called by the worker runtime only."""
    global _channel
    _channel = channel


async def interrupt(payload: dict[str, Any], *, timeout: float | None = None, default: Any = None) -> Any:
    """Pause this turn, show ``payload`` to the client, and return the value it resumes with.

    With ``timeout`` (seconds), the server resolves the interrupt itself with ``default`` if
    nobody has answered by then (recorded as resolved by ``timeout``). The deadline is kept
    in the store: it holds across restarts and while the turn is parked.

    Raises:
        RuntimeError: outside a ``motus serve`` worker subprocess.
        ValueError: the pickled interrupt exceeds 16 KiB ("Interrupt message too large").
        TypeError: ``payload`` is not a JSON-serializable dict.
        RuntimeError: the turn already waits on as many interrupts as the server allows.
        EOFError: ``"Worker pipe closed"`` when the turn is cancelled (session deleted,
            timed out, or the server shutting down) while waiting.
    """
    channel = _channel
    if channel is None:
        raise RuntimeError("interrupt() called outside motus serve worker subprocess")
    return await channel.interrupt(payload, timeout=timeout, default=default)


def was_asked(payload: dict[str, Any]) -> bool:
    """Whether this turn's first run raised an interrupt with ``payload`` that a replay has
    not reached yet. The approval gate asks this before letting a call through on a grant:
    a grant learned from one answer during a replay must not skip a gate that, in the first
    run, had already asked (and may have been rejected)."""
    channel = _channel
    if channel is None:
        return False
    return channel.journal.has_unconsumed(INTERRUPT, canonical_payload(_as_json_object(payload)))


def session_grants() -> set[str]:
    """The tools this session approved "for the session" (empty outside a worker). The
    approval gate reads and adds to it; nothing else should."""
    channel = _channel
    return channel.grants if channel is not None else set()
