"""Attacks on the memory a running server holds for many people at once: what it keeps of
past turns must be bounded in bytes, not only in count, or large answers of sessions already
deleted grow the serving process until the machine runs out."""

from __future__ import annotations

from tests.integration.serve.hardening.test_held_waits import serving_process

#: Growth of the serving process's RSS allowed over the run: the order of the worker's other
#: byte budgets (``answer.MAX_BUFFERED_TOTAL`` is 64 MiB), plus the allocator's slack.
ALLOWED_GROWTH_MB = 80
TURNS = 150
RESPONSE_BYTES = 1_000_000  # the echo agent answers with the message: 1 MB each


def test_large_answers_of_deleted_sessions_are_not_kept_in_memory(start_server) -> None:
    """150 sessions, one after another: each gets one message of 1 MB (echoed back, so the
    turn's ``message`` event is 1 MB), then is deleted. Nothing of them is in use any more.
    The store's ``RecentEvents`` (the newest events, held for the streams a change wakes)
    was bounded by a count (10,000, trimmed at twice that), whatever the events' size: this
    run grew the serving process by 164 MB, and at its cap it could hold 20,000 responses of
    up to 10 MB each. It is now bounded by bytes too (``RECENT_EVENT_BYTES``)."""
    server = start_server("tests.agents:dispatch", "--workers", "1")
    warm = server.create_session()
    server.send(warm, "echo warm")
    server.wait_for_status(warm, "idle")
    assert server.delete(f"/sessions/{warm}").status_code == 204
    worker = serving_process(server)
    before = worker.memory_info().rss
    body = "echo " + "y" * RESPONSE_BYTES
    for _ in range(TURNS):
        sid = server.create_session()
        assert server.send(sid, body).status_code == 202
        assert server.wait_for_status(sid, "idle", timeout=60)["status"] == "idle"
        assert server.delete(f"/sessions/{sid}").status_code == 204
    assert server.get("/health").json()["total_sessions"] == 0
    grown_mb = (worker.memory_info().rss - before) / 2**20
    assert grown_mb < ALLOWED_GROWTH_MB, (
        f"the serving process grew by {grown_mb:.0f} MB over {TURNS} turns of "
        f"{RESPONSE_BYTES // 1000} kB answers, every session deleted"
    )
