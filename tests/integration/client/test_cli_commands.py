"""``motus serve health|create|sessions|get|delete|messages|send`` against a real server.

Most calls run the click commands in-process (``CliRunner``) for speed; they still talk
HTTP to a real server. ``test_entry_point`` runs the installed entry point as a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from motus.cli import main
from tests.conftest import ROOT, Server, refused_url, server_env, server_factory, wait_until
from tests.integration.client.stub_http import StubServer

AGENT = "tests.agents.client:hitl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("cli")) as start:
        yield start(AGENT, "--workers", "2", "--allow-custom-ids")


def motus(*args: str, env: dict[str, str | None] | None = None, stdin: str | None = None) -> Result:
    runner = CliRunner(env={"MOTUS_API_KEY": None, **(env or {})})
    return runner.invoke(main, ["serve", *args], input=stdin, catch_exceptions=False)


def ok(*args: str, **kwargs: object) -> Result:
    result = motus(*args, **kwargs)  # type: ignore[arg-type]
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result


def failed(*args: str, code: int = 1, **kwargs: object) -> str:
    """Run a command that must fail; return its stderr (never a traceback)."""
    result = motus(*args, **kwargs)  # type: ignore[arg-type]
    assert result.exit_code == code, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr
    return result.stderr


def test_health(server: Server) -> None:
    lines = ok("health", server.url).stdout.splitlines()
    assert lines[0] == "status: ok" and "max_workers: 2" in lines
    data = json.loads(ok("health", server.url, "--json").stdout)
    assert data["status"] == "ok" and set(data) == {"status", "max_workers", "running_workers", "total_sessions", "store", "live_turns", "parked_turns", "open_streams"}


def test_session_lifecycle_in_text_and_json(server: Server) -> None:
    session_id = ok("create", server.url).stdout.strip()
    uuid.UUID(session_id)
    assert ok("messages", server.url, session_id).stdout == "No messages.\n"
    rows = json.loads(ok("sessions", server.url, "--json").stdout)
    assert {"session_id": session_id, "total_messages": 0, "status": "idle", "title": None} in rows
    table = ok("sessions", server.url).stdout.splitlines()
    assert table[0].split() == ["SESSION", "ID", "STATUS", "MESSAGES", "TITLE"]
    assert f"{session_id}  idle         0" in table

    assert ok("send", server.url, session_id, "hello").stdout == f"Message accepted; session {session_id} is running.\n"
    shown = ok("get", server.url, session_id, "--wait", "--timeout", "20").stdout
    assert shown == f'session_id: {session_id}\nstatus: idle\nresponse:\n  assistant: got {{"content": "hello", "user_params": null}}\n'
    body = json.loads(ok("get", server.url, session_id, "--json").stdout)
    assert body == {
        "session_id": session_id,
        "status": "idle",
        "response": {"role": "assistant", "content": 'got {"content": "hello", "user_params": null}'},
        "error": None,
        "interrupts": None,
    }

    out = ok("send", server.url, session_id, "again", "--wait", "--param", "n=2", "--param", "x=0.5", "--param", "on=false").stdout
    assert 'got {"content": "again", "user_params": {"n": 2, "on": false, "x": 0.5}}' in out
    assert ok("messages", server.url, session_id).stdout == (
        "user: hello\n"
        'assistant: got {"content": "hello", "user_params": null}\n'
        "user: again\n"
        '  user_params: {"n": 2, "x": 0.5, "on": false}\n'
        'assistant: got {"content": "again", "user_params": {"n": 2, "on": false, "x": 0.5}}\n'
    )
    stored = json.loads(ok("messages", server.url, session_id, "--json").stdout)
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[2]["user_params"] == {"n": 2, "x": 0.5, "on": False}

    accepted = json.loads(ok("send", server.url, session_id, "be brief", "--role", "system", "--json").stdout)
    assert accepted == {"session_id": session_id, "status": "running"}
    wait_until(lambda: json.loads(ok("get", server.url, session_id, "--json").stdout)["status"] == "idle", what="idle")
    assert json.loads(ok("messages", server.url, session_id, "--json").stdout)[4]["role"] == "system"

    assert ok("delete", server.url, session_id).stdout == f"Deleted session {session_id}\n"
    assert failed("get", server.url, session_id).startswith("Error: 404 Not Found: ")
    assert failed("delete", server.url, session_id).startswith("Error: 404 Not Found: ")
    assert failed("messages", server.url, session_id).startswith("Error: 404 Not Found: ")
    assert failed("send", server.url, session_id, "hi").startswith("Error: 404 Not Found: ")
    created = json.loads(ok("create", server.url, "--json").stdout)
    assert json.loads(ok("delete", server.url, created["session_id"], "--json").stdout) == {"session_id": created["session_id"], "deleted": True}


def test_create_with_state_and_custom_id(server: Server, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps([{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]))
    custom = str(uuid.uuid4())
    assert ok("create", server.url, "--id", custom, "--state", str(state)).stdout == custom + "\n"
    assert ok("messages", server.url, custom).stdout == "user: before\nassistant: ok\n"
    assert failed("create", server.url, "--id", custom).startswith("Error: 409 Conflict: ")
    assert failed("create", server.url, "--id", "nope").startswith("Error: 400 Bad Request: ")
    from_stdin = ok("create", server.url, "--state", "-", stdin='[{"role": "user", "content": "piped"}]').stdout.strip()
    assert ok("messages", server.url, from_stdin).stdout == "user: piped\n"
    state.write_text("{not json")
    assert "is not valid JSON" in failed("create", server.url, "--state", str(state), code=2)
    for session_id in (custom, from_stdin):
        ok("delete", server.url, session_id)


def test_interrupts_errors_and_waiting(server: Server, tmp_path: Path) -> None:
    session_id = ok("create", server.url).stdout.strip()
    paused = ok("send", server.url, session_id, "approve", "--wait").stdout
    assert "status: interrupted\ninterrupt " in paused and '"tool_name": "delete_file"' in paused
    body = json.loads(ok("get", server.url, session_id, "--json").stdout)
    assert body["interrupts"][0]["type"] == "tool_approval"
    assert failed("send", server.url, session_id, "hi").startswith("Error: 409 Conflict: ")
    ok("delete", server.url, session_id)

    session_id = ok("create", server.url).stdout.strip()
    result = motus("send", server.url, session_id, "fail", "--wait")
    assert result.exit_code == 1
    assert "status: error\nerror:\n  Traceback (most recent call last):" in result.stdout
    assert result.stdout.rstrip().endswith("ValueError: boom")

    gate = tmp_path / "open"
    assert "status: running" in ok("send", server.url, session_id, f"gate {gate}", "--wait", "--timeout", "0.2").stdout
    assert "status: running" in ok("get", server.url, session_id, "--wait", "--timeout", "0.1").stdout
    gate.touch()
    assert "status: idle" in ok("get", server.url, session_id, "--wait", "--timeout", "20").stdout
    ok("delete", server.url, session_id)


def test_the_inbox_says_how_to_answer_and_resume_answers(server: Server) -> None:
    """``motus serve inbox`` ends with how to answer what it lists; ``motus serve resume``
    answers one; a second answer is refused naming when the first came; VALUE must be JSON.
    The inbox's help names the real types (user_input, not ask_user_question); ``--limit``
    lists the oldest only."""
    assert "user_input (ask_user_question)" in ok("inbox", "--help").stdout
    session_id = ok("create", server.url).stdout.strip()
    ok("send", server.url, session_id, "approve", "--wait")
    listed = ok("inbox", server.url, "--type", "tool_approval").stdout
    [interrupt_id] = [item["interrupt_id"] for item in json.loads(ok("inbox", server.url, "--json").stdout) if item["session_id"] == session_id]
    assert f"Session {session_id}: approve\n  message at 20" in listed and ": approve\n  [tool_approval] approve " in listed
    assert f"    interrupt {interrupt_id}  since " in listed
    oldest = json.loads(ok("inbox", server.url, "--json", "--limit", "1").stdout)  # the oldest only (other tests' may wait too)
    assert len(oldest) == 1 and oldest == json.loads(ok("inbox", server.url, "--json").stdout)[:1]
    assert "Invalid value for '--limit'" in failed("inbox", server.url, "--limit", "0", code=2)
    assert listed.rstrip().endswith("or open the session in the chat: motus serve chat URL --session SESSION"), listed
    assert "motus serve resume URL SESSION INTERRUPT VALUE" in listed

    assert "not JSON" in failed("resume", server.url, session_id, interrupt_id, "{approved: true}", code=2)
    assert ok("resume", server.url, session_id, interrupt_id, '{"approved": true}').stdout == f"Answered; session {session_id} is running.\n"
    assert "status: idle" in ok("get", server.url, session_id, "--wait", "--timeout", "20").stdout
    late = failed("resume", server.url, session_id, interrupt_id, '{"approved": false}')
    assert late.startswith("Error: 404 Not Found: ") and "it was already resumed at 20" in late, late
    ok("delete", server.url, session_id)


def test_webhook_options(server: Server) -> None:
    session_id = ok("create", server.url).stdout.strip()
    with StubServer() as hook:
        ok("send", server.url, session_id, "hi", "--webhook-url", hook.url + "/hook", "--webhook-token", "t0k", "--webhook-include-messages")
        wait_until(lambda: hook.requests, timeout=20, what="the webhook")
    [call] = hook.requests
    assert call.headers["Authorization"] == "Bearer t0k"
    assert call.body["status"] == "idle" and len(call.body["messages"]) == 2
    ok("delete", server.url, session_id)


def test_usage_errors(server: Server) -> None:
    assert "KEY=VALUE" in failed("send", server.url, "some-id", "hi", "--param", "novalue", code=2)
    assert "need --webhook-url" in failed("send", server.url, "some-id", "hi", "--webhook-token", "t", code=2)
    assert "must be an http:// or https:// URL" in failed("send", server.url, "some-id", "hi", "--webhook-url", "ftp://x", code=2)
    assert "Invalid value for '--role'" in failed("send", server.url, "some-id", "hi", "--role", "robot", code=2)


@pytest.mark.parametrize(
    "args",
    [["health"], ["create"], ["sessions"], ["get", "ID"], ["get", "ID", "--wait"], ["delete", "ID"], ["messages", "ID"], ["send", "ID", "hi"],
     ["resume", "ID", "INTERRUPT", "{}"]],
)
def test_server_not_there(args: list[str]) -> None:
    with refused_url() as url:
        stderr = failed(args[0], url, *args[1:])
    assert stderr == f"Error: Could not connect to {url}\n"


def test_unauthorized_names_the_fix_and_never_prints_the_key() -> None:
    with StubServer(status=401, reply={"detail": "Missing or invalid API key"}) as stub:
        stderr = failed("sessions", stub.url, "--api-key", "sekrit-flag")
        assert stderr == "Error: 401 Unauthorized: Missing or invalid API key (set --api-key or MOTUS_API_KEY)\n"
        failed("health", stub.url, env={"MOTUS_API_KEY": "sekrit-env"})
        failed("get", stub.url, "x")
    sent = [call.headers.get("Authorization") for call in stub.requests]
    assert sent == ["Bearer sekrit-flag", "Bearer sekrit-env", None]
    help_text = motus("sessions", "--help", env={"MOTUS_API_KEY": "sekrit-env"}).stdout
    assert "MOTUS_API_KEY" in help_text and "sekrit" not in help_text


def test_entry_point(server: Server) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "motus", "serve", *args],
            capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60,
        )

    result = run("sessions", server.url, "--json")
    assert result.returncode == 0 and isinstance(json.loads(result.stdout), list)
    with refused_url() as url:
        result = run("health", url)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"Error: Could not connect to {url}\n")
