"""From a Python function to the JSON schema a model sees, and back to validated arguments.

:func:`arguments_model` turns a function's signature into a pydantic model: each
parameter becomes a field with its type hint (``str``, ``int``, ``float``, ``bool``,
``Optional[...]``, ``list[...]``, ``dict[str, X]``, ``Literal[...]``, pydantic
models...) and its default. ``Annotated[X, "text"]`` or ``Annotated[X, Field(...)]``
gives a parameter its description; so does a Google-style ``Args:`` section of the
docstring. :func:`json_schema` renders that model as a self-contained JSON schema
(references inlined, pydantic's ``title`` noise removed), the shape every provider's
tool calling accepts.

:func:`validate_arguments` is the other direction: it parses the model's JSON argument
string, validates and coerces it (``"3"`` becomes ``3`` for an ``int``) and raises
:class:`ToolArgumentsError` with a message written for the model, which can then
correct its call.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

__all__ = ["ToolArgumentsError", "arguments_model", "json_schema", "validate_arguments", "split_docstring"]


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema; the message says why."""


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def split_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {parameter: description}).

    The description is the docstring up to its first section header (``Args:``,
    ``Returns:``...); a Google-style ``Args:`` section gives per-parameter descriptions,
    continuation lines joined.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        header = _ARGS_HEADER.match(line) or _SECTION_HEADER.match(line)
        if header and len(line) - len(line.lstrip()) == 0:
            section = "args" if _ARGS_HEADER.match(line) else "other"
            entry_indent, current = None, None
            continue
        if section is None:
            description.append(line)
        elif section == "args" and line.strip():
            indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(line)
            if match and (entry_indent is None or indent <= entry_indent):
                entry_indent, current = indent, match.group(1)
                params[current] = match.group(2).strip()
            elif current is not None:
                params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), params


def _with_description(annotation: Any, description: str | None) -> Any:
    """Turn ``Annotated[X, "text"]`` into ``Annotated[X, Field(description="text")]``.

    A docstring description is used only when the annotation carries none.
    """
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
        converted: list[Any] = []
        has_description = False
        for item in metadata:
            if isinstance(item, str):
                converted.append(Field(description=item))
                has_description = True
            else:
                if isinstance(item, FieldInfo) and item.description:
                    has_description = True
                converted.append(item)
        if description and not has_description:
            converted.append(Field(description=description))
        return Annotated[(base, *converted)]  # type: ignore[return-value]
    if description:
        return Annotated[annotation, Field(description=description)]
    return annotation


def arguments_model(fn: Callable[..., Any], model_name: str) -> type[BaseModel]:
    """A pydantic model of ``fn``'s keyword-callable parameters (``*args``/``**kwargs`` skipped)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    _, param_docs = split_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        annotation = _with_description(hints.get(name, Any), param_docs.get(name))
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[name] = (annotation, default)
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)  # type: ignore[call-overload]


def _clean(node: Any, defs: Mapping[str, Any], stack: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_clean(item, defs, stack) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and isinstance(node["$ref"], str) and node["$ref"].startswith("#/$defs/"):
        ref = node["$ref"].rsplit("/", 1)[-1]
        if ref in stack:
            raise RecursionError(ref)
        inlined = dict(_clean(defs[ref], defs, (*stack, ref)))
        inlined.update({k: _clean(v, defs, stack) for k, v in node.items() if k not in ("$ref", "title")})
        return inlined
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _clean(sub, defs, stack) for name, sub in value.items()}
        else:
            out[key] = _clean(value, defs, stack)
    return out


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of ``model`` with ``$ref``s inlined and titles removed.

    A recursive model cannot be inlined; its schema keeps ``$defs`` (titles removed).
    """
    raw = model.model_json_schema()
    defs = raw.get("$defs", {})
    try:
        schema = _clean(raw, defs, ())
    except RecursionError:
        schema = {k: v for k, v in raw.items() if k != "title"}
    schema.pop("description", None)  # the tool's own description says it once, at the top
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return schema


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_arguments(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse the model's argument payload (a JSON object string, a dict, or empty) into a dict."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolArgumentsError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        raise ToolArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def validate_arguments(model: type[BaseModel], arguments: Mapping[str, Any]) -> BaseModel:
    """Validate and coerce ``arguments`` against ``model``; :class:`ToolArgumentsError` if they do not fit."""
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as exc:
        raise ToolArgumentsError(_describe(exc)) from None
