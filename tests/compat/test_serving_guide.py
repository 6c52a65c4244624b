"""The serving guide: ``AgentServer(agent_fn=...)``, what may be served, and what happens
when a worker cannot be started. Servers here are real processes spoken to over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import psutil
import requests

from motus.serve import AgentServer
from tests.compat import agents
from tests.conftest import ROOT, server_env

SERVE = ("-m", "tests.compat.serve_agent_fn")


# -- the constructor ------------------------------------------------------------------------------


def test_agent_fn_takes_a_function_or_an_import_path() -> None:
    by_object = AgentServer(agent_fn=agents.guide_agent, store="memory")
    assert by_object.agent_path is None and by_object._agent_obj is agents.guide_agent
    by_path = AgentServer(agent_fn="tests.compat.agents:guide_agent", store="memory")
    assert by_path.agent_path == "tests.compat.agents:guide_agent"
    assert AgentServer("tests.compat.agents:guide_agent", store="memory").agent_path == by_path.agent_path
    assert AgentServer(agent=agents.guide_agent, store="memory")._agent_obj is agents.guide_agent


def test_the_agent_is_given_once() -> None:
    with pytest.raises(TypeError, match="not both"):
        AgentServer(agents.guide_agent, agent_fn=agents.guide_agent)
    with pytest.raises(TypeError, match="needs an agent"):
        AgentServer()


@pytest.mark.parametrize(
    ("agent", "needle"),
    [
        (agents.nested_agent, "is a function defined inside _make_nested()"),
        (agents.lambda_agent, "is a lambda"),
        (agents.locked_agent, "cannot be sent to a worker process (TypeError: cannot pickle '_thread.lock' object)"),
    ],
    ids=["nested", "lambda", "unpicklable-object"],
)
def test_an_agent_no_worker_can_load_is_refused_at_construction(agent: object, needle: str) -> None:
    with pytest.raises(ValueError, match="^Agent must be a module-level function") as refused:
        AgentServer(agent_fn=agent, store="memory")
    assert needle in str(refused.value)


def test_an_unpicklable_object_is_fine_by_import_path() -> None:
    assert AgentServer(agent_fn="tests.compat.agents:locked_agent", store="memory").agent_path == "tests.compat.agents:locked_agent"


@pytest.mark.parametrize(("attr", "needle"), [("nested_agent", "inside _make_nested()"), ("lambda_agent", "is a lambda")])
def test_motus_serve_start_refuses_it_in_one_line(attr: str, needle: str) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "motus", "serve", "start", f"tests.compat.agents:{attr}", "--port", "0"],
        cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60,
    )
    assert ran.returncode == 2, ran.stderr
    [line] = ran.stderr.strip().splitlines()
    assert line.startswith("Error: Agent must be a module-level function") and needle in line
    assert "Traceback" not in ran.stdout + ran.stderr


# -- real servers ---------------------------------------------------------------------------------


def _turn(base_url: str, content: str, timeout: float = 20.0) -> dict:
    """Send one message to a new session and long-poll until it is no longer running."""
    session_id = requests.post(f"{base_url}/sessions", timeout=5).json()["session_id"]
    assert requests.post(f"{base_url}/sessions/{session_id}/messages", json={"content": content}, timeout=5).status_code == 202
    deadline = time.monotonic() + timeout
    while True:
        body = requests.get(f"{base_url}/sessions/{session_id}", params={"wait": "true", "timeout": 2}, timeout=10).json()
        if body["status"] != "running":
            return body
        assert time.monotonic() < deadline, f"the turn is still running after {timeout}s: {body}"


def test_the_import_path_form_serves_too(start_python_server) -> None:
    server = start_python_server(*SERVE, "--by-path")
    assert _turn(server.url, "hello")["response"]["content"] == "No action taken."


def test_an_agent_defined_in_the_script_that_serves_it(start_python_server) -> None:
    server = start_python_server("tests/compat/script_server.py")
    body = _turn(server.url, "hi")
    assert body["status"] == "idle" and body["response"]["content"] == "script says: hi"
    # Its workers come from multiprocessing: the zygote forked in case it would serve is gone.
    names = []
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            names.append(proc.name())
        except psutil.NoSuchProcess:
            continue  # a worker that ended meanwhile
    assert "motus-zygote" not in names, names


def test_a_worker_that_cannot_start_fails_the_turn(start_python_server) -> None:
    """Workers started with an interpreter that does not exist: every start fails. Each turn
    fails at once with the reason, the next turn gets its own attempt, and the server does
    not retry in a loop."""
    server = start_python_server(*SERVE, "--python-executable", "/nonexistent/python3")
    for content in ("first", "second"):
        body = _turn(server.url, content)
        assert body["status"] == "error", body
        # The forkserver that starts workers never comes up: connecting to it is refused.
        assert re.fullmatch(r"Could not start a worker process: \w+Error: .+", body["error"]), body["error"]
    assert requests.get(f"{server.url}/health", timeout=5).json()["running_workers"] == 0
    log = server.log()
    assert log.count("Traceback") <= 1, log  # the first failure's, then one line each
    assert log.count("Could not start a worker process") < 10, log


def test_an_agent_a_worker_cannot_restore_fails_its_turn(start_python_server) -> None:
    server = start_python_server(*SERVE, "--agent", "fragile_agent")
    for content in ("first", "second"):
        body = _turn(server.url, content)
        assert body["status"] == "error"
        assert body["error"] == (
            "Could not load the agent in the worker process: "
            "RuntimeError: this agent cannot be restored outside the server"
        )


def test_the_openapi_document_lists_422_for_every_body() -> None:
    from motus.serve.openapi import openapi_document

    with_body = [
        (path, method, operation)
        for path, methods in openapi_document()["paths"].items()
        for method, operation in methods.items()
        if "requestBody" in operation
    ]
    assert len(with_body) >= 4
    for path, method, operation in with_body:
        assert {"415", "422"} <= set(operation["responses"]), (method, path)
        assert "not JSON" in operation["responses"]["422"]["description"]
