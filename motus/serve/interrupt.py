"""Moved to :mod:`motus.durable.interrupt`: this module only re-exports it, so the guide's
``from motus.serve.interrupt import interrupt`` keeps working.

The worker's channel is state of ``motus.durable.interrupt`` alone: read it here (any name
not listed below, ``_channel`` included, is looked up there when asked, so it is always
current), but install or patch it there: a name assigned here reaches nothing that runs a turn.
The wire records are re-exported too, as they always were from this module.
"""

from __future__ import annotations

from typing import Any

import motus.durable.interrupt as _moved
from motus.durable.interrupt import (
    EXIT_GRACE_SECONDS,
    MAX_INTERRUPT_BYTES,
    end_group,
    flush_stdio,
    interrupt,
    session_grants,
    was_asked,
)
from motus.durable.records import Ack, Failure, Interrupt, Job, Record, Result, Resume

__all__ = ["interrupt", "Job", "Interrupt", "Resume", "Result", "Failure", "Record", "Ack", "MAX_INTERRUPT_BYTES"]


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
