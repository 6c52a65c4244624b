"""Serve an OpenAI Agents SDK agent (``agents.Agent``) with motus' approvals and durability.

``motus serve start myapp:agent`` with ``agent = agents.Agent(...)`` wraps it in
:class:`OpenAIAgentsAgent` (auto-detected; no import of this module needed). Build the
adapter yourself to pass options: ``agent = OpenAIAgentsAgent(my_agent, max_turns=20)``.

A turn:

1. the session's history (:class:`~motus.models.ChatMessage` list) and the new message become
   the SDK's input items (user / assistant / ``function_call`` / ``function_call_output``);
2. ``Runner.run`` runs the agent. A tool declared with ``needs_approval`` (``True`` or a
   callable) stops the run with ``result.interruptions``; each becomes a ``tool_approval``
   interrupt (``{"type": "tool_approval", "tool_name", "tool_args"}``), all of one step at
   once. ``{"approved": true}`` approves the call in the run's ``RunState``; a rejection
   rejects it with ``"User rejected <tool>[: <reason>]"`` as the message the model sees.
   Arguments edited in an approval cannot be applied to an SDK tool call, so such an answer
   rejects the call and tells the model why;
3. the run continues from its ``RunState`` until it ends or asks again.

Durability: each run segment is a ``motus.step`` whose recorded value is the SDK's own pause
state (``RunState.to_json()`` and the pending approvals) or the run's outcome. A replay after
``--park-after`` or a restart gets those back from the journal and does not call the model or
any tool again; only the segment after the last answer runs.

The response is the final output (a structured output as JSON). A guardrail tripwire ends the
turn with a refusal message. The new state holds the conversation as ChatMessages: the user
message, assistant messages with their tool calls, the tool results, the response.

Tracing: the SDK sends traces to OpenAI by default; served turns run with tracing disabled
unless ``MOTUS_OPENAI_AGENTS_TRACING=1`` is set.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from pydantic_core import to_jsonable_python

from motus.durable.journal import step
from motus.frameworks._common import Answer, Approval, ask_approvals, finish, output_text, parse_arguments
from motus.models import ChatMessage
from motus.models.messages import FunctionCall, ToolCall

try:
    import agents as _sdk
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "Serving an OpenAI Agents SDK agent needs the 'openai-agents' package: pip install 'motus[openai-agents]'"
    ) from exc

__all__ = ["OpenAIAgentsAgent", "to_input_items", "to_chat_messages"]

EDITED_ARGS = "the approval edited the arguments, which cannot be applied to this tool call; ask for it again with the arguments you want"


def tracing_enabled() -> bool:
    return os.environ.get("MOTUS_OPENAI_AGENTS_TRACING", "").strip().lower() in ("1", "true", "yes")


class OpenAIAgentsAgent:
    """A :class:`~motus.serve.agents.ServableAgent` running an ``agents.Agent``."""

    def __init__(self, agent: Any, *, max_turns: int | None = None, run_config: Any = None, context: Any = None) -> None:
        if not isinstance(agent, _sdk.Agent):
            raise TypeError(f"OpenAIAgentsAgent needs an agents.Agent, got {type(agent).__name__}")
        self.agent = agent
        self.max_turns = max_turns
        self.run_config = run_config
        self.context = context

    def __repr__(self) -> str:
        return f"OpenAIAgentsAgent({self.agent.name!r})"

    # -- the turn -------------------------------------------------------------------------

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
        items = to_input_items([*state, message])
        snapshot = await step("openai-agents: run", self._start, items)
        segment = 0
        while snapshot["status"] == "interrupted":
            approvals = [Approval(**item) for item in snapshot["approvals"]]
            answers = await ask_approvals(approvals, editable=False)  # see EDITED_ARGS
            segment += 1
            saved = snapshot["state"]

            async def resume(decisions: list[dict[str, Any]], saved: dict[str, Any] = saved) -> dict[str, Any]:
                return await self._resume(saved, [Answer(**d) for d in decisions], len(items))

            snapshot = await step(f"openai-agents: resume {segment}", resume, [dataclasses.asdict(a) for a in answers])
        if snapshot["status"] == "refused":
            response = ChatMessage.assistant_message(content=snapshot["output"])
            return response, [*state, message, response]
        produced = to_chat_messages(snapshot["items"])
        return finish(message, state, produced, snapshot["output"])

    # -- run segments (each one a motus.step) ---------------------------------------------

    def _config(self) -> Any:
        config = self.run_config if self.run_config is not None else _sdk.RunConfig()
        if not tracing_enabled():
            _sdk.set_tracing_disabled(True)
            config = dataclasses.replace(config, tracing_disabled=True)
        return config

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"run_config": self._config()}
        if self.max_turns is not None:
            options["max_turns"] = self.max_turns
        return options

    async def _start(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return await self._run(items, len(items), context=self.context)

    async def _resume(self, saved: dict[str, Any], answers: list[Answer], input_length: int) -> dict[str, Any]:
        run_state = await _sdk.RunState.from_json(self.agent, saved)
        pending = {_call_id(item): item for item in run_state.get_interruptions()}
        for answer in answers:
            item = pending.get(answer.call_id)
            if item is None:
                raise RuntimeError(f"the run has no pending approval for tool call {answer.call_id!r}")
            if answer.approved and answer.tool_args is None:
                run_state.approve(item)
            else:
                text = answer.message or f"User rejected {item.tool_name}: {EDITED_ARGS}"
                run_state.reject(item, rejection_message=text)
        return await self._run(run_state, input_length)

    async def _run(self, run_input: Any, input_length: int, **extra: Any) -> dict[str, Any]:
        try:
            result = await _sdk.Runner.run(self.agent, run_input, **self._options(), **extra)
        except (_sdk.InputGuardrailTripwireTriggered, _sdk.OutputGuardrailTripwireTriggered) as exc:
            guardrail = exc.guardrail_result.guardrail
            name = guardrail.get_name() if hasattr(guardrail, "get_name") else type(guardrail).__name__
            return {"status": "refused", "output": f"Sorry, I can't help with that: the request was stopped by the {name!r} guardrail."}
        if result.interruptions:
            approvals = [
                Approval(call_id=_call_id(item), tool_name=item.tool_name or "tool", tool_args=parse_arguments(_raw(item, "arguments")))
                for item in result.interruptions
            ]
            return {
                "status": "interrupted",
                "state": _plain(result.to_state().to_json()),
                "approvals": [dataclasses.asdict(a) for a in approvals],
            }
        items = _plain(result.to_input_list())[input_length:]
        return {"status": "done", "items": items, "output": output_text(result.final_output)}


def _raw(item: Any, field: str) -> Any:
    raw = item.raw_item
    return raw.get(field) if isinstance(raw, dict) else getattr(raw, field, None)


def _call_id(item: Any) -> str:
    return str(_raw(item, "call_id") or _raw(item, "id") or "")


def _plain(value: Any) -> Any:
    """JSON data only (what the journal keeps must pickle and read back anywhere)."""
    return json.loads(json.dumps(to_jsonable_python(value)))


# -- ChatMessage <-> SDK input items ------------------------------------------------------


def to_input_items(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the SDK's input items (Responses-style dicts)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            items.append({"type": "function_call_output", "call_id": message.tool_call_id or "", "output": message.content or ""})
        elif message.role == "assistant":
            if message.content:
                items.append({"role": "assistant", "content": message.content})
            for call in message.tool_calls or []:
                items.append({"type": "function_call", "call_id": call.id, "name": call.function.name, "arguments": call.function.arguments})
        elif message.role == "system":
            items.append({"role": "system", "content": message.content or ""})
        else:
            items.append({"role": "user", "content": message.content or ""})
    return items


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(part.get("text") or part.get("refusal") or "")
            else:
                parts.append(str(part))
        return "".join(parts)
    return "" if content is None else json.dumps(content)


def to_chat_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    """The SDK's run items (``result.to_input_list()``) as chat messages; kinds with no chat
    form (reasoning, for example) are left out."""
    messages: list[ChatMessage] = []
    names: dict[str, str] = {}
    for item in items:
        kind = item.get("type")
        role = item.get("role")
        if kind == "function_call":
            call = ToolCall(id=item["call_id"], function=FunctionCall(name=item["name"], arguments=item.get("arguments") or "{}"))
            names[call.id] = call.function.name
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage.assistant_message(tool_calls=[call]))
        elif kind == "function_call_output":
            call_id = item.get("call_id") or ""
            messages.append(ChatMessage.tool_message(_text(item.get("output")), tool_call_id=call_id, name=names.get(call_id)))
        elif role in ("assistant", "user", "system") and kind in (None, "message"):
            messages.append(ChatMessage(role=role, content=_text(item.get("content"))))
    return messages


def adapt(agent: Any) -> OpenAIAgentsAgent | None:
    """The adapter for an ``agents.Agent`` (used by ``motus serve``'s auto-detection); None for
    any other object of the package."""
    if isinstance(agent, _sdk.Agent):
        return OpenAIAgentsAgent(agent)
    return None
