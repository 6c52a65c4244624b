"""Agents served by ``tests/integration/serve/approvals/test_workflow.py`` (events, inbox,
expiry, grants, audit). Imported by the server subprocess as ``tests.agents.approval:NAME``.

Gated tool bodies leave one line per run in ``ran-<tool>`` under ``$MOTUS_EXAMPLE_DIR``, so a
test counts what really ran, whatever the server says.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from motus.durable.journal import current
from motus.models import ChatMessage
from motus.serve.interrupt import interrupt
from motus.tools import tool


def _sandbox() -> Path:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or "/nonexistent-motus-test-sandbox")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _ran(name: str, line: str) -> None:
    with open(_sandbox() / f"ran-{name}", "a") as handle:
        handle.write(line + "\n")


def _reply(message: ChatMessage, state: list[ChatMessage], content: str):
    response = ChatMessage.assistant_message(content=content)
    return response, state + [message, response]


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete ``path`` (it only records that it ran)."""
    _ran("delete_file", path)
    return f"deleted {path}"


@tool(requires_approval=lambda path: path.startswith("/etc"))
def edit_file(path: str) -> str:
    """Edit ``path``; only paths under /etc need a person."""
    _ran("edit_file", path)
    return f"edited {path}"


@tool(requires_approval=True, approval_timeout=float(os.environ.get("MOTUS_TEST_APPROVAL_TIMEOUT", "1")))
def send_money(amount: int) -> str:
    """Send ``amount``; an approval nobody gives within the timeout is a rejection."""
    _ran("send_money", str(amount))
    return f"sent {amount}"


@tool(requires_approval=True, approvers=["finance"], self_approval=False)
def wire_money(amount: int) -> str:
    """Wire ``amount``: a key with the role ``finance`` approves, never the one who asked."""
    _ran("wire_money", str(amount))
    return f"wired {amount}"


@tool(requires_approval=True, approvers=["finance"], quorum=2)
def release_funds(amount: int) -> str:
    """Release ``amount``: two different keys with the role ``finance`` approve (a two-person rule)."""
    _ran("release_funds", str(amount))
    return f"released {amount}"


TOOLS = {"delete_file": delete_file, "edit_file": edit_file, "send_money": send_money, "wire_money": wire_money,
         "release_funds": release_funds}


async def calls(message: ChatMessage, state: list[ChatMessage]):
    """Run the tool calls the message lists, one after another: ``delete_file a;
    delete_file b; send_money 5`` (the model's part, scripted). Replies with each result."""
    results = []
    for part in (message.content or "").split(";"):
        name, _, argument = part.strip().partition(" ")
        if not name:
            continue
        tool_ = TOOLS[name]
        key = "amount" if name in ("send_money", "wire_money", "release_funds") else "path"
        value: object = int(argument) if key == "amount" else argument
        results.append(await tool_.invoke({key: value}))
    return _reply(message, state, " | ".join(results))


async def expiring(message: ChatMessage, state: list[ChatMessage]):
    """One custom interrupt that resolves itself with ``{"choice": "default"}`` after the
    number of seconds the message says."""
    value = await interrupt(
        {"type": "confirm", "prompt": "Go ahead?"}, timeout=float(message.content or "1"), default={"choice": "default"}
    )
    return _reply(message, state, f"got {value}")


async def two_questions(message: ChatMessage, state: list[ChatMessage]):
    """Two interrupts at once (as ``asyncio.gather`` would raise them)."""
    import asyncio

    first, second = await asyncio.gather(
        interrupt({"type": "confirm", "prompt": "first?"}), interrupt({"type": "confirm", "prompt": "second?"})
    )
    return _reply(message, state, f"{first} {second}")


async def asks_while_thinking(message: ChatMessage, state: list[ChatMessage]):
    """A question and a model call in one ``asyncio.gather``: the question waits on a person
    while the model call (journaled as a model reply, as a client of motus's would) finishes
    once the test creates ``release-thinking`` in the sandbox."""

    async def think() -> dict:
        deadline = time.monotonic() + 20
        while not (_sandbox() / "release-thinking").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return {"choices": [{"message": {"role": "assistant", "content": "Meanwhile I looked it up."}}]}

    journal = current()
    assert journal is not None
    answer, _ = await asyncio.gather(
        interrupt({"type": "confirm", "prompt": "Go on?"}), journal.call("model", "think", "Own.chat", think)
    )
    return _reply(message, state, f"got {answer}")
