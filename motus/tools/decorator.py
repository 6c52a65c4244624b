"""``@tool``: describe a Python function to a model, and run the model's calls to it safely.

``tool`` is thin sugar over :class:`Tool`: it records the name, the description (the
docstring), the JSON schema (from type hints, or from a pydantic model given as
``schema=``) and the guardrails, and returns a :class:`Tool`. Calling the ``Tool``
object like a function calls the original function directly, unchecked. The model's
path is :meth:`Tool.invoke`:

1. parse and validate the model's arguments (coercing ``"3"`` to ``3`` and so on);
2. run the input guardrail chain, whose first link is the approval gate when
   ``requires_approval`` is set (see :mod:`motus.tools.approval`), then validate the
   possibly patched arguments again;
3. call the function (async directly; sync in a thread, so the event loop stays free
   for other tool calls and for resumes);
4. run the output guardrail chain;
5. render the result as the text the model reads: strings as they are, anything else
   as JSON.

Guarantee: :meth:`Tool.invoke` returns ``{"error": "..."}`` for every failure the model
can act on (bad arguments, a tripped guardrail, a rejection, an exception raised by
the tool function) instead of raising. It lets through only what must end the turn:
``EOFError`` (the turn was cancelled while waiting for a person), errors raised by
``interrupt()`` itself (called outside a worker, payload too large: the spec says these
propagate like any other exception), and bugs inside guardrails.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, overload

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from motus.api.approvers import policy_fields
from motus.guardrails import GuardrailTripped, Guardrail, run_tool_input_guardrails, run_tool_output_guardrails
from motus.durable.journal import OutcomeUnknown, ReplayDiverged, tool_call
from motus.tools.approval import EditedArguments, approval_gate
from motus.tools.schema import (
    ToolArgumentsError,
    arguments_model,
    json_schema,
    parse_arguments,
    split_docstring,
    validate_arguments,
)

log = logging.getLogger(__name__)

__all__ = ["Tool", "tool", "render_result", "error_result"]


def error_result(message: str) -> str:
    """The tool result a model gets when a call fails: ``{"error": message}`` as JSON."""
    return json.dumps({"error": message}, ensure_ascii=False)


def render_result(value: Any) -> str:
    """Tool results reach the model as text: a ``str`` unchanged, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(to_jsonable_python(value, fallback=str), ensure_ascii=False)


#: The module ``interrupt()`` runs in (named, not imported: it is worker-only machinery).
_INTERRUPT_MODULE = "motus.durable.interrupt"


def _raised_by_interrupt(exc: BaseException) -> bool:
    """True when ``exc`` came out of ``interrupt()`` (outside a worker, payload too
    large...): those end the turn as the spec says, they are not the tool's own failure."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == _INTERRUPT_MODULE:
            return True
        tb = tb.tb_next
    return False


class _Outcome(Exception):
    """Internal: carries an error message for the model out of :meth:`Tool.call`."""


class Tool:
    """A function a model may call, with its schema, guardrails and approval policy.

    Attributes:
        name: what the model calls it (also ``__tool_name__``, as in the reference product).
        description: what the model is told it does.
        parameters: the JSON schema of its arguments.
        input_guardrails: the full input chain, approval gate first when there is one.
        output_guardrails: the output chain.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        schema: type[BaseModel] | None = None,
        requires_approval: bool | Callable[..., Any] = False,
        input_guardrails: Sequence[Guardrail] = (),
        output_guardrails: Sequence[Guardrail] = (),
        approval_timeout: float | None = None,
        approvers: Sequence[str] | None = None,
        self_approval: bool = True,
        quorum: int = 1,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"tool() needs a function, got {type(fn).__name__}")
        if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise TypeError("schema= must be a pydantic BaseModel subclass")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        doc_description, _ = split_docstring(getattr(fn, "__doc__", None))
        if description is None and schema is not None and not doc_description:
            doc_description, _ = split_docstring(schema.__doc__)
        self.description = description if description is not None else doc_description
        self.schema_model = schema
        self.arguments_model = schema if schema is not None else arguments_model(fn, f"{self.name}_arguments")
        self.parameters = json_schema(self.arguments_model)
        self.requires_approval = requires_approval
        if approval_timeout is not None:
            if isinstance(approval_timeout, bool) or not isinstance(approval_timeout, (int, float)) or not (
                0 < approval_timeout < float("inf")
            ):
                raise ValueError(f"approval_timeout must be a finite number of seconds > 0, got {approval_timeout!r}")
            if not requires_approval:
                raise ValueError("approval_timeout needs requires_approval: a tool nobody approves cannot time out")
        self.approval_timeout = approval_timeout
        self.approval_policy = policy_fields(approvers, self_approval, quorum)
        if self.approval_policy and not requires_approval:
            raise ValueError("approvers, self_approval and quorum need requires_approval: they say who may approve a call")
        gate = [approval_gate(self.name, requires_approval, approval_timeout, self.approval_policy)] if requires_approval else []
        self.input_guardrails: list[Guardrail] = [*gate, *input_guardrails]
        self.output_guardrails: list[Guardrail] = list(output_guardrails)
        self._passes_model = schema is not None and self._takes_model_instance(fn, schema)
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]
        #: The name the model calls it by, where the reference product's code looks for it.
        self.__tool_name__ = self.name

    @staticmethod
    def _takes_model_instance(fn: Callable[..., Any], schema: type[BaseModel]) -> bool:
        """True when ``fn`` takes the whole schema model as its one parameter."""
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        return len(params) == 1 and params[0].name not in schema.model_fields

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the original function directly: no validation, guardrails or approval."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        gate = ", requires_approval" if self.requires_approval else ""
        return f"<Tool {self.name}{gate}>"

    def definition(self) -> dict[str, Any]:
        """Provider-neutral description: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        return {"type": "function", "function": self.definition()}

    def _validated(self, arguments: dict[str, Any], edited: bool = False) -> dict[str, Any]:
        try:
            model = validate_arguments(self.arguments_model, arguments)
        except ToolArgumentsError as exc:
            who = " (as edited by the user)" if edited else ""
            raise _Outcome(f"Invalid arguments for {self.name}{who}: {exc}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def _call_function(self, arguments: dict[str, Any]) -> Any:
        if self._passes_model:
            assert self.schema_model is not None
            call = functools.partial(self.fn, self.schema_model.model_validate(arguments))
        else:
            call = functools.partial(self.fn, **arguments)
        if inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(getattr(self.fn, "__call__", None)):
            return await call()
        result = await asyncio.to_thread(call)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _journaled_call(self, arguments: dict[str, Any]) -> Any:
        """Run the body through the turn's journal: a replay returns the recorded result,
        and a gated tool's body never runs twice (see ``motus.durable.journal.tool_call``). A
        result the journal cannot record is recorded as the text the model reads anyway."""
        body = functools.partial(self._call_function, arguments)
        return await tool_call(self.name, arguments, body, gated=bool(self.requires_approval), unrecordable=render_result)

    async def invoke(self, arguments: str | dict[str, Any] | None) -> str:
        """Run one model call of this tool and return the text the model reads.

        See the module docstring for what is turned into ``{"error": ...}`` and what
        propagates.
        """
        try:
            try:
                raw = parse_arguments(arguments)
            except ToolArgumentsError as exc:
                raise _Outcome(f"Invalid arguments for {self.name}: {exc}") from None
            validated = self._validated(raw)
            edited = False
            if self.input_guardrails:
                patched, edited = await self._run_input_chain(validated)
                if patched != validated:
                    validated = self._validated(patched, edited=edited)
            try:
                result = await self._journaled_call(validated)
            except (GuardrailTripped, EOFError, ReplayDiverged):
                raise
            except OutcomeUnknown as unknown:
                raise _Outcome(str(unknown)) from None
            except Exception as exc:  # the model may recover from a failing tool: tell it why
                if _raised_by_interrupt(exc):
                    raise
                log.warning("tool %s raised %s: %s", self.name, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
                raise _Outcome(f"{self.name} failed: {type(exc).__name__}: {exc}") from None
            if self.output_guardrails:
                result = await run_tool_output_guardrails(self.output_guardrails, result)
        except _Outcome as outcome:
            return error_result(str(outcome))
        except GuardrailTripped as tripped:
            return error_result(tripped.message)
        if edited:
            return json.dumps(
                {
                    "note": "The user edited the arguments before approving; the tool ran with tool_args.",
                    "tool_args": to_jsonable_python(validated, fallback=str),
                    "result": to_jsonable_python(result, fallback=str) if not isinstance(result, str) else result,
                },
                ensure_ascii=False,
            )
        return render_result(result)

    async def _run_input_chain(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Run the input chain; also say whether the approval gate applied a person's edit."""
        edited = False

        def note(verdict: dict[str, Any]) -> None:
            nonlocal edited
            edited = edited or isinstance(verdict, EditedArguments)

        patched = await run_tool_input_guardrails(self.input_guardrails, arguments, on_patch=note)
        return patched, edited


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = ...,
    description: str | None = ...,
    schema: type[BaseModel] | None = ...,
    requires_approval: bool | Callable[..., Any] = ...,
    input_guardrails: Sequence[Guardrail] = ...,
    output_guardrails: Sequence[Guardrail] = ...,
    approval_timeout: float | None = ...,
    approvers: Sequence[str] | None = ...,
    self_approval: bool = ...,
    quorum: int = ...,
) -> Tool: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = ...,
    description: str | None = ...,
    schema: type[BaseModel] | None = ...,
    requires_approval: bool | Callable[..., Any] = ...,
    input_guardrails: Sequence[Guardrail] = ...,
    output_guardrails: Sequence[Guardrail] = ...,
    approval_timeout: float | None = ...,
    approvers: Sequence[str] | None = ...,
    self_approval: bool = ...,
    quorum: int = ...,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, **options: Any) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool`: ``@tool``, ``@tool(requires_approval=True, ...)`` or ``tool(fn, ...)``.

    Options: ``name``, ``description`` (default: the docstring), ``schema`` (a pydantic
    model for the arguments instead of the type hints), ``requires_approval`` (``True``
    or a predicate over the arguments), ``approval_timeout`` (seconds before an unanswered
    approval is rejected), ``approvers`` (roles, one of which the answering API key must
    have), ``self_approval=False`` (the key that sent the turn's message may not
    approve) and ``quorum=N`` (N different keys must approve; see ``motus.api.approvers``), ``input_guardrails``, ``output_guardrails``.
    """
    if fn is not None:
        return Tool(fn, **options)

    def decorate(function: Callable[..., Any]) -> Tool:
        return Tool(function, **options)

    return decorate
