"""Moved to :mod:`motus.durable.jsonshape`: this module only re-exports it, so old imports
work (any name not listed below is looked up there when asked)."""

from __future__ import annotations

from typing import Any

import motus.durable.jsonshape as _moved
from motus.durable.jsonshape import (
    JSON_BYTES_PER_VALUE,
    MAX_JSON_CONTAINERS,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES_FREE,
    containers_upper_bound,
    json_cost_problem,
    json_depth_exceeds,
    key_with_lone_surrogate,
    values_allowed,
    values_upper_bound,
)

__all__ = [
    "JSON_BYTES_PER_VALUE", "MAX_JSON_CONTAINERS", "MAX_JSON_DEPTH", "MAX_JSON_VALUES_FREE", "containers_upper_bound",
    "json_cost_problem", "json_depth_exceeds", "key_with_lone_surrogate", "values_allowed", "values_upper_bound",
]


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
