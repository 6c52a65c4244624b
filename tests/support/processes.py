"""Whether a process is still running, as the tests ask it; and which children a test
started (``started_since``, for the leak check).

One answer for every test: a zombie is dead (it has exited and waits only to be reaped), and
a process reaped between two questions (``pid_exists`` and then ``Process``) is dead too,
not a ``NoSuchProcess`` raised into a ``wait_until``."""

from __future__ import annotations

import os
import time

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


# -- the leak check's view of this process's children ------------------------------------------
#
# ``no_leaks`` asks after every test which child processes it started and left running. Asking
# psutil (``Process.children``) reads the ``stat`` file of every process on the machine to
# find their parents (~4 ms with the few hundred a suite has running), twice or more a test:
# ~8% of the test processes' CPU. Two cheaper facts answer the question instead:
#
# - ``/proc/self/task/*/children`` lists this process's children (one file per thread);
# - a child's start time (``stat`` field 22, clock ticks since boot) says whether the test
#   started it, so no list of the children before the test is needed.
#
# The kernel documents the ``children`` files as possibly missing a child while another is
# created or exits at that moment, so "none left" from them is confirmed by psutil's full
# scan before the check passes (``started_since(..., exact=True)``).

_TICKS = os.sysconf("SC_CLK_TCK")


def now_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/PID/stat`` start times use."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def started_at(pid: int) -> int | None:
    """The start time of a running (not zombie) process ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _listed_children() -> set[int] | None:
    """The pids in this process's ``children`` files; None where the kernel has none."""
    found: set[int] = set()
    read = False
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
                found.update(int(pid) for pid in handle.read().split())
            read = True
        except OSError:
            continue  # a thread that ended meanwhile (or no such files: ``read`` stays False)
    return found if read else None


def started_since(ticks: int, exact: bool = False) -> set[int]:
    """This process's running children started at ``ticks`` or later (one tick earlier
    too: the clock is read in whole ticks). ``exact``: from psutil's scan of every process,
    not the ``children`` files (see above)."""
    pids = None if exact else _listed_children()
    if pids is None:
        pids = {child.pid for child in psutil.Process().children(recursive=False)}
    return {pid for pid in pids if (started := started_at(pid)) is not None and started >= ticks - 1}
