"""API keys on every route, and the limits that keep one client from exhausting the server."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import requests

from tests.conftest import Server, wait_until
from tests.integration.serve.approvals.test_hitl import WebhookSink, interrupted, resume

KEY = "k-" + uuid.uuid4().hex
OLD_KEY = "old-" + uuid.uuid4().hex
TOKEN = "tok-" + uuid.uuid4().hex

ROUTES = [
    ("get", "/sessions"),
    ("post", "/sessions"),
    ("put", "/sessions/{sid}"),
    ("get", "/sessions/{sid}"),
    ("get", "/sessions/{sid}?wait=true&timeout=1"),
    ("delete", "/sessions/{sid}"),
    ("post", "/sessions/{sid}/messages"),
    ("get", "/sessions/{sid}/messages"),
    ("post", "/sessions/{sid}/resume"),
    ("get", "/openapi.json"),
    ("get", "/metrics"),
]


def authed(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import server_factory

    with server_factory(tmp_path_factory.mktemp("auth")) as start:
        yield start("tests.agents:dispatch", "--workers", "2", "--api-key", KEY, "--api-key", OLD_KEY, "--allow-custom-ids")


def snapshot(server: Server) -> list:
    sessions = requests.get(server.url + "/sessions", headers=authed(), timeout=10).json()
    return sorted((s["session_id"], s["status"], s["total_messages"]) for s in sessions)


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {KEY}", "Bearer ", f"Bearer {KEY}x"], ids=["none", "wrong", "basic-scheme", "empty", "key-plus-one"])
def test_every_route_needs_the_key(keyed: Server, method: str, path: str, header: str | None) -> None:
    sid = requests.post(keyed.url + "/sessions", json={}, headers=authed(), timeout=10).json()["session_id"]
    before = snapshot(keyed)
    headers = {"Authorization": header} if header is not None else {}
    url = keyed.url + path.format(sid=sid if "put" != method else str(uuid.uuid4()))
    response = requests.request(method, url, json={"content": "echo hi", "interrupt_id": "x"}, headers=headers, timeout=10)
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    detail = response.json()["detail"]
    assert "API key" in detail and KEY not in detail and OLD_KEY not in detail
    assert snapshot(keyed) == before


def test_health_is_public_and_both_keys_work(keyed: Server) -> None:
    assert requests.get(keyed.url + "/health", timeout=10).status_code == 200
    for key in (KEY, OLD_KEY):
        created = requests.post(keyed.url + "/sessions", json={}, headers=authed(key), timeout=10)
        assert created.status_code == 201
        sid = created.json()["session_id"]
        sent = requests.post(f"{keyed.url}/sessions/{sid}/messages", json={"content": "echo keyed"}, headers=authed(key), timeout=10)
        assert sent.status_code == 202
        body = requests.get(f"{keyed.url}/sessions/{sid}", params={"wait": "true", "timeout": 10}, headers=authed(key), timeout=20).json()
        assert body["response"]["content"] == "echo: keyed"
    document = requests.get(keyed.url + "/openapi.json", headers=authed(), timeout=10).json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_resume_needs_the_key_and_a_rejected_one_changes_nothing(keyed: Server) -> None:
    sid = requests.post(keyed.url + "/sessions", json={}, headers=authed(), timeout=10).json()["session_id"]
    requests.post(f"{keyed.url}/sessions/{sid}/messages", json={"content": "approval secret.txt"}, headers=authed(), timeout=10)
    session = requests.Session()
    session.headers.update(authed())
    [item] = interrupted(keyed.with_headers(authed()), sid)["interrupts"]
    refused = requests.post(f"{keyed.url}/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}}, timeout=10)
    assert refused.status_code == 401
    assert session.get(f"{keyed.url}/sessions/{sid}", timeout=10).json()["status"] == "interrupted"
    accepted = session.post(f"{keyed.url}/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}}, timeout=10)
    assert accepted.status_code == 200


def test_keys_and_tokens_never_reach_the_log(start_server) -> None:
    server = start_server("tests.agents:dispatch", "--workers", "1", "--log-level", "debug", env={"MOTUS_API_KEY": f"{KEY},{OLD_KEY}"})
    sink = WebhookSink()
    try:
        session = requests.Session()
        session.headers.update(authed(OLD_KEY))
        sid = session.post(server.url + "/sessions", json={}, timeout=10).json()["session_id"]
        session.post(f"{server.url}/sessions/{sid}/messages", json={"content": "crash", "webhook": {"url": sink.url, "token": TOKEN}}, timeout=10)
        [call] = sink.wait_for(1)
        assert call["authorization"] == f"Bearer {TOKEN}"
        session.post(f"{server.url}/sessions/{sid}/messages", json={"content": "echo", "webhook": {"url": "http://127.0.0.1:9/x", "token": TOKEN}}, timeout=10)
        requests.get(server.url + "/sessions", headers=authed("bad-" + KEY), timeout=10)
        body = session.get(f"{server.url}/sessions/{sid}", params={"wait": "true", "timeout": 10}, timeout=20).json()
        assert TOKEN not in str(body)
    finally:
        sink.close()
    server.stop()
    log = server.log()
    assert KEY not in log and OLD_KEY not in log and TOKEN not in log


def test_non_loopback_bind_without_key_warns(start_server) -> None:
    server = start_server("tests.agents:echo", "--workers", "1", "--host", "0.0.0.0")
    assert "without an API key" in server.log() and "--api-key" in server.log()
    keyed = start_server("tests.agents:echo", "--workers", "1", "--host", "0.0.0.0", "--api-key", KEY)
    assert "without an API key" not in keyed.log()


#: One server for the request-size and the long-poll caps: each test works on its own session.
CAPPED = ("tests.agents:dispatch", "--workers", "1", "--max-request-bytes", "4096", "--max-wait", "0.5")


def test_request_body_limit(shared_server) -> None:
    server = shared_server(*CAPPED)
    sid = server.create_session()
    big = server.post(f"/sessions/{sid}/messages", json={"content": "x" * 5000})
    assert big.status_code == 413 and "4096" in big.json()["detail"]
    assert server.get(f"/sessions/{sid}").json()["status"] == "idle"
    # A resume value is limited only by the same cap: a 3 KB value goes through.
    server.send(sid, "approval p")
    [item] = interrupted(server, sid)["interrupts"]
    assert resume(server, sid, item["interrupt_id"], {"approved": True, "note": "y" * 3000}).status_code == 200
    server.wait_for_status(sid, "idle")


def test_long_poll_is_capped(shared_server) -> None:
    server = shared_server(*CAPPED)
    sid = server.create_session()
    server.send(sid, "hang")
    # Asks for five minutes; the server caps it, so this returns long before the read timeout.
    body = server.get(f"/sessions/{sid}", params={"wait": "true", "timeout": 300}, timeout=20).json()
    assert body["status"] == "running"
    server.delete(f"/sessions/{sid}")


def test_pending_interrupts_are_capped_per_turn(start_server) -> None:
    server = start_server("tests.agents:three_at_once", "--workers", "1", "--max-interrupts", "2")
    sid = server.create_session()
    server.send(sid, "go")
    body = server.wait_for_status(sid, "error")
    assert "RuntimeError: Too many pending interrupts" in body["error"]
    assert "--max-interrupts" in body["error"]


def test_past_the_long_poll_slots_a_wait_is_a_503_with_retry_after_and_the_client_backs_off(start_server) -> None:
    """``--threads 10 --max-streams 1 --max-waiting 0`` leaves one long-poll slot (10 threads, 8 kept for
    resumes and health checks, one for a stream). With it taken, another ``?wait=true`` is
    refused with 503 and ``Retry-After`` (an immediate 200 would invite a client polling in
    a loop to spin), and changes nothing; the Python client waits as told and asks again,
    and once its own poll's time is up reads the session without waiting."""
    from motus.client import Client

    # --max-waiting 0: no long poll is held without a thread (held ones: test_held_waits.py).
    server = start_server("tests.agents:dispatch", "--workers", "1", "--threads", "10", "--max-streams", "1", "--max-waiting", "0")
    held = server.create_session()
    server.send(held, "hang")
    holder: dict[str, requests.Response] = {}
    thread = threading.Thread(target=lambda: holder.setdefault("r", server.get(f"/sessions/{held}", params={"wait": "true", "timeout": 30}, timeout=40)))
    thread.start()
    try:
        other = server.create_session()

        def refused() -> list[requests.Response]:  # a list: a 503 Response is falsy itself
            response = server.get(f"/sessions/{other}", params={"wait": "true", "timeout": 0.05}, timeout=10)
            return [response] if response.status_code == 503 else []

        [response] = wait_until(refused, what="a long poll refused while the only slot is taken")  # type: ignore[misc]
        assert response.headers["Retry-After"] == "1", response.headers
        assert "--threads" in response.json()["detail"], response.text
        inbox = server.get("/interrupts", params={"wait": "true", "timeout": 0.05}, timeout=10)
        assert inbox.status_code == 503 and inbox.headers["Retry-After"] == "1", inbox.text
        assert server.get(f"/sessions/{other}").json()["status"] == "idle"  # a plain read still answers

        client = Client(server.url)
        try:
            started = time.monotonic()
            assert client.get_session(other, wait=True, timeout=1.5).status == "idle"
            assert time.monotonic() - started >= 1.0  # it waited as told rather than failing or spinning
            assert client.inbox(wait=True, timeout=0.5) == []
        finally:
            client.close()
    finally:
        assert server.delete(f"/sessions/{held}").status_code == 204  # ends the held long poll
        thread.join(20)
    assert not thread.is_alive() and holder["r"].status_code == 404  # it ended with its session


def test_past_the_stream_slots_the_client_waits_as_retry_after_says(start_server) -> None:
    """``--max-streams 1 --max-waiting 0`` (every stream on a thread): with the one slot taken
    a stream is a 503 with ``Retry-After: 5``. ``Client.events`` waits that long before it
    asks again, rather than its own back-off (0.4, 0.8, 1.6, 3.2 s: four refusals in those
    five seconds), and gets the stream once the slot is free."""
    from motus.client import Client

    server = start_server("tests.agents:dispatch", "--threads", "10", "--max-streams", "1", "--max-waiting", "0")
    holder = requests.get(server.url + "/events", stream=True, timeout=30)
    assert holder.status_code == 200
    sid = server.create_session()
    got: list[object] = []
    client = Client(server.url)
    stream = client.events(sid)
    reader = threading.Thread(target=lambda: got.append(next(stream)))
    try:
        reader.start()

        def refused() -> int:
            return server.log().count(f"GET /sessions/{sid}/events 503")

        wait_until(refused, what="the client's stream refused")
        holder.close()  # the slot is free once the server sees the hang-up
        reader.join(30)
        assert got and got[0].kind == "ready", got  # type: ignore[attr-defined]
        assert refused() == 1, server.log()[-2000:]
    finally:
        holder.close()
        stream.close()
        client.close()
        reader.join(10)
