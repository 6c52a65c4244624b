"""Guardrails: checks that run around a tool call or around a whole agent turn.

Two levels, one rule set:

* **Tool guardrails** (``@tool(input_guardrails=[...], output_guardrails=[...])``).
  An *input* guardrail is called with only the tool arguments it declares as
  parameters (all of them if it takes ``**kwargs``). It returns ``None`` to let the
  call pass, a ``dict`` to patch those arguments (the patched values are validated
  again before the tool runs), or raises :class:`ToolInputGuardrailTripped` to block
  the call. An *output* guardrail is called with the tool's result; it returns
  ``None`` to keep it, anything else to replace it, or raises
  :class:`ToolOutputGuardrailTripped`. A tripped tool guardrail never ends the turn:
  the model receives ``{"error": "<message>"}`` as the tool result and decides what
  to do next.
* **Agent guardrails** (``ReActAgent(input_guardrails=[...], output_guardrails=[...])``)
  are called with the text of the user's message, or of the final answer. They return
  ``None`` (pass) or a replacement string, or raise :class:`InputGuardrailTripped` /
  :class:`OutputGuardrailTripped`, which ends the turn with that exception: the session
  goes to ``error`` and keeps its previous state.

Chains run in list order; each guardrail sees the output of the one before it.
Guardrails may be sync or async functions. An exception other than a trip is a bug in
the guardrail and propagates unchanged, so it is never mistaken for a verdict.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "GuardrailTripped",
    "InputGuardrailTripped",
    "OutputGuardrailTripped",
    "ToolInputGuardrailTripped",
    "ToolOutputGuardrailTripped",
    "Guardrail",
    "call_with_declared",
    "run_tool_input_guardrails",
    "run_tool_output_guardrails",
    "run_input_guardrails",
    "run_output_guardrails",
]

Guardrail = Callable[..., Any]


class GuardrailTripped(Exception):
    """Base of every guardrail verdict that blocks. ``message`` is what the model or user sees."""

    def __init__(self, message: str = "Guardrail tripped") -> None:
        super().__init__(message)
        self.message = message


class InputGuardrailTripped(GuardrailTripped):
    """An agent-level input guardrail blocked the user's message."""


class OutputGuardrailTripped(GuardrailTripped):
    """An agent-level output guardrail blocked the final answer."""


class ToolInputGuardrailTripped(GuardrailTripped):
    """A tool input guardrail blocked the call; the model sees ``{"error": message}``."""


class ToolOutputGuardrailTripped(GuardrailTripped):
    """A tool output guardrail blocked the result; the model sees ``{"error": message}``."""


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def declared_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``arguments`` that ``fn`` declares (all of them if it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: give them everything
        return dict(arguments)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    accepted = {
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {name: value for name, value in arguments.items() if name in accepted}


async def call_with_declared(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    """Call sync or async ``fn`` with the arguments it declares, and return its result."""
    return await _maybe_await(fn(**declared_arguments(fn, arguments)))


def _name(guardrail: Guardrail) -> str:
    return getattr(guardrail, "__name__", type(guardrail).__name__)


async def run_tool_input_guardrails(
    guardrails: Sequence[Guardrail],
    arguments: Mapping[str, Any],
    on_patch: Callable[[Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run a tool input chain and return the (possibly patched) arguments.

    ``on_patch`` is told of every patch, in order. Raises
    :class:`ToolInputGuardrailTripped` (or a subclass) when a guardrail blocks.
    """
    current = dict(arguments)
    for guardrail in guardrails:
        verdict = await call_with_declared(guardrail, current)
        if verdict is None:
            continue
        if not isinstance(verdict, Mapping):
            raise TypeError(
                f"tool input guardrail {_name(guardrail)} returned {type(verdict).__name__}; "
                "return None to pass, a dict to patch arguments, or raise ToolInputGuardrailTripped"
            )
        if on_patch is not None:
            on_patch(verdict)
        current.update(verdict)
    return current


async def run_tool_output_guardrails(guardrails: Sequence[Guardrail], result: Any) -> Any:
    """Run a tool output chain; each guardrail gets the previous result and may replace it."""
    current = result
    for guardrail in guardrails:
        replacement = await _maybe_await(guardrail(current))
        if replacement is not None:
            current = replacement
    return current


async def _run_text_chain(guardrails: Sequence[Guardrail], text: str, kind: str) -> str:
    current = text
    for guardrail in guardrails:
        replacement = await _maybe_await(guardrail(current))
        if replacement is None:
            continue
        if not isinstance(replacement, str):
            raise TypeError(f"{kind} guardrail {_name(guardrail)} returned {type(replacement).__name__}; return None or a str")
        current = replacement
    return current


async def run_input_guardrails(guardrails: Sequence[Guardrail], text: str) -> str:
    """Run an agent input chain over the user's text; raises :class:`InputGuardrailTripped`."""
    return await _run_text_chain(guardrails, text, "input")


async def run_output_guardrails(guardrails: Sequence[Guardrail], text: str) -> str:
    """Run an agent output chain over the final answer; raises :class:`OutputGuardrailTripped`."""
    return await _run_text_chain(guardrails, text, "output")
