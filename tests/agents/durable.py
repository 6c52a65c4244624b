"""Agents served by ``tests/integration/serve/durability/test_durability.py`` (durable store, parking,
replay, restarts). Imported by the server subprocess as ``tests.agents.durable:NAME``.

Every agent leaves traces in a directory the test owns (``$MOTUS_EXAMPLE_DIR``, the
"sandbox"), so a test can count what really ran, whatever the server says:

- ``pids``: one line per time the agent's turn code started (the first run and every
  replay), with the worker's pid, so a test can look for that process in the server's
  process tree;
- ``ran-<path>``: one line per time the gated ``touch`` tool's body ran for ``<path>``;
- ``started-<name>`` / ``done-<name>``: the gated ``hold`` tool's body started (its pid) /
  finished; the body blocks until the test creates ``release-<name>``;
- ``step-token`` / ``step-count``: one line per time a ``motus.step`` body ran.

The ReAct agent talks to the scripted loopback provider the test runs
(``$MOTUS_TEST_PROVIDER_URL``, see ``tests/support/fakes/providers.py``).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import motus
from motus.agent import ReActAgent
from motus.models import ChatMessage
from motus.models.openai_client import OpenAIChatClient
from motus.serve.interrupt import interrupt
from motus.tools import tool
from motus.tools.builtins.ask_user import ask_user_question

PROVIDER_URL = os.environ.get("MOTUS_TEST_PROVIDER_URL", "http://127.0.0.1:9")
PROVIDER_KEY = os.environ.get("MOTUS_TEST_PROVIDER_KEY", "sk-test-key")

#: How long the gated ``hold`` tool waits for its release file before giving up, so a
#: failing test never leaves a worker blocked for ever.
HOLD_LIMIT_SECONDS = 20.0


def sandbox() -> Path:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _append(name: str, line: str) -> None:
    with open(sandbox() / name, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _lines(name: str) -> list[str]:
    path = sandbox() / name
    return path.read_text().splitlines() if path.exists() else []


def record_pid() -> None:
    """Plain (not journaled) agent code: runs again on every replay."""
    _append("pids", str(os.getpid()))


def _reply(message: ChatMessage, state: list[ChatMessage], content: str):
    response = ChatMessage.assistant_message(content=content)
    return response, state + [message, response]


# -- issue 9, section 0: the pool deadlock -------------------------------------------------


async def _pause(name: str, default_seconds: float) -> None:
    """Sleep as the issue's agent does, or, when ``$MOTUS_TEST_GATE_DIR`` is set, wait until
    the test creates ``<dir>/<name>-go``, so the test decides the order of events instead of
    racing the clock. (Polling here is the agent's own code, not the test's synchronisation.)"""
    gate_dir = os.environ.get("MOTUS_TEST_GATE_DIR")
    if not gate_dir:
        await asyncio.sleep(float(os.environ.get(f"MOTUS_TEST_{name.upper()}_SECONDS", default_seconds)))
        return
    gate = Path(gate_dir) / f"{name}-go"
    while not gate.exists():
        await asyncio.sleep(0.01)


async def gather_two(message: ChatMessage, state: list[ChatMessage]):
    """The agent of issue 9 section 0: "busy" holds a compute slot for a while; anything else
    awaits two interrupts through ``asyncio.gather``, the second raised a while after the
    first. ("echo" answers at once: a later turn that must still get a slot.)"""
    if message.content == "echo":
        return ChatMessage.assistant_message(content="echo"), state
    if message.content == "busy":
        gate_dir = os.environ.get("MOTUS_TEST_GATE_DIR")
        if gate_dir:
            (Path(gate_dir) / "busy-started").touch()
        await _pause("busy", 5.0)
        return ChatMessage.assistant_message(content="ok"), state

    async def later():
        await _pause("later", 2.0)
        return await interrupt({"type": "b"})

    a, b = await asyncio.gather(interrupt({"type": "a"}), later())
    return ChatMessage.assistant_message(content=f"{a}{b}"), state


async def gather_now(message: ChatMessage, state: list[ChatMessage]):
    """Two interrupts from one ``asyncio.gather``, both raised at once ("echo": no interrupt)."""
    if message.content == "echo":
        return _reply(message, state, "echo")
    record_pid()
    a, b = await asyncio.gather(interrupt({"type": "a"}), interrupt({"type": "b"}))
    return _reply(message, state, f"a={a!r} b={b!r}")


async def one_gate(message: ChatMessage, state: list[ChatMessage]):
    """One interrupt; writes ``<pid> <content>`` to ``gates`` each time the turn (re)starts."""
    _append("gates", f"{os.getpid()} {message.content}")
    value = await interrupt({"type": "ok", "turn": message.content})
    return _reply(message, state, f"{message.content}: {value!r}")


# -- non-determinism ---------------------------------------------------------------------


async def random_payload(message: ChatMessage, state: list[ChatMessage]):
    """A different payload on every run: a replay cannot match the journal."""
    record_pid()
    value = await interrupt({"type": "x", "n": random.random()})
    return _reply(message, state, f"value={value!r}")


# -- motus.step ------------------------------------------------------------------------------


def issue_token(name: str) -> str:
    """A side effect the turn must perform exactly once: a fresh token, written down."""
    token = uuid.uuid4().hex
    _append(name, token)
    return token


async def _count_side_effect() -> int:
    await asyncio.sleep(0)
    _append("step-count", "ran")
    return len(_lines("step-count"))


# The decorator form, applied as users write it (module level). Guarded only so that this
# module still imports where ``motus.step`` does not exist yet (the other agents need it).
count_side_effect = motus.step("count side effect")(_count_side_effect) if hasattr(motus, "step") else None


async def stepper(message: ChatMessage, state: list[ChatMessage]):
    """step -> interrupt -> decorated step -> interrupt. Each step body must run once in
    all, however many times the turn is parked and replayed; on replay the steps return
    their recorded results (so the payloads, built from them, match the journal)."""
    if count_side_effect is None:
        raise RuntimeError("motus.step is missing")
    record_pid()
    token = await motus.step("issue token", issue_token, "step-token")
    first = await interrupt({"type": "confirm", "token": token})
    count = await count_side_effect()
    second = await interrupt({"type": "confirm-again", "count": count})
    return _reply(message, state, f"token={token} count={count} first={first} second={second}")


# -- a ReAct agent with gated file tools, against the scripted provider --------------------


@tool(requires_approval=True)
def touch(path: str) -> str:
    """Record that this (gated) tool ran for ``path``: one line in ``ran-<path>`` per run."""
    _append(f"ran-{path}", str(os.getpid()))
    return f"Touched {path}"


@tool(requires_approval=True)
def hold(name: str) -> str:
    """A gated tool whose body writes ``started-<name>``, then blocks until the test creates
    ``release-<name>``, then writes ``done-<name>``."""
    _append(f"started-{name}", str(os.getpid()))
    release = sandbox() / f"release-{name}"
    deadline = time.monotonic() + HOLD_LIMIT_SECONDS
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"release-{name} never appeared")
        time.sleep(0.02)
    _append(f"done-{name}", str(os.getpid()))
    return f"Released {name}"


class PidRecording:
    """A ServableAgent wrapper: records the worker's pid each time the turn (re)starts."""

    def __init__(self, inner: ReActAgent) -> None:
        self.inner = inner

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]):
        record_pid()
        return await self.inner.run_turn(message, state)


files = PidRecording(
    ReActAgent(
        client=OpenAIChatClient(api_key=PROVIDER_KEY, base_url=PROVIDER_URL, max_retries=2, backoff=0.01, max_retry_after=1.0),
        model_name="fake-model",
        system_prompt="You manage files.",
        tools=[touch, hold, ask_user_question],
    )
)


# -- a ReAct agent over a model client of the user's own (not one of motus's HTTP clients) --


def _own_model(messages: list[ChatMessage], tools: object) -> ChatMessage | str:
    """The script of ``own_client``: each call is one line in ``model-calls``, so a test
    counts how often the client was asked (a replay must not ask it again)."""
    from motus.models.scripted import calls_this_turn, tool_calls

    _append("model-calls", str(calls_this_turn(messages)))
    if calls_this_turn(messages) == 0:
        return tool_calls(("touch", {"path": "old_logs.txt"}), text="I'll remove the old logs first.")
    return "Done: the old logs are gone."


def _scripted() -> object:
    from motus.models import ScriptedChatClient

    return ScriptedChatClient(_own_model)


own_client = PidRecording(ReActAgent(client=_scripted(), model_name="own", tools=[touch]))
