"""Agents: :class:`ReActAgent`, the tool-calling loop ``motus serve`` can run."""

from __future__ import annotations

from motus.agent.react import ReActAgent

__all__ = ["ReActAgent"]
