"""Moved to :mod:`motus.frameworks.anthropic`, with the other framework adapters: this module
only re-exports it, so ``from motus.anthropic import ToolRunner, requires_approval`` keeps
working (any name not listed below is looked up there when asked)."""

from __future__ import annotations

from typing import Any

import motus.frameworks.anthropic as _moved
from motus.frameworks.anthropic import ToolRunner, requires_approval, to_anthropic_messages, to_chat_messages

__all__ = ["ToolRunner", "requires_approval", "to_anthropic_messages", "to_chat_messages"]


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
