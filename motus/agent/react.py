"""``ReActAgent``: a model that calls tools until it can answer.

One turn (:meth:`ReActAgent.run_turn`, the ``ServableAgent`` shape ``motus serve``
runs)::

    user message -> input guardrails -> [model -> tool calls -> tool results]* -> model
                 -> final answer -> output guardrails

* Each step sends the system prompt, the whole conversation and the tool definitions
  to the client (the interface in :mod:`motus.models.base`). A blocking client runs in
  a thread, so the event loop stays free to deliver resumes to paused tools.
* Inside a served turn each model call is journaled whatever client made it: motus's own
  clients journal their HTTP request (the provider's reply); any other client's reply is
  journaled here, in the OpenAI chat-completions shape (``completion_record``). A replay
  then gets the recorded reply instead of asking the client again, and the live view of a
  waiting turn (``GET /sessions/{id}``'s ``turn``, the inbox's ``agent_text``) shows what
  the model said and which tools it called before the turn paused.
* The tool calls of one step run concurrently: two gated tools in one step are two
  pending interrupts at once, resumable in any order. Every tool call gets exactly one
  tool message, in the order the model asked for them, whatever order they finish in.
* Tool failures the model can act on (bad arguments, guardrail trips, rejections, an
  unknown tool) come back to it as ``{"error": ...}`` results; see
  :meth:`motus.tools.Tool.invoke`. A tripped *agent* guardrail
  (:class:`~motus.guardrails.InputGuardrailTripped`,
  :class:`~motus.guardrails.OutputGuardrailTripped`) or a
  :class:`~motus.models.ModelError` ends the turn with that exception, and the session
  keeps its previous state.
* The returned state is the input state plus this turn's user, assistant and tool
  messages in order (the system prompt is not stored), so the next turn continues the
  conversation. After ``max_steps`` model calls that still asked for tools, the turn
  ends with an assistant message saying so.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from motus.guardrails import Guardrail, run_input_guardrails, run_output_guardrails
from motus.durable.journal import current, digest
from motus.models._client_base import HttpChatClient
from motus.models.base import ChatClient, ChatCompletion, Usage, completion_from_record, completion_record
from motus.models.messages import ChatMessage, ToolCall
from motus.tools.decorator import Tool, error_result, tool as make_tool

log = logging.getLogger(__name__)

__all__ = ["ReActAgent"]


def _as_message(value: ChatMessage | dict[str, Any]) -> ChatMessage:
    return value if isinstance(value, ChatMessage) else ChatMessage.model_validate(value)


class ReActAgent:
    """A tool-calling agent over any chat client.

    Args:
        client: an object with ``chat(model=, messages=, tools=, **options)``.
        model_name: passed to the client as ``model``.
        system_prompt: sent first on every model call; not stored in the state.
        tools: :class:`~motus.tools.Tool` objects, or plain functions (wrapped with ``tool``).
        max_steps: most model calls in one turn.
        input_guardrails / output_guardrails: agent-level chains over the user's text
            and the final answer; a guardrail that takes ``(value, agent)`` gets this
            agent (see :mod:`motus.guardrails`).
        **model_options: sent with every model call (``temperature``, ``max_tokens``...).
    """

    def __init__(
        self,
        client: ChatClient,
        model_name: str,
        system_prompt: str | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        max_steps: int = 10,
        input_guardrails: Sequence[Guardrail] = (),
        output_guardrails: Sequence[Guardrail] = (),
        **model_options: Any,
    ) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.client = client
        self.model_name = model_name
        self.system_prompt = system_prompt
        self.max_steps = max_steps
        self.input_guardrails = list(input_guardrails)
        self.output_guardrails = list(output_guardrails)
        self.model_options = model_options
        self.tools: dict[str, Tool] = {}
        for item in tools:
            wrapped = item if isinstance(item, Tool) else make_tool(item)
            if wrapped.name in self.tools:
                raise ValueError(f"two tools are named {wrapped.name!r}")
            self.tools[wrapped.name] = wrapped

    def __repr__(self) -> str:
        return f"ReActAgent(model_name={self.model_name!r}, tools={list(self.tools)})"

    async def run_turn(
        self, message: ChatMessage | dict[str, Any], state: Sequence[ChatMessage | dict[str, Any]]
    ) -> tuple[ChatMessage, list[ChatMessage]]:
        """Answer ``message`` given the conversation ``state``; return (answer, new state)."""
        user = _as_message(message)
        conversation = [_as_message(item) for item in state]
        if self.input_guardrails:
            text = await run_input_guardrails(self.input_guardrails, user.content or "", agent=self)
            if text != (user.content or ""):
                user = user.model_copy(update={"content": text})
        conversation.append(user)
        usage = Usage()
        for step in range(self.max_steps):
            completion = await self._complete(conversation)
            usage = usage + completion.usage
            reply = completion.message
            if reply.role != "assistant":
                reply = reply.model_copy(update={"role": "assistant"})
            if not reply.tool_calls:
                final = await self._finish(reply)
                conversation.append(final)
                log.info("turn finished after %s model calls, %s tokens", step + 1, usage.total_tokens)
                return final, conversation
            conversation.append(reply)
            conversation.extend(await self._run_tools(reply.tool_calls))
        final = await self._finish(
            ChatMessage.assistant_message(f"I stopped after {self.max_steps} steps without reaching a final answer.")
        )
        conversation.append(final)
        log.info("turn hit max_steps=%s, %s tokens", self.max_steps, usage.total_tokens)
        return final, conversation

    async def _complete(self, conversation: list[ChatMessage]) -> ChatCompletion:
        messages = list(conversation)
        if self.system_prompt:
            messages.insert(0, ChatMessage.system_message(self.system_prompt))
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "messages": messages,
            "tools": [t.definition() for t in self.tools.values()] or None,
            **self.model_options,
        }
        journal = current()
        if journal is None or isinstance(self.client, HttpChatClient):  # (those journal their own requests)
            return await self._ask(kwargs)

        async def ask() -> dict[str, Any]:
            return completion_record(await self._ask(kwargs))

        key = digest(["chat", kwargs])
        return completion_from_record(await journal.call("model", key, f"{type(self.client).__name__}.chat", ask))

    async def _ask(self, kwargs: dict[str, Any]) -> ChatCompletion:
        if inspect.iscoroutinefunction(self.client.chat):
            return await self.client.chat(**kwargs)
        return await asyncio.to_thread(self.client.chat, **kwargs)

    async def _finish(self, reply: ChatMessage) -> ChatMessage:
        if not self.output_guardrails:
            return reply
        text = await run_output_guardrails(self.output_guardrails, reply.content or "", agent=self)
        return reply if text == (reply.content or "") else reply.model_copy(update={"content": text})

    async def _run_tools(self, calls: list[ToolCall]) -> list[ChatMessage]:
        """Run one step's tool calls concurrently; results in the model's order.

        If one call raises (the turn is being cancelled), the others are cancelled too
        and the exception propagates.
        """
        tasks = [asyncio.ensure_future(self._run_tool(call)) for call in calls]
        try:
            contents = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [
            ChatMessage.tool_message(content, tool_call_id=call.id, name=call.function.name)
            for call, content in zip(calls, contents)
        ]

    async def _run_tool(self, call: ToolCall) -> str:
        found = self.tools.get(call.function.name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            return error_result(f"Unknown tool {call.function.name!r}; available tools: {known}")
        return await found.invoke(call.function.arguments)
