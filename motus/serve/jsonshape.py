"""Limits on the shape of JSON that crosses the API or the worker pipe.

Deeply nested JSON breaks pickling and pydantic's serializer (around 255 levels) long
before it is useful to anyone, so every request body and interrupt payload is held to
``MAX_JSON_DEPTH`` levels; past it the client gets a 400 and the agent a ``ValueError``,
and nothing is stored.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64
#: At most this many objects and arrays in one request body. Each costs Python about 60-200
#: bytes once parsed, so a body of tiny items (``[{}, {}, ...]``, 3 bytes each) would cost
#: 25-300 times its size; past the limit it is refused before it is parsed. The count is
#: an upper bound (brackets inside strings count too), so it errs on the side of refusing.
MAX_JSON_CONTAINERS = 50_000


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


def containers_upper_bound(raw: bytes) -> int:
    """How many JSON objects and arrays ``raw`` can hold at most (no parsing, no copy)."""
    return raw.count(b"{") + raw.count(b"[")
