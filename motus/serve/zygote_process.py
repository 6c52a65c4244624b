"""What runs in the zygote process (``motus.serve.zygote`` is the server's side and the
protocol): loading the agent, the rehearsal, the loop that forks one child per request, the
child's start, reaping and killing what a child leaves in its process group, and, for a
zygote forked from the serving process, becoming what a fresh one is. Also what the arbiter
uses to note what the agent's import opened (``agent_import``), which a forked zygote keeps.

Imports nothing of the server's side, so the fresh zygote loads only this.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

#: The largest config (pickled; an agent object travels in it) sent to a forked zygote in one
#: message; a larger one goes to a fresh zygote on its standard input instead.
EARLY_CONFIG_LIMIT = 64 * 1024

def wait_readable(objects: list[Any], timeout: float | None) -> list[Any]:
    """The objects (connections, or descriptors as ints) that are readable or closed, waiting
    up to ``timeout`` seconds (None: no limit). ``poll``, not ``select``: a busy server's
    descriptors go past 1024; and not ``multiprocessing.connection.wait``, which builds a
    new selector per call (the pool's manager calls this several times a turn)."""
    by_fd = {obj if isinstance(obj, int) else obj.fileno(): obj for obj in objects}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    events = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in events]


def readable(fd: int, timeout: float | None) -> bool:
    return bool(wait_readable([fd], timeout))


def main(config: dict[str, Any]) -> None:
    """The fresh zygote's entry point (see ``_BOOTSTRAP``)."""
    ctl = socket.socket(fileno=config["ctl_fd"])
    _stdin_from_devnull()  # the config pipe is done with; children must not hold it
    _serve(ctl, config)


def _stdin_from_devnull() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def flush_stdio() -> None:
    """Write what Python buffers for stdout and stderr, so that no process forked from this
    one inherits it and writes it again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # closed, broken or replaced (by the agent's import): nothing to write
            continue


def _serve(ctl: socket.socket, config: dict[str, Any]) -> None:
    """Load the agent, rehearse, say ``ready``, then fork a child per request until the
    server closes ``ctl``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's business
    with _exit_if_abandoned(ctl):
        # Imported here, watched: a server stopped while this loads (a fifth of a second, and
        # what the agent's module imports) is not kept waiting for it.
        from motus.serve import worker

        agent, load_error = worker.load(config["agent_path"], config["agent_blob"])
        try:
            worker.rehearse()
        except Exception as exc:  # only a warm-up: each turn meets a real problem itself, in its own error
            _warn(f"motus zygote: serving without the rehearsal turn, which failed: {type(exc).__name__}: {exc}")
    # What the agent's import printed and Python still buffers goes out now, once: every
    # child would otherwise inherit the buffer and write it again when its turn ends.
    flush_stdio()
    gc.collect()
    gc.freeze()  # what the children inherit is never traversed by their collections
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    try:
        ctl.sendall(b"ready")
    except OSError:
        return  # the server gave up on us (it is shutting down): nothing to serve
    children: set[int] = set()  # forked and not yet reaped
    poller = select.poll()  # not select(): the descriptors it inherited may be past 1024
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if wake_r in ready:
            _drain(wake_r)
            _reap(children)
        if ctl.fileno() in ready:
            try:
                request = ctl.recv(16)
            except OSError:
                request = b""
            if not request:
                break  # the server closed the socket or died
            try:
                _fork(ctl, (wake_r, wake_w), agent, load_error, children)
            except OSError:
                break  # the server went away while we answered
    _end_children(children, wake_r)


def _warn(line: str) -> None:
    """One line on the zygote's stderr (the server's log); the agent's import may have closed it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        return  # nowhere to say it: serving matters more than the warning


def _end_children(children: set[int], wake_r: int) -> None:
    """The server is gone or closing. A stopping server has ended its workers already; after
    a crash, children still running see their pipe close and get the same grace period a
    cancelled turn gets, then their groups are killed (their loop may be too busy to notice)."""
    from motus.durable.interrupt import EXIT_GRACE_SECONDS

    deadline = time.monotonic() + EXIT_GRACE_SECONDS + 0.5
    _reap(children)
    while children and time.monotonic() < deadline:
        readable(wake_r, max(0.0, deadline - time.monotonic()))
        _drain(wake_r)
        _reap(children)
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)  # not reaped: the id is still this child's
        except ProcessLookupError:
            os.kill(pid, signal.SIGKILL)  # it had not made its own group yet
    for pid in list(children):
        os.waitpid(pid, 0)


_agent_fds: dict[int, tuple[int, int]] = {}


def _open_descriptors() -> dict[int, tuple[int, int]]:
    found = {}
    for name in os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"):
        try:
            info = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # the listing's own descriptor, closed by now
        found[int(name)] = (info.st_dev, info.st_ino)
    return found


@contextlib.contextmanager
def agent_import() -> Iterator[None]:
    """Around the serving process's import of the agent (``motus serve start`` checks its
    path): the descriptors the import opens (a log file, a SQLite database, an index) are
    the agent's, and a zygote forked from this process keeps them (``_become_forked_zygote``
    closes every other one). Without this, the module's file objects would use numbers the
    zygote had closed, and that its children reuse for their event loop or job pipe."""
    try:
        before = _open_descriptors()
    except OSError:
        yield  # no descriptor table to read: the zygote closes them all, as before
        return
    try:
        yield
    finally:
        try:
            after = _open_descriptors()
        except OSError:
            after = {}
        _agent_fds.update({fd: ident for fd, ident in after.items() if fd > 2 and before.get(fd) != ident})


def _kept_agent_fds() -> set[int]:
    """The agent's descriptors (``agent_import``) still open on the file they were opened on."""
    kept = set()
    for fd, ident in _agent_fds.items():
        try:
            info = os.fstat(fd)
        except OSError:
            continue  # closed since
        if (info.st_dev, info.st_ino) == ident:
            kept.add(fd)
    return kept


def become_forked_zygote(ctl: socket.socket) -> None:
    """In the forked child: become what a fresh zygote is (its own session, no descriptor of
    the server's but the standard streams, the agent's own descriptors, default signal
    handlers, its name), then wait for the config and serve."""
    os.setsid()
    # Every descriptor but the control socket and the agent's own (what its import opened):
    # the listeners, gunicorn's pipes, the server's files.
    low = 3
    for keep in sorted(_kept_agent_fds() | {ctl.fileno()}):
        os.closerange(low, keep)
        low = keep + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        try:
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            continue  # not settable (SIGKILL, SIGSTOP)
    _fresh_logging()
    _stdin_from_devnull()
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("motus-zygote")  # what ps and top show; its children inherit it
    except OSError as exc:
        _warn(f"motus zygote: could not name the process: {exc}")
    sys.argv = [*sys.argv[:1], "motus-zygote"]  # as a fresh zygote's last word
    message = ctl.recv(EARLY_CONFIG_LIMIT + 1024)
    if not message:
        return  # closed before use: no pool wanted us
    config = pickle.loads(message)
    os.environ.clear()
    os.environ.update(config.pop("environ"))
    _serve(ctl, config)


def _fresh_logging() -> None:
    """The root logger's level as a fresh interpreter has it: ``WARNING``. At the server's
    ``--log-level`` (info), what an agent's libraries log at info (httpx: each request's
    method and URL, query string included) went to the server's log, and only until a fresh
    zygote replaced this one. The server's handler stays: the warnings that do go out are in
    the log's format."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)


@contextlib.contextmanager
def _exit_if_abandoned(ctl: socket.socket) -> Iterator[None]:
    """While the agent loads (which may take long, or hang), exit as soon as the server
    closes the control socket or dies: nothing is sent on it before ``ready``, so any event
    on it means that. A thread watches, and is joined before the first fork."""
    done = threading.Event()

    def watch() -> None:
        poller = select.poll()
        poller.register(ctl.fileno(), select.POLLIN)
        while not done.is_set():
            if poller.poll(100):
                os._exit(0)  # abandoned: there is no one to serve

    watcher = threading.Thread(target=watch, name="motus-zygote-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _fork(ctl: socket.socket, wake: tuple[int, int], agent: Any, load_error: str | None, children: set[int]) -> None:
    ours, theirs = socket.socketpair()
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        ctl.sendall(f"fork failed: {exc}".encode()[:60])
        return
    if pid == 0:
        ours.close()
        _child(theirs, ctl, wake, agent, load_error)  # never returns
    theirs.close()
    children.add(pid)
    try:
        os.setpgid(pid, pid)  # as the child does first: whichever runs first closes the window
    except OSError:
        pass  # the child got there first (or has exited): its group is settled
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        os.kill(pid, signal.SIGKILL)  # not yet reaped: the pid is still this child's
        ours.close()
        ctl.sendall(f"pidfd_open failed: {exc}".encode()[:60])
        return
    try:
        socket.send_fds(ctl, [str(pid).encode()], [ours.fileno(), pidfd])
    finally:
        ours.close()
        os.close(pidfd)


def _child(sock: socket.socket, ctl: socket.socket, wake: tuple[int, int], agent: Any, load_error: str | None) -> None:
    """In the fresh process: drop the zygote's descriptors and handlers, run one turn, exit
    without the interpreter's shutdown (there is nothing of ours to flush but stdio)."""
    code = 1
    flush: Callable[[], bool] | None = None
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        ctl.close()
        from motus.durable.interrupt import flush_stdio as flush
        from motus.serve.worker import run_worker

        run_worker(Connection(sock.detach()), agent, load_error, forked_by_zygote=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        # Whatever the agent did to the process (a stream closed or replaced, an import
        # broken), this process ends here: it must never return into the zygote's loop.
        try:
            if flush is not None and not flush():
                code = code or 1
        finally:
            os._exit(code)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        return  # empty


def _reap(children: set[int]) -> None:
    """Reap every exited child, killing what is left of its process group first."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        try:
            os.killpg(info.si_pid, signal.SIGKILL)  # the zombie still holds the group id
        except (ProcessLookupError, PermissionError):
            pass  # nothing left in its group
        os.waitpid(info.si_pid, 0)
        children.discard(info.si_pid)
