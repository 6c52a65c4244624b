"""Limits on the shape of JSON that crosses the API or the worker pipe.

Deeply nested JSON breaks pickling and pydantic's serializer (around 255 levels) long
before it is useful to anyone, so every request body and interrupt payload is held to
``MAX_JSON_DEPTH`` levels; past it the client gets a 400 and the agent a ``ValueError``,
and nothing is stored.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64


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
        stack.extend((child, depth + 1) for child in children)
    return False
