"""The framework examples under ``examples/`` work offline as their docs say (issue 16, item 6):
served by a real ``motus serve``, with their scripted models, two approvals in one step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.integration.frameworks.helpers import approval, interrupted, needs, resume_ok, session_messages, start_turn, wait_idle

EXAMPLES = [
    pytest.param("examples.openai_agents.notes_agent:agent", "agents", id="openai-agents"),
    pytest.param("examples.pydantic_ai.notes_agent:agent", "pydantic_ai", id="pydantic-ai"),
]


@pytest.mark.parametrize(("agent", "package"), EXAMPLES)
def test_the_example_asks_before_deleting_notes(start_server: Callable[..., Server], tmp_path: Path, agent: str, package: str) -> None:
    needs(package)
    notes = tmp_path / "notes"  # missing: the example creates it with its sample notes
    server = start_server(agent, env={"MOTUS_EXAMPLE_DIR": str(notes), "MOTUS_EXAMPLE_OFFLINE": "1", "OPENAI_API_KEY": ""})
    assert "using the offline scripted model because MOTUS_EXAMPLE_OFFLINE is set" in server.log()  # says so at start
    session_id = start_turn(server, "delete groceries and todo")
    [(groceries, first), (todo, second)] = approval(interrupted(server, session_id, count=2))
    fixed = {"editable": False} if package == "agents" else {}  # the SDK cannot apply edited arguments
    assert first == {"type": "tool_approval", "tool_name": "delete_note", "tool_args": {"name": "groceries"}, **fixed}
    assert second == {"type": "tool_approval", "tool_name": "delete_note", "tool_args": {"name": "todo"}, **fixed}
    assert not notes.exists()  # no tool ran yet (the first tool that runs creates the samples)

    resume_ok(server, session_id, todo, {"approved": False, "reason": "still need it"})
    resume_ok(server, session_id, groceries, {"approved": True})
    response = wait_idle(server, session_id)["response"]["content"]
    assert response == "delete_note: Deleted groceries; delete_note: User rejected delete_note: still need it"
    assert not (notes / "groceries.txt").exists() and (notes / "todo.txt").exists()

    server.send(session_id, "list")
    assert wait_idle(server, session_id)["response"]["content"] == "list_notes: ideas, todo"
    roles = [m["role"] for m in session_messages(server, session_id)]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool", "assistant"]
