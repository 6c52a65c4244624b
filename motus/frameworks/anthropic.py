"""Serve an Anthropic SDK tool-runner agent with motus' approvals and durability.

The Anthropic Python SDK runs tools with ``client.beta.messages.tool_runner(model=...,
max_tokens=..., tools=[...], messages=[...])``; that runner cannot stop for a person. Build a
:class:`ToolRunner` the same way instead and serve it (``motus serve start myapp:runner``)::

    # pip install 'motus[anthropic]'
    import anthropic
    from anthropic import beta_tool
    from motus.anthropic import ToolRunner, requires_approval  # or motus.frameworks.anthropic

    @beta_tool
    def list_notes() -> str:
        "List the notes."

    @requires_approval
    @beta_tool
    def delete_note(name: str) -> str:
        "Delete a note by name."

    runner = ToolRunner(client=anthropic.AsyncAnthropic(), model="claude-sonnet-4-5",
                        max_tokens=1024, tools=[list_notes, delete_note], system="...")

Tools are the SDK's runnable tools (``@beta_tool`` / ``@beta_async_tool`` functions, sync or
async, with either client). A tool needs a person's approval when it is marked with
:func:`requires_approval` (as a decorator over ``@beta_tool``, or ``requires_approval(tool)``),
or when the runner's own ``requires_approval=`` names it (a collection of tool names) or says so
(a predicate ``(tool_name, tool_input) -> bool``, deciding per call).

A turn:

1. the session's history (:class:`~motus.models.ChatMessage` list) and the new message become
   Messages API messages (assistant tool calls as ``tool_use`` blocks, tool results as
   ``tool_result`` blocks; ``system`` messages join the runner's ``system`` prompt);
2. ``client.beta.messages.create`` is called with them and the tools. For the ``tool_use``
   blocks of the reply, every call that needs approval becomes a ``tool_approval`` interrupt
   (``{"type": "tool_approval", "tool_name", "tool_args"}``), all of one reply at once. An
   approval runs the tool (with the edited ``tool_args`` merged over the model's, when the
   person changed them); a rejection does not run it, and the model gets a ``tool_result`` with
   ``is_error`` and ``"User rejected <tool>[: <reason>]"``. Other calls just run. A tool that
   raises gives the model an ``is_error`` result, as the SDK's runner does;
3. the results go back to the model, until a reply asks for no tool (or after
   ``max_iterations`` model calls).

Durability: each model call is a ``motus.step`` recording the reply, and each tool run is
recorded in the turn's journal by the same call as motus' own tools
(:func:`motus.durable.journal.tool_call`; an approval-required one is *gated*: if the
server stops while it runs, it is not run again and the model is told the outcome is unknown). A
turn replayed after ``--park-after`` or a restart therefore asks the model nothing and runs no
tool it already ran. The new state holds the conversation as ChatMessages: the user message,
assistant messages with their tool calls, the tool results, the response.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from motus.durable.journal import OutcomeUnknown, step, tool_call
from motus.frameworks._common import Approval, ask_approvals, finish, output_text, parse_arguments
from motus.models import ChatMessage
from motus.models.messages import FunctionCall, ToolCall

try:
    import anthropic as _sdk
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("motus.anthropic needs the 'anthropic' package: pip install 'motus[anthropic]'") from exc

try:  # a tool raises it to give the model its own error content (anthropic >= 0.70)
    from anthropic.lib.tools import ToolError as _ToolError
except ImportError:  # pragma: no cover - older SDKs

    class _ToolError(Exception):  # type: ignore[no-redef]
        content: Any = None


__all__ = ["ToolRunner", "requires_approval", "to_anthropic_messages", "to_chat_messages"]

log = logging.getLogger(__name__)

_MARK = "_motus_requires_approval"

ApprovalRule = Collection[str] | Callable[[str, Any], bool] | None


def requires_approval(tool: Any) -> Any:
    """Mark an SDK tool (``@beta_tool`` / ``@beta_async_tool``) as needing a person's approval
    before each run; returns the tool, so it also works as a decorator above ``@beta_tool``."""
    if not _is_runnable(tool):
        raise TypeError(
            f"requires_approval() takes a tool made with anthropic's @beta_tool / @beta_async_tool, got {type(tool).__name__}"
            " (put @requires_approval above @beta_tool)"
        )
    setattr(tool, _MARK, True)
    return tool


def _is_runnable(tool: Any) -> bool:
    return callable(getattr(tool, "to_dict", None)) and callable(getattr(tool, "call", None))


class ToolRunner:
    """A :class:`~motus.serve.agents.ServableAgent` running Anthropic's tool loop with approvals.

    ``client``: ``anthropic.Anthropic()`` or ``anthropic.AsyncAnthropic()`` (default: a new
    ``AsyncAnthropic()``, which reads ``ANTHROPIC_API_KEY``). ``model``, ``max_tokens``,
    ``tools``, ``system`` and any further keyword (``temperature``, ``tool_choice``,
    ``thinking``, ``betas``, ...) are passed to ``client.beta.messages.create`` as for the SDK's
    ``tool_runner``. ``requires_approval``: tool names, or a predicate ``(tool_name,
    tool_input) -> bool``, on top of the tools marked with :func:`requires_approval`.
    ``max_iterations``: most model calls in one turn.
    """

    def __init__(
        self,
        *,
        model: str,
        tools: Iterable[Any] = (),
        client: Any = None,
        max_tokens: int = 1024,
        system: str | None = None,
        requires_approval: ApprovalRule = None,
        max_iterations: int = 10,
        **params: Any,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("ToolRunner needs a model name: ToolRunner(model='claude-...', ...)")
        if max_iterations < 1:
            raise ValueError("max_iterations must be at least 1")
        self.tools: dict[str, Any] = {}
        for tool in tools:
            if not _is_runnable(tool):
                raise TypeError(
                    f"ToolRunner tools must be runnable SDK tools (functions decorated with anthropic's @beta_tool or "
                    f"@beta_async_tool), got {type(tool).__name__}: {tool!r}"
                )
            if tool.name in self.tools:
                raise ValueError(f"ToolRunner got two tools named {tool.name!r}")
            self.tools[tool.name] = tool
        for key in ("messages", "stream"):
            if key in params:
                raise TypeError(f"ToolRunner does not take {key}=: the session's history is the messages, tools go in tools=")
        if requires_approval is not None and not callable(requires_approval):
            names = {requires_approval} if isinstance(requires_approval, str) else set(requires_approval)
            unknown = sorted(names - set(self.tools))
            if unknown:
                raise ValueError(
                    f"ToolRunner(requires_approval=...) names {', '.join(map(repr, unknown))}, which is not among its tools "
                    f"({', '.join(map(repr, self.tools)) or 'none'})"
                )
            requires_approval = frozenset(names)
        self.approval_rule = requires_approval
        self.client = client if client is not None else _sdk.AsyncAnthropic()
        if not callable(getattr(getattr(getattr(self.client, "beta", None), "messages", None), "create", None)):
            raise TypeError(
                f"ToolRunner needs an Anthropic SDK client (anthropic.Anthropic() or anthropic.AsyncAnthropic()), got {type(self.client).__name__}"
            )
        self.model = model
        self.max_tokens = max_tokens
        self.system = system
        self.max_iterations = max_iterations
        self.params = params

    def __repr__(self) -> str:
        return f"ToolRunner(model={self.model!r}, tools={list(self.tools)!r})"

    def needs_approval(self, name: str, tool_input: Any) -> bool:
        """Whether this call of tool ``name`` must be approved by a person first."""
        tool = self.tools.get(name)
        if tool is not None and getattr(tool, _MARK, False):
            return True
        rule = self.approval_rule
        if rule is None:
            return False
        if callable(rule):
            return bool(rule(name, tool_input))
        return name in rule

    # -- the turn -------------------------------------------------------------------------

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
        system, messages = to_anthropic_messages([*state, message])
        system = "\n\n".join(part for part in (self.system, system) if part) or None
        start = len(messages)
        for iteration in range(1, self.max_iterations + 1):
            reply = await step(f"anthropic: model {iteration}", self._create, system, messages)
            content = [_block_param(block) for block in reply.get("content") or []]
            messages.append({"role": "assistant", "content": content})
            calls = [block for block in content if block.get("type") == "tool_use"]
            if not calls:
                if reply.get("stop_reason") == "pause_turn":  # a server tool paused the turn: let the model go on
                    continue
                text = output_text("".join(block.get("text", "") for block in content if block.get("type") == "text"))
                return finish(message, state, to_chat_messages(messages[start:]), text)
            messages.append({"role": "user", "content": await self._run_calls(calls)})
        response = f"I stopped after {self.max_iterations} model calls without reaching a final answer."
        return finish(message, state, to_chat_messages(messages[start:]), response)

    async def _create(self, system: str | None, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One model call (a ``motus.step``: its recorded value is the reply as JSON data)."""
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages, **self.params}
        if system:
            params["system"] = system
        if self.tools:
            params["tools"] = [tool.to_dict() for tool in self.tools.values()]
        create = self.client.beta.messages.create
        if isinstance(self.client, _sdk.AsyncAnthropic) or type(self.client).__name__.startswith("Async"):  # also AsyncAnthropicBedrock, ...
            reply = await create(**params)
        else:
            reply = await asyncio.to_thread(lambda: create(**params))
        return reply.model_dump(mode="json", exclude_none=True)

    async def _run_calls(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks for one reply's ``tool_use`` blocks, in the model's order:
        approvals asked all at once first, then the tools run one after another."""
        gated = [
            Approval(call_id=call["id"], tool_name=call["name"], tool_args=parse_arguments(call.get("input")))
            for call in calls
            if call["name"] in self.tools and self.needs_approval(call["name"], call.get("input"))
        ]
        answers = {answer.call_id: answer for answer in await ask_approvals(gated)} if gated else {}
        results: list[dict[str, Any]] = []
        for call in calls:
            answer = answers.get(call["id"])
            tool_input = call.get("input")
            if answer is not None and not answer.approved:
                outcome = {"content": answer.message or f"User rejected {call['name']}", "is_error": True}
            else:
                if answer is not None and answer.tool_args is not None:
                    tool_input = {**tool_input, **answer.tool_args} if isinstance(tool_input, dict) else answer.tool_args
                outcome = await self._run_tool(call["name"], tool_input, gated=answer is not None)
            result = {"type": "tool_result", "tool_use_id": call["id"], "content": outcome["content"]}
            if outcome.get("is_error"):
                result["is_error"] = True
            results.append(result)
        return results

    async def _run_tool(self, name: str, tool_input: Any, *, gated: bool) -> dict[str, Any]:
        """Run one tool through the turn's journal, as motus' own tools run: a replay returns the
        recorded result, and an approved (gated) tool never runs twice."""
        tool = self.tools.get(name)
        if tool is None:
            return {"content": f"Error: Tool '{name}' not found", "is_error": True}

        async def run() -> dict[str, Any]:
            try:
                if inspect.iscoroutinefunction(tool.call):
                    result = await tool.call(tool_input)
                else:  # a sync tool runs on a worker thread, as in the SDK's async runner
                    result = await asyncio.to_thread(tool.call, tool_input)
                    if inspect.isawaitable(result):
                        result = await result
                return {"content": _result_content(result)}
            except Exception as exc:  # the model may recover from a failing tool: tell it why, as the SDK does
                log.warning("tool %s raised %s: %s", name, type(exc).__name__, exc)
                return {"content": _error_content(exc), "is_error": True}

        try:
            return await tool_call(name, tool_input, run, gated=gated)
        except OutcomeUnknown as unknown:
            return {"content": str(unknown), "is_error": True}


def _result_content(result: Any) -> Any:
    """A tool's return value as ``tool_result`` content: text, or a list of content blocks."""
    if result is None or isinstance(result, str):
        return result if result is not None else ""
    if isinstance(result, (list, tuple)):
        return [_block_param(block) for block in result]
    return output_text(result)


def _error_content(exc: Exception) -> Any:
    if isinstance(exc, _ToolError):
        return _result_content(exc.content)
    return repr(exc)


def _block_param(block: Any) -> dict[str, Any]:
    """A content block (from a reply, or a tool) as request data: plain JSON, no null fields."""
    if hasattr(block, "model_dump"):
        block = block.model_dump(mode="json", exclude_none=True)
    return {key: value for key, value in dict(block).items() if value is not None}


def _text_of(content: Any) -> str:
    """``tool_result`` content as the text a ChatMessage keeps (non-text blocks by their type)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(f"[{block.get('type', 'content') if isinstance(block, dict) else 'content'}]")
    return "".join(parts)


# -- ChatMessage <-> Messages API -----------------------------------------------------------


def to_anthropic_messages(messages: list[ChatMessage]) -> tuple[str | None, list[dict[str, Any]]]:
    """Chat messages as ``(system, messages)`` for the Messages API: system messages joined,
    tool results as ``tool_result`` blocks in user messages, consecutive user-side blocks in one
    message (the API alternates user and assistant)."""
    system: list[str] = []
    result: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        last = result[-1] if result else None
        if last is not None and last["role"] == role:
            previous = last["content"]
            if isinstance(previous, str):
                previous = [{"type": "text", "text": previous}]
            last["content"] = [*previous, *blocks]
        elif role == "user" and len(blocks) == 1 and blocks[0]["type"] == "text":
            result.append({"role": role, "content": blocks[0]["text"]})  # plain text, as people write it
        else:
            result.append({"role": role, "content": blocks})

    for message in messages:
        if message.role == "system":
            if message.content:
                system.append(message.content)
        elif message.role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
            for call in message.tool_calls or []:
                arguments = parse_arguments(call.function.arguments)
                blocks.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": arguments if isinstance(arguments, dict) else {"input": arguments}})
            add("assistant", blocks)
        elif message.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": message.content or ""}])
        else:
            add("user", [{"type": "text", "text": message.content or ""}])
    return ("\n\n".join(system) or None), result


def to_chat_messages(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """What a turn's loop added (assistant replies and user messages of tool results) as chat
    messages: assistant text with tool calls, and one tool message per result."""
    chat: list[ChatMessage] = []
    names: dict[str, str] = {}
    for message in messages:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if message.get("role") == "assistant":
            text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
            calls = []
            for block in blocks:
                if block.get("type") == "tool_use":
                    names[block["id"]] = block["name"]
                    arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                    calls.append(ToolCall(id=block["id"], function=FunctionCall(name=block["name"], arguments=arguments)))
            if text or calls:
                chat.append(ChatMessage.assistant_message(content=text or None, tool_calls=calls or None))
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                call_id = block.get("tool_use_id") or ""
                chat.append(ChatMessage.tool_message(_text_of(block.get("content")), tool_call_id=call_id, name=names.get(call_id)))
    return chat
