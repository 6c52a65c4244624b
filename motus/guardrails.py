"""Guardrails: checks that run around a tool call or around a whole agent turn.

Two levels, one rule set:

* **Tool guardrails** (``@tool(input_guardrails=[...], output_guardrails=[...])``).
  An *input* guardrail is called with only the tool arguments it declares as
  parameters (all of them if it takes ``**kwargs``); one that requires a parameter the
  call does not have is skipped for that call, so one guardrail can serve several tools.
  It returns ``None`` to let the call pass, a ``dict`` to patch those arguments (the
  patched values are validated again before the tool runs), or raises
  :class:`ToolInputGuardrailTripped` (or :class:`ToolRejected`) to block the call. An
  *output* guardrail is called with the tool's result; it returns
  ``None`` to keep it, anything else to replace it, or raises
  :class:`ToolOutputGuardrailTripped`. A tripped tool guardrail never ends the turn:
  the model receives ``{"error": "<message>"}`` as the tool result and decides what
  to do next.
* **Agent guardrails** (``ReActAgent(input_guardrails=[...], output_guardrails=[...])``)
  are called with the text of the user's message, or of the final answer, and with the
  agent too when they ask for it: a parameter named ``agent`` (``(value, agent)``), or a
  second positional parameter without a default. They return
  ``None`` (pass) or a replacement string, or raise :class:`InputGuardrailTripped` /
  :class:`OutputGuardrailTripped`, which ends the turn with that exception: the session
  goes to ``error`` and keeps its previous state.

Chains run in list order; each guardrail sees the output of the one before it.
Guardrails may be sync or async functions. An exception other than a trip is a bug in
the guardrail and propagates unchanged, so it is never mistaken for a verdict.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "GuardrailTripped",
    "InputGuardrailTripped",
    "OutputGuardrailTripped",
    "ToolInputGuardrailTripped",
    "ToolOutputGuardrailTripped",
    "ToolRejected",
    "Guardrail",
    "call_with_declared",
    "missing_arguments",
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


class ToolRejected(ToolInputGuardrailTripped):
    """A person declined a tool call. ``str()`` is the message, which the model sees as
    ``{"error": message}``: ``ToolRejected("user said no")`` reads "user said no". The
    approval gate raises :meth:`by_user`, which reads "User rejected <tool>[: <reason>]"."""

    def __init__(self, message: str = "Tool call rejected", *, tool_name: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.reason = reason

    @classmethod
    def by_user(cls, tool_name: str, reason: str | None = None) -> ToolRejected:
        message = f"User rejected {tool_name}" + (f": {reason}" if reason else "")
        return cls(message, tool_name=tool_name, reason=reason)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        return None


def missing_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> list[str]:
    """The parameters ``fn`` requires (no default) that ``arguments`` does not hold."""
    parameters = _parameters(fn)
    if parameters is None:
        return []
    required = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, p in parameters.items()
        if p.kind in required and p.default is inspect.Parameter.empty and name not in arguments
    ]


def declared_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``arguments`` that ``fn`` declares (all of them if it takes ``**kwargs``)."""
    parameters = _parameters(fn)
    if parameters is None:  # no signature to read: give it everything
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
        missing = missing_arguments(guardrail, current)
        if missing:
            log.debug("tool input guardrail %s skipped: the call has no %s", _name(guardrail), ", ".join(missing))
            continue
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


def _agent_parameter(guardrail: Guardrail) -> str | None:
    """How an agent guardrail asks for the agent: ``"keyword"`` (a parameter named
    ``agent`` after the value), ``"positional"`` (a second positional parameter without a
    default), or ``None`` (it takes the value alone)."""
    parameters = _parameters(guardrail)
    if parameters is None:
        return None
    after_value = list(parameters.values())[1:]
    if any(p.name == "agent" and p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in after_value):
        return "keyword"
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if after_value and after_value[0].kind in positional and after_value[0].default is inspect.Parameter.empty:
        return "positional"
    return None


def _call_text_guardrail(guardrail: Guardrail, value: str, agent: Any) -> Any:
    how = _agent_parameter(guardrail) if agent is not None else None
    if how == "keyword":
        return guardrail(value, agent=agent)
    if how == "positional":
        return guardrail(value, agent)
    return guardrail(value)


async def _run_text_chain(guardrails: Sequence[Guardrail], text: str, kind: str, agent: Any = None) -> str:
    current = text
    for guardrail in guardrails:
        replacement = await _maybe_await(_call_text_guardrail(guardrail, current, agent))
        if replacement is None:
            continue
        if not isinstance(replacement, str):
            raise TypeError(f"{kind} guardrail {_name(guardrail)} returned {type(replacement).__name__}; return None or a str")
        current = replacement
    return current


async def run_input_guardrails(guardrails: Sequence[Guardrail], text: str, agent: Any = None) -> str:
    """Run an agent input chain over the user's text (guardrails that ask for it get
    ``agent``); raises :class:`InputGuardrailTripped`."""
    return await _run_text_chain(guardrails, text, "input", agent)


async def run_output_guardrails(guardrails: Sequence[Guardrail], text: str, agent: Any = None) -> str:
    """Run an agent output chain over the final answer (guardrails that ask for it get
    ``agent``); raises :class:`OutputGuardrailTripped`."""
    return await _run_text_chain(guardrails, text, "output", agent)
