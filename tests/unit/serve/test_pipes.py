"""``pipes.Frames``: a worker's messages taken out of what its pipe has delivered so far,
whole and in order, however the bytes were split, without ever waiting for more."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
import threading
from collections.abc import Iterator

import pytest

from motus.serve.pipes import Frames


@pytest.fixture
def pipe() -> Iterator[tuple[multiprocessing.connection.Connection, multiprocessing.connection.Connection]]:
    reader, writer = multiprocessing.Pipe(duplex=True)
    yield reader, writer
    reader.close()
    writer.close()


def drain(frames: Frames, reader: multiprocessing.connection.Connection) -> list[bytes]:
    taken = []
    while reader.poll(0):
        assert frames.read(reader.fileno())
        while (frame := frames.take()) is not None:
            taken.append(frame)
    return taken


def test_frames_written_by_a_connection_come_out_whole_and_in_order(pipe) -> None:  # type: ignore[no-untyped-def]
    reader, writer = pipe
    sent = [b"", b"x", b"y" * 16_385, pickle.dumps({"a": 1}), b"z" * 100_000]
    done = threading.Thread(target=lambda: [writer.send_bytes(data) for data in sent])
    done.start()
    frames, got = Frames(), []
    while len(got) < len(sent):
        reader.poll(5)
        got.extend(drain(frames, reader))
    done.join(5)
    assert got == sent


def test_a_frame_split_at_every_byte_is_taken_only_once_whole(pipe) -> None:  # type: ignore[no-untyped-def]
    reader, writer = pipe
    body = pickle.dumps(("a message", 1))
    raw = struct.pack("!i", len(body)) + body + struct.pack("!i", 1) + b"!"
    frames, got = Frames(), []
    for i in range(len(raw)):
        os.write(writer.fileno(), raw[i : i + 1])
        got.extend(drain(frames, reader))
        if i < 4 + len(body) - 1:
            assert got == [], i  # nothing until its last byte has come
    assert got == [body, b"!"]


def test_the_long_header_form_is_read(pipe) -> None:  # type: ignore[no-untyped-def]
    """Frames past 2 GiB are written as -1 and an 8-byte size; the same form for a small one
    must read the same."""
    reader, writer = pipe
    os.write(writer.fileno(), struct.pack("!i", -1) + struct.pack("!Q", 3) + b"abc")
    assert drain(Frames(), reader) == [b"abc"]


def test_the_end_of_the_pipe_is_said_and_a_half_frame_is_never_taken(pipe) -> None:  # type: ignore[no-untyped-def]
    reader, writer = pipe
    os.write(writer.fileno(), struct.pack("!i", 10) + b"12345")
    writer.close()
    frames = Frames()
    assert frames.read(reader.fileno()) and frames.take() is None
    assert not frames.read(reader.fileno())  # the end: nothing more will come
    assert frames.take() is None


def test_a_negative_size_is_an_empty_frame_that_cannot_be_unpickled(pipe) -> None:  # type: ignore[no-untyped-def]
    """No worker of ours writes one; ``Connection`` read it as an empty frame, so the turn
    ended as an unreadable message. Waiting for it to complete would hang the turn and keep
    everything written after it."""
    reader, writer = pipe
    os.write(writer.fileno(), struct.pack("!i", -2) + b"\0" * 100)
    frames = Frames()
    assert frames.read(reader.fileno())
    assert frames.take() == b""
