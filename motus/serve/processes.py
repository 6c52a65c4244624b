"""How the pool starts a worker process: the zygote where it can run, ``multiprocessing`` elsewhere.

Both launchers give the pool the same thing: a process object with ``sentinel`` (a
descriptor that is readable once the process has exited), ``is_alive()``, ``join()``,
``kill_group()`` and ``close()``, and the server's end of the job pipe.

- ``motus.serve.zygote`` (Linux): the default. A start costs a fraction of what
  ``multiprocessing`` costs (see ``docs/performance.md``). From ``motus serve start`` with no
  secret to keep from agents, the zygote is forked from the serving process before it
  starts any thread (``fork_zygote_early``), with the agent already imported; otherwise,
  or with ``MOTUS_WORKER_START=fresh-zygote``, it is a fresh interpreter that imports the
  agent itself.
- ``multiprocessing``'s forkserver (spawn where there is no forkserver): where there are no
  pidfds, for an agent object defined in the main script (its workers must run that script
  first, as ``multiprocessing`` does), or when ``MOTUS_WORKER_START=multiprocessing``.

The launcher is used by the pool's spawner thread only; ``interrupt`` and ``close`` come
from the thread that shuts the pool down.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from motus.serve import zygote
from motus.serve.agents import agent_module, needs_main
from motus.serve.worker import worker_main

#: ``multiprocessing``: start workers with ``multiprocessing`` even where the zygote runs;
#: ``fresh-zygote``: a zygote that is a fresh interpreter and imports the agent itself (for an
#: agent whose import must not be inherited from the serving process).
START_ENV_VAR = "MOTUS_WORKER_START"

#: Set in ``motus serve start``'s arbiter before gunicorn forks the serving process
#: (``allow_early_zygote``); inherited by that fork.
_early_allowed = False


_HAVE_PROC = os.path.exists("/proc/self/stat")


def wait_stopped(pid: int, timeout: float) -> bool:
    """Whether every thread of process ``pid`` is stopped (by SIGSTOP) within ``timeout``
    seconds, polled from ``/proc``. A signal reaches a thread running on another core a
    moment after ``kill`` returns, and each thread stops on its own (one finishing a write
    to the pipe, say); False if they are not all stopped by then, or the process has ended."""
    if not _HAVE_PROC:  # no /proc to look in (not Linux): a stop is taken to take a moment
        time.sleep(min(timeout, 0.01))
        return True
    deadline = time.monotonic() + timeout
    while True:
        states = _thread_states(pid)
        if states is None or states & {b"Z", b"X"}:
            return False  # ended
        if states <= {b"T", b"t"}:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def _thread_states(pid: int) -> set[bytes] | None:
    """The states (``/proc/PID/task/TID/stat``) of the threads of ``pid``; None if it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    states = set()
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue  # a thread that just ended
        end = stat.rfind(b")")
        states.add(stat[end + 2:end + 3])
    return states if states else None


def allow_early_zygote() -> None:
    """Let the serving process fork its zygote (``fork_zygote_early``). Only for a server
    that holds no secret: a forked zygote and its workers share the serving process's
    memory and its original environment block (``/proc/PID/environ``), where an API key, a
    webhook secret or a database URL could be read by an agent; a fresh interpreter holds
    none of them."""
    global _early_allowed
    _early_allowed = True


def fork_zygote_early() -> None:
    """In the serving process, before it starts a thread: fork the zygote now (see
    ``zygote.fork_early``) if ``allow_early_zygote`` was called and workers are to come from
    a zygote."""
    if _early_allowed and os.environ.get(START_ENV_VAR, "") in ("", "zygote"):
        zygote.fork_early()

WORKER_PROCESS_NAME = "motus-worker"
#: Workers of an agent defined in the main script: they run that script first (see below).
WORKER_WITH_MAIN_NAME = "motus-worker-main"


class WorkerProcess(Protocol):
    pid: int | None

    @property
    def sentinel(self) -> int: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def kill_group(self, only_group: bool = False) -> None: ...

    def close(self) -> None: ...


class Launcher(Protocol):
    name: str

    def start(self) -> tuple[WorkerProcess, Connection]: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


def launcher(agent_path: str | None, agent_blob: bytes | None) -> Launcher:
    """The launcher for this agent on this platform (see the module docstring)."""
    main_script = agent_blob is not None and needs_main(agent_blob)
    if zygote.available() and not main_script and os.environ.get(START_ENV_VAR, "") != "multiprocessing":
        return ZygoteLauncher(agent_path, agent_blob)
    return MultiprocessingLauncher(agent_path, agent_blob, main_script)


class ZygoteLauncher:
    name = "zygote"

    def __init__(self, agent_path: str | None, agent_blob: bytes | None) -> None:
        self._zygote = zygote.Zygote(agent_path, None if agent_path else agent_blob)

    def start(self) -> tuple[WorkerProcess, Connection]:
        return self._zygote.start_child()

    def interrupt(self) -> None:
        self._zygote.interrupt()

    def close(self) -> None:
        self._zygote.close()


class MultiprocessingLauncher:
    name = "multiprocessing"

    def __init__(self, agent_path: str | None, agent_blob: bytes | None, main_script: bool) -> None:
        self._agent_path = agent_path
        self._agent_blob = None if agent_path else agent_blob
        self._process_name = WORKER_WITH_MAIN_NAME if main_script else WORKER_PROCESS_NAME
        self._ctx = _context(agent_module(agent_path) if agent_path else None)
        zygote.discard_early()  # forked in case the zygote would serve: it will not

    def start(self) -> tuple[WorkerProcess, Connection]:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(child, self._agent_path, self._agent_blob), name=self._process_name)
        try:
            process.start()
        except BaseException:
            parent.close()  # a start that keeps failing must not leak a pipe each time
            raise
        finally:
            child.close()
        return MultiprocessingProcess(process), parent

    def interrupt(self) -> None:
        """Nothing to wake: a ``multiprocessing`` start does not wait on us."""

    def close(self) -> None:
        """The forkserver ends by itself when this process exits."""


class MultiprocessingProcess:
    """A ``multiprocessing`` process with the pool's interface. Its forkserver reaps it, so
    after ``close`` (it has been joined) it is never signalled again."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process
        self.pid = process.pid
        self.sentinel = process.sentinel
        self._closed = False

    def is_alive(self) -> bool:
        return not self._closed and self._process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if not self._closed:
            self._process.join(timeout)

    def kill_group(self, only_group: bool = False) -> None:
        """SIGKILL the worker and its process group (it called setpgrp). "Already dead" is fine."""
        if self._closed or self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if not only_group:
                try:
                    self._process.kill()
                except (ProcessLookupError, ValueError):
                    pass  # it is already gone

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._process.close()


def _skip_main_for_workers() -> None:
    """Workers must not re-run the server's ``__main__``.

    ``multiprocessing`` re-imports the parent's main script in every spawned or forkserver
    child (as ``__mp_main__``) unless it is a ``-m pkg.__main__`` module. For a worker that is
    pure cost at best (the ``motus`` console script, gunicorn's script) and a second server
    at worst (a user's ``AgentServer(...).run()`` without a main guard). Workers need nothing
    from ``__main__``: the agent is imported by its module path. So for processes named
    ``WORKER_PROCESS_NAME`` the preparation data leaves the main module out. The wrapper is
    installed once and changes nothing for any other process. The one exception is an agent
    object defined in the main script itself (``AgentServer(agent_fn=my_agent)`` in
    ``myapp.py``): its workers are named ``WORKER_WITH_MAIN_NAME`` and run the script as
    ``__mp_main__``, exactly as ``multiprocessing`` does, so the agent can be unpickled.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_motus_wrapper", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if name == WORKER_PROCESS_NAME:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._motus_wrapper = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def _context(agent_module: str | None) -> multiprocessing.context.BaseContext:
    _skip_main_for_workers()
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["motus.serve.worker"] + ([agent_module] if agent_module else []))
        return ctx
    return multiprocessing.get_context("spawn")
