"""An agent's process writes interrupts and journal records of its own to the worker's pipe.

Before, a message the server failed to apply (other than a turn's outcome) raised in the
pool's manager thread, was logged as "pool listener failed" and dropped. The worker then
waited for an answer or an ``Ack`` that never came: the session stayed ``running`` with its
compute slot until the turn's timeout, if it had one (and a malformed record could even
replace a pending interrupt in the journal). Now a malformed message ends its turn in error
with one line that says what was wrong, the process is stopped, and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Server, wait_until

FORGER = "tests.agents.forged_message:forger"

CASES = {
    "interrupt-payload": "interrupt: its payload is not a dict (int)",
    "interrupt-id": "interrupt: its id is not a non-empty str",
    "interrupt-not-json": "interrupt: it is not JSON: TypeError: Object of type set is not JSON serializable",
    "interrupt-timeout": "interrupt: its timeout is not a finite number of seconds > 0",
    "record-none": "record: its entry is not a JournalEntry (NoneType)",
    "record-kind": "record: its kind is not one a worker records ('interrupt')",
    "record-fields": "record: it sets fields only the server sets (an interrupt's)",
    "record-over-interrupt": "record: its seq is the interrupt ",
}


def settled(server: Server, sid: str, timeout: float = 8.0) -> dict:
    """The session once it is neither ``running`` nor ``interrupted`` (the agent waits 30 s
    after its forgery, so a server that let the turn go on fails here)."""

    def check() -> dict | None:
        body = server.wait(sid, timeout=1)
        return body if body["status"] not in ("running", "interrupted") else None

    return wait_until(check, timeout=timeout, what=f"session {sid} to end its turn")  # type: ignore[return-value]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_forged_interrupt_or_record_ends_only_its_own_turn(start_server: Callable[..., Server], tmp_path: Path, store: str) -> None:
    url = "memory" if store == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    server = start_server(FORGER, "--workers", "1", "--store", url)
    bystander = server.create_session()
    for kind, why in CASES.items():
        sid = server.create_session()
        server.send(sid, f"forge {kind}")
        body = settled(server, sid)
        assert body["status"] == "error", (kind, body)
        assert body["error"].startswith(f"Worker sent a malformed {why}") and "\n" not in body["error"], (kind, body)
        assert not body["interrupts"], (kind, body)
        assert server.get(f"/sessions/{sid}/messages").json() == [], kind  # the history as it was
        # The only compute slot was given back: another session's turn runs.
        server.send(bystander, kind)
        assert server.wait_for_status(bystander, "idle")["response"]["content"] == f"done: {kind}"
        # And the forging session takes a new message.
        server.send(sid, "again")
        assert server.wait_for_status(sid, "idle")["response"]["content"] == "done: again"
    log = server.log()
    assert "Traceback" not in log and "pool listener failed" not in log, log
    assert server.stop() == 0  # the stopped workers are gone, and a graceful stop is not kept waiting
