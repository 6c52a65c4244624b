"""Helpers shared by the framework tests (real servers, the scripted loopback provider).

A framework server is dear to start (its SDK's import), so a module's independent tests share
one (``shared_app``): one server, one scripted provider and one sandbox for the module, the
provider's script and record and the sandbox emptied before each test and the test's sessions
deleted after it. Tests run one at a time in a module, so nothing of one test reaches the
provider or the sandbox during another.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import Server, wait_until
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls
from tests.integration.serve.durability.test_durability import agent_env, kill_server, lines, refused_start, resume_ok, store_url, wait_idle  # noqa: F401
from tests.integration.serve.approvals.test_hitl import interrupted, resume, start_turn  # noqa: F401


def needs(package: str) -> None:
    """Skip unless ``package`` (a framework's SDK) is installed, without importing it here:
    the SDK runs in the servers and subprocesses the test starts, and its import in the test
    process only cost CPU (openai-agents ~3.6 s, anthropic ~3 s, pydantic-ai ~1.8 s)."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"needs the {package} package (pip install 'motus[test]')")


class SharedProvider(FakeProvider):
    """A scripted provider for a whole module, cleared before each test."""

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.dropped = 0


@pytest.fixture(scope="module")
def module_provider() -> Iterator[SharedProvider]:
    with SharedProvider() as fake:
        yield fake


@pytest.fixture(scope="module")
def module_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandbox")


@dataclass
class SharedApp:
    """The module's server of ``agent`` (``shared_server``), its provider and its sandbox."""

    start: Callable[..., Server]
    fake: SharedProvider
    sandbox: Path
    agent: str
    started: list[Server] = field(default_factory=list)

    def server(self) -> Server:
        """The module's server, once its fork server has imported the framework (a warm
        process is ready): the first test's turn then waits no longer than the others'."""
        server = self.start(self.agent, env=agent_env(self.sandbox, self.fake))
        self.started.append(server)
        wait_until(lambda: warm_processes(server) > 0, timeout=120, interval=0.05, what="a warm worker process")
        return server

    def delete_sessions(self) -> None:
        """Delete every session on the servers this test used: a turn a failed test left
        running is stopped before it can reach the next test's script or sandbox."""
        for server in self.started:
            for session in server.get("/sessions").json():
                gone = server.delete(f"/sessions/{session['session_id']}")
                assert gone.status_code in (204, 404), gone.text


def warm_processes(server: Server) -> float:
    """``motus_worker_processes_warm`` from the server's metrics."""
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("motus_worker_processes_warm "):
            return float(line.split()[1])
    raise AssertionError("the metrics have no motus_worker_processes_warm")


@contextmanager
def shared_app(start: Callable[..., Server], fake: SharedProvider, sandbox: Path, agent: str) -> Iterator[SharedApp]:
    """The module's app for one test: an empty script, record and sandbox; its sessions
    deleted at the end."""
    fake.reset()
    for path in sandbox.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    app = SharedApp(start, fake, sandbox, agent)
    try:
        yield app
    finally:
        app.delete_sessions()


def shared_app_fixture(agent: str) -> Callable[..., Iterator[SharedApp]]:
    """A ``shared`` fixture for a module (``shared = shared_app_fixture(AGENT)``): its server
    of ``agent``, for tests that each use sessions of their own. The module imports
    ``module_provider`` and ``module_sandbox`` too."""

    @pytest.fixture
    def shared(shared_server: Callable[..., Server], module_provider: SharedProvider, module_sandbox: Path) -> Iterator[SharedApp]:
        with shared_app(shared_server, module_provider, module_sandbox, agent) as app:
            yield app

    return shared


def approval(body: dict) -> list[tuple[str, dict]]:
    """The pending interrupts as ``(interrupt_id, payload)``, sorted by payload."""
    items = [(item["interrupt_id"], item["payload"]) for item in body["interrupts"]]
    for _, payload in items:
        assert set(payload) - {"editable"} == {"type", "tool_name", "tool_args"} and payload["type"] == "tool_approval", payload
        assert payload.get("editable", True) in (True, False), payload
    return sorted(items, key=lambda item: json.dumps(item[1], sort_keys=True))


def sent_messages(fake: FakeProvider, index: int) -> list[dict]:
    """The chat messages of the model request ``index``."""
    return fake.requests[index].body["messages"]


def tool_results_of(fake: FakeProvider, index: int) -> dict[str, str]:
    """``tool_call_id -> content`` of the tool messages the model got in request ``index``."""
    return {m["tool_call_id"]: m["content"] for m in sent_messages(fake, index) if m.get("role") == "tool"}


def session_messages(server: Server, session_id: str) -> list[dict]:
    response = server.get(f"/sessions/{session_id}/messages")
    assert response.status_code == 200, response.text
    return response.json()


def ran(sandbox: Path, name: str) -> int:
    return len(lines(sandbox / name))


# -- scenarios the chat-completions frameworks share (the served app is what differs) --------

Serve = Callable[..., Server]  # serve(*server_args) -> a server of the framework's app


def check_a_parked_turn_replays_without_the_model_or_a_tool(serve: Serve, fake: FakeProvider, sandbox: Path, db: Path) -> None:
    """With ``--park-after 0``: a turn that ran one tool, then waits on approval for a
    second, is resumed after its worker is gone; the replay takes the first segment from the
    journal, so the model is asked once more (not three times) and the first tool never
    runs again."""
    fake.script(
        openai_tool_calls(("call_1", "lookup", {"topic": "logs"})),
        openai_tool_calls(("call_2", "touch", {"path": "logs.txt"})),
    )
    server = serve("--store", store_url(db), "--park-after", "0")
    session_id = start_turn(server, "look up logs, then touch logs.txt")
    [(interrupt_id, payload)] = approval(interrupted(server, session_id))
    assert payload["tool_args"] == {"path": "logs.txt"}
    assert ran(sandbox, "looked-logs") == 1 and len(fake.requests) == 2

    fake.script(openai_text("All done."))
    wait_until(  # the worker is gone: the resume replays the turn from its journal
        lambda: (lambda h: h["parked_turns"] == 1 and h["live_turns"] == 0)(server.get("/health").json()),
        timeout=15, what="the turn to park",
    )
    resume_ok(server, session_id, interrupt_id, {"approved": True})
    assert wait_idle(server, session_id)["response"]["content"] == "All done."
    assert len(fake.requests) == 3
    assert ran(sandbox, "looked-logs") == 1 and ran(sandbox, "ran-logs.txt") == 1
    assert tool_results_of(fake, 2) == {"call_1": "Facts about logs", "call_2": "Touched logs.txt"}


def check_an_approval_survives_kill_9(serve: Serve, fake: FakeProvider, sandbox: Path, db: Path) -> None:
    """Two approvals pending, the whole server group SIGKILLed, a new server on the same
    SQLite file: the same interrupts come back, and each approved tool runs exactly once."""
    fake.script(openai_tool_calls(("call_a", "touch", {"path": "a.txt"}), ("call_b", "touch", {"path": "b.txt"})))
    first = serve("--store", store_url(db))
    session_id = start_turn(first, "touch both")
    before = interrupted(first, session_id, count=2)["interrupts"]
    kill_server(first)

    second = serve("--store", store_url(db))
    body = second.get(f"/sessions/{session_id}").json()
    assert body["status"] == "interrupted" and body["interrupts"] == before, body
    [(first_id, _), (second_id, _)] = approval(body)
    fake.script(openai_text("Both touched."))
    resume_ok(second, session_id, first_id, {"approved": True})
    resume_ok(second, session_id, second_id, {"approved": True})
    assert wait_idle(second, session_id)["response"]["content"] == "Both touched."
    assert ran(sandbox, "ran-a.txt") == 1 and ran(sandbox, "ran-b.txt") == 1
    assert len(fake.requests) == 2  # the first model call was not made again
    assert tool_results_of(fake, 1) == {"call_a": "Touched a.txt", "call_b": "Touched b.txt"}
