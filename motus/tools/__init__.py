"""Tools a model can call: ``@tool``, approval gates and guardrails.

``from motus.tools import tool, Tool, ToolRejected``. See :mod:`motus.tools.decorator`
for the call path, :mod:`motus.tools.approval` for ``requires_approval`` and
:mod:`motus.tools.builtins.ask_user` for the ``ask_user_question`` builtin.
"""

from __future__ import annotations

from motus.tools.approval import ToolRejected
from motus.tools.decorator import Tool, tool
from motus.tools.schema import ToolArgumentsError

__all__ = ["tool", "Tool", "ToolRejected", "ToolArgumentsError"]
