"""Whether a process is still running, as the tests ask it.

One answer for every test: a zombie is dead (it has exited and waits only to be reaped), and
a process reaped between two questions (``pid_exists`` and then ``Process``) is dead too,
not a ``NoSuchProcess`` raised into a ``wait_until``."""

from __future__ import annotations

import psutil


def alive(proc: psutil.Process | int) -> bool:
    """Running and not a zombie. Given a ``Process``, ``is_running`` also checks that its pid
    was not reused since."""
    try:
        if isinstance(proc, int):
            proc = psutil.Process(proc)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
