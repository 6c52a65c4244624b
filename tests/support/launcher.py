"""Start ``motus serve start`` servers for the tests without paying for an interpreter each time.

The suite starts about 430 servers. Each start used to be a fresh ``python -m motus serve
start``: an interpreter, then click, gunicorn, pydantic, Flask, prometheus_client and motus
imported in the arbiter and its worker, about 0.4 s of CPU before the server did anything of
its own, and the suite on this 2-core machine is bound by CPU. Here a *template* process
imports those modules once (one per test process and set of third-party modules its agents
import: the framework SDKs, see ``agent_imports``); each start forks one, and the child becomes
exactly what ``python -m motus serve start ARGS`` would be from there on: its own session,
standard output and error to the server's log, standard input from ``/dev/null``, the
server's environment and working directory, ``sys.argv`` as ``python -m`` sets it, and
``motus``'s own ``__main__`` run by ``runpy``. Everything the tests look at (the arbiter,
its gunicorn worker, the zygote and the workers, the HTTP API) is the product's code
running as it does in production; what differs is only what happened before ``main()``.

What stays a real ``python -m motus`` process: a start whose environment sets a ``PYTHON*``
variable (the interpreter reads those when it starts), every ``launch`` outside
``Starter``, and a server given API keys, which re-executes itself to hide them.

The child is the template's, not the test process's: ``TemplateProcess`` gives the tests the
part of ``subprocess.Popen`` they use (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
``returncode``) through a pidfd the template hands over and an exit status it reads for us.
The template never reaps a child before we ask for its status, so the pid stays that
child's (a zombie) until then and a signal can never reach another process.

Thread safety: one lock serialises every exchange with the template.
"""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil

#: Modules a server imports before it serves: imported once, in the template. Not the agent
#: (tests' agents act at import) and nothing a server would not import itself.
PRELOAD = (
    "motus.cli",
    "motus.serve.cli",
    "motus.serve.server",
    "motus.serve.app",
    "motus.serve.gunicorn",
    "motus.serve.gunicorn.worker",
    "motus.serve.gunicorn.arbiter",
    "motus.serve.processes",
    "motus.serve.worker",
    "motus.serve.store.memory",
    "motus.serve.store.sqlite",
    "motus.serve.metrics",
    "gunicorn.arbiter",
    "flask",
)

#: Imported too where installed (extras): what a server on a PostgreSQL store loads.
PRELOAD_IF_INSTALLED = ("motus.serve.store.postgres", "psycopg", "psycopg_pool")

#: Top-level packages never preloaded for an agent: those whose modules act at import (test
#: agents record pids, examples read their environment), and motus itself (``PRELOAD`` has
#: what every server imports; the rest comes from the bytecode cache in milliseconds), so
#: agents that import only motus share one template.
NOT_PRELOADED = frozenset({"tests", "examples", "bench", "motus"})

_TEMPLATE = r"""
import importlib, importlib.util, json, os, runpy, socket, sys

import gc

ctl = socket.socket(fileno=int(sys.argv[1]))
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
optional = json.loads(sys.argv[3])
tried = set()


# Import what a server is about to import (once per template: later servers inherit it),
# then move every object out of the collector's reach, so a server's collections never
# write to (and copy) the pages it shares with the template. A module that fails to import
# here is left to the server, which imports it again and reports the failure itself.
def preload(names):
    for name in names:
        if name in tried or name in sys.modules:
            continue
        tried.add(name)
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # not installed here: the server's own import says so, if it needs it
        except Exception as exc:
            print(f"template: not preloaded: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    gc.freeze()


preload(optional)
preload(json.loads(sys.argv[4]))
main_path = importlib.util.find_spec("motus.__main__").origin
ctl.sendall(b"ready")


def become_server(request, log_fd):
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [main_path, *request["args"]]
    code = 1
    try:
        runpy.run_module("motus", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            import atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


while True:
    message, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 20, 1)
    if not message:
        break
    request = json.loads(message)
    if request["op"] == "start":
        [log_fd] = fds
        pid = os.fork()
        if pid == 0:
            ctl.close()
            become_server(request, log_fd)
        os.close(log_fd)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(ctl, [str(pid).encode()], [pidfd])
        os.close(pidfd)
    elif request["op"] == "status":
        _, status = os.waitpid(request["pid"], 0)
        ctl.sendall(str(os.waitstatus_to_exitcode(status)).encode())
"""

_lock = threading.Lock()
#: A template per set of agent imports (``agent_imports``): a server starts from the one that
#: imported what its agent imports, and holds nothing another agent's SDK left behind (the
#: memory tests measure a server's heap).
_templates: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], socket.socket]] = {}
#: Which template started each server (its status is that template's to read).
_started_by: dict[int, socket.socket] = {}


def usable(env: dict[str, str] | None) -> bool:
    """Whether a start with this extra environment may come from the template."""
    return hasattr(os, "pidfd_open") and not any(name.startswith("PYTHON") for name in env or {})


def template_pids() -> set[int]:
    """The templates' pids (children of this process that are no test's leak)."""
    with _lock:
        return {proc.pid for proc, _ctl in _templates.values()}


def server_roots() -> list[psutil.Process]:
    """The processes servers run as at their top: this process's children and the template's
    (a server forked by the template is the template's child, not ours)."""
    roots = psutil.Process().children()
    for pid in template_pids():
        try:
            roots += psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            pass  # it is gone: its servers with it
    return roots


def agent_imports(agent: str, root: Path) -> list[str]:
    """The third-party modules the agent's module imports at its top level (read from its
    source, never run; not the standard library's, nor ``NOT_PRELOADED``'s): a framework
    agent's SDK (1-3 s of CPU to import) is then imported once, by the template of that set
    of imports, instead of once per server."""
    module = agent.partition(":")[0]
    base = root.joinpath(*module.split("."))
    source = next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)
    if source is None:
        return []
    try:
        tree = ast.parse(source.read_text())
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []  # the server reports it
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [name for name in names if (top := name.partition(".")[0]) not in NOT_PRELOADED and top not in sys.stdlib_module_names]


def start(args: list[str], log_path: Path, env: dict[str, str], cwd: Path, base_env: dict[str, str]) -> TemplateProcess:
    """Fork ``python -m motus *args`` with environment ``env`` from the template, which is
    started on first use with ``base_env`` (what every server's environment has in common).
    ``args[2]`` is the agent (``serve start AGENT ...``): its module's imports are preloaded."""
    preload = tuple(sorted(set(agent_imports(args[2], cwd)))) if args[:2] == ["serve", "start"] and len(args) > 2 else ()
    with _lock:
        proc, ctl = _running(base_env, preload)
        with open(log_path, "w") as log_file:
            request = {"op": "start", "args": args, "env": env, "cwd": str(cwd)}
            socket.send_fds(ctl, [json.dumps(request).encode()], [log_file.fileno()])
        message, fds, _flags, _addr = socket.recv_fds(ctl, 64, 1)
        if not message or len(fds) != 1:
            raise RuntimeError(f"the server template did not start a server (it exited with {proc.poll()})")
        _started_by[int(message)] = ctl
        return TemplateProcess(int(message), fds[0], args)


def stop() -> None:
    """End the templates (their servers must have been stopped)."""
    with _lock:
        templates = list(_templates.values())
        _templates.clear()
        _started_by.clear()
    for proc, ctl in templates:
        ctl.close()
        proc.wait(10)


def _running(env: dict[str, str], preload: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], socket.socket]:
    running = _templates.get(preload)
    if running is not None and running[0].poll() is None:
        return running
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # "motus serve start" at the end: the tests find a server's processes by that command line.
    proc = subprocess.Popen(
        [sys.executable, "-c", _TEMPLATE, str(theirs.fileno()), json.dumps(PRELOAD), json.dumps(PRELOAD_IF_INSTALLED),
         json.dumps(list(preload)), "motus", "serve", "start"],
        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    theirs.close()
    ours.settimeout(60)
    if ours.recv(16) != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError("the server template did not start")
    ours.settimeout(None)
    _templates[preload] = (proc, ours)
    return _templates[preload]


def _status(pid: int) -> int:
    with _lock:
        ctl = _started_by.pop(pid, None)
        assert ctl is not None, "the template that started the server is gone"
        ctl.sendall(json.dumps({"op": "status", "pid": pid}).encode())
        return int(ctl.recv(64))


class TemplateProcess:
    """A server forked by the template: the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, pid: int, pidfd: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._pidfd = pidfd

    def poll(self) -> int | None:
        if self.returncode is None and _exited(self._pidfd, 0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not _exited(self._pidfd, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped: the pid is still this server's
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                return  # it has exited (a zombie until we collect it), as Popen's would be

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self) -> None:
        self.returncode = _status(self.pid)
        os.close(self._pidfd)


def _exited(pidfd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
