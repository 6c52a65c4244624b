"""Clients that read large answers are not turned away for those that do not: a thread
writing an answer itself takes one of the few places (``answer.DIRECT_WRITERS``) only while
its client takes nothing (an attack on the first version, where every such write took one:
the fifth of five people reading a 60 MB history was cut off, and with ``--threads 4`` the
second; four clients that never read it denied every large answer for ~240 s)."""

from __future__ import annotations

import threading
import time

import requests

from tests.conftest import wait_until
from tests.integration.serve.hardening.test_held_waits import (  # noqa: F401 - a fixture
    ARGS, Raw, answer_length, long_polls_open, opened, read_all, serving_process, unsent_bytes,
)


def test_alike_long_polls_of_an_answer_over_32_mib_that_read_each_get_it_whole(start_server, opened: list) -> None:
    """Three alike long polls of a 56 MiB answer (past ``MAX_HELD_ANSWER``), their clients
    reading at 16 MiB/s: each copy is served again on a thread that writes it itself, and
    ``--threads 4`` has one place. Each gets the answer whole: a client that reads takes no
    place (the first version cut two of the three off)."""
    server = start_server("tests.agents:dispatch", *ARGS, "--max-request-bytes", str(64 * 1024 * 1024))
    hanging, sid = server.create_session(), server.create_session()
    server.send(hanging, "hang")
    size = 56 * 1024 * 1024
    server.send(sid, "echo " + "x" * size)
    polls = [Raw(server, f"/sessions/{sid}?wait=true&timeout=120", rcvbuf=4096) for _ in range(3)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 3, what="every long poll waiting")
    assert server.delete(f"/sessions/{hanging}").status_code == 204
    out: dict = {}  # each client reads at 16 MiB/s (64 times ANSWER_MIN_RATE)
    readers = [threading.Thread(target=_slow_reader, args=(poll, 16 * 1024 * 1024, out, i, 120)) for i, poll in enumerate(polls)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    got = [out[i][0] for i in range(3)]
    whole = [len(buf) > size and len(buf) == answer_length(buf) for buf in got]
    assert all(whole), f"cut off although the client reads: {[len(buf) for buf in got]} bytes; " \
        f"log: {[l for l in server.log().splitlines() if 'closed' in l][-2:]}"


def _slow_reader(raw: Raw, rate: int, out: dict, key: int, timeout: float) -> None:
    buf = bytearray(raw.buf)
    wanted = None
    deadline = time.monotonic() + timeout
    start = time.monotonic()
    try:
        while time.monotonic() < deadline:
            raw.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = raw.sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            if wanted is None and b"\r\n\r\n" in buf[:65536]:
                wanted = answer_length(bytes(buf[:65536]))
            if wanted is not None and len(buf) >= wanted:
                break
            # pace: at most `rate` bytes a second
            ahead = len(buf) / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    except OSError as error:
        out[key] = (bytes(buf), wanted, repr(error))
        return
    out[key] = (bytes(buf), wanted, None)


def _big_history_server(start_server, *args: str):
    server = start_server("tests.agents:dispatch", "--max-request-bytes", str(80 * 1024 * 1024), *args)
    state = [{"role": "user", "content": "x" * 6000}] * 10_000  # a ~60 MB answer, past MAX_HELD_ANSWER
    created = server.post("/sessions", json={"state": state}, timeout=120)
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    length = len(server.get(f"/sessions/{sid}/messages", timeout=120).content)
    assert length > 32 * 1024 * 1024
    return server, sid, length


def _readers(server, sid, count: int, rate: int, timeout: float):
    raws = [Raw(server, f"/sessions/{sid}/messages", rcvbuf=65536) for _ in range(count)]
    out: dict = {}
    threads = [threading.Thread(target=_slow_reader, args=(raw, rate, out, i, timeout)) for i, raw in enumerate(raws)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return raws, out


def test_five_clients_that_read_a_history_over_32_mib_each_get_it_whole(start_server, opened: list) -> None:
    """Five people open a ~60 MB history at once (default ``--threads``: four places), each
    reading at 8 MiB/s. Each answer is written by its own thread (past ``MAX_HELD_ANSWER``),
    and each arrives whole (the first version cut the fifth off)."""
    server, sid, length = _big_history_server(start_server)
    raws, out = _readers(server, sid, 5, 8 * 1024 * 1024, 120)
    opened += raws
    complete = [out[i][1] is not None and len(out[i][0]) >= out[i][1] for i in range(5)]
    assert all(complete), f"cut off (bytes got of ~{length}): {[(len(out[i][0]), out[i][2]) for i in range(5)]}"


def test_two_clients_that_read_a_history_over_32_mib_on_four_threads_each_get_it_whole(start_server, opened: list) -> None:
    """``--threads 4`` (one place): two people open the same ~60 MB history, both reading at
    8 MiB/s; both get it whole (the first version cut the second off)."""
    server, sid, length = _big_history_server(start_server, "--threads", "4")
    raws, out = _readers(server, sid, 2, 8 * 1024 * 1024, 120)
    opened += raws
    complete = [out[i][1] is not None and len(out[i][0]) >= out[i][1] for i in range(2)]
    assert all(complete), f"cut off (bytes got of ~{length}): {[(len(out[i][0]), out[i][2]) for i in range(2)]}"


def test_four_clients_that_never_read_a_large_history_do_not_turn_away_one_that_reads(
    start_server, opened: list,
) -> None:
    """Four clients (default ``--threads``: the four places) ask for a ~60 MB history and
    read nothing: they take every place (for ``--read-timeout``, no longer: a thread gives up
    on a client that takes nothing that long). A client that reads at full speed then asks
    for the same history and gets it whole (the first version cut it off; the places were
    held ~240 s)."""
    server, sid, length = _big_history_server(start_server)
    stalled = [Raw(server, f"/sessions/{sid}/messages", rcvbuf=4096) for _ in range(4)]
    opened += stalled
    wait_until(lambda: all(unsent_bytes(server, raw) > 0 for raw in stalled), timeout=60, what="every stalled client served")
    raws, out = _readers(server, sid, 1, 1 << 40, 60)
    opened += raws
    got, wanted, error = out[0]
    assert wanted is not None and len(got) >= wanted, \
        f"a reading client got {len(got)} of ~{length} bytes ({error}) while 4 clients did not read"


def test_thirty_watchers_that_read_at_once_each_get_the_answer(start_server, opened: list) -> None:
    """30 people watch one session (alike long polls) and read their answers at once, as fast
    as loopback allows. The turn's response is 6 MB, so the worker's 64 MiB holds about ten
    copies at a time: the others wait for room while those are taken, and every one gets the
    answer (copies were counted before any was sent, and 19 of the 30 got a 503)."""
    server = start_server("tests.agents.hardening:slow_echo", "--threads", "4")
    sid = server.create_session()
    assert server.send(sid, "b" * 6_000_000).status_code == 202
    polls = [Raw(server, f"/sessions/{sid}?wait=true&timeout=120") for _ in range(30)]
    opened += polls
    wait_until(lambda: long_polls_open(server) == 30, what="every long poll held")
    got = read_all(polls, timeout=60)  # every client reads at once, as fast as it can
    statuses = [buf.split(b"\r\n", 1)[0] for buf in got]
    assert all(status.startswith(b"HTTP/1.1 200 ") for status in statuses), statuses
    assert all(len(buf) == answer_length(bytes(buf)) for buf in got), [len(buf) for buf in got]
