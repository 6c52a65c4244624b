"""Copies of one answer for the alike long polls it also answers (``MotusWorker._answer_alike``).

Held long polls woken by one publish whose requests are the same bytes (one inbox query by
thousands of approvers) are served once; each of the others gets a copy of that answer with
a request id of its own. Owns ``Copies`` (one answer and what each copy needs),
``send_copies`` and ``COPY_SENDERS``, the threads that run it.

Why threads: a ``send`` to a loopback socket costs ~17 us in the kernel (it delivers to the
reader inside the call), with the GIL released. From the main loop alone, 5,000 copies took
~145 ms of its time, during which it served nobody. The main loop now prepares each batch
(``Copies.prepare``: the body, the ticket, the count: all the Python work) and hands it to
a sender, which only makes the system calls (a sender doing the Python work too queued for
the GIL behind the main loop, and the broadcast got slower, not faster); the main loop keeps
each connection alive once its batch comes back.

Guarantees: each copy is a whole answer of its own (its request id: the client's own when it
sent one, else a fresh one of the same length), counted in the metrics and logged as its own
request; every byte not yet sent is counted in the worker's total (``Budget``), as any answer
the main loop holds. Threads: ``send_copies`` runs on a sender (or on the main loop, for a
few copies) and touches only its batch's sockets, whose connections are in no table of the
main loop until the results come back to it; everything else runs on the main loop.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from motus.serve.gunicorn.answer import MAX_HELD_ANSWER, Budget
from motus.serve.gunicorn.private import socket_of
from motus.serve.logs import REQUEST_ID_HEADER, log_answers

#: Threads that send copies, made at the first broadcast large enough to need them.
COPY_SENDERS = 2
#: Copies a sender sends before handing them back to the main loop; a broadcast to fewer
#: is sent by the main loop itself.
COPIES_PER_BATCH = 128

#: ``send_copies``'s result for a copy whose client is gone.
GONE = -1

_REQUEST_ID_FIELD = b"\r\n" + REQUEST_ID_HEADER.lower().encode() + b":"


def request_id_in(answer: bytes | bytearray) -> tuple[bytes | None, int]:
    """The request id an answer's head carries, and where its value starts (None, -1 if
    it has none)."""
    head_end = answer.find(b"\r\n\r\n")
    head = bytes(answer[:head_end if head_end >= 0 else len(answer)]).lower()
    at = head.find(_REQUEST_ID_FIELD)
    if at < 0:
        return None, -1
    start = at + len(_REQUEST_ID_FIELD)
    while start < len(head) and head[start] in b" \t":
        start += 1
    end = head.find(b"\r\n", start)
    end = len(head) if end < 0 else end
    return bytes(answer[start:end]).rstrip(b" \t"), start


class Copies:
    """One answer (``copy``, as the first request's thread wrote it) to send to alike waiting
    requests; ``counted``: the worker's total already counts ``len(copy)`` bytes for each."""

    def __init__(self, worker: Budget, app: Any, copy: bytes, answered: Any, counted: bool) -> None:
        self.worker = worker
        self.app = app
        self.copy = copy
        self.answered = answered
        self.counted = counted
        self.request_id, self.at = request_id_in(copy)

    def body_for(self, request: bytes) -> tuple[bytes, str]:
        """The copy for one request, and its request id: the client's own if the request
        carries the same one as the first (its bytes are the same), else a fresh one."""
        own = self.request_id
        if own is None:
            return self.copy, ""
        if own not in request:  # the server chose the first one's
            own = os.urandom(len(own) // 2).hex().encode()
            return self.copy[:self.at] + own + self.copy[self.at + len(own):], own.decode()
        return self.copy, own.decode()

    def prepare(self, conns: list[Any]) -> tuple[list[tuple[Any, bytes]], list[Any]]:
        """Main loop: each connection's copy, counted in the metrics and logged as its
        request's answer (``(conn, body)`` each), and the connections whose copy is more than
        the worker may hold now (each to be served again on a thread of its own, which writes
        a large answer itself)."""
        ids: list[str] = []
        ready: list[tuple[Any, bytes]] = []
        refused: list[Any] = []
        for conn in conns:
            body, own = self.body_for(conn.motus_rerun)
            if not self.counted and (len(body) > MAX_HELD_ANSWER or not self.worker.hold_bytes(len(body))):
                refused.append(conn)
                continue
            conn.motus_rerun = None
            ticket, conn.motus_ticket = conn.motus_ticket, None
            ticket.cancel()
            ids.append(own)
            ready.append((conn, body))
        log_answers(self.app, self.answered, ids, None, alike=True)
        return ready, refused


def send_copies(ready: list[tuple[Any, bytes]]) -> list[tuple[Any, int, int]]:
    """A copy sender (or the main loop, for a few): send each copy once, without waiting:
    ``(conn, size, sent)``, ``sent`` being the bytes the socket took (the rest is left in
    ``conn.motus_unsent``) or ``GONE``. Only the system call runs here, with the GIL
    released: the Python work of a copy is the main loop's (``prepare``), so the senders do
    not queue for the GIL behind it."""
    results: list[tuple[Any, int, int]] = []
    for conn, body in ready:
        try:
            sent = socket_of(conn).send(body)  # non-blocking while held
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            sent = GONE
        if 0 <= sent < len(body):
            conn.motus_unsent = body[sent:]
        results.append((conn, len(body), sent))
    return results


def senders() -> ThreadPoolExecutor:
    """The copy senders (``COPY_SENDERS`` threads, named ``motus-copies`` where ``ps -L``
    and ``top -H`` show them)."""
    return ThreadPoolExecutor(COPY_SENDERS, thread_name_prefix="motus-copies", initializer=_name_thread)


def _name_thread() -> None:
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write("motus-copies")
    except OSError:
        pass  # not Linux: the name is only for people looking at threads
