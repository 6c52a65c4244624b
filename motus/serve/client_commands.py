"""Client commands of ``motus serve`` (chat, health, create, sessions, get, delete, messages, send).

Placeholder until the client issue lands: ``register`` adds nothing yet.
"""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the client commands to the ``motus serve`` group."""
