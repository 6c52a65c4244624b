"""Durable sessions (issue 9, ``shared/spec/durability.md``): the store, parked turns,
replay, restarts and crashes, and the pool deadlock that came first.

Every test runs real ``motus serve`` processes over real SQLite files (``--store
sqlite:////abs/path.db``); nothing about the store is mocked. The agents live in
``tests/agents/durable.py`` and leave marker files in a sandbox directory, so what *ran*
is counted on disk, independently of what the server reports. Model calls go to the
scripted loopback provider (``tests/support/fakes/providers.py``), which records every request,
so a test can tell whether a replay asked the model again.

Restarts: ``start_server`` gives every server a fresh port, so a "restart" is a second
``start_server`` on the same ``--store`` after the first was stopped (SIGTERM) or killed
(``os.killpg(..., SIGKILL)``); the fixture stops whatever is still running at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import Server, free_port, launch, wait_until
from tests.support.processes import alive as _alive
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import FakeProvider, openai_text, openai_tool_calls, tool_messages
from tests.integration.serve.approvals.test_hitl import WebhookSink, interrupted, resume, start_turn

FILES = "tests.agents.durable:files"
OUTCOME_UNKNOWN = "Outcome unknown: the server stopped while {tool} was running"
HEALTH_KEYS = {"status", "max_workers", "running_workers", "total_sessions", "store", "live_turns", "parked_turns"}
QUESTION = {
    "question": "Which folder should I use?",
    "header": "Folder",
    "multiSelect": False,
    "options": [
        {"label": "Archive", "description": "Keep it in archive/"},
        {"label": "Scratch", "description": "Keep it in scratch/"},
    ],
}


# -- helpers ------------------------------------------------------------------------------


def store_url(path: Path) -> str:
    """SQLAlchemy's spelling of an absolute path: four slashes."""
    assert path.is_absolute()
    return f"sqlite:///{path}"


def agent_env(sandbox: Path, fake: FakeProvider | None = None, **extra: str) -> dict[str, str]:
    sandbox.mkdir(parents=True, exist_ok=True)
    env = {"MOTUS_EXAMPLE_DIR": str(sandbox), "OPENROUTER_API_KEY": "", **extra}
    if fake is not None:
        env["MOTUS_TEST_PROVIDER_URL"] = fake.url
    return env


def health(server: Server) -> dict:
    response = server.get("/health")
    assert response.status_code == 200, response.text
    body = response.json()
    assert HEALTH_KEYS <= set(body), body
    return body


def wait_settled(server: Server, session_id: str, timeout: float = 15.0) -> dict:
    """Long-poll until the session is no longer ``running`` (fails after ``timeout``)."""

    def settled() -> dict | None:
        body = server.wait(session_id, timeout=5)
        return body if body["status"] != "running" else None

    return wait_until(settled, timeout=timeout, what=f"session {session_id} to stop running")  # type: ignore[return-value]


def wait_idle(server: Server, session_id: str, timeout: float = 15.0) -> dict:
    """Wait for the turn to end and insist it ended ``idle``: a turn that fails or pauses
    again fails the test at once, showing the session."""
    body = wait_settled(server, session_id, timeout)
    assert body["status"] == "idle", body
    return body


def resume_ok(server: Server, session_id: str, interrupt_id: str, value: object) -> dict:
    response = resume(server, session_id, interrupt_id, value)
    assert response.status_code == 200, response.text
    return response.json()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []




def agent_processes(server: Server, sandbox: Path) -> list[int]:
    """Processes in the server's tree that ran (or replay) this test's agent turn code: the
    agents write their pid to ``pids`` each time a turn starts. Warm pool processes that
    never got a turn are not counted, so this is exactly "the turns' worker processes"."""
    ran = {int(pid) for pid in lines(sandbox / "pids")}
    found = []
    for proc in server.descendants():
        try:
            if proc.pid in ran and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_parked(server: Server, sandbox: Path, parked: int = 1) -> None:
    """Every turn of this test waits on a person with no process: the process tree has no
    worker that ran a turn, and ``/health`` agrees (``parked`` parked, none live)."""

    def settled() -> bool:
        body = health(server)
        return not agent_processes(server, sandbox) and body["parked_turns"] == parked and body["live_turns"] == 0

    try:
        wait_until(settled, timeout=15, interval=0.02, what=f"{parked} parked turn(s) with no worker process")
    except AssertionError:
        raise AssertionError(f"turn processes {agent_processes(server, sandbox)}, health {health(server)}") from None


def kill_server(*servers: Server) -> None:
    """SIGKILL each server's whole process group (a server was started in a new session, so
    its pid is the group id), as a power loss or ``kill -9`` would; then wait until every
    process they had started has gone too (workers run in their own groups and end on their
    own once their pipe to the dead server closes). Several servers are all killed before
    any is waited for: they die together, so none outlives another by a lease and takes its
    turns over (waiting for one's workers can take longer than that on a busy machine)."""
    descendants = [proc for server in servers for proc in server.descendants()]
    for server in servers:
        os.killpg(server.process.pid, signal.SIGKILL)
    for server in servers:
        server.process.wait(10)

    def gone() -> bool:
        return not [p for p in descendants if _alive(p.pid)]

    try:
        wait_until(gone, timeout=15, what="the killed server's processes to exit")
    except AssertionError:
        survivors = [p.pid for p in descendants if _alive(p.pid)]
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise AssertionError(f"processes {survivors} outlived the killed server") from None


def refused_start(args: list[str], tmp_path: Path, name: str = "refused") -> tuple[int, str]:
    """Run ``python -m motus serve start ARGS --port P`` (cwd: the repository, the tests'
    environment) and return its exit code and output. It must exit on its own: if it
    answers ``/health`` instead, or outlives 30 s, it is killed and the test fails."""
    port = free_port()
    log_path = tmp_path / f"{name}.log"
    process = launch(["serve", "start", *args, "--port", str(port)], log_path)

    def exited_or_serving() -> bool:
        if process.poll() is not None:
            return True
        try:
            return requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    try:
        wait_until(exited_or_serving, timeout=30, interval=0.05, what="the start to be refused")
        if process.poll() is None:
            raise AssertionError(f"the server started instead of refusing:\n{log_path.read_text(errors='replace')}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    return process.returncode, log_path.read_text(errors="replace")


def assert_short_clean_error(output: str) -> None:
    """A clear error, not a traceback: no ``Traceback`` and only a few lines of text (the
    reason, plus click's usage lines when it is a usage error)."""
    assert "Traceback" not in output, output
    text = [line for line in output.splitlines() if line.strip()]
    assert text, "no error message at all"
    assert len(text) <= 8, output


def tool_results(fake: FakeProvider) -> list[tuple[int, dict]]:
    """Every ``role: tool`` message the model was sent: (request index, message)."""
    return [(index, message) for index, request in enumerate(fake.requests) for message in tool_messages(request.body)]


def error_of(content: str) -> str:
    return json.loads(content)["error"]


# -- issue 9 section 0: the pool deadlock ---------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_second_gathered_interrupt_raised_while_a_resume_is_queued_does_not_leak_the_slot(
    start_server: Callable[..., Server], tmp_path: Path, store: str
) -> None:
    """The issue's sequence, with the agent's sleeps replaced by gates the test opens, so the
    order of events is exactly the issue's on any machine: session 1 is interrupted on ``a``;
    session 2's "busy" turn takes the only slot; ``a`` is resumed (queued for the slot); ``b``
    is raised while the resume is still queued; the busy turn ends; ``b`` is resumed. Session
    1 must then finish, a later turn must run, and no slot may stay taken."""
    gates = tmp_path / "gates"
    gates.mkdir()
    store_args = ["--store", "memory"] if store == "memory" else ["--store", store_url(tmp_path / "s.db")]
    server = start_server(
        "tests.agents.durable:gather_two", "--workers", "1", *store_args, env={"MOTUS_TEST_GATE_DIR": str(gates)}
    )

    first = start_turn(server, "go")
    [a] = interrupted(server, first)["interrupts"]
    assert a["payload"] == {"type": "a"}

    busy = start_turn(server, "busy")
    wait_until(lambda: (gates / "busy-started").exists(), what="the busy turn to take the only slot")
    assert resume(server, first, a["interrupt_id"], "A").status_code == 200  # queued behind "busy"

    (gates / "later-go").touch()  # later() raises b now
    body = interrupted(server, first)
    [b] = body["interrupts"]
    assert b["payload"] == {"type": "b"} and b["interrupt_id"] != a["interrupt_id"]
    assert server.get(f"/sessions/{busy}").json()["status"] == "running"  # the order of events

    (gates / "busy-go").touch()
    assert wait_idle(server, busy)["response"]["content"] == "ok"
    assert resume(server, first, b["interrupt_id"], "B").status_code == 200

    assert wait_idle(server, first, timeout=15)["response"]["content"] == "AB"
    later = start_turn(server, "echo")
    assert wait_idle(server, later, timeout=15)["response"]["content"] == "echo"
    wait_until(lambda: health(server)["running_workers"] == 0, what="every compute slot to be free")


def test_partial_resume_of_a_parked_turn_never_holds_a_slot(start_server: Callable[..., Server], tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    server = start_server(
        "tests.agents.durable:gather_now", "--workers", "1", "--store", store_url(tmp_path / "s.db"), "--park-after", "0",
        env=agent_env(sandbox),
    )
    waiting = start_turn(server, "go")
    pending = {i["payload"]["type"]: i for i in interrupted(server, waiting, 2)["interrupts"]}
    assert set(pending) == {"a", "b"}
    assert_parked(server, sandbox)

    answer = resume_ok(server, waiting, pending["a"]["interrupt_id"], "A")
    assert answer["status"] == "interrupted"  # b is still pending
    [still] = interrupted(server, waiting)["interrupts"]
    assert still == pending["b"]  # same id, same payload

    # With the only slot, another session's turn still runs: the half-answered turn holds none.
    other = start_turn(server, "echo")
    assert wait_idle(server, other, timeout=15)["response"]["content"] == "echo"
    wait_until(lambda: health(server)["running_workers"] == 0, what="every compute slot to be free")
    assert_parked(server, sandbox)

    assert resume_ok(server, waiting, pending["b"]["interrupt_id"], "B")["status"] == "running"
    assert wait_idle(server, waiting, timeout=15)["response"]["content"] == "a='A' b='B'"
    wait_until(lambda: health(server)["running_workers"] == 0, what="every compute slot to be free")


# -- kill -9 -------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_with_20_interrupted_sessions_loses_nothing_and_runs_each_approved_tool_once(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    # Default --park-after and no live-turn budget: all twenty turns stay live until the kill.
    args = ["--workers", "2", "--store", store_url(tmp_path / "s.db"), "--max-live-turns", "0"]
    env = agent_env(sandbox, fake)
    count = 20
    # The replies go to whichever session asks first, so each session is told by its
    # interrupt which file it got; the call id follows from the file.
    fake.script(*(openai_tool_calls((f"call_{n}", "touch", {"path": f"f{n}.txt"})) for n in range(count)))

    first = start_server(FILES, *args, env=env)
    sessions = [start_turn(first, f"touch a file ({n})") for n in range(count)]
    before = {sid: interrupted(first, sid)["interrupts"] for sid in sessions}
    paths = {sid: items[0]["payload"]["tool_args"]["path"] for sid, items in before.items()}
    for sid, [item] in before.items():
        assert item["type"] == "tool_approval"
        assert item["payload"] == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": paths[sid]}}
    assert sorted(paths.values()) == sorted(f"f{n}.txt" for n in range(count))
    state = health(first)
    assert state["store"] == "sqlite" and state["live_turns"] == count and state["parked_turns"] == 0, state
    assert len(fake.requests) == count

    kill_server(first)

    second = start_server(FILES, *args, env=env)
    state = health(second)
    assert state["store"] == "sqlite" and state["total_sessions"] == count, state
    assert state["parked_turns"] == count and state["live_turns"] == 0, state
    assert sorted(s["session_id"] for s in second.get("/sessions").json()) == sorted(sessions)
    for sid in sessions:
        body = second.get(f"/sessions/{sid}").json()
        assert body["status"] == "interrupted" and body["interrupts"] == before[sid], body

    fake.script(*(openai_text("Done.") for _ in range(count)))
    approved = {sid for sid in sessions if int(paths[sid][1:-4]) % 2 == 0}
    for sid in sessions:
        [item] = before[sid]
        value = {"approved": True} if sid in approved else {"approved": False, "reason": "not this one"}
        assert resume_ok(second, sid, item["interrupt_id"], value)["status"] == "running"
    for sid in sessions:
        assert wait_idle(second, sid, timeout=30)["response"]["content"] == "Done.", sid

    # What ran, counted on disk: each approved tool exactly once, each rejected one never.
    for sid in sessions:
        ran = lines(sandbox / f"ran-{paths[sid]}")
        assert len(ran) == (1 if sid in approved else 0), (paths[sid], ran)
    # What the model saw: the first call of each turn was replayed from the journal, not asked
    # again; each tool result reached the model exactly once, after the history it belongs to.
    assert len(fake.requests) == 2 * count
    results = tool_results(fake)
    assert len(results) == count
    for sid in sessions:
        path = paths[sid]
        call_id = f"call_{path[1:-4]}"
        [(index, message)] = [(i, m) for i, m in results if m["tool_call_id"] == call_id]
        if sid in approved:
            assert message["content"] == f"Touched {path}"
        else:
            assert error_of(message["content"]) == "User rejected touch: not this one"
        assert [m["role"] for m in fake.requests[index].body["messages"]] == ["system", "user", "assistant", "tool"]


def test_kill_9_inside_an_approved_gated_tool_never_runs_it_again(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    args = ["--workers", "2", "--store", store_url(tmp_path / "s.db")]
    env = agent_env(sandbox, fake)
    fake.script(openai_tool_calls(("call_h", "hold", {"name": "x"})))

    first = start_server(FILES, *args, env=env)
    sid = start_turn(first, "hold x")
    [item] = interrupted(first, sid)["interrupts"]
    assert item["payload"] == {"type": "tool_approval", "tool_name": "hold", "tool_args": {"name": "x"}}
    assert resume_ok(first, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
    started = sandbox / "started-x"
    wait_until(lambda: lines(started), timeout=15, what="the tool body to start")
    [worker_pid] = [int(pid) for pid in lines(started)]

    kill_server(first)
    assert not _alive(worker_pid)
    (sandbox / "release-x").touch()  # were the body run again, it would now finish

    fake.script(openai_text("I could not confirm that it ran."))
    second = start_server(FILES, *args, env=env)
    body = wait_idle(second, sid, timeout=30)  # a running turn is replayed at start
    assert body["response"]["content"] == "I could not confirm that it ran."

    assert len(lines(started)) == 1 and not (sandbox / "done-x").exists()
    assert len(fake.requests) == 2  # the first model call came from the journal
    [message] = tool_messages(fake.requests[1].body)
    assert message["tool_call_id"] == "call_h"
    assert json.loads(message["content"]) == {"error": OUTCOME_UNKNOWN.format(tool="hold")}
    messages = second.get(f"/sessions/{sid}/messages").json()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


# -- parking ---------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite-never"])
def test_without_parking_an_interrupted_turn_keeps_its_worker(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path, store: str
) -> None:
    """The control for the parking tests: with ``--store memory`` (never parks) or
    ``--park-after never`` the waiting turn's worker is in the process tree, and ``/health``
    counts it live."""
    sandbox = tmp_path / "sandbox"
    fake_provider.script(openai_tool_calls(("call_1", "touch", {"path": "one.txt"})), openai_text("Touched it."))
    store_args = ["--store", "memory"] if store == "memory" else ["--store", store_url(tmp_path / "s.db"), "--park-after", "never"]
    server = start_server(FILES, "--workers", "2", *store_args, env=agent_env(sandbox, fake_provider))
    sid = start_turn(server, "touch one")
    [item] = interrupted(server, sid)["interrupts"]
    state = health(server)
    assert state["store"] == store.split("-")[0] and state["live_turns"] == 1 and state["parked_turns"] == 0, state
    assert agent_processes(server, sandbox) == [int(lines(sandbox / "pids")[0])]

    resume_ok(server, sid, item["interrupt_id"], {"approved": True})
    assert wait_idle(server, sid)["response"]["content"] == "Touched it."
    assert len(lines(sandbox / "ran-one.txt")) == 1 and len(lines(sandbox / "pids")) == 1


def test_past_max_live_turns_the_longest_waiting_turns_park_at_once(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """A burst of approvals costs rows, not a process each: with ``--max-live-turns 2`` and
    four turns waiting, the two that have waited longest are parked well before
    ``--park-after`` (30 s), the two newest keep their process, and every one still ends
    with its own answer (the parked ones by a replay)."""
    sandbox = tmp_path / "sandbox"
    server = start_server(
        "tests.agents.durable:one_gate", "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--max-live-turns", "2",
        env=agent_env(sandbox),
    )
    sids = []
    for n in range(4):
        sid = start_turn(server, f"t{n}")
        interrupted(server, sid)
        sids.append(sid)
    wait_until(lambda: (h := health(server))["parked_turns"] == 2 and h["live_turns"] == 2, what="two parked turns and two live ones")
    first_run = {turn: int(pid) for pid, turn in (line.split() for line in lines(sandbox / "gates"))}
    wait_until(lambda: first_run["t0"] not in agent_processes_of(server, first_run) and first_run["t1"] not in agent_processes_of(server, first_run),
               what="the two oldest turns' processes to end")
    assert {first_run["t2"], first_run["t3"]} <= set(agent_processes_of(server, first_run))

    for n, sid in enumerate(sids):
        [item] = server.get(f"/sessions/{sid}").json()["interrupts"]
        resume_ok(server, sid, item["interrupt_id"], n)
        assert wait_idle(server, sid, timeout=15)["response"]["content"] == f"t{n}: {n}"
    replays = [turn for _pid, turn in (line.split() for line in lines(sandbox / "gates"))][4:]
    assert sorted(replays) == ["t0", "t1"]  # only the parked ones ran again


def agent_processes_of(server: Server, pids: dict[str, int]) -> list[int]:
    """Which of ``pids`` are live processes of the server's tree."""
    wanted = set(pids.values())
    return [proc.pid for proc in server.descendants() if proc.pid in wanted and _alive(proc)]


def test_park_after_0_ends_the_worker_and_a_resume_replays_a_single_gate(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    fake.script(openai_tool_calls(("call_1", "touch", {"path": "one.txt"})), openai_text("Touched it."))
    server = start_server(
        FILES, "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--park-after", "0", env=agent_env(sandbox, fake)
    )
    sid = start_turn(server, "touch one")
    [item] = interrupted(server, sid)["interrupts"]
    assert item["payload"] == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "one.txt"}}
    assert_parked(server, sandbox)
    assert server.get(f"/sessions/{sid}").json()["interrupts"] == [item]  # parked looks the same

    assert resume_ok(server, sid, item["interrupt_id"], {"approved": True})["status"] == "running"
    assert wait_idle(server, sid, timeout=15)["response"]["content"] == "Touched it."
    assert len(lines(sandbox / "ran-one.txt")) == 1
    assert len(fake.requests) == 2
    assert [(m["tool_call_id"], m["content"]) for _, m in tool_results(fake)] == [("call_1", "Touched one.txt")]
    pids = lines(sandbox / "pids")
    assert len(pids) == 2 and pids[0] != pids[1]  # replayed in a fresh worker
    wait_until(lambda: health(server)["parked_turns"] == 0 and health(server)["live_turns"] == 0, what="no turn left")


@pytest.mark.parametrize("order", ["approve-first", "reject-first"])
def test_park_after_0_two_gathered_gates_resume_in_either_order(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path, order: str
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    fake.script(
        openai_tool_calls(("call_a", "touch", {"path": "a.txt"}), ("call_b", "touch", {"path": "b.txt"})),
        openai_text("One of two."),
    )
    server = start_server(
        FILES, "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--park-after", "0", env=agent_env(sandbox, fake)
    )
    sid = start_turn(server, "touch a and b")
    by_path = {i["payload"]["tool_args"]["path"]: i for i in interrupted(server, sid, 2)["interrupts"]}
    assert set(by_path) == {"a.txt", "b.txt"}
    assert_parked(server, sandbox)

    answers = [("a.txt", {"approved": True}), ("b.txt", {"approved": False})]
    if order == "reject-first":
        answers.reverse()
    (first_path, first_value), (second_path, second_value) = answers

    assert resume_ok(server, sid, by_path[first_path]["interrupt_id"], first_value)["status"] == "interrupted"
    [still] = interrupted(server, sid)["interrupts"]
    assert still == by_path[second_path]  # the other gate keeps its id and payload
    assert_parked(server, sandbox)

    assert resume_ok(server, sid, by_path[second_path]["interrupt_id"], second_value)["status"] == "running"
    assert wait_idle(server, sid, timeout=15)["response"]["content"] == "One of two."
    assert len(lines(sandbox / "ran-a.txt")) == 1 and not (sandbox / "ran-b.txt").exists()
    assert len(fake.requests) == 2
    assert [(m["tool_call_id"], m["content"]) for _, m in tool_results(fake)] == [
        ("call_a", "Touched a.txt"),
        ("call_b", json.dumps({"error": "User rejected touch"})),
    ]
    # Replayed in fresh workers (once per resume, or once when both were answered).
    assert len(set(lines(sandbox / "pids"))) >= 2


def test_park_after_0_question_then_approval_in_one_turn(
    start_server: Callable[..., Server], fake_provider: FakeProvider, tmp_path: Path
) -> None:
    fake = fake_provider
    sandbox = tmp_path / "sandbox"
    fake.script(
        openai_tool_calls(("call_q", "ask_user_question", {"questions": [QUESTION]})),
        openai_tool_calls(("call_t", "touch", {"path": "archive.txt"})),
        openai_text("Archived."),
    )
    server = start_server(
        FILES, "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--park-after", "0", env=agent_env(sandbox, fake)
    )
    sid = start_turn(server, "put it somewhere")
    [question] = interrupted(server, sid)["interrupts"]
    assert question["type"] == "user_input" and question["payload"] == {"type": "user_input", "questions": [QUESTION]}
    assert_parked(server, sandbox)

    answers = {"answers": {QUESTION["question"]: "Archive"}}
    assert resume_ok(server, sid, question["interrupt_id"], answers)["status"] == "running"
    [approval] = interrupted(server, sid)["interrupts"]
    assert approval["payload"] == {"type": "tool_approval", "tool_name": "touch", "tool_args": {"path": "archive.txt"}}
    assert approval["interrupt_id"] != question["interrupt_id"]
    assert_parked(server, sandbox)
    assert len(fake.requests) == 2 and not (sandbox / "ran-archive.txt").exists()

    assert resume_ok(server, sid, approval["interrupt_id"], {"approved": True})["status"] == "running"
    assert wait_idle(server, sid, timeout=15)["response"]["content"] == "Archived."
    assert len(lines(sandbox / "ran-archive.txt")) == 1
    assert len(fake.requests) == 3  # each model call was made once, however many replays
    results = tool_results(fake)
    assert [(i, m["tool_call_id"]) for i, m in results] == [(1, "call_q"), (2, "call_q"), (2, "call_t")]
    assert json.loads(results[0][1]["content"]) == answers
    assert results[2][1]["content"] == "Touched archive.txt"
    assert len(lines(sandbox / "pids")) == 3


def test_step_runs_once_across_parking_and_replays(start_server: Callable[..., Server], tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    server = start_server(
        "tests.agents.durable:stepper", "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--park-after", "0",
        env=agent_env(sandbox),
    )
    sid = start_turn(server, "go")
    [first] = interrupted(server, sid)["interrupts"]
    [token] = lines(sandbox / "step-token")
    assert first["payload"] == {"type": "confirm", "token": token}
    assert_parked(server, sandbox)

    resume_ok(server, sid, first["interrupt_id"], "yes")
    [second] = interrupted(server, sid)["interrupts"]  # reached by a replay of the whole turn
    assert second["payload"] == {"type": "confirm-again", "count": 1}
    assert_parked(server, sandbox)

    resume_ok(server, sid, second["interrupt_id"], "sure")
    body = wait_idle(server, sid, timeout=15)
    assert body["response"]["content"] == f"token={token} count=1 first=yes second=sure"
    assert lines(sandbox / "step-token") == [token]  # ``await motus.step(name, fn, *args)``: once
    assert lines(sandbox / "step-count") == ["ran"]  # ``@motus.step(name)``: once
    assert len(lines(sandbox / "pids")) == 3  # plain agent code did run again on each replay


def test_a_non_deterministic_agent_fails_with_replay_diverged(start_server: Callable[..., Server], tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    server = start_server(
        "tests.agents.durable:random_payload", "--workers", "2", "--store", store_url(tmp_path / "s.db"), "--park-after", "0",
        env=agent_env(sandbox),
    )
    sid = start_turn(server, "go")
    [item] = interrupted(server, sid)["interrupts"]
    assert item["payload"]["type"] == "x"
    assert_parked(server, sandbox)
    assert resume(server, sid, item["interrupt_id"], "whatever").status_code == 200
    body = wait_settled(server, sid)
    assert body["status"] == "error", body
    assert body["error"].startswith("Replay diverged:"), body["error"]
    assert body["interrupts"] is None


# -- the store at start --------------------------------------------------------------------


def test_the_store_can_come_from_MOTUS_STORE_and_idle_sessions_survive_a_restart(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    db = tmp_path / "s.db"
    env = {"MOTUS_STORE": store_url(db)}
    first = start_server("tests.agents:counting", "--workers", "1", env=env)
    assert health(first)["store"] == "sqlite"
    sid = start_turn(first, "hi")
    assert wait_idle(first, sid)["response"]["content"] == "turn 1: hi"
    assert first.stop() == 0
    assert db.exists()

    second = start_server("tests.agents:counting", "--workers", "1", env=env)
    state = health(second)
    assert state["store"] == "sqlite" and state["total_sessions"] == 1, state
    body = second.get(f"/sessions/{sid}").json()
    assert body["status"] == "idle" and body["response"]["content"] == "turn 1: hi", body
    assert [m["content"] for m in second.get(f"/sessions/{sid}/messages").json()] == ["hi", "turn 1: hi"]
    second.send(sid, "again")
    assert wait_idle(second, sid)["response"]["content"] == "turn 2: again"  # the history came back


def test_a_second_server_on_the_same_sqlite_file_is_refused(start_server: Callable[..., Server], tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    holder = start_server("tests.agents:echo", "--workers", "1", "--store", store_url(db))
    sid = start_turn(holder, "hi")
    assert wait_idle(holder, sid)["response"]["content"] == "echo: hi"

    code, output = refused_start(["tests.agents:echo", "--workers", "1", "--store", store_url(db)], tmp_path)
    assert code == 2, output
    assert_short_clean_error(output)
    assert str(db) in output, output
    assert "PostgreSQL" in output, output
    holder_pids = [holder.process.pid, *(p.pid for p in holder.descendants())]
    assert any(re.search(rf"\b{pid}\b", output) for pid in holder_pids), (holder_pids, output)

    # The refused start disturbed nothing.
    sid2 = start_turn(holder, "still here")
    assert wait_idle(holder, sid2)["response"]["content"] == "echo: still here"
    assert health(holder)["total_sessions"] == 2


def _bump_schema_version(db: Path) -> None:
    """Make ``db`` look written by a newer motus: ``meta.schema_version`` one higher."""
    with closing(sqlite3.connect(db)) as conn:
        cursor = conn.execute("SELECT * FROM meta")
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        [row] = [r for r in rows if "schema_version" in r]
        key_column = columns[row.index("schema_version")]
        [value_column] = [c for c in columns if c != key_column]
        current = row[columns.index(value_column)]
        assert int(current) >= 1, current
        newer = str(int(current) + 1) if isinstance(current, str) else int(current) + 1
        conn.execute(f'UPDATE meta SET "{value_column}" = ? WHERE "{key_column}" = ?', (newer, "schema_version"))
        conn.commit()


@pytest.mark.parametrize("case", ["corrupt", "newer-schema", "malformed-url", "unwritable"])
def test_an_unusable_store_stops_the_start_with_a_clear_error(
    start_server: Callable[..., Server], tmp_path: Path, case: str
) -> None:
    db = tmp_path / "s.db"
    if case == "corrupt":
        db.write_bytes(b"this is not a SQLite database, just some bytes\n" * 200)
        url = store_url(db)
    elif case == "newer-schema":
        made = start_server("tests.agents:echo", "--workers", "1", "--store", store_url(db))
        assert made.stop() == 0
        _bump_schema_version(db)
        url = store_url(db)
    elif case == "malformed-url":
        url = "bogus://x"
    else:  # a path whose parent is a file: not creatable, whoever runs the test (root too)
        (tmp_path / "a-file").write_text("not a directory")
        url = store_url(tmp_path / "a-file" / "s.db")
    before = db.read_bytes() if db.exists() else None

    code, output = refused_start(["tests.agents:echo", "--workers", "1", "--store", url], tmp_path, name=case)
    assert code == 2, output
    assert_short_clean_error(output)
    if case == "newer-schema":
        assert "schema" in output.lower(), output
    if before is not None:
        assert db.read_bytes() == before  # refused, never rewritten


# -- SIGTERM -----------------------------------------------------------------------------------


def test_sigterm_with_a_durable_store_parks_interrupted_turns_for_the_next_start(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    args = ["--workers", "2", "--store", store_url(tmp_path / "s.db")]
    sink = WebhookSink()
    try:
        first = start_server("tests.agents:dispatch", *args)
        single = first.create_session()
        first.send(single, "approval /tmp/report.txt", webhook={"url": sink.url})
        double = start_turn(first, "two")
        before = {single: interrupted(first, single)["interrupts"], double: interrupted(first, double, 2)["interrupts"]}
        assert health(first)["live_turns"] == 2  # live (not yet parked) when the signal comes

        assert first.stop() == 0  # graceful, and no process outlives it
        assert sink.calls == []  # the turn did not end ("Turn cancelled" would have fired it)

        second = start_server("tests.agents:dispatch", *args)
        state = health(second)
        assert state["parked_turns"] == 2 and state["live_turns"] == 0 and state["total_sessions"] == 2, state
        for sid, items in before.items():
            body = second.get(f"/sessions/{sid}").json()
            assert body["status"] == "interrupted" and body["interrupts"] == items, body

        [item] = before[single]
        resume_ok(second, single, item["interrupt_id"], {"approved": True})
        assert wait_idle(second, single, timeout=15)["response"]["content"] == "approved=True value={'approved': True}"
        by_tool = {i["payload"]["tool_name"]: i for i in before[double]}
        resume_ok(second, double, by_tool["b"]["interrupt_id"], "B")
        resume_ok(second, double, by_tool["a"]["interrupt_id"], "A")
        assert wait_idle(second, double, timeout=15)["response"]["content"] == "first='A' second='B'"
    finally:
        sink.close()


def test_sigterm_with_the_memory_store_still_cancels_interrupted_turns(start_server: Callable[..., Server]) -> None:
    server = start_server("tests.agents:dispatch", "--workers", "2", "--store", "memory")
    sink = WebhookSink()
    try:
        state = health(server)
        assert state["store"] == "memory", state
        sid = server.create_session()
        server.send(sid, "approval doomed", webhook={"url": sink.url})
        interrupted(server, sid)
        state = health(server)
        assert state["live_turns"] == 1 and state["parked_turns"] == 0, state
        assert server.stop() == 0
        [call] = sink.wait_for(1)
        assert call["body"]["status"] == "error" and call["body"]["error"] == "Turn cancelled"
    finally:
        sink.close()


# -- a model client of the user's own ------------------------------------------------------


def test_a_model_client_of_the_users_own_is_journaled_shown_while_waiting_and_not_asked_again(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Any ``chat(...)`` client, not only motus's HTTP ones: what the model said before the
    gate is in the live view and the inbox while the turn waits, and the parked turn's
    replay gets the recorded reply (the client is asked twice in all, not three times)."""
    sandbox = tmp_path / "sandbox"
    server = start_server("tests.agents.durable:own_client", "--store", store_url(tmp_path / "s.db"), "--park-after", "0",
                          env=agent_env(sandbox))
    session_id = start_turn(server, "clean up the logs")
    [item] = interrupted(server, session_id)["interrupts"]
    assert_parked(server, sandbox)
    model, gate = server.get(f"/sessions/{session_id}").json()["turn"]["steps"]
    assert (model["kind"], model["label"], model["text"]) == ("model", "ScriptedChatClient.chat", "I'll remove the old logs first.")
    assert model["tool_calls"] == [{"name": "touch", "arguments": {"path": "old_logs.txt"}}]
    assert gate["interrupt_id"] == item["interrupt_id"]
    [inbox] = server.get("/interrupts").json()
    assert inbox["context"]["agent_text"] == "I'll remove the old logs first."
    assert resume_ok(server, session_id, item["interrupt_id"], {"approved": True})["status"] == "running"
    assert wait_idle(server, session_id, timeout=20)["response"]["content"] == "Done: the old logs are gone."
    assert (sandbox / "model-calls").read_text().split() == ["0", "1"]
    assert len((sandbox / "pids").read_text().split()) == 2  # the turn did run again (a replay)
    assert len((sandbox / "ran-old_logs.txt").read_text().split()) == 1


def test_after_kill_9_the_inbox_still_says_who_asked_what_and_the_own_clients_reply_is_not_asked_again(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """SIGKILL of the whole server group while a turn waits: the restarted server's inbox
    has the same title, message, sender and agent text; the replay gets the recorded reply
    of the user's own model client; the finished history names its sender."""
    sandbox = tmp_path / "sandbox"
    args = ("--store", store_url(tmp_path / "s.db"), "--api-key", "alice=SECRET1")
    alice = start_server("tests.agents.durable:own_client", *args, env=agent_env(sandbox)).with_headers(
        {"Authorization": "Bearer SECRET1"})
    session_id = start_turn(alice, "clean up the logs")
    interrupted(alice, session_id)
    assert alice.patch(f"/sessions/{session_id}", json={"title": "Logs"}).status_code == 200
    [before] = alice.get("/interrupts").json()
    kill_server(alice)

    again = start_server("tests.agents.durable:own_client", *args, env=agent_env(sandbox)).with_headers(
        {"Authorization": "Bearer SECRET1"})
    [after] = again.get("/interrupts").json()
    assert after == before
    assert after["context"] == {"session_title": "Logs", "message": "clean up the logs", "sent_by": "alice",
                                "sent_at": before["context"]["sent_at"], "agent_text": "I'll remove the old logs first."}
    assert resume_ok(again, session_id, after["interrupt_id"], {"approved": True})["status"] == "running"
    assert wait_idle(again, session_id, timeout=20)["response"]["content"] == "Done: the old logs are gone."
    assert (sandbox / "model-calls").read_text().split() == ["0", "1"]
    [asked] = [m for m in again.get(f"/sessions/{session_id}/messages", params={"senders": "true"}).json() if m["role"] == "user"]
    assert (asked["content"], asked["sent_by"], asked["sent_at"]) == ("clean up the logs", "alice", before["context"]["sent_at"])
