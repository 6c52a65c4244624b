"""Our own fork server (the "zygote"): one small process that forks a fresh worker per request.

Why not ``multiprocessing``'s forkserver: every process it starts costs the server a new
connection, pickled preparation data and a pickled process object, and costs the child the
unpickling of both, multiprocessing's after-fork hooks and the copy-on-write faults of all
that. Here a start is one byte one way and two descriptors back; the child goes straight
from ``fork()`` to waiting for its job. The zygote also loads the agent and rehearses a turn
once, before it forks anyone, so no child pays for lazy first-time work.

This module is the server's side (``Zygote``, ``Child``) and the zygote forked early from the
serving process (``fork_early``); what runs inside the zygote is ``motus.serve.zygote_process``.

Shape::

    server (spawner thread)                zygote (single-threaded)              child
    -----------------------                ------------------------              -----
    Popen(python -c ...), config on stdin  load agent, rehearse, gc.freeze()
                       <── b"ready" ───────
    b"F" ──────────────────────────────▶   socketpair(); fork() ───────────────▶ setpgid, close
                                           pidfd_open(child)                     zygote's fds,
    (pid, [conn fd, pidfd]) ◀── SCM_RIGHTS                                       run_worker(conn)
                                           SIGCHLD: killpg(child) while it is    os._exit()
                                           a zombie, then reap it

Guarantees:

- The server never forks itself (it is threaded): the zygote is a fresh interpreter started
  with ``subprocess`` (the executable ``multiprocessing`` would use), and it forks only
  while single-threaded (unless the agent's own import started threads, as with any fork
  server).
- A child is known to the server by a pidfd: waiting on it, testing it and killing it can
  never reach another process, even after the pid is reused.
- When a child exits, the zygote kills the rest of its process group *before* reaping it: the
  group id is still held by the zombie, so the signal cannot reach an unrelated group. If the
  zygote itself is gone, the pool kills the group (``Child.kill_group``).
- The zygote runs in its own session, so a signal to the server's process group does not end
  it before the workers whose groups it must end.
- The zygote ends when the server closes the control socket or dies (EOF). Children it
  leaves behind end themselves: their job pipe reaches EOF.
- One thread at a time calls ``start_child`` (the pool's spawner); ``interrupt`` and
  ``close`` may be called from any thread and wake a start that is waiting.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing import spawn
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from motus.serve.zygote_process import EARLY_CONFIG_LIMIT, agent_import, become_forked_zygote, flush_stdio, main, readable, wait_readable

__all__ = ["Child", "Zygote", "ZygoteError", "agent_import", "available", "discard_early", "fork_early", "main", "wait_readable"]

#: How long the zygote may take to import and load the agent before a start counts as failed.
READY_TIMEOUT_SECONDS = 120.0
#: How long one fork may take to be answered.
FORK_TIMEOUT_SECONDS = 30.0

_BOOTSTRAP = (
    "import pickle, sys\n"
    "config = pickle.load(sys.stdin.buffer)\n"
    "sys.path[:] = config['sys_path']\n"
    "from motus.serve.zygote_process import main\n"
    "main(config)\n"
)


def available() -> bool:
    """Whether this platform can run the zygote (fork, pidfds and descriptor passing)."""
    return all(hasattr(os, name) for name in ("fork", "pidfd_open")) and hasattr(signal, "pidfd_send_signal") and hasattr(socket, "send_fds")


class ZygoteError(RuntimeError):
    """The zygote could not be started, or could not start a child."""


class ZygoteKilled(ZygoteError):
    """A fresh zygote was killed by a signal before it was ready (someone killed it, or its
    whole group): not a fault of the agent's, so a start may try a fresh one once more."""


class Child:
    """One worker process started by the zygote, known by its pidfd.

    The same small interface the pool uses for ``multiprocessing`` processes: ``sentinel``
    (readable once the process has exited), ``is_alive``, ``join``, ``kill_group`` and
    ``close``. Guarded by the pool's lock like the rest of a handle.
    """

    def __init__(self, pid: int, pidfd: int, zygote_alive: Callable[[], bool] = lambda: True) -> None:
        self.pid = pid
        self.sentinel = pidfd
        self._zygote_alive = zygote_alive  # whether the zygote that forked it can still reap it
        self._closed = False

    def is_alive(self) -> bool:
        return not self._closed and not readable(self.sentinel, 0)

    def join(self, timeout: float | None = None) -> None:
        if not self._closed:
            readable(self.sentinel, timeout)

    def kill_group(self, only_group: bool = False) -> None:
        """SIGKILL the process and its group.

        While the process lives, its pid is its group's id, so ``killpg`` cannot reach
        another group. After it exited (``only_group``), its zygote kills what is left of
        the group before reaping it; if that zygote is gone (killed), the group is killed
        here, as ``multiprocessing``'s processes are: the group id cannot be reused while a
        member of the group lives, so at worst the signal finds no one.
        """
        if self._closed:
            return
        if only_group:
            if not self._zygote_alive():
                _kill_group_quietly(self.pid)
            return
        try:
            # Linux 6.9+: the group of exactly this process, with no window at all.
            signal.pidfd_send_signal(self.sentinel, signal.SIGKILL, None, _PIDFD_SIGNAL_PROCESS_GROUP)
            return
        except ProcessLookupError:
            return  # it has exited: its zygote (or ``only_group`` above) ends its group
        except OSError:
            pass  # an older kernel (EINVAL): by its pid, which it holds while it lives
        if self.is_alive():
            _kill_group_quietly(self.pid)
        try:
            signal.pidfd_send_signal(self.sentinel, signal.SIGKILL)  # not in its group yet?
        except ProcessLookupError:
            pass  # it has exited: its zygote (or the line above) ends its group

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.sentinel)


#: ``PIDFD_SIGNAL_PROCESS_GROUP`` (linux/pidfd.h): signal the process group of the pidfd's process.
_PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def _kill_group_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no one is left in the group


def _wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """``proc.wait(timeout)``, but woken the moment the process exits (by its pidfd):
    ``Popen.wait`` with a timeout polls, sleeping up to 50 ms past the exit, and a server's
    stop waits for its zygote this way."""
    if proc.poll() is None:  # not reaped, so its pid is still its own
        fd = os.pidfd_open(proc.pid)
        try:
            readable(fd, timeout)
        finally:
            os.close(fd)
    if proc.poll() is None:
        raise subprocess.TimeoutExpired(proc.args, timeout)


class Zygote:
    """The server's side: starts the zygote on first use (and again after it died), asks it
    for children. See the module docstring for the protocol and the guarantees."""

    def __init__(self, agent_path: str | None, agent_blob: bytes | None) -> None:
        self._config: dict[str, Any] = {"agent_path": agent_path, "agent_blob": agent_blob}
        self._lock = threading.Lock()  # guards _proc, _ctl, _closed (not the socket's traffic)
        self._proc: subprocess.Popen[bytes] | _Forked | None = None
        self._ctl: socket.socket | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def start_child(self) -> tuple[Child, Connection]:
        """A fresh worker process and the server's end of its job pipe (spawner thread only).

        A zygote that had been running and is found dead now (killed, or its agent killed
        it) made no child for this request: a new zygote is started and asked once more, so
        the turn waiting for a process does not fail for it. So is one killed by a signal
        while it was starting (``ZygoteKilled``); one that exits on its own (the agent does
        not import) fails the start at once."""
        for attempt in (1, 2):
            try:
                ctl, proc, fresh = self._running()
            except ZygoteKilled:
                if attempt == 1 and not self._closing():
                    continue  # killed while it started: a fresh one is asked instead
                raise
            error: OSError | None = None
            try:
                ctl.settimeout(FORK_TIMEOUT_SECONDS)
                ctl.sendall(b"F")
                message, fds, _flags, _addr = socket.recv_fds(ctl, 64, 2)
            except OSError as exc:
                message, fds, error = b"", [], exc
            if message and len(fds) == 2:
                return Child(int(message), fds[1], lambda: proc.poll() is None), Connection(fds[0])
            for fd in fds:
                os.close(fd)
            self._discard()
            if not message and attempt == 1 and not fresh and not self._closing():
                continue  # it had died (no answer, or EOF): no child was made
            if error is not None:
                raise ZygoteError(f"the worker zygote stopped answering ({type(error).__name__}: {error})")
            detail = message.decode(errors="replace") if message else "it exited"
            raise ZygoteError(f"the worker zygote could not start a process: {detail}")
        raise AssertionError("unreachable")  # the second attempt returns or raises

    def interrupt(self) -> None:
        """Refuse new starts and wake a start that is waiting (any thread)."""
        with self._lock:
            self._closed = True
            if self._ctl is not None:
                try:
                    self._ctl.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # not connected any more: nothing is waiting on it

    def close(self, timeout: float = 5.0) -> None:
        """End the zygote and wait for it (call once no start can be running), and one
        ``fork_early`` made that no start took (the server stopped before its first start)."""
        self.interrupt()
        self._discard(timeout)
        discard_early()

    # -- internals ------------------------------------------------------------------------

    def _closing(self) -> bool:
        with self._lock:
            return self._closed

    def _running(self) -> tuple[socket.socket, subprocess.Popen[bytes], bool]:
        """The control socket and process of a ready zygote, and whether it was started
        just now."""
        with self._lock:
            if self._closed:
                raise ZygoteError("the pool is closing")
            if self._ctl is not None and self._proc is not None and self._proc.poll() is None:
                return self._ctl, self._proc, False
        self._discard()
        adopted = self._adopt_early()
        ctl, proc = adopted if adopted is not None else self._launch()
        return ctl, proc, True

    def _adopt_early(self) -> tuple[socket.socket, Any] | None:
        """The zygote ``fork_early`` made in this process, given our config and ready; None
        if there is none (or it cannot take the config, or it died): then a fresh one is
        launched, as after any zygote's death."""
        early = _take_early()
        if early is None:
            return None
        ctl, proc = early
        # Our environment as it is now (the server took its secrets out of it), as a fresh
        # zygote would inherit it.
        config = pickle.dumps({**self._config, "environ": dict(os.environ)}, protocol=pickle.HIGHEST_PROTOCOL)
        self._hold(ctl, proc)
        if len(config) > EARLY_CONFIG_LIMIT:
            self._discard()  # an agent object too large for one message: a fresh zygote unpickles it
            return None
        try:
            ctl.sendall(config)
        except OSError:
            self._discard()
            if self._closing():  # ``interrupt`` shut the socket: no fresh zygote to start and end at once
                raise ZygoteError("the pool is closing") from None
            return None  # it died before it was used: a fresh one takes its place
        return ctl, self._await_ready(ctl, proc)

    def _launch(self) -> tuple[socket.socket, subprocess.Popen[bytes]]:
        if self._closing():
            raise ZygoteError("the pool is closing")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = dict(self._config, sys_path=list(sys.path), ctl_fd=theirs.fileno())
        command = [spawn.get_executable(), *subprocess._args_from_interpreter_flags(), "-c", _BOOTSTRAP, "motus-zygote"]  # type: ignore[attr-defined]
        try:
            # Its own session: a signal to the server's process group (Ctrl-C, a supervisor's
            # SIGTERM, kill -9 of the group) must not end it before the server's workers,
            # whose groups it kills when they exit; it ends when the server closes the socket.
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, pass_fds=[theirs.fileno()], close_fds=True, start_new_session=True
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._hold(ours, proc)
        try:
            assert proc.stdin is not None
            proc.stdin.write(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))
            proc.stdin.close()
        except (OSError, ValueError) as exc:
            self._discard()
            raise ZygoteError(f"the worker zygote did not start ({type(exc).__name__}: {exc})") from None
        return ours, self._await_ready(ours, proc)

    def _hold(self, ctl: socket.socket, proc: Any) -> None:
        """Make this zygote the one ``_discard`` ends; if the pool closed meanwhile, end it now."""
        with self._lock:
            self._proc, self._ctl = proc, ctl
            closed = self._closed
        if closed:
            self._discard()
            raise ZygoteError("the pool is closing")

    def _await_ready(self, ctl: socket.socket, proc: Any) -> Any:
        """Wait for the zygote's ``ready`` (it has loaded the agent and rehearsed)."""
        try:
            ctl.settimeout(READY_TIMEOUT_SECONDS)
            ready = ctl.recv(64)
        except (OSError, ValueError) as exc:
            self._discard()
            raise ZygoteError(f"the worker zygote did not start ({type(exc).__name__}: {exc})") from None
        if ready != b"ready":
            self._discard()
            code = proc.poll()
            error = ZygoteKilled if code is not None and code < 0 else ZygoteError
            raise error(f"the worker zygote exited during start-up (exit code {code})")
        return proc

    def _discard(self, timeout: float = 1.0) -> None:
        """Forget the zygote: close our end (it sees EOF and exits) and reap it."""
        with self._lock:
            proc, ctl = self._proc, self._ctl
            self._proc = self._ctl = None
        if ctl is not None:
            ctl.close()
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass  # it is gone: nothing left to flush to
        try:
            _wait_for_exit(proc, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the zygote forked by the serving process (the default under gunicorn) -------------------

#: The zygote ``fork_early`` made and no pool has taken yet: (the pid that forked it, our end
#: of its control socket, the process). Only the process that forked it may take it.
_early: tuple[int, socket.socket, _Forked] | None = None
_early_lock = threading.Lock()


class _Forked:
    """A zygote this process forked (``fork_early``): the part of ``Popen``'s interface the
    server side uses (``pid``, ``poll``, ``wait``, ``kill``, ``args``, ``stdin``)."""

    stdin = None
    args = "motus-zygote"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if timeout is not None:
            _wait_for_exit(self, timeout)  # type: ignore[arg-type]
        elif self.returncode is None:
            self._reap(0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:  # not reaped: the pid is still its own
            os.kill(self.pid, signal.SIGKILL)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:
            self.returncode = -1  # reaped by someone else: gone all the same
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def fork_early() -> None:
    """Fork the zygote now, from the serving process while it is still single-threaded and
    has the agent imported (gunicorn's worker, just forked from the arbiter, which imported
    the agent to check its path), so the zygote does not start a fresh interpreter and import
    motus and the agent again. Only for a server that holds no secret (the caller decides:
    ``processes.allow_early_zygote``): the zygote and its workers share what the serving
    process had in memory and its original environment block. It waits for its config until the pool asks for its first
    process (``Zygote._adopt_early``); if no pool takes it, ``discard_early`` ends it, and so
    does this process's exit (the socket closes). Does nothing where a thread is running:
    forking then is what the zygote exists to avoid."""
    global _early
    if not available() or threading.active_count() > 1 or _early is not None:
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.collect()  # objects the parent had dropped close their descriptors now, not in the zygote
    flush_stdio()  # what this process buffered is its own to write, not the zygote's and its children's too
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return  # the pool launches a fresh zygote instead
    if pid == 0:
        code = 1
        try:
            ours.close()
            become_forked_zygote(theirs)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)  # never return into the code that forked us
    theirs.close()
    with _early_lock:
        _early = (os.getpid(), ours, _Forked(pid))


#: Descriptors the agent's import opened in this process (``agent_import``), by number, with
#: the file each was (device, inode): a zygote forked from this process keeps those still
#: open on the same file, as a fresh zygote keeps what its own import of the agent opened.
def _take_early() -> tuple[socket.socket, _Forked] | None:
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is None:
        return None
    owner, ctl, proc = early
    if owner != os.getpid():  # inherited through another fork: not ours to use
        ctl.close()
        return None
    return ctl, proc


def discard_early() -> None:
    """End a zygote ``fork_early`` made that no pool took (workers come from
    ``multiprocessing`` here): it sees its socket close and exits."""
    early = _take_early()
    if early is not None:
        ctl, proc = early
        ctl.close()
        try:
            _wait_for_exit(proc, 5.0)  # type: ignore[arg-type]
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
