"""Helpers shared by the framework tests (real servers, the scripted loopback provider)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Server
from tests.fakes.providers import FakeProvider
from tests.integration.serve.test_durability import agent_env, kill_server, lines, refused_start, resume_ok, store_url, wait_idle  # noqa: F401
from tests.integration.serve.test_hitl import interrupted, resume, start_turn  # noqa: F401


def approval(body: dict) -> list[tuple[str, dict]]:
    """The pending interrupts as ``(interrupt_id, payload)``, sorted by payload."""
    items = [(item["interrupt_id"], item["payload"]) for item in body["interrupts"]]
    for _, payload in items:
        assert set(payload) == {"type", "tool_name", "tool_args"} and payload["type"] == "tool_approval", payload
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
