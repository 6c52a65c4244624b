"""Prometheus metrics and operator logs of a real ``motus serve`` process.

One keyed server (an admin key, a read-only key, ``--metrics-port`` and ``--log-format
json``) runs a scripted flow: an echo turn, an approval interrupt and its resume, a long
poll, an event stream, webhooks that arrive and fail. After each step the metrics must have
moved exactly as the step says; at the end the log must be JSON line by line, carry the
request ids the responses echoed, and hold no key, token or payload.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from motus.serve.logs import printable, request_id_from
from tests.conftest import Server, free_port, wait_until
from tests.unit.serve.test_webhooks import Receiver

ADMIN_SECRET = "adm-" + uuid.uuid4().hex
READ_SECRET = "rd-" + uuid.uuid4().hex
WEBHOOK_TOKEN = "wh-" + uuid.uuid4().hex
PAYLOAD = "payload-" + uuid.uuid4().hex  # the message content, and so the interrupt's tool_args
RESUME_VALUE = "resume-" + uuid.uuid4().hex
QUERY_SECRET = "query-" + uuid.uuid4().hex

ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}
READER = {"Authorization": f"Bearer {READ_SECRET}"}


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by (name, sorted labels); the text must parse whole."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


class Scraper:
    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers = url, headers or {}

    def __call__(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        response = requests.get(self.url, headers=self.headers, timeout=10)
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/plain"), response.headers
        return parse(response.text)


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not in the scrape: {sorted(k for k in samples if k[0].startswith(name))}"
    return samples[key]


def moved(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def test_metrics_and_json_logs_follow_a_scripted_session(start_server, receiver: Receiver) -> None:
    metrics_port = free_port()
    server = start_server(
        "tests.agents:dispatch", "--workers", "2", "--log-format", "json", "--metrics-port", str(metrics_port),
        "--api-key", f"admin={ADMIN_SECRET}", "--api-key", f"reader={READ_SECRET}:read",
    )
    admin = server.with_headers(ADMIN)

    # -- who may read /metrics --------------------------------------------------------------
    refused = requests.get(server.url + "/metrics", timeout=10)
    assert refused.status_code == 401, refused.text
    assert requests.get(server.url + "/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    scrape = Scraper(server.url + "/metrics", READER)  # the read-only key may read them
    unauthenticated = Scraper(f"http://127.0.0.1:{metrics_port}/metrics")  # --metrics-port: no key asked
    start = scrape()
    assert {name for name, _ in unauthenticated()} == {name for name, _ in start}  # the same metrics on both
    assert value(start, "motus_compute_slots") == 2
    wait_until(lambda: value(scrape(), "motus_worker_processes_warm") >= 1, timeout=20, what="a warm worker process")
    start = scrape()
    assert value(start, "motus_worker_start_seconds_count") >= 1
    assert value(start, "motus_worker_processes") >= value(start, "motus_worker_processes_warm") >= 1
    for outcome in ("idle", "error", "timeout", "cancelled", "exited", "deleted"):
        assert value(start, "motus_turns_ended_total", outcome=outcome) == 0
    assert not [key for key in start if "session" in dict(key[1])]  # no label takes a session id

    # -- an echo turn ----------------------------------------------------------------------
    session_id = admin.create_session()
    response = server.with_headers({**ADMIN, "X-Request-Id": "echo-turn.1"}).post(
        f"/sessions/{session_id}/messages", json={"content": f"echo {PAYLOAD}"})
    assert response.status_code == 202 and response.headers["X-Request-Id"] == "echo-turn.1"
    assert admin.wait_for_status(session_id, "idle")["response"]["content"] == f"echo: {PAYLOAD}"
    after_echo = scrape()
    assert moved(start, after_echo, "motus_turns_started_total") == 1
    assert moved(start, after_echo, "motus_turns_ended_total", outcome="idle") == 1
    assert moved(start, after_echo, "motus_turns_ended_total", outcome="error") == 0
    assert moved(start, after_echo, "motus_turn_duration_seconds_count", outcome="idle") == 1
    assert moved(start, after_echo, "motus_turn_duration_seconds_sum", outcome="idle") > 0
    assert moved(start, after_echo, "motus_interrupts_total") == 0
    assert value(after_echo, "motus_turns_live") == 0
    assert value(after_echo, "motus_compute_slots_in_use") == 0
    assert moved(start, after_echo, "motus_store_operation_seconds_count", operation="save") >= 3  # create, start, end
    sent = ("motus_http_requests_total", (("endpoint", "motus_api.send_message"), ("method", "POST"), ("status", "202")))
    assert sent not in start and after_echo[sent] == 1  # a series appears with its first request

    # -- a long poll on the inbox, answered by an approval interrupt ------------------------------
    polled: list[requests.Response] = []
    poll = threading.Thread(target=lambda: polled.append(
        requests.get(server.url + "/interrupts", params={"wait": "true", "timeout": 30}, headers=ADMIN, timeout=40)))
    poll.start()
    try:
        wait_until(lambda: value(scrape(), "motus_long_polls_open") == 1, what="the long poll in the gauge")
        admin.send(session_id, f"approval {PAYLOAD}")
        interrupted = admin.wait_for_status(session_id, "interrupted")
    finally:
        poll.join(40)
    assert polled and polled[0].status_code == 200 and len(polled[0].json()) == 1
    waiting = scrape()
    assert value(waiting, "motus_long_polls_open") == 0
    assert moved(after_echo, waiting, "motus_turns_started_total") == 1
    assert moved(after_echo, waiting, "motus_interrupts_total") == 1
    assert value(waiting, "motus_interrupts_pending") == 1
    assert value(waiting, "motus_interrupts_parked") == 0
    assert value(waiting, "motus_turns_live") == 1
    assert value(waiting, "motus_compute_slots_in_use") == 0  # waiting on a person holds no slot
    assert sum(v for k, v in waiting.items() if k[0] == "motus_turns_ended_total") == sum(
        v for k, v in after_echo.items() if k[0] == "motus_turns_ended_total")

    # -- the resume -------------------------------------------------------------------------------
    interrupt_id = interrupted["interrupts"][0]["interrupt_id"]
    resumed = admin.post(f"/sessions/{session_id}/resume",
                         json={"interrupt_id": interrupt_id, "value": {"approved": True, "note": RESUME_VALUE}})
    assert resumed.status_code == 200, resumed.text
    assert "approved=True" in admin.wait_for_status(session_id, "idle")["response"]["content"]
    done = scrape()
    assert moved(waiting, done, "motus_interrupt_wait_seconds_count", resolution="resume") == 1
    assert moved(waiting, done, "motus_interrupt_wait_seconds_count", resolution="timeout") == 0
    assert moved(waiting, done, "motus_interrupt_wait_seconds_sum", resolution="resume") > 0
    assert moved(waiting, done, "motus_turns_ended_total", outcome="idle") == 1
    assert moved(start, done, "motus_turn_duration_seconds_count", outcome="idle") == 2
    assert value(done, "motus_interrupts_pending") == 0
    assert value(done, "motus_turns_live") == 0
    assert moved(start, done, "motus_turns_started_total") == 2

    # -- an event stream ---------------------------------------------------------------------
    stream = requests.get(server.url + "/events", headers=READER, stream=True, timeout=30)
    try:
        assert stream.status_code == 200
        wait_until(lambda: value(scrape(), "motus_event_streams_open") == 1, what="the stream in the gauge")
    finally:
        stream.close()
    wait_until(lambda: value(scrape(), "motus_event_streams_open") == 0, timeout=15, what="the closed stream to leave the gauge")

    # -- webhooks: one delivered, one answered 500 ------------------------------------------------
    before_hooks = scrape()
    for path in ("/ok", "/status/500"):
        hooked = admin.create_session()
        admin.send(hooked, "echo hooked", webhook={"url": receiver.url(path), "token": WEBHOOK_TOKEN})
    wait_until(lambda: moved(before_hooks, scrape(), "motus_webhook_deliveries_total", outcome="delivered") == 1
               and moved(before_hooks, scrape(), "motus_webhook_deliveries_total", outcome="failed") == 1,
               timeout=20, what="both webhook outcomes counted")
    assert any(WEBHOOK_TOKEN in json.dumps(r.headers) for r in receiver.requests)  # it was sent

    # -- a delete ends a live turn as "deleted" ---------------------------------------------------
    doomed = admin.create_session()
    admin.send(doomed, "approval x")
    admin.wait_for_status(doomed, "interrupted")
    before_delete = scrape()
    assert admin.delete(f"/sessions/{doomed}").status_code == 204
    assert moved(before_delete, scrape(), "motus_turns_ended_total", outcome="deleted") == 1

    # -- request ids, and things that must never be logged ----------------------------------------
    insane = server.with_headers({**ADMIN, "X-Request-Id": "has space"}).get(f"/sessions/{session_id}")
    generated = insane.headers["X-Request-Id"]
    assert generated != "has space" and len(generated) == 32
    queried = server.with_headers({**ADMIN, "X-Request-Id": "with-query"}).get(
        f"/sessions/{session_id}/messages", params={"token": QUERY_SECRET})
    assert queried.status_code == 200
    assert server.stop() == 0

    lines = [line for line in server.log().splitlines() if line.strip()]
    entries = []
    for line in lines:
        entry = json.loads(line)  # every line is one JSON object
        assert isinstance(entry, dict) and {"time", "level", "logger", "message"} <= set(entry), line
        entries.append(entry)
    access = [entry for entry in entries if entry["logger"] == "motus.access"]
    by_id = {entry["request_id"]: entry for entry in access}
    echo_line = by_id["echo-turn.1"]
    assert echo_line["method"] == "POST" and echo_line["status"] == 202
    assert echo_line["path"] == f"/sessions/{session_id}/messages" and echo_line["session_id"] == session_id
    assert isinstance(echo_line["duration_ms"], float) and echo_line["duration_ms"] >= 0
    assert by_id[generated]["status"] == 200 and by_id[generated]["session_id"] == session_id
    assert by_id["with-query"]["path"] == f"/sessions/{session_id}/messages"  # no query string
    created = [entry for entry in access if entry["method"] == "POST" and entry["path"] == "/sessions"]
    assert created and all(entry.get("session_id") for entry in created)  # the id it created
    assert [entry["status"] for entry in access if entry["path"] == "/metrics"][:2] == [401, 401]
    assert all("request_id" in entry and "duration_ms" in entry for entry in access)
    assert sum(1 for entry in access if entry["request_id"] == "echo-turn.1") == 1  # one line per request
    assert any(entry["logger"] == "gunicorn.error" for entry in entries)  # gunicorn's own lines are JSON too
    log = server.log()
    for secret in (ADMIN_SECRET, READ_SECRET, WEBHOOK_TOKEN, PAYLOAD, RESUME_VALUE, QUERY_SECRET):
        assert secret not in log, f"{secret[:4]}... is in the log"


def test_text_log_lines_carry_the_request_id(start_server) -> None:
    server = start_server("tests.agents:echo")
    response = server.with_headers({"X-Request-Id": "ping-7"}).get("/health")
    assert response.headers["X-Request-Id"] == "ping-7"
    session_id = server.create_session()
    wait_until(lambda: "request_id=ping-7" in server.log(), what="the access line")
    line = next(line for line in server.log().splitlines() if "request_id=ping-7" in line)
    assert "motus.access: GET /health 200" in line and " ms " in line
    wait_until(lambda: f"session_id={session_id}" in server.log(), what="the create line naming its session")
    # Without keys, /metrics is open like every other route.
    samples = parse(server.get("/metrics").text)
    assert value(samples, "motus_sessions") == 1


def test_metrics_port_must_differ_from_the_port(tmp_path) -> None:
    from tests.conftest import launch

    port = free_port()
    process = launch(["serve", "start", "tests.agents:echo", "--port", str(port), "--metrics-port", str(port)], tmp_path / "same.log")
    assert process.wait(30) == 2
    assert "--metrics-port must differ from --port" in (tmp_path / "same.log").read_text()


def test_request_ids_are_taken_only_when_sane() -> None:
    assert request_id_from("abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    for bad in (None, "", "a b", "x" * 129, "id\r\nX-Evil: 1", "ünïcode", "semi;colon"):
        generated = request_id_from(bad)
        assert generated != bad and len(generated) == 32 and int(generated, 16) >= 0
    assert request_id_from("x" * 128) == "x" * 128
    assert printable("/sessions/a\nfake line") == "/sessions/a\\nfake line"
    assert printable("p" * 300).endswith("...") and len(printable("p" * 300)) == 259


def test_each_server_counts_apart() -> None:
    """Two servers in one process: their own registries, nothing shared."""
    from motus.serve.server import AgentServer

    first, second = AgentServer("tests.agents:echo", store="memory"), AgentServer("tests.agents:echo", store="memory")
    try:
        first.metrics.turn_started()
        first.metrics.turn_ended("idle", 0.01)
        first_samples = parse(first.metrics.render()[0].decode())
        second_samples = parse(second.metrics.render()[0].decode())
        assert value(first_samples, "motus_turns_started_total") == 1
        assert value(second_samples, "motus_turns_started_total") == 0
        assert value(first_samples, "motus_turn_duration_seconds_count", outcome="idle") == 1
        assert value(second_samples, "motus_worker_processes") == 0  # not started: no pool
    finally:
        first.shutdown()
        second.shutdown()


def test_the_sessions_held_in_memory_are_counted_apart_from_those_in_the_store(start_server, tmp_path) -> None:
    """With ``--session-cache 1`` the store has every session and memory one; one waiting on
    a person with its process must stay in memory too, beyond the cache."""
    server = start_server(
        "tests.agents:dispatch", "--workers", "2", "--store", f"sqlite:///{tmp_path / 'store.sqlite3'}",
        "--session-cache", "1", "--park-after", "never",
    )
    scrape = Scraper(server.url + "/metrics")
    waiting = server.create_session()
    server.send(waiting, "approval x")
    server.wait_for_status(waiting, "interrupted")
    for _ in range(3):
        server.create_session()
    samples = scrape()
    assert value(samples, "motus_sessions") == 4
    assert value(samples, "motus_sessions_in_memory") == 2  # the waiting one, and the newest


def test_parked_interrupts_and_failed_turns_are_counted(start_server, tmp_path) -> None:
    server = start_server(
        "tests.agents:dispatch", "--workers", "2", "--store", f"sqlite:///{tmp_path / 'store.sqlite3'}", "--park-after", "0",
    )
    scrape = Scraper(server.url + "/metrics")
    start = scrape()
    session_id = server.create_session()
    server.send(session_id, "approval x")
    server.wait_for_status(session_id, "interrupted")
    parked = wait_until(lambda: (lambda s: s if value(s, "motus_turns_parked") == 1 else None)(scrape()),
                        what="the waiting turn to be parked")
    assert value(parked, "motus_interrupts_parked") == 1 and value(parked, "motus_interrupts_pending") == 1
    assert value(parked, "motus_turns_live") == 0
    assert moved(start, parked, "motus_store_operation_seconds_count", operation="save") >= 3  # create, start, interrupt
    assert moved(start, parked, "motus_store_errors_total", operation="save") == 0

    crashed = server.create_session()
    server.send(crashed, "crash now")
    server.wait_for_status(crashed, "error")
    after = scrape()
    assert moved(start, after, "motus_turns_ended_total", outcome="error") == 1
    assert moved(start, after, "motus_turns_ended_total", outcome="idle") == 0
    assert value(after, "motus_interrupts_parked") == 1  # the parked one still waits
