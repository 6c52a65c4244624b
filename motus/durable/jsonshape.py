"""Limits on the shape of JSON that crosses the API or the worker pipe.

Deeply nested JSON breaks pickling and pydantic's serializer (around 255 levels) long
before it is useful to anyone, so every request body and interrupt payload is held to
``MAX_JSON_DEPTH`` levels; past it the client gets a 400 and the agent a ``ValueError``,
and nothing is stored.

What a body costs once parsed depends on how many values it holds more than on its size:
a short key or a tiny object is a few bytes of JSON and 60-200 bytes of Python, a few times
over while it is validated. ``json_cost_problem`` bounds both counts before anything is
parsed (see ``MAX_JSON_CONTAINERS`` and ``MAX_JSON_VALUES_FREE``), so that a body within
every limit costs at most about 20 times its size at peak (plus a few MiB for a small one).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 64
#: At most this many objects and arrays in one request body. Each costs Python about 60-200
#: bytes once parsed, so a body of tiny items (``[{}, {}, ...]``, 3 bytes each) would cost
#: 25-300 times its size; past the limit it is refused before it is parsed. The count is
#: an upper bound (brackets inside strings count too), so it errs on the side of refusing.
MAX_JSON_CONTAINERS = 50_000
#: At most this many JSON values (array elements and object members) in one request body,
#: plus one per ``JSON_BYTES_PER_VALUE`` bytes of it. Messages, histories and tool
#: arguments stay far below (a message of text is hundreds of bytes for a handful of
#: values); a body of short keys or numbers (``{"a":0,"b":0,...}``, 6 bytes a value) is
#: refused before it is parsed. Counted as an upper bound too (commas inside strings count).
MAX_JSON_VALUES_FREE = 50_000
JSON_BYTES_PER_VALUE = 32


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when containers in ``value`` nest deeper than ``limit`` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        # Only containers are pushed: a list of a million numbers costs no extra memory here.
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return False


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def key_with_lone_surrogate(value: Any) -> str | None:
    """The first object key in ``value`` holding a lone surrogate (half of a UTF-16 pair,
    which JSON can spell as ``\\ud800``), or None. Such a key cannot be written as text:
    a message's history is dumped as JSON by its worker, which would replace or refuse it
    (values are kept, escaped). Checked at the door, so no turn fails for it later."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _LONE_SURROGATE.search(key):
                    return key
                if isinstance(child, (dict, list)):
                    stack.append(child)
        elif isinstance(item, list):
            stack.extend(child for child in item if isinstance(child, (dict, list)))
    return None


def lone_surrogate_key_problem(value: Any, what: str) -> str | None:
    """Why ``value`` (``what``: "interrupt() payload", say) cannot be kept: an
    object key holding a lone surrogate (``key_with_lone_surrogate``); None when it can."""
    key = key_with_lone_surrogate(value)
    if key is None:
        return None
    return (f"{what} has the object key {json.dumps(key)}, which holds a lone surrogate (half of a UTF-16 pair) "
            "and cannot be written as text; use the whole character")


def without_lone_surrogate_keys(value: Any) -> Any:
    """``value`` with each lone surrogate in an object key (at any depth) replaced the way
    UTF-8 text with one is read back (U+FFFD for each of its bytes). For a payload an
    earlier motus stored before such keys were refused at the door: it is still shown, not
    a 500. ``value`` itself when it holds no such key (looked for first: the common case
    costs a walk, not a copy)."""
    if key_with_lone_surrogate(value) is None:
        return value
    return _replaced_keys(value)


def _replaced_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            (_replace_surrogates(key) if isinstance(key, str) else key): _replaced_keys(child)
            for key, child in value.items()
        }
    if isinstance(value, list):
        return [_replaced_keys(child) for child in value]
    return value


def _replace_surrogates(text: str) -> str:
    if not _LONE_SURROGATE.search(text):
        return text
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def containers_upper_bound(raw: bytes) -> int:
    """How many JSON objects and arrays ``raw`` can hold at most (no parsing, no copy)."""
    return raw.count(b"{") + raw.count(b"[")


def values_upper_bound(raw: bytes) -> int:
    """How many JSON values ``raw`` can hold at most: the top one, and in each object or
    array one more than its commas (no parsing, no copy)."""
    return 1 + raw.count(b",") + containers_upper_bound(raw)


def values_allowed(size: int) -> int:
    return MAX_JSON_VALUES_FREE + size // JSON_BYTES_PER_VALUE


def json_cost_problem(raw: bytes) -> str | None:
    """Why ``raw`` would cost too much to parse (the 400's detail), or None."""
    containers = containers_upper_bound(raw)
    if containers > MAX_JSON_CONTAINERS:
        return (
            f"Request body holds too many JSON objects and arrays (up to {containers}; the limit is "
            f"{MAX_JSON_CONTAINERS}): send fewer, larger items"
        )
    values, allowed = values_upper_bound(raw), values_allowed(len(raw))
    if values > allowed:
        return (
            f"Request body holds too many JSON values for its size (up to {values} in {len(raw)} bytes; "
            f"the limit is {MAX_JSON_VALUES_FREE} plus one per {JSON_BYTES_PER_VALUE} bytes, {allowed} here): "
            "send fewer, larger items"
        )
    return None
