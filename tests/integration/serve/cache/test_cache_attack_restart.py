"""kill -9 with a session cache of one, then a restart with a cache of one: nothing lost,
parked turns resumable from the inbox, each approved tool run once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Server
from tests.integration.serve.approvals.test_hitl import interrupted, start_turn
from tests.integration.serve.durability.test_durability import (
    FILES, agent_env, health, kill_server, lines, resume_ok, store_url, tool_results, wait_idle,
)
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls


def test_kill_9_with_a_cache_of_one(start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    args = ["--workers", "2", "--store", store_url(tmp_path / "s.db"), "--session-cache", "1", "--park-after", "0"]
    env = agent_env(sandbox, fake)
    count = 8
    fake.script(*(openai_tool_calls((f"call_{n}", "touch", {"path": f"f{n}.txt"})) for n in range(count)))
    first = start_server(FILES, *args, env=env)
    sessions = [start_turn(first, f"touch a file ({n})") for n in range(count)]
    before = {sid: interrupted(first, sid)["interrupts"] for sid in sessions}
    paths = {sid: items[0]["payload"]["tool_args"]["path"] for sid, items in before.items()}
    inbox = first.get("/interrupts").json()
    kill_server(first)

    second = start_server(FILES, *args, env=env)
    state = health(second)
    assert state["total_sessions"] == count and state["parked_turns"] == count and state["live_turns"] == 0, state
    assert second.get("/interrupts").json() == inbox
    for sid in sessions:
        body = second.get(f"/sessions/{sid}").json()
        assert body["status"] == "interrupted" and body["interrupts"] == before[sid], body
    fake.script(*(openai_text("Done.") for _ in range(count)))
    for sid in sessions:
        [item] = before[sid]
        assert resume_ok(second, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
        late = second.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": True})
        assert late.status_code == 404 and "already resumed" in late.text, late.text
    for sid in sessions:
        assert wait_idle(second, sid, timeout=30)["response"]["content"] == "Done.", sid
    for sid in sessions:
        assert len(lines(sandbox / f"ran-{paths[sid]}")) == 1, paths[sid]
        assert len(second.get(f"/sessions/{sid}/messages").json()) >= 4
    assert len(tool_results(fake)) == count
    state = health(second)
    assert state["parked_turns"] == 0 and state["live_turns"] == 0, state
    metrics = second.get("/metrics").text
    print([line for line in metrics.splitlines() if "interrupt" in line and not line.startswith("#")][:10])
