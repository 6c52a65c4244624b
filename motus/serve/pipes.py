"""What goes onto and comes off a worker's pipe, as the pool's manager thread handles it.

The pool (``motus.serve.pool``) owns the processes, the threads and the locks; this module
owns only the bytes on a worker's pipe, in ``multiprocessing``'s framing (a 4-byte big-endian
length, or -1 and an 8-byte one, then the pickled message). Nothing here takes a lock or
starts a thread; each object is used by one thread at a time (``Frames``: the manager only).

Guarantees:

- Whole messages only: ``Frames`` passes on a message once all of its bytes have come, in
  the order they were written, however the writes were split; a half-written message is
  never taken, and a stalled or dead writer leaves it untaken.
- Never waits on one worker: ``Frames.read`` makes a single ``read(2)`` on a pipe that is
  readable and returns what it holds, so a worker stalled halfway through a message holds
  up its own turn, never the manager that reads every other worker's pipe.
- The inline-send limit: the manager writes a job itself only when it pickles to at most
  ``inline_job_limit()`` bytes (at most 32 KiB, a quarter of an empty socket pair's send
  buffer), so that first write to an empty pipe returns at once even if the process never
  reads. ``pickled_within`` says whether a job fits without pickling a large one whole:
  text past the limit is counted, not pickled, and a pickler is stopped after its first
  frame past the limit.
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
from multiprocessing.reduction import ForkingPickler
from typing import Any

from motus.durable.records import Failure, Job


class _CappedBuffer(io.BytesIO):
    """A pickling buffer that refuses to grow past ``limit`` bytes: a job too large for the
    manager to send itself is given up after the pickler's first 64 KiB frame, instead of
    being pickled whole on the thread that reads every worker's results (24 MB of history
    took ~200 ms), then again by the sender."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self._limit:
            raise OverflowError(f"more than {self._limit} bytes")
        return super().write(data)


def _text_at_least(job: Job, limit: int) -> bool:
    """Whether the job's messages hold more than ``limit`` characters of text, so it surely
    pickles to more than ``limit`` bytes (a str pickles to at least a byte a character).
    Microseconds for a long history, against pickling the first 64 KiB of it to find out."""
    total = 0
    for message in (job.message, *job.state):
        content = message.get("content") if type(message) is dict else None
        if type(content) is str:
            total += len(content)
            if total > limit:
                return True
    return False


def inline_job_limit() -> int:
    """The largest pickled job the manager sends itself: a quarter of a fresh socket pair's
    send buffer (212,992 bytes by default on Linux), at most 32 KiB, so a first write to an
    empty pipe never waits for the reader."""
    left, right = socket.socketpair()
    try:
        return min(32 * 1024, left.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4)
    finally:
        left.close()
        right.close()


def pickled_within(job: Job, limit: int) -> memoryview | None:
    """The job pickled, if that takes at most ``limit`` bytes; None if it is larger or cannot
    be pickled (the sender thread pickles it again and reports why)."""
    if _text_at_least(job, limit):
        return None
    buffer = _CappedBuffer(limit)
    try:
        ForkingPickler(buffer).dump(job)
    except Exception:  # too big (given up after one frame), or the sender reports why
        return None
    return buffer.getbuffer()


class Frames:
    """A worker's messages, read without ever blocking the manager (which reads every
    worker's pipe). ``Connection.recv`` reads a whole frame, waiting for as long as its
    writer takes: a worker that wrote half a frame, or was stopped halfway through a large
    result, held up every other turn's messages. Here each pass makes one ``read(2)``,
    which returns what is there once the pipe is readable, and takes whole frames out of
    what has come so far. Manager thread only."""

    CHUNK = 1 << 20

    def __init__(self) -> None:
        self._buffer = bytearray()

    def read(self, fd: int) -> bool:
        """Take in what the pipe holds; False at its end (the worker closed it)."""
        try:
            data = os.read(fd, self.CHUNK)
        except BlockingIOError:
            return True  # nothing after all (a spurious wake-up)
        if not data:
            return False
        self._buffer += data
        return True

    def buffered(self) -> bool:
        """Whether bytes were read and not yet taken as a whole frame (a read of ``len``:
        safe from another thread, if only as a hint taken with the worker stopped)."""
        return len(self._buffer) > 0

    def take(self) -> bytes | None:
        """The next whole frame's bytes, or None until one has fully arrived."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (size,) = struct.unpack_from("!i", buffer)
        start = 4
        if size == -1:
            if len(buffer) < 12:
                return None
            (size,) = struct.unpack_from("!Q", buffer, 4)
            start = 12
        if size < 0:  # no worker of ours writes that: an empty frame, which cannot be unpickled
            del buffer[:4]
            return b""
        end = start + size
        if len(buffer) < end:
            return None
        frame = bytes(buffer[start:end])
        del buffer[:end]
        return frame


def unpickle(frame: bytes) -> object:
    """The message a frame holds; a ``Failure`` saying why if it cannot be read (an agent's
    process may write anything, and unpickling may call anything: ``SystemExit`` too is
    caught, or it would end the manager thread)."""
    try:
        return ForkingPickler.loads(frame)
    except (Exception, SystemExit) as exc:
        return Failure(error=f"Worker sent an unreadable message: {type(exc).__name__}: {exc}")


def readable(fd: int) -> bool:
    """Whether ``fd`` has something to read (or its end) now, without reading it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
