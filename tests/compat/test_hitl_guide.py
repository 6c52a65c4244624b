"""The human-in-the-loop guide's flows, driven the way the reference's own integration test
drives them: a server built with ``AgentServer(agent_fn=...)`` in a fixture, a real HTTP
server, plain ``requests``. Only the fixture is ours (a real server process instead of
uvicorn in a thread); the helpers and the assertions are written as a reference user would
write them, and long polls stand in for the reference's sleeps.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import requests

from tests.compat.agents import QUESTION
from tests.compat.conftest import python_servers
from tests.conftest import wait_until

SERVE = ("-m", "tests.compat.serve_agent_fn")


@pytest.fixture(scope="module")
def running_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``AgentServer(agent_fn=guide_agent, max_workers=2, timeout=30.0, ttl=0)``, served over HTTP."""
    with python_servers(tmp_path_factory.mktemp("compat-hitl")) as start:
        yield start(*SERVE).url


# -- helpers, as the reference's test writes them ---------------------------------------------


def _create_session(base_url: str) -> str:
    resp = requests.post(f"{base_url}/sessions", timeout=5.0)  # no body at all, as the reference sends it
    assert resp.status_code == 201, f"create_session failed: {resp.text}"
    assert resp.headers["Location"] == f"/sessions/{resp.json()['session_id']}"
    return resp.json()["session_id"]


def _send_message(base_url: str, session_id: str, content: str) -> dict:
    resp = requests.post(f"{base_url}/sessions/{session_id}/messages", json={"role": "user", "content": content}, timeout=5.0)
    assert resp.status_code == 202, f"send_message failed: {resp.text}"
    assert resp.json() == {"session_id": session_id, "status": "running"}
    return resp.json()


def _wait_for(base_url: str, session_id: str, status: str, max_wait: float = 20.0) -> dict:
    """Long-poll until the session is in ``status``; fail on an unexpected ``error``."""
    deadline = time.monotonic() + max_wait
    while True:
        resp = requests.get(f"{base_url}/sessions/{session_id}", params={"wait": "true", "timeout": "2"}, timeout=10.0)
        assert resp.status_code == 200, resp.text
        data = resp.json()
        if data["status"] == status:
            return data
        if data["status"] == "error" and status != "error":
            pytest.fail(f"Expected {status}, got error: {data}")
        if time.monotonic() > deadline:
            pytest.fail(f"Session never reached {status}: {data}")


def _resume(base_url: str, session_id: str, interrupt_id: str, value: object) -> requests.Response:
    return requests.post(
        f"{base_url}/sessions/{session_id}/resume", json={"interrupt_id": interrupt_id, "value": value}, timeout=5.0
    )


def _start(base_url: str, content: str) -> tuple[str, dict]:
    session_id = _create_session(base_url)
    _send_message(base_url, session_id, content)
    return session_id, _wait_for(base_url, session_id, "interrupted")


# -- the guide's flows ---------------------------------------------------------------------------


def test_infrastructure_smoke(running_server: str) -> None:
    resp = requests.get(f"{running_server}/health", timeout=5.0)
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok" and resp.json()["max_workers"] == 2


def test_tool_approval_happy_path(running_server: str) -> None:
    session_id, data = _start(running_server, "please delete the file")
    [item] = data["interrupts"]
    assert item["type"] == "tool_approval"
    assert item["payload"] == {"type": "tool_approval", "tool_name": "delete_file", "tool_args": {"path": "/tmp/test.txt"}}
    assert data["response"] is None and data["error"] is None

    resp = _resume(running_server, session_id, item["interrupt_id"], {"approved": True})
    assert resp.status_code == 200
    assert resp.json() == {"session_id": session_id, "status": "running"}

    final = _wait_for(running_server, session_id, "idle")
    assert final["response"]["content"] == "Deleted /tmp/test.txt"
    assert final["interrupts"] is None


def test_tool_approval_rejection(running_server: str) -> None:
    session_id, data = _start(running_server, "please delete the file")
    assert _resume(running_server, session_id, data["interrupts"][0]["interrupt_id"], {"approved": False}).status_code == 200
    final = _wait_for(running_server, session_id, "idle")
    # The model would read the rejection as the tool's error result, exactly these words.
    assert final["response"]["content"] == '{"error": "User rejected delete_file"}'
    assert "rejected" in final["response"]["content"].lower()


def test_ask_user_question_round_trip(running_server: str) -> None:
    session_id, data = _start(running_server, "please ask me a question")
    [item] = data["interrupts"]
    assert item["type"] == "user_input"
    assert item["payload"] == {"type": "user_input", "questions": [QUESTION]}

    assert _resume(running_server, session_id, item["interrupt_id"], "Option A").status_code == 200
    final = _wait_for(running_server, session_id, "idle")
    assert "chose" in final["response"]["content"].lower() and "Option A" in final["response"]["content"]


def test_ask_user_question_structured_answers(running_server: str) -> None:
    session_id, data = _start(running_server, "ask")
    answers = {"answers": {"Which option?": "B"}}
    assert _resume(running_server, session_id, data["interrupts"][0]["interrupt_id"], answers).status_code == 200
    final = _wait_for(running_server, session_id, "idle")
    assert final["response"]["content"] == 'You chose: {"answers": {"Which option?": "B"}}'


def test_custom_interrupt_primitive(running_server: str) -> None:
    session_id, data = _start(running_server, "color")
    [item] = data["interrupts"]
    assert item["type"] == "color_picker" and item["payload"]["presets"] == ["#FF6B6B", "#4ECDC4", "#FFE66D"]
    assert _resume(running_server, session_id, item["interrupt_id"], {"hex": "#4ECDC4"}).status_code == 200
    assert _wait_for(running_server, session_id, "idle")["response"]["content"] == "Using #4ECDC4 for the export."


def test_post_messages_409_during_interrupted(running_server: str) -> None:
    session_id, data = _start(running_server, "please delete the file")
    interrupt_id = data["interrupts"][0]["interrupt_id"]
    try:
        resp = requests.post(
            f"{running_server}/sessions/{session_id}/messages", json={"role": "user", "content": "another message"}, timeout=5.0
        )
        assert resp.status_code == 409, f"Expected 409 while interrupted, got {resp.status_code}: {resp.text}"
        assert "interrupted" in resp.json()["detail"]
    finally:
        _resume(running_server, session_id, interrupt_id, {"approved": True})
        _wait_for(running_server, session_id, "idle")
    # Once idle, the session takes a message again.
    _send_message(running_server, session_id, "hello")
    assert _wait_for(running_server, session_id, "idle")["response"]["content"] == "No action taken."


def test_resume_wrong_interrupt_id_returns_404(running_server: str) -> None:
    session_id, data = _start(running_server, "please delete the file")
    real_interrupt_id = data["interrupts"][0]["interrupt_id"]
    try:
        resp = _resume(running_server, session_id, "00000000-0000-0000-0000-000000000000", {"approved": True})
        assert resp.status_code == 404, f"Expected 404 for fake interrupt_id, got {resp.status_code}: {resp.text}"
        assert resp.json()["detail"]
    finally:
        assert _resume(running_server, session_id, real_interrupt_id, {"approved": True}).status_code == 200
        _wait_for(running_server, session_id, "idle")
    # Resumes are not idempotent: the second one is a 404 that says why.
    again = _resume(running_server, session_id, real_interrupt_id, {"approved": True})
    assert again.status_code == 404 and "Session not actively waiting for resume" in again.json()["detail"]


def test_refresh_shows_pending_interrupts(running_server: str) -> None:
    session_id, data = _start(running_server, "please delete the file")
    try:
        resp = requests.get(f"{running_server}/sessions/{session_id}", timeout=5.0)
        assert resp.status_code == 200
        refreshed = resp.json()
        assert refreshed["status"] == "interrupted"
        assert refreshed["interrupts"] == data["interrupts"]
        assert {"interrupt_id", "type", "payload"} <= set(refreshed["interrupts"][0])
    finally:
        _resume(running_server, session_id, data["interrupts"][0]["interrupt_id"], {"approved": True})
        _wait_for(running_server, session_id, "idle")


def test_concurrent_interrupts_resolve_in_any_order(running_server: str) -> None:
    session_id = _create_session(running_server)
    _send_message(running_server, session_id, "two gated calls at once")

    def both_pending() -> dict | None:
        data = requests.get(f"{running_server}/sessions/{session_id}", timeout=5.0).json()
        assert data["status"] in ("running", "interrupted"), data
        return data if data["status"] == "interrupted" and len(data["interrupts"]) == 2 else None

    data = wait_until(both_pending, timeout=20, what="both gated calls to be pending")
    by_path = {item["payload"]["tool_args"]["path"]: item["interrupt_id"] for item in data["interrupts"]}
    assert set(by_path) == {"a", "b"}

    first = _resume(running_server, session_id, by_path["b"], {"approved": True})
    assert first.status_code == 200 and first.json()["status"] == "interrupted"
    still = requests.get(f"{running_server}/sessions/{session_id}", timeout=5.0).json()
    assert still["status"] == "interrupted" and [i["interrupt_id"] for i in still["interrupts"]] == [by_path["a"]]
    assert _resume(running_server, session_id, by_path["b"], {"approved": True}).status_code == 404  # already resumed

    last = _resume(running_server, session_id, by_path["a"], {"approved": False})
    assert last.status_code == 200 and last.json()["status"] == "running"
    final = _wait_for(running_server, session_id, "idle")
    assert final["response"]["content"] == '{"error": "User rejected delete_file"} | Deleted b'


def test_unknown_session_is_404_everywhere(running_server: str) -> None:
    missing = str(uuid.uuid4())
    for method, path, body in [
        ("get", f"/sessions/{missing}", None),
        ("get", f"/sessions/{missing}/messages", None),
        ("post", f"/sessions/{missing}/messages", {"content": "hi"}),
        ("post", f"/sessions/{missing}/resume", {"interrupt_id": "x", "value": True}),
        ("delete", f"/sessions/{missing}", None),
    ]:
        resp = requests.request(method, running_server + path, json=body, timeout=5.0)
        assert resp.status_code == 404, (method, path, resp.text)
        assert missing in resp.json()["detail"]


# -- status codes and messages a reference client checks ----------------------------------------


def test_a_bad_return_value_names_the_shape(running_server: str) -> None:
    session_id = _create_session(running_server)
    _send_message(running_server, session_id, "wrong shape")
    error = _wait_for(running_server, session_id, "error")["error"]
    assert "Agent must return a (response, state) tuple, got str" in error
    assert "Agent returned str 'just a string'" in error  # and ours, which shows the value
    assert requests.get(f"{running_server}/sessions/{session_id}/messages", timeout=5.0).json() == []


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/sessions/{sid}/messages", b"", "body is required"),
        ("/sessions/{sid}/messages", b"{not json", "Malformed JSON"),
        ("/sessions/{sid}/messages", b"[1, 2]", "must be a JSON object, got list"),
        ("/sessions/{sid}/resume", b"null", "must be a JSON object, got NoneType"),
        ("/sessions/{sid}/resume", b'"text"', "must be a JSON object, got str"),
        ("/sessions/{sid}/resume", b"", "body is required"),
        ("/sessions", b"  \r\n ", "Malformed JSON"),
        ("/sessions/{sid}/messages", b'{"content": 5}', "content"),
    ],
)
def test_every_body_problem_is_a_422(running_server: str, path: str, body: bytes, needle: str) -> None:
    session_id = _create_session(running_server)
    before = requests.get(f"{running_server}/sessions", timeout=5.0).json()
    resp = requests.post(
        running_server + path.format(sid=session_id), data=body, headers={"Content-Type": "application/json"}, timeout=5.0
    )
    assert resp.status_code == 422, resp.text
    assert needle in resp.json()["detail"]
    assert requests.get(f"{running_server}/sessions", timeout=5.0).json() == before


def test_a_body_not_declared_json_is_still_415(running_server: str) -> None:
    session_id = _create_session(running_server)
    resp = requests.post(f"{running_server}/sessions/{session_id}/messages", data=b'{"content": "x"}', headers={"Content-Type": "text/plain"}, timeout=5.0)
    assert resp.status_code == 415 and "Content-Type" in resp.json()["detail"]
    assert requests.get(f"{running_server}/sessions/{session_id}", timeout=5.0).json()["status"] == "idle"


def test_custom_ids_off_is_405(running_server: str) -> None:
    resp = requests.put(f"{running_server}/sessions/{uuid.uuid4()}", json={}, timeout=5.0)
    assert resp.status_code == 405
    assert resp.json()["detail"].startswith("Custom session IDs are not enabled")
    assert "--allow-custom-ids" in resp.json()["detail"]


def test_custom_ids_accept_any_uuid_spelling(start_python_server) -> None:
    base_url = start_python_server(*SERVE, "--allow-custom-ids").url
    plain = uuid.uuid4()
    for spelled in (str(plain).upper(), uuid.uuid4().hex, uuid.uuid4().hex.upper(), str(uuid.uuid4())):
        resp = requests.put(f"{base_url}/sessions/{spelled}", timeout=5.0)
        assert resp.status_code == 201, resp.text
        assert resp.json()["session_id"] == spelled and resp.headers["Location"] == f"/sessions/{spelled}"
        _send_message(base_url, spelled, "hello")
        assert _wait_for(base_url, spelled, "idle")["response"]["content"] == "No action taken."
    assert requests.put(f"{base_url}/sessions/{str(plain).upper()}", json={}, timeout=5.0).status_code == 409
    for bad in ("not-a-uuid", "1234", str(plain) + "0"):
        resp = requests.put(f"{base_url}/sessions/{bad}", json={}, timeout=5.0)
        assert resp.status_code == 400, resp.text
        assert resp.json()["detail"].startswith("Session ID must be a valid UUID")
