"""``motus.client`` against a real server: every endpoint, every error, whole turns."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from motus.client import (
    SKIP,
    APIError,
    Client,
    ClientError,
    Conflict,
    ConnectionFailed,
    HealthResponse,
    InterruptInfo,
    NotFound,
    SessionResponse,
    TurnFailed,
    TurnPaused,
    Unauthorized,
    Unavailable,
)
from motus.models import ChatMessage
from tests.agents.client import APPROVAL, CUSTOM, QUESTIONS
from tests.conftest import Server, refused_url, server_factory, wait_until
from tests.integration.client.stub_http import StubServer

AGENT = "tests.agents.client:hitl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("client")) as start:
        yield start(AGENT, "--workers", "2", "--allow-custom-ids")


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, timeout=10) as c:
        yield c


def test_health_create_list_get_messages_delete(client: Client) -> None:
    health = client.health()
    assert isinstance(health, HealthResponse) and health.status == "ok" and health.max_workers == 2

    session = client.create_session()
    assert session == SessionResponse(session_id=session.session_id, status="idle")
    assert session.session_id in {row.session_id for row in client.list_sessions()}
    assert client.get_session(session.session_id).status == "idle"
    assert client.get_messages(session.session_id) == []

    history = [ChatMessage.user_message("earlier"), {"role": "assistant", "content": "noted"}]
    preloaded = client.create_session(state=history)
    assert client.get_messages(preloaded.session_id) == [ChatMessage.user_message("earlier"), ChatMessage.assistant_message("noted")]
    [row] = [row for row in client.list_sessions() if row.session_id == preloaded.session_id]
    assert (row.total_messages, row.status) == (2, "idle")

    client.delete_session(session.session_id)
    with pytest.raises(NotFound) as caught:
        client.get_session(session.session_id)
    assert caught.value.status == 404 and session.session_id in caught.value.detail
    with pytest.raises(NotFound):
        client.delete_session(session.session_id)
    with pytest.raises(NotFound):
        client.get_messages(session.session_id)
    client.delete_session(preloaded.session_id)


def test_send_with_user_params_and_long_poll(client: Client) -> None:
    session_id = client.create_session().session_id
    accepted = client.send_message(session_id, "hello", user_params={"n": 3})
    assert (accepted.session_id, accepted.status) == (session_id, "running")
    done = client.wait(session_id)
    assert done.status == "idle"
    assert done.response == ChatMessage.assistant_message('got {"content": "hello", "user_params": {"n": 3}}')
    assert [m.content for m in client.get_messages(session_id)][0] == "hello"
    client.delete_session(session_id)


def test_custom_ids(client: Client) -> None:
    custom = str(uuid.uuid4())
    assert client.create_session(session_id=custom).session_id == custom
    with pytest.raises(Conflict) as caught:
        client.create_session(session_id=custom)
    assert caught.value.status == 409
    with pytest.raises(APIError) as bad:
        client.create_session(session_id="not-a-uuid")
    assert bad.value.status == 400 and bad.value.detail
    client.delete_session(custom)


def test_conflict_resume_and_interrupt_errors(client: Client) -> None:
    session_id = client.create_session().session_id
    client.send_message(session_id, "approve")
    paused = client.wait(session_id)
    assert paused.status == "interrupted"
    [item] = paused.interrupts or []
    assert (item.type, item.payload) == ("tool_approval", APPROVAL)

    with pytest.raises(Conflict) as caught:
        client.send_message(session_id, "again")
    assert caught.value.status == 409 and caught.value.detail
    with pytest.raises(NotFound):
        client.resume(session_id, "no-such-interrupt", True)
    resumed = client.resume(session_id, item.interrupt_id, {"approved": True})
    assert resumed.session_id == session_id and resumed.status in ("running", "idle")
    with pytest.raises(NotFound):
        client.resume(session_id, item.interrupt_id, {"approved": True})  # resumes are not idempotent
    assert client.wait(session_id).response.content == 'got {"approved": true}'
    with pytest.raises(NotFound):
        client.resume(str(uuid.uuid4()), item.interrupt_id, 1)
    client.delete_session(session_id)


def test_run_turn_answers_every_interrupt_type_once(client: Client) -> None:
    session_id = client.create_session().session_id
    seen: list[InterruptInfo] = []
    replies = {
        "tool_approval": {"approved": True},
        "user_input": {"answers": {"How would you like to organize the files?": "By date"}},
        "color_picker": {"hex": "#FFE66D"},
    }

    def answer(item: InterruptInfo) -> object:
        seen.append(item)
        if item.payload.get("tool_name") == "tool_b":
            return {"approved": False, "reason": "not b"}
        return replies[item.type]

    assert client.run_turn(session_id, "approve", answer).content == 'got {"approved": true}'
    reply = client.run_turn(session_id, "ask", answer)
    assert reply.content == 'got {"answers": {"How would you like to organize the files?": "By date"}}'
    assert client.run_turn(session_id, "custom", answer).content == 'got {"hex": "#FFE66D"}'
    reply = client.run_turn(session_id, "two", answer)
    assert reply.content == 'got [{"approved": true}, {"approved": false, "reason": "not b"}]'
    assert [item.payload for item in seen[:3]] == [APPROVAL, QUESTIONS, CUSTOM]
    assert sorted(item.payload["tool_name"] for item in seen[3:]) == ["tool_a", "tool_b"]
    assert len({item.interrupt_id for item in seen}) == len(seen) == 5
    assert client.run_turn(session_id, "plain", answer, user_params={"k": "v"}).content == 'got {"content": "plain", "user_params": {"k": "v"}}'
    client.delete_session(session_id)


def test_run_turn_raises_on_error_and_on_skip(client: Client) -> None:
    session_id = client.create_session().session_id
    with pytest.raises(TurnFailed) as failed:
        client.run_turn(session_id, "fail", lambda item: None)
    assert failed.value.session.status == "error"
    assert failed.value.detail.startswith("Traceback (most recent call last)")
    assert failed.value.detail.rstrip().endswith("ValueError: boom")

    asked: list[str] = []
    with pytest.raises(TurnPaused) as paused:
        client.run_turn(session_id, "custom", lambda item: asked.append(item.interrupt_id) or SKIP)
    assert paused.value.session.status == "interrupted" and len(asked) == 1
    # finish_turn on the paused session asks again and completes it.
    done = client.finish_turn(session_id, lambda item: "#000000")
    assert done.status == "idle" and done.response.content == 'got "#000000"'
    client.delete_session(session_id)


def test_long_polls_that_time_out_are_repeated(client: Client, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    session_id = client.create_session().session_id
    client.send_message(session_id, f"gate {gate}")
    assert client.get_session(session_id, wait=True, timeout=0.2).status == "running"

    polls: list[str] = []

    class OpeningClient(Client):
        """Lets the turn end only after a long poll came back with ``running``."""

        def get_session(self, session_id: str, wait: bool = False, timeout: float | None = None) -> SessionResponse:
            session = super().get_session(session_id, wait=wait, timeout=timeout)
            polls.append(session.status)
            if session.status == "running":
                gate.touch()
            return session

    with OpeningClient(client.base_url) as opening:
        done = opening.finish_turn(session_id, lambda item: None, poll_seconds=0.1)
    assert done.status == "idle" and done.response.content == 'got "opened"'
    assert polls[0] == "running" and polls[-1] == "idle"
    client.delete_session(session_id)


def test_session_deleted_during_the_turn(client: Client, server: Server) -> None:
    session_id = client.create_session().session_id

    def delete_then_answer(item: InterruptInfo) -> object:
        assert server.delete(f"/sessions/{session_id}").status_code == 204
        return {"approved": True}

    with pytest.raises(NotFound) as caught:
        client.run_turn(session_id, "approve", delete_then_answer)
    assert caught.value.status == 404


def test_an_answer_someone_else_gave_first_is_warned_about_not_dropped(client: Client, server: Server, caplog: pytest.LogCaptureFixture) -> None:
    """The person's callback answers after another client did: the resume is refused (404),
    ``run_turn`` logs a warning that the answer did not count, naming when the other answer
    was given, and returns the turn as that answer ended it."""
    session_id = client.create_session().session_id

    def answered_elsewhere_first(item: InterruptInfo) -> object:
        other = server.post(f"/sessions/{session_id}/resume", json={"interrupt_id": item.interrupt_id, "value": {"approved": False}})
        assert other.status_code == 200, other.text
        return {"approved": True}

    with caplog.at_level("WARNING", logger="motus.client.library"):
        reply = client.run_turn(session_id, "approve", answered_elsewhere_first)
    assert reply.content == 'got {"approved": false}'
    [warning] = [r for r in caplog.records if "did not count" in r.getMessage()]
    assert warning.levelname == "WARNING" and "it was already resumed at 20" in warning.getMessage(), warning.getMessage()


def test_server_not_there_and_going_away(tmp_path: Path) -> None:
    with refused_url() as url, Client(url, timeout=5) as client:
        for call in (client.health, client.create_session, client.list_sessions, lambda: client.get_session("x", wait=True)):
            with pytest.raises(ConnectionFailed) as caught:
                call()
            assert caught.value.status is None and str(caught.value) == f"Could not connect to {url}"

    with server_factory(tmp_path) as start:
        server = start(AGENT, "--shutdown-timeout", "1")
        with Client(server.url, timeout=5) as client:
            session_id = client.create_session().session_id

            def stop_server(item: InterruptInfo) -> object:
                server.stop()
                return {"approved": True}

            with pytest.raises(ConnectionFailed):
                client.run_turn(session_id, "approve", stop_server)


def test_session_limit_and_custom_ids_disabled(tmp_path: Path) -> None:
    with server_factory(tmp_path) as start:
        server = start(AGENT, "--max-sessions", "1")
        with Client(server.url) as client:
            client.create_session()
            with pytest.raises(Unavailable) as full:
                client.create_session()
            assert full.value.status == 503 and full.value.detail
            with pytest.raises(APIError) as disabled:
                client.create_session(session_id=str(uuid.uuid4()))
            assert disabled.value.status == 405


def test_api_key_is_sent_as_bearer_and_401_is_unauthorized() -> None:
    with StubServer(status=401, reply={"detail": "Invalid API key"}) as stub:
        with Client(stub.url, api_key="sekrit-key") as client:
            assert "sekrit" not in repr(client)
            with pytest.raises(Unauthorized) as caught:
                client.health()
        assert (caught.value.status, caught.value.detail) == (401, "Invalid API key")
        assert isinstance(caught.value, ClientError)
        assert stub.requests[0].headers["Authorization"] == "Bearer sekrit-key"
        with Client(stub.url) as anonymous, pytest.raises(Unauthorized):
            anonymous.list_sessions()
        assert "Authorization" not in stub.requests[1].headers


def test_error_bodies_that_are_not_json() -> None:
    with StubServer(status=502, reply="<html>bad gateway</html>") as stub, Client(stub.url) as client:
        with pytest.raises(APIError) as caught:
            client.health()
    assert caught.value.status == 502 and "bad gateway" in caught.value.detail
    with StubServer(status=200, reply={"unexpected": True}) as stub, Client(stub.url) as client:
        with pytest.raises(ClientError, match="unexpected HealthResponse"):
            client.health()


def test_webhook_options_reach_the_server(client: Client) -> None:
    with StubServer() as hook:
        session_id = client.create_session().session_id
        client.send_message(session_id, "hi", webhook={"url": hook.url + "/done", "token": "t0k", "include_messages": True})
        wait_until(lambda: hook.requests, timeout=20, what="the webhook")
    [call] = hook.requests
    assert call.path == "/done" and call.headers["Authorization"] == "Bearer t0k"
    assert call.body["session_id"] == session_id and call.body["status"] == "idle"
    assert [m["content"] for m in call.body["messages"]] == ["hi", 'got {"content": "hi", "user_params": null}']
    client.delete_session(session_id)
