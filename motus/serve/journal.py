"""Moved to :mod:`motus.durable.journal`: this module only re-exports it, so old imports work.

The running turn's journal is state of ``motus.durable.journal`` alone: read it here (any
name not listed below is looked up there when asked, so ``_journal`` is always current, and
a record pickled under this module's old name, such as ``_Raised``, still loads), but
install or patch it there, never here.
"""

from __future__ import annotations

from typing import Any

import motus.durable.journal as _moved
from motus.durable.journal import (
    CONFLICT_WAIT_SECONDS,
    READY_TRIES,
    Journal,
    OutcomeUnknown,
    ReplayDiverged,
    Unrecordable,
    canonical_payload,
    current,
    current_parent,
    digest,
    pack,
    step,
    unpack,
)

__all__ = [
    "CONFLICT_WAIT_SECONDS", "READY_TRIES", "Journal", "OutcomeUnknown", "ReplayDiverged", "Unrecordable",
    "canonical_payload", "current", "current_parent", "digest", "pack", "step", "unpack",
]


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
