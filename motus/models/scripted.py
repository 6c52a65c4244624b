"""``ScriptedChatClient``: a model client that answers from a script, offline.

For trying an agent without an API key, and for tests: it implements the interface of
:mod:`motus.models.base` like the HTTP clients, so ``ReActAgent`` drives it the same way,
its tools pause for approval the same way, and a served turn journals its replies (a replay
gets the recorded ones).

A script is a list of replies, or a function of the conversation. With a list, the reply is
chosen by how many model calls the current turn has made (the assistant messages after the
last user message): the first call of every turn gets ``replies[0]``, the second
``replies[1]``, and past the end the last one again. It holds no counter of its own, so it
answers the same in every worker process and on every replay. A reply is a text, a
``ChatMessage`` (or its dict), or :func:`tool_calls`.

    agent = ReActAgent(
        client=ScriptedChatClient([tool_calls(("delete_file", {"path": "old.log"}), text="I'll delete old.log."),
                                   "Done: old.log is gone."]),
        model_name="scripted", tools=[delete_file],
    )
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Union

from motus.models.base import ChatCompletion
from motus.models.messages import ChatMessage, FunctionCall, ToolCall

#: One scripted reply: text, an assistant message, or its dict.
Reply = Union[str, ChatMessage, dict[str, Any]]
#: A script as a function: (the messages the model is sent, the tool definitions) -> a reply.
ReplyFunction = Callable[[list[ChatMessage], "list[dict[str, Any]] | None"], Reply]


def tool_calls(*calls: tuple[str, dict[str, Any]], text: str | None = None) -> ChatMessage:
    """An assistant reply that calls tools: ``tool_calls(("delete_file", {"path": "x"}))``,
    with ``text`` said before them. Call ids are numbered in order (``call_1``, ...)."""
    if not calls:
        raise ValueError("tool_calls() needs at least one (name, arguments) pair")
    return ChatMessage.assistant_message(
        text,
        tool_calls=[
            ToolCall(id=f"call_{index}", function=FunctionCall(name=name, arguments=json.dumps(arguments)))
            for index, (name, arguments) in enumerate(calls, 1)
        ],
    )


class ScriptedChatClient:
    """Answers ``chat`` from ``script``: a list of replies, or a function (see the module docstring)."""

    provider = "scripted"

    def __init__(self, script: Sequence[Reply] | ReplyFunction) -> None:
        if not callable(script):
            script = list(script)
            if not script:
                raise ValueError("ScriptedChatClient needs at least one reply")
            for reply in script:
                _message(reply)  # a bad reply is refused here, not at the first turn
        self.script = script

    def __repr__(self) -> str:
        return f"ScriptedChatClient({len(self.script)} replies)" if isinstance(self.script, list) else "ScriptedChatClient(function)"

    def chat(
        self, *, model: str, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None, **options: Any
    ) -> ChatCompletion:
        if isinstance(self.script, list):
            reply = self.script[min(calls_this_turn(messages), len(self.script) - 1)]
        else:
            reply = self.script(list(messages), tools)
        return ChatCompletion(message=_message(reply), model=model, finish_reason="tool_calls" if _message(reply).tool_calls else "stop")


def calls_this_turn(messages: Sequence[ChatMessage]) -> int:
    """How many model calls the turn has made so far: assistant messages after the last user one."""
    count = 0
    for message in reversed(messages):
        if message.role == "user":
            break
        if message.role == "assistant":
            count += 1
    return count


def _message(reply: Reply) -> ChatMessage:
    if isinstance(reply, str):
        return ChatMessage.assistant_message(reply)
    if isinstance(reply, dict):
        reply = ChatMessage.model_validate(reply)
    if not isinstance(reply, ChatMessage):
        raise TypeError(f"a scripted reply is a str, a ChatMessage or its dict, got {type(reply).__name__}")
    return reply if reply.role == "assistant" else reply.model_copy(update={"role": "assistant"})
