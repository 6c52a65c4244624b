"""Tools that ship with motus. ``ask_user_question`` lives in :mod:`motus.tools.builtins.ask_user`."""

from __future__ import annotations

from motus.tools.builtins.ask_user import ask_user_question

__all__ = ["ask_user_question"]
