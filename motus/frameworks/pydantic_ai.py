"""Serve a Pydantic AI agent (``pydantic_ai.Agent``) with motus' approvals and durability.

``motus serve start myapp:agent`` with ``agent = pydantic_ai.Agent(...)`` wraps it in
:class:`PydanticAIAgent` (auto-detected). A tool that needs a person is declared the Pydantic
AI way, ``@agent.tool(requires_approval=True)``, and the agent's output types must include
``DeferredToolRequests`` (``output_type=[str, DeferredToolRequests]``) so that the run can
stop and ask; an agent with such tools but without that output type is refused at start-up.

A turn:

1. the session's history (:class:`~motus.models.ChatMessage` list) becomes Pydantic AI's
   ``message_history`` (user prompts, responses with tool calls, tool returns) and the new
   message the run's user prompt;
2. ``agent.run`` runs. When its output is ``DeferredToolRequests``, each call in
   ``approvals`` becomes a ``tool_approval`` interrupt (``{"type": "tool_approval",
   "tool_name", "tool_args"}``), all at once. An approval is ``ToolApproved`` (with the
   edited arguments, merged over the model's, when the person changed them); a rejection is
   ``ToolDenied("User rejected <tool>[: <reason>]")``, the text the model sees as the tool's
   result;
3. the run continues with the message history and those ``DeferredToolResults``, until it
   ends or asks again.

Durability: each run segment is a ``motus.step`` whose recorded value is Pydantic AI's own
pause state, the message history (``ModelMessagesTypeAdapter`` JSON) with the deferred
requests, or the run's outcome; a replay after ``--park-after`` or a restart does not call the
model or any tool again. Deferred calls that are not approvals (``CallDeferred``, external
tools) have no motus counterpart yet: such a turn fails saying so.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from motus.durable.journal import step
from motus.frameworks._common import Answer, Approval, ask_approvals, finish, output_text
from motus.models import ChatMessage
from motus.models.messages import FunctionCall, ToolCall

try:
    import pydantic_ai as _pai
    from pydantic_ai import messages as _msg
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("Serving a Pydantic AI agent needs the 'pydantic-ai' package: pip install 'motus[pydantic-ai]'") from exc

__all__ = ["PydanticAIAgent", "to_model_messages", "to_chat_messages", "check"]


class PydanticAIAgent:
    """A :class:`~motus.serve.agents.ServableAgent` running a ``pydantic_ai.Agent``."""

    def __init__(self, agent: Any, *, deps: Any = None) -> None:
        if not isinstance(agent, _pai.Agent):
            raise TypeError(f"PydanticAIAgent needs a pydantic_ai.Agent, got {type(agent).__name__}")
        check(agent)
        self.agent = agent
        self.deps = deps

    def __repr__(self) -> str:
        return f"PydanticAIAgent({self.agent.name!r})"

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
        history = [item.model_dump(mode="json") for item in state]
        snapshot = await step("pydantic-ai: run", self._start, history, message.model_dump(mode="json"))
        segment = 0
        while snapshot["status"] == "deferred":
            approvals = [Approval(**item) for item in snapshot["approvals"]]
            answers = await ask_approvals(approvals)
            segment += 1
            saved = snapshot["messages"]

            async def resume(decisions: list[dict[str, Any]], saved: list[Any] = saved) -> dict[str, Any]:
                return await self._resume(saved, [Answer(**d) for d in decisions], approvals, len(history))

            snapshot = await step(f"pydantic-ai: resume {segment}", resume, [dataclasses.asdict(a) for a in answers])
        produced = to_chat_messages(_pai.ModelMessagesTypeAdapter.validate_python(snapshot["messages"][len(history):]))
        return finish(message, state, produced, snapshot["output"])

    # -- run segments (each one a motus.step) ---------------------------------------------

    async def _start(self, history: list[dict[str, Any]], message: dict[str, Any]) -> dict[str, Any]:
        messages = to_model_messages([ChatMessage.model_validate(item) for item in history])
        prompt = ChatMessage.model_validate(message).content or ""
        result = await self.agent.run(prompt, message_history=messages or None, deps=self.deps)
        return _snapshot(result)

    async def _resume(self, saved: list[Any], answers: list[Answer], approvals: list[Approval], history_length: int) -> dict[str, Any]:
        messages = _pai.ModelMessagesTypeAdapter.validate_python(saved)
        asked = {item.call_id: item for item in approvals}
        results: dict[str, Any] = {}
        for answer in answers:
            if not answer.approved:
                results[answer.call_id] = _pai.ToolDenied(answer.message or "User rejected the tool call")
            elif answer.tool_args is not None:
                original = asked[answer.call_id].tool_args
                merged = {**original, **answer.tool_args} if isinstance(original, dict) else answer.tool_args
                results[answer.call_id] = _pai.ToolApproved(override_args=merged)
            else:
                results[answer.call_id] = _pai.ToolApproved()
        result = await self.agent.run(
            message_history=messages, deferred_tool_results=_pai.DeferredToolResults(approvals=results), deps=self.deps
        )
        return _snapshot(result)


def _snapshot(result: Any) -> dict[str, Any]:
    """What the journal keeps of a run: JSON data only."""
    messages = json.loads(_pai.ModelMessagesTypeAdapter.dump_json(result.all_messages()))
    output = result.output
    if isinstance(output, _pai.DeferredToolRequests):
        if output.calls:
            names = ", ".join(sorted({call.tool_name for call in output.calls}))
            raise RuntimeError(
                f"The agent deferred tool calls that are not approvals ({names}); motus serves only approval-required "
                "deferred calls (requires_approval=True / ApprovalRequired)"
            )
        approvals = [
            Approval(call_id=call.tool_call_id, tool_name=call.tool_name, tool_args=call.args_as_dict()) for call in output.approvals
        ]
        return {"status": "deferred", "messages": messages, "approvals": [dataclasses.asdict(a) for a in approvals]}
    return {"status": "done", "messages": messages, "output": output_text(output)}


# -- start-up check -----------------------------------------------------------------------


def _approval_tools(agent: Any) -> list[str]:
    """Names of the agent's tools declared ``requires_approval=True``."""
    names: list[str] = []

    def visit(toolset: Any, depth: int = 0) -> None:
        if depth > 8 or toolset is None:
            return
        tools = getattr(toolset, "tools", None)
        if isinstance(tools, dict):
            names.extend(name for name, tool in tools.items() if getattr(tool, "requires_approval", False))
        if isinstance(toolset, _pai.ApprovalRequiredToolset):
            names.append(f"{type(toolset.wrapped).__name__} (ApprovalRequiredToolset)")
        for child in (getattr(toolset, "wrapped", None), *(getattr(toolset, "toolsets", None) or ())):
            visit(child, depth + 1)

    try:
        toolsets = list(agent.toolsets)
    except Exception:  # a toolset built per run cannot be looked at here
        toolsets = []
    for toolset in toolsets:
        visit(toolset)
    return sorted(set(names))


def _allows_deferred(agent: Any) -> bool:
    schema = getattr(agent, "_output_schema", None)
    allows = getattr(schema, "allows_deferred_tools", None)
    if isinstance(allows, bool):
        return allows
    output_type = getattr(agent, "output_type", None)
    kinds = output_type if isinstance(output_type, (list, tuple)) else [output_type]
    return any(kind is _pai.DeferredToolRequests for kind in kinds)


def check(agent: Any) -> None:
    """Refuse an agent whose approvals could never be asked (``ValueError`` saying what to change)."""
    gated = _approval_tools(agent)
    if gated and not _allows_deferred(agent):
        label = f"pydantic_ai.Agent {agent.name!r}" if getattr(agent, "name", None) else "this pydantic_ai.Agent"
        raise ValueError(
            f"{label} has tools that require approval ({', '.join(gated)}) but its output types do not include "
            "DeferredToolRequests, so the run cannot stop to ask a person: build it with "
            "output_type=[str, DeferredToolRequests] (add DeferredToolRequests to the output types you have)"
        )


def adapt(agent: Any) -> PydanticAIAgent | None:
    """The adapter for a ``pydantic_ai.Agent`` (used by ``motus serve``'s auto-detection)."""
    if isinstance(agent, _pai.Agent):
        return PydanticAIAgent(agent)
    return None


# -- ChatMessage <-> Pydantic AI messages -------------------------------------------------


def to_model_messages(messages: list[ChatMessage]) -> list[Any]:
    """Chat messages as Pydantic AI's ``message_history``."""
    result: list[Any] = []
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant":
            parts: list[Any] = [_msg.TextPart(content=message.content)] if message.content else []
            for call in message.tool_calls or []:
                names[call.id] = call.function.name
                parts.append(_msg.ToolCallPart(tool_name=call.function.name, args=call.function.arguments, tool_call_id=call.id))
            if parts:  # an empty assistant message has nothing to tell the model
                result.append(_msg.ModelResponse(parts=parts))
            continue
        if message.role == "tool":
            call_id = message.tool_call_id or ""
            part: Any = _msg.ToolReturnPart(tool_name=message.name or names.get(call_id, "tool"), content=message.content or "", tool_call_id=call_id)
        elif message.role == "system":
            part = _msg.SystemPromptPart(content=message.content or "")
        else:
            part = _msg.UserPromptPart(content=message.content or "")
        last = result[-1] if result else None
        if isinstance(last, _msg.ModelRequest):
            last.parts = [*last.parts, part]  # consecutive request parts travel together
        else:
            result.append(_msg.ModelRequest(parts=[part]))
    return result


def to_chat_messages(messages: list[Any]) -> list[ChatMessage]:
    """What a run produced as chat messages: responses (text and tool calls) and tool results.
    The run's own user prompt and system prompts are left out (the turn adds the message)."""
    chat: list[ChatMessage] = []
    for message in messages:
        if isinstance(message, _msg.ModelResponse):
            text = "".join(part.content for part in message.parts if isinstance(part, _msg.TextPart))
            calls = [
                ToolCall(id=part.tool_call_id, function=FunctionCall(name=part.tool_name, arguments=part.args_as_json_str()))
                for part in message.parts
                if isinstance(part, _msg.ToolCallPart)
            ]
            if text or calls:
                chat.append(ChatMessage.assistant_message(content=text or None, tool_calls=calls or None))
            continue
        for part in getattr(message, "parts", ()):
            if isinstance(part, _msg.ToolReturnPart):
                chat.append(ChatMessage.tool_message(part.model_response_str(), tool_call_id=part.tool_call_id, name=part.tool_name))
            elif isinstance(part, _msg.RetryPromptPart) and part.tool_name:
                chat.append(ChatMessage.tool_message(part.model_response(), tool_call_id=part.tool_call_id, name=part.tool_name))
    return chat
