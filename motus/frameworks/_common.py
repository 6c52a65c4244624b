"""What the framework adapters share: approval payloads and answers, and results as messages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from motus.models import ChatMessage
from motus.tools.approval import parse_approval


@dataclass(frozen=True)
class Approval:
    """One tool call the framework wants a person to approve."""

    call_id: str
    tool_name: str
    tool_args: Any


@dataclass(frozen=True)
class Answer:
    """A person's answer to one :class:`Approval`, in plain data (it is a step argument)."""

    call_id: str
    approved: bool
    message: str | None = None  # for a rejection: what the model is told
    tool_args: dict[str, Any] | None = None  # for an approval: arguments the person edited


def parse_arguments(arguments: Any) -> Any:
    """A tool call's arguments as JSON data (a JSON string is decoded; bad JSON stays text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return to_jsonable_python(arguments)


async def ask_approvals(approvals: Sequence[Approval], editable: bool = True) -> list[Answer]:
    """Raise one ``tool_approval`` interrupt per call, all at once, and read the answers.

    A tool the session approved "for the session" earlier (``"remember": "session"``) is let
    through without asking, as for motus' own gated tools. ``editable=False``: the framework
    cannot run a call with other arguments than its own, so the payload says
    ``"editable": false`` and clients offer no edit (one that is sent anyway is refused by
    the adapter)."""
    from motus.durable.interrupt import interrupt, session_grants, was_asked

    grants = session_grants()

    async def ask(item: Approval) -> Answer:
        payload: dict[str, Any] = {"type": "tool_approval", "tool_name": item.tool_name, "tool_args": item.tool_args}
        if not editable:
            payload["editable"] = False
        if item.tool_name in grants and not was_asked(payload):
            # approved for the session earlier (and, on a replay, not asked the first time:
            # a grant read back from one answer must not skip a call that was asked, and
            # may have been rejected)
            return Answer(item.call_id, True)
        value = await interrupt(payload)
        decision = parse_approval(value)
        if not decision.approved:
            text = f"User rejected {item.tool_name}" + (f": {decision.reason}" if decision.reason else "")
            return Answer(item.call_id, False, message=text)
        if isinstance(value, dict) and value.get("remember") == "session":
            grants.add(item.tool_name)
        edited = decision.tool_args
        if edited is not None and isinstance(item.tool_args, dict) and all(item.tool_args.get(k) == v for k, v in edited.items()):
            edited = None  # nothing changed
        return Answer(item.call_id, True, tool_args=edited)

    return list(await asyncio.gather(*(ask(item) for item in approvals)))


def output_text(output: Any) -> str:
    """A final output as the response's text: a string as it is, anything else as JSON."""
    if isinstance(output, str):
        return output
    return json.dumps(to_jsonable_python(output), ensure_ascii=False)


def finish(message: ChatMessage, state: list[ChatMessage], produced: list[ChatMessage], text: str) -> tuple[ChatMessage, list[ChatMessage]]:
    """The turn's ``(response, new_state)``: the history, the new message, what the run
    produced, and the response (replacing the run's last assistant text, which it renders)."""
    if produced and produced[-1].role == "assistant" and not produced[-1].tool_calls:
        produced = produced[:-1]
    response = ChatMessage.assistant_message(content=text)
    return response, [*state, message, *produced, response]
