"""Serving agents over HTTP: ``AgentServer``, ``interrupt()``, ``ServableAgent``.

Imports are lazy so that a worker process (which imports ``motus.serve.interrupt``) never
pulls in Flask or gunicorn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AgentServer", "ServableAgent", "interrupt"]


def __getattr__(name: str) -> Any:
    if name == "AgentServer":
        from motus.serve.server import AgentServer

        return AgentServer
    if name == "ServableAgent":
        from motus.serve.agents import ServableAgent

        return ServableAgent
    if name == "interrupt":
        from motus.serve.interrupt import interrupt

        return interrupt
    raise AttributeError(f"module 'motus.serve' has no attribute {name!r}")
