"""The built-in web chat served at ``/ui/``.

Placeholder until the web UI issue lands: ``register_ui`` adds nothing yet.
"""

from __future__ import annotations

from flask import Flask


def register_ui(app: Flask) -> None:
    """Mount the web chat on ``app`` under ``/ui/``."""
