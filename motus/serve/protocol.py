"""Moved to :mod:`motus.durable.records`: this module only re-exports it, so old imports work
(any name not listed below is looked up there when asked)."""

from __future__ import annotations

from typing import Any

import motus.durable.records as _moved
from motus.durable.records import (
    INTERRUPT,
    MODEL,
    STEP,
    TOOL,
    Ack,
    Failure,
    Interrupt,
    Job,
    JournalEntry,
    Record,
    Result,
    Resume,
    message_problem,
    result_problem,
    resulting_state,
    same_json,
    unchanged_prefix,
)

__all__ = [
    "INTERRUPT", "MODEL", "STEP", "TOOL", "Ack", "Failure", "Interrupt", "Job", "JournalEntry", "Record", "Result",
    "Resume", "message_problem", "result_problem", "resulting_state", "same_json", "unchanged_prefix",
]


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
