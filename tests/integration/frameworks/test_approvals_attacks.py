"""Attacks on the framework adapters' approvals, through real server processes.

- A session grant ("remember": "session") read back from the journal during a replay must not
  approve a framework call the first run had asked about (and the person rejected): the
  framework adapters' ``ask_approvals`` now asks ``was_asked`` as motus' own gate does.
- A resume value of any odd shape rejects the framework call, and never reaches the log
  (``parse_approval`` logged ``approved=%r``: client data, unbounded).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Server, wait_until
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls
from tests.integration.serve.durability.test_durability import agent_env, lines, resume_ok, store_url, wait_settled
from tests.integration.serve.approvals.test_hitl import interrupted, resume, start_turn
from tests.integration.frameworks.helpers import needs

FRAMEWORK_AGENTS = [
    pytest.param("agents", "tests.agents.frameworks.openai_agents:agent", id="openai-agents"),
    pytest.param("pydantic_ai", "tests.agents.frameworks.pydantic_ai:agent", id="pydantic-ai"),
]


def _parked(server: Server) -> bool:
    health = server.get("/health").json()
    return health["parked_turns"] == 1 and health["live_turns"] == 0


@pytest.mark.parametrize(("package", "agent"), FRAMEWORK_AGENTS)
def test_a_session_grant_learned_in_a_replay_does_not_approve_a_call_the_person_rejected(
    package: str, agent: str, start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path, tmp_path: Path
) -> None:
    """Two gated calls of one tool at once; the turn parks; the person approves one "for the
    session" and rejects the other. The replay must not let the grant (learned from the first
    answer it reads back) wave through the call the first run asked about and was refused."""
    needs(package)
    fake = fake_provider
    fake.script(openai_tool_calls(("call_a", "touch", {"path": "a.txt"}), ("call_b", "touch", {"path": "b.txt"})))
    server = start_server(agent, "--store", store_url(tmp_path / "s.db"), "--park-after", "0", env=agent_env(sandbox, fake))
    session_id = start_turn(server, "touch both")
    body = interrupted(server, session_id, count=2)
    ids = {item["payload"]["tool_args"]["path"]: item["interrupt_id"] for item in body["interrupts"]}
    wait_until(lambda: _parked(server), timeout=15, what="the turn to park")

    fake.script(openai_text("One done, one refused."))
    resume_ok(server, session_id, ids["a.txt"], {"approved": True, "remember": "session"})
    resume(server, session_id, ids["b.txt"], {"approved": False, "reason": "never b"})
    wait_settled(server, session_id, 20)
    assert len(lines(sandbox / "ran-a.txt")) == 1
    assert len(lines(sandbox / "ran-b.txt")) == 0, "a call the person rejected ran"


#: Resume values are never logged (motus/serve/logs.py); this marker must not reach the log.
RESUME_MARKER = "resume-marker-" + uuid.uuid4().hex

ODD_VALUES = [
    "yes",
    {"approved": RESUME_MARKER + "y" * 50000},
    None,
    [True],
    {"approved": "true"},
    {"approved": 1},
    {"approved": True, "tool_args": "path=evil.txt"},
    {"approved": True, "tool_args": ["evil.txt"]},
    {"approved": False, "reason": "x" * 20000},
    {"approved": False, "reason": ["not", "a", "string"]},
]


@pytest.mark.parametrize(("package", "agent"), FRAMEWORK_AGENTS)
def test_a_framework_approval_of_any_odd_shape_is_a_rejection_and_never_runs_the_tool(
    package: str, agent: str, start_server: Callable[..., Server], fake_provider: FakeProvider, sandbox: Path
) -> None:
    needs(package)
    fake = fake_provider
    server = start_server(agent, env=agent_env(sandbox, fake))
    for index, value in enumerate(ODD_VALUES):
        path = f"odd{index}.txt"
        fake.script(openai_tool_calls((f"call_{index}", "touch", {"path": path})), openai_text("Left it."))
        session_id = start_turn(server, f"touch {path}")
        [item] = interrupted(server, session_id)["interrupts"]
        resume_ok(server, session_id, item["interrupt_id"], value)
        body = wait_settled(server, session_id, 20)
        assert body["status"] == "idle", (value, body)
        assert len(lines(sandbox / f"ran-{path}")) == 0, value
    assert RESUME_MARKER not in server.log_path.read_text(errors="replace"), "a resume value reached the log"

