"""``interrupt()``: pause the running turn until a client posts a resume.

This module holds the primitive and the wire messages exchanged between the server and a
worker process over one duplex ``multiprocessing`` Pipe::

    server                                   worker (one process, one turn)
      Job(session_id, turn_id, message, state)  ->  run the agent
                                      <-  Interrupt(interrupt_id, payload)   (any number)
      Resume(interrupt_id, value)        ->  the awaiting future gets ``value``
                                      <-  Result(response, state) | Failure(error)

The wire messages are plain picklable dataclasses that reference no server object, so a
turn could one day be re-driven from a journal.

Module state (``_channel``) is safe to keep globally: a worker process runs exactly one
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
import threading
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from motus.serve.jsonshape import MAX_JSON_DEPTH, json_depth_exceeds

log = logging.getLogger(__name__)

#: Hard limit on one pickled outbound ``Interrupt`` message, as the spec states.
MAX_INTERRUPT_BYTES = 16 * 1024

#: How long a worker whose pipe closed may run its handlers before it ends itself.
EXIT_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class Job:
    """The one turn a worker process runs. ``message``/``state`` are JSON-ready dicts."""

    session_id: str
    turn_id: int
    message: dict[str, Any]
    state: list[dict[str, Any]]
    max_interrupts: int = 0  # pending at once; 0 = no limit


@dataclass(frozen=True)
class Interrupt:
    """Worker -> server: the agent paused; ``payload`` is the agent's dict, as given."""

    interrupt_id: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Resume:
    """Server -> worker: the client's reply to one interrupt."""

    interrupt_id: str
    value: Any


@dataclass(frozen=True)
class Result:
    """Worker -> server: the turn completed. Both are JSON-ready dicts."""

    response: dict[str, Any]
    state: list[dict[str, Any]]


@dataclass(frozen=True)
class Failure:
    """Worker -> server: the turn failed; ``error`` is what the session shows."""

    error: str


class _Channel:
    """The worker's end of the pipe while a turn runs."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop, max_interrupts: int = 0) -> None:
        self._conn = conn
        self._max_interrupts = max_interrupts
        self._loop = loop
        self._send_lock = threading.Lock()
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._closed = False  # set on the loop thread once EOF is seen
        self._reader = threading.Thread(target=self._read_resumes, name="motus-resume-reader", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def send(self, message: object) -> None:
        with self._send_lock:
            self._conn.send(message)

    async def interrupt(self, payload: dict[str, Any]) -> Any:
        payload = _as_json_object(payload)
        if self._closed:
            raise EOFError("Worker pipe closed")
        if self._max_interrupts and len(self._pending) >= self._max_interrupts:
            raise RuntimeError(
                f"Too many pending interrupts: this turn already waits on {len(self._pending)} "
                f"(the server allows {self._max_interrupts}, see --max-interrupts); "
                "wait for some to be resumed before raising more"
            )
        message = Interrupt(interrupt_id=str(uuid.uuid4()), payload=payload)
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_INTERRUPT_BYTES:
            raise ValueError(
                f"Interrupt message too large: {len(data)} bytes pickled, the limit is "
                f"{MAX_INTERRUPT_BYTES} bytes. Upload large data elsewhere and pass a URL instead."
            )
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[message.interrupt_id] = future
        try:
            with self._send_lock:
                self._conn.send_bytes(data)
        except OSError:
            self._pending.pop(message.interrupt_id, None)
            raise EOFError("Worker pipe closed") from None
        try:
            return await future
        finally:
            self._pending.pop(message.interrupt_id, None)

    def _read_resumes(self) -> None:
        """Reader thread: deliver resumes; on EOF fail every waiter and end the process."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Resume):
                self._loop.call_soon_threadsafe(self._deliver, message)
            else:
                log.warning("worker ignored unexpected message %r", type(message).__name__)
        try:
            self._loop.call_soon_threadsafe(self._fail_all)
        except RuntimeError:
            pass  # the loop already finished: the turn is over, nothing awaits a resume
        # The server closed our pipe: the turn was cancelled or timed out. Give the agent a
        # moment to run its handlers (finally blocks, except EOFError), then end for sure so
        # no process outlives its turn even if the agent ignores the error.
        threading.Event().wait(EXIT_GRACE_SECONDS)
        os._exit(1)

    def _deliver(self, message: Resume) -> None:
        future = self._pending.get(message.interrupt_id)
        if future is None or future.done():
            log.warning("resume for unknown interrupt %s ignored", message.interrupt_id)
            return
        future.set_result(message.value)

    def _fail_all(self) -> None:
        self._closed = True
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(EOFError("Worker pipe closed"))


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
        return json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"interrupt() payload must be JSON-serializable: {exc}") from None


_channel: _Channel | None = None


def _install(channel: _Channel | None) -> None:
    """Called by the worker runtime only."""
    global _channel
    _channel = channel


async def interrupt(payload: dict[str, Any]) -> Any:
    """Pause this turn, show ``payload`` to the client, and return the value it resumes with.

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
    return await channel.interrupt(payload)
