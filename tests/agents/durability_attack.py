"""Agents served by ``tests/integration/serve/durability/test_durability_attacks.py``: each one pokes at a
corner of durable turns (the store, the journal, parking, replay, restarts). Imported by the
server subprocess as ``tests.agents.durability_attack:NAME``.

Like ``tests.agents.durable``, every agent leaves traces in the test's sandbox
(``$MOTUS_EXAMPLE_DIR``) so a test counts what really ran; the helpers come from there.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import motus
from motus.models import ChatMessage
from motus.serve.interrupt import interrupt
from motus.tools import tool
from tests.agents.durable import _append, _lines, _reply, hold, record_pid, sandbox, touch

#: How long an agent waits for a file the test creates before giving up, so a failing test
#: never leaves a worker blocked for ever.
WAIT_LIMIT_SECONDS = 20.0


def _wait_for_file(name: str) -> None:
    """Block until the test creates ``<sandbox>/<name>`` (the agent's own polling; the test
    decides when)."""
    path = sandbox() / name
    deadline = time.monotonic() + WAIT_LIMIT_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never appeared")
        time.sleep(0.01)


# -- text a SQLite TEXT column cannot hold --------------------------------------------------

async def echo_answer(message: ChatMessage, state: list[ChatMessage]):
    """``ask``: asks a question and answers with the client's reply, verbatim (as
    ``ask_user_question`` hands a free-text answer to the model); anything else is echoed."""
    if message.content == "ask":
        value = await interrupt({"type": "question", "prompt": "Say something"})
        return _reply(message, state, str(value))
    return _reply(message, state, message.content or "")


# -- values the journal cannot pickle, or cannot unpickle ------------------------------------


class Opaque:
    """A perfectly good tool result that pickle refuses (it holds a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return "opaque thing"


@tool
def make_opaque() -> str:
    """Return an object the model reads as text, but that cannot be pickled."""
    return Opaque()  # type: ignore[return-value]


async def opaque_tool(message: ChatMessage, state: list[ChatMessage]):
    """Calls a tool whose result cannot be pickled, and answers with what the model would read."""
    text = await make_opaque.invoke({})
    return _reply(message, state, text)


class ApiError(Exception):
    """An exception shaped like most HTTP clients' (two required arguments): pickle can write it
    but not read it back (``ApiError(message)`` misses ``body``)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def call_api() -> str:
    _append("api-calls", str(os.getpid()))
    raise ApiError(503, "try again later")


async def step_raises_api_error(message: ChatMessage, state: list[ChatMessage]):
    """A step that raises a custom exception the agent handles, then an approval."""
    record_pid()
    try:
        await motus.step("call api", call_api)
        outcome = "ok"
    except ApiError as exc:
        outcome = f"api said {exc.status}"
    value = await interrupt({"type": "confirm", "outcome": outcome})
    return _reply(message, state, f"{outcome}; value={value!r}")


# -- parking while journaled code runs -------------------------------------------------------


def slow_effect() -> int:
    """A side effect that takes as long as the test wants: ``effect-started`` when it begins,
    ``effect-done`` when it ends (after ``release-effect`` appears)."""
    _append("effect-started", str(os.getpid()))
    _wait_for_file("release-effect")
    _append("effect-done", str(os.getpid()))
    return len(_lines("effect-started"))


async def step_after_partial_resume(message: ChatMessage, state: list[ChatMessage]):
    """Two gates from one ``asyncio.gather``; once ``a`` is answered its branch runs a
    ``motus.step`` while ``b`` still waits on a person."""
    record_pid()

    async def branch_a():
        a = await interrupt({"type": "a"})
        runs = await motus.step("slow effect", slow_effect)
        return a, runs

    (a, runs), b = await asyncio.gather(branch_a(), interrupt({"type": "b"}))
    return _reply(message, state, f"a={a} b={b} runs={runs}")


async def late_step(message: ChatMessage, state: list[ChatMessage]):
    """``step``: two gates from one ``asyncio.gather``; once ``a`` is answered its branch
    waits (plain code, not journaled) until the test creates ``go-step``, then runs the
    ``motus.step`` ``slow_effect``, while ``b`` still waits on a person. ``ask <name>``:
    waits until the test creates ``go-<name>``, writes ``asking-<name>``, then raises one
    interrupt (a turn that begins to wait on a person when the test says)."""
    kind, _, name = (message.content or "").partition(" ")
    if kind == "ask":
        await asyncio.to_thread(_wait_for_file, f"go-{name}")
        _append(f"asking-{name}", str(os.getpid()))
        value = await interrupt({"type": "question", "who": name})
        return _reply(message, state, f"value={value!r}")

    async def branch_a():
        a = await interrupt({"type": "a"})
        await asyncio.to_thread(_wait_for_file, "go-step")
        runs = await motus.step("slow effect", slow_effect)
        return a, runs

    (a, runs), b = await asyncio.gather(branch_a(), interrupt({"type": "b"}))
    return _reply(message, state, f"a={a} b={b} runs={runs}")


# -- gated tools in one gather ---------------------------------------------------------------


async def hold_and_touch(message: ChatMessage, state: list[ChatMessage]):
    """Two gated tools at once (as a model step with two tool calls runs them): ``hold`` (whose
    body blocks until the test releases it) and ``touch``."""
    record_pid()
    held, touched = await asyncio.gather(hold.invoke({"name": "x"}), touch.invoke({"path": "t.txt"}))
    return _reply(message, state, f"hold={held} touch={touched}")


async def two_gates(message: ChatMessage, state: list[ChatMessage]):
    """Two interrupts one after the other (its worker's pid goes to ``pids``)."""
    record_pid()
    first = await interrupt({"type": "gate", "n": 1})
    second = await interrupt({"type": "gate", "n": 2})
    return _reply(message, state, f"{first}+{second}")


async def wait_here(message: ChatMessage, state: list[ChatMessage]):
    """One plain interrupt (its worker's pid goes to ``pids``)."""
    record_pid()
    value = await interrupt({"type": "wait", "who": message.content})
    return _reply(message, state, f"value={value!r}")


# -- processes an agent starts ---------------------------------------------------------------


async def spawns_helper(message: ChatMessage, state: list[ChatMessage]):
    """Starts a helper process (as a tool running a shell command does), then waits on a person."""
    record_pid()
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _append("helper", str(helper.pid))
    value = await interrupt({"type": "confirm"})
    helper.kill()
    helper.wait()
    return _reply(message, state, f"value={value!r}")


# -- store trouble while a turn runs ---------------------------------------------------------


async def gated_reply(message: ChatMessage, state: list[ChatMessage]):
    """``started`` once running; then waits for ``go`` and, for "ask", raises an interrupt,
    otherwise answers."""
    _append("started", str(os.getpid()))
    await asyncio.to_thread(_wait_for_file, "go")
    if message.content == "ask":
        value = await interrupt({"type": "confirm"})
        return _reply(message, state, f"value={value!r}")
    return _reply(message, state, "done")


# -- concurrency on replay -------------------------------------------------------------------


def fetch(url: str) -> str:
    _append("fetches", url)
    return f"page of {url}"


async def slow_branch_same_step(message: ChatMessage, state: list[ChatMessage]):
    """Two concurrent branches use the same step with different arguments. Branch one does some
    plain (not journaled) work in a thread first; branch two waits on a person first. The code
    is deterministic: only timing differs between the first run and a replay."""
    record_pid()

    async def slow():
        await asyncio.to_thread(time.sleep, 0.5)
        return await motus.step("fetch", fetch, "one")

    async def asks():
        answer = await interrupt({"type": "which"})
        return await motus.step("fetch", fetch, f"two-{answer}")

    first, second = await asyncio.gather(slow(), asks())
    return _reply(message, state, f"{first} | {second}")

