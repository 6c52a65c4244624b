"""The gunicorn arbiter's side of motus: one worker only, and a stop that ends when the worker has.

Owns ``claim_single_worker`` (a second worker of one arbiter is refused at boot, with
``SINGLE_WORKER_MESSAGE``: motus keeps live turns in one process) and ``MotusArbiter``, the
arbiter ``run_gunicorn`` runs, whose graceful stop waits on the arbiter's signal queue instead
of polling.

Guarantees: the lock that proves a worker is the only one is held by that worker's own
descriptor for its life (inherited locks are claimed again), in a directory only this user can
write; a graceful stop returns as soon as the worker has exited, turns into a quick stop on
SIGINT/SIGQUIT, and kills a worker still alive after ``graceful_timeout``. The arbiter's state
is reached only through ``private.ArbiterSeam``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import tempfile
import time
from typing import Any

from motus.serve.gunicorn.private import ArbiterSeam

_held_lock: Any = None
_held_pid: int | None = None

SINGLE_WORKER_MESSAGE = (
    "motus keeps sessions (and the workers waiting on a human) in memory in one process, so a "
    "resume must reach the process that holds its session. Run gunicorn with exactly one worker "
    "(-w 1) and raise --threads for concurrency; motus' own --workers / MOTUS_WORKERS sets how "
    "many turns run at once."
)


def _private_dir() -> str:
    """A directory only this user can write: ``$XDG_RUNTIME_DIR``, else ``<tmp>/motus-<uid>``
    created with mode 0700. A lock file at a predictable name in a shared ``/tmp`` could be
    created first by another local user, and stop the server from booting."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return runtime
    path = os.path.join(tempfile.gettempdir(), f"motus-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # made before (by this user, or not): checked below
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(
            f"{path} is not a private directory of this user (owned by uid {info.st_uid}, mode "
            f"{oct(info.st_mode & 0o777)}); remove it or set XDG_RUNTIME_DIR"
        )
    return path


def claim_single_worker() -> None:
    """Refuse to serve from a second worker of the same gunicorn arbiter.

    The first worker takes an exclusive lock on a file named after the arbiter's pid and
    holds it for its life; another worker of that arbiter fails to take it and raises. When
    the first worker dies, its lock goes with it, so gunicorn's restart of it still works.
    """
    global _held_lock, _held_pid
    if _held_lock is not None and _held_pid == os.getpid():
        return
    # A lock inherited across a fork (gunicorn --preload claims in the arbiter) proves
    # nothing about this process: claim again, with a descriptor of our own.
    path = claim_path(os.getppid())
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        handle = os.fdopen(fd, "a+")  # noqa: SIM115 - held for the life of the process
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RuntimeError(f"Refusing to start a second gunicorn worker. {SINGLE_WORKER_MESSAGE}") from None
        if _still_named(handle, path):
            break
        handle.close()  # unlinked between our open and our lock: a lock on it proves nothing
    _held_lock, _held_pid = handle, os.getpid()
    _sweep_stale_claims(keep=path)


def _still_named(handle: Any, path: str) -> bool:
    """Whether ``path`` still names the file ``handle`` has open."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except (OverflowError, ValueError):
        return False  # not a pid this system can have
    return True


def claim_path(arbiter_pid: int) -> str:
    """The lock file the worker of arbiter ``arbiter_pid`` holds."""
    return os.path.join(_private_dir(), f"gunicorn-{arbiter_pid}.lock")


def remove_claim(arbiter_pid: int) -> None:
    """The arbiter's exit, its worker gone: its lock file goes too (else every start left
    one behind)."""
    try:
        os.unlink(claim_path(arbiter_pid))
    except OSError:
        pass  # never made (no worker booted), or swept already: nothing to remove


def _sweep_stale_claims(keep: str) -> None:
    """Remove the lock files of arbiters that are gone (servers killed without their
    arbiter's exit).

    A file whose arbiter still runs is never touched: its worker may be between creating the
    file and locking it, and a sweep that locked it then made that worker refuse to boot as
    a "second worker" (seen when several servers started at once). A gone arbiter's file is
    locked before it is removed, so one an orphaned worker still holds stays.
    """
    folder = os.path.dirname(keep)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if not (name.startswith("gunicorn-") and name.endswith(".lock")) or path == keep:
            continue
        try:
            arbiter = int(name[len("gunicorn-") : -len(".lock")])
        except ValueError:
            continue  # not a name this module made
        if _alive(arbiter):
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)  # nobody holds it: its worker is gone
        except OSError:
            continue  # held by a live worker (BlockingIOError), or gone meanwhile
        finally:
            os.close(fd)


class MotusArbiter(ArbiterSeam):
    """gunicorn's arbiter, but a graceful stop returns as soon as the worker has exited.

    gunicorn's own ``stop`` checks for the worker every 0.1 s and sleeps once more after it
    has reaped it, which made every stop 0.1-0.2 s longer than the worker took. Here the wait
    is on the arbiter's signal queue, which a SIGCHLD fills at once. The rest is gunicorn's:
    the listening sockets are closed first (TCP only, so nothing to unlink), a SIGINT or
    SIGQUIT during the wait turns it into gunicorn's quick stop, and a worker still alive
    after ``graceful_timeout`` is killed (gunicorn's ``stop``, called at the end, would have
    given it a second ``graceful_timeout``). The SIGTERM is sent again every second of the
    wait (the worker acts on the first).
    """

    def motus_halted(self) -> None:
        """The arbiter exits, its worker stopped: its lock file goes with it."""
        remove_claim(self.pid)

    def motus_stop(self, graceful: bool) -> bool:
        """Runs first on every stop; returns whether gunicorn's stop, which follows, is still
        to be graceful."""
        if graceful and self.has_workers() and not self.has_dirty_arbiter():
            self.close_listeners()
            self.signal_workers(signal.SIGTERM)
            deadline = time.monotonic() + self.cfg.graceful_timeout
            # Reap first: the SIGCHLD of a worker that died just before the stop may have been
            # taken off the queue with the SIGTERM that began it, and will not come again.
            self.reap()
            while self.has_workers() and time.monotonic() < deadline:
                sig = self.next_signal(min(1.0, max(0.0, deadline - time.monotonic())))
                if sig in (signal.SIGINT, signal.SIGQUIT):
                    graceful = False
                    break
                self.reap()
                if sig is None and self.has_workers():
                    # Again: a worker forked just before the stop (to replace a dead one) may
                    # have had the first SIGTERM before it set its own handlers, and lost it.
                    self.signal_workers(signal.SIGTERM)
            if graceful and self.has_workers():
                # Out of time: gunicorn's stop would begin another whole graceful_timeout.
                self.signal_workers(signal.SIGKILL)
        return graceful
