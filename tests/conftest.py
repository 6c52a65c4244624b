"""Shared fixtures: a real ``motus serve`` process per test, and a leak check.

``start_server(agent, *args)`` runs ``python -m motus serve start <agent> --port <free>``
(gunicorn, as a user runs it) in a subprocess, waits until ``GET /health`` answers, and
stops it at the end of the test, failing the test if the server or anything it started
outlives that stop. ``shared_server(agent, *args)`` is the same for a whole module: tests that
do not depend on each other share one server (a start costs ~0.85 s of CPU; the suite's
time is mostly server starts). Test agents live in importable modules under ``tests/`` (for example
``tests.agents:echo``).

The autouse ``no_leaks`` fixture fails any test that leaves a child process or a thread
behind.

``pg_cluster`` (session scope, one per xdist worker) is a throwaway PostgreSQL server
(``tests/support/pg.py``); ``pg_url`` is the URL of a fresh, empty database on it. Where PostgreSQL
is not installed they skip, except in CI (``CI`` or ``MOTUS_REQUIRE_POSTGRES`` set to a true
value), where that is a failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.support import http, launcher, pg, processes
from tests.support.processes import alive as _alive

ROOT = Path(__file__).resolve().parent.parent

# Tests press Ctrl-C in the processes they start (the terminal chat, `flask motus serve`). A
# suite started in the background by a shell without job control inherits SIGINT ignored, and
# so would every process it starts: Python then never raises KeyboardInterrupt. Restore it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: The modules that take longest from start to end (measured: they wait on timers, several
#: instances or many turns), started first so that none of them starts last and keeps the
#: run going after the other test processes are done. xdist hands out whole modules in
#: collection order (``--no-loadscope-reorder`` in pyproject.toml; its default order, by
#: number of tests, put the long modules with few tests last). A module missing here only
#: runs in the usual order; the list needs to be roughly right, not complete.
LONGEST_FIRST = (
    "tests/integration/serve/approvals/test_workflow.py",
    "tests/integration/serve/instances/test_instances_attacks.py",
    "tests/integration/serve/workers/test_zygote.py",
    "tests/integration/serve/instances/test_postgres_history_attacks.py",
    "tests/integration/serve/hardening/test_fuzz.py",
    "tests/integration/frameworks/test_openai_agents.py",
    "tests/integration/serve/history/test_history_attacks.py",
    "tests/integration/serve/durability/test_durability.py",
    "tests/integration/frameworks/test_anthropic.py",
    "tests/integration/serve/instances/test_several_instances.py",
    "tests/integration/serve/workers/test_rehearsal_attacks.py",
    "tests/integration/serve/durability/test_durability_attacks.py",
    "tests/integration/serve/approvals/test_workflow_attacks.py",
    "tests/integration/serve/hardening/test_hardening_attacks.py",
    "tests/integration/serve/approvals/test_hitl.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules of ``LONGEST_FIRST`` first, in its order; the rest keep theirs."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End this test process's server template (``tests/support/launcher.py``)."""
    launcher.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Compile motus, the examples and the test agents to bytecode once, before any server
    starts. The suite starts ~430 servers, each of three processes importing motus; with
    ``PYTHONDONTWRITEBYTECODE`` set (as on some machines) or an editable install nobody has
    imported yet, each would compile the same sources again (~0.15 s of CPU a start).
    Only the controlling process does it (xdist's workers carry ``workerinput``)."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    for folder in ("motus", "examples", "tests"):
        compileall.compile_dir(ROOT / folder, quiet=1)


#: ``wait_until``'s polling when no ``interval`` is given: the first pauses are short (most
#: conditions hold within milliseconds), then they double up to the cap, so a wait of
#: seconds costs a few dozen polls (each an HTTP request or a process scan, CPU in the test
#: and the server alike) instead of hundreds.
FIRST_POLL_INTERVAL = 0.005
MAX_POLL_INTERVAL = 0.05


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float | None = None, what: str = "condition") -> object:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes (then fail).
    ``interval``: a fixed pause between polls; by default they back off (see above)."""
    deadline = time.monotonic() + timeout
    pause = FIRST_POLL_INTERVAL if interval is None else interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        if interval is None:
            pause = min(MAX_POLL_INTERVAL, pause * 2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def refused_url() -> Iterator[str]:
    """A loopback URL where every connection is refused while the block runs: its port is
    bound and never listened on, so no other test's server can take it meanwhile (a port
    ``free_port`` found free can be, with the suite's processes starting servers in parallel)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Server:
    """A running ``motus serve`` subprocess."""

    url: str
    process: subprocess.Popen[str]
    log_path: Path
    extra: dict[str, object] = field(default_factory=dict)  # whatever a test wants to keep with it
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request

    def with_headers(self, headers: dict[str, str]) -> Server:
        """The same server, spoken to with ``headers`` (an API key, say)."""
        return Server(url=self.url, process=self.process, log_path=self.log_path, extra=self.extra, headers=headers)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def base_url(self) -> str:
        """Where the next request goes (``Instances`` takes its instances in turn)."""
        return self.url

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One request to ``path``, with this server's headers and a 30 s timeout unless given."""
        kwargs.setdefault("timeout", 30)
        return http.request(method, self.base_url() + path, headers=self.headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("PATCH", path, **kwargs)

    def create_session(self) -> str:
        response = self.post("/sessions", json={})
        assert response.status_code == 201, response.text
        return response.json()["session_id"]

    def send(self, session_id: str, content: str, **fields: object) -> requests.Response:
        response = self.post(f"/sessions/{session_id}/messages", json={"content": content, **fields})
        assert response.status_code == 202, response.text
        return response

    def wait(self, session_id: str, timeout: float = 10.0) -> dict:
        response = self.get(f"/sessions/{session_id}", params={"wait": "true", "timeout": timeout}, timeout=timeout + 10)
        assert response.status_code == 200, response.text
        return response.json()

    def wait_for_status(self, session_id: str, status: str, timeout: float = 20.0) -> dict:
        """Long-poll until the session is in ``status`` (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.wait(session_id, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            if body["status"] == status:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"session {session_id} stayed {body['status']!r}, wanted {status!r}: {body}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; fail if the server or any process it started survives.

        Descendants are recorded before the signal because an orphan is re-parented away
        from us and would otherwise escape the leak check.
        """
        descendants = self.descendants()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
                raise AssertionError(f"server did not stop within {timeout}s of SIGTERM:\n{self.log()}")
        try:
            wait_until(lambda: not [p for p in descendants if _alive(p)], timeout=10, what="server's children to exit")
        except AssertionError:
            survivors = [p.pid for p in descendants if _alive(p)]
            for proc in descendants:
                if _alive(proc):
                    proc.kill()
            raise AssertionError(f"processes {survivors} outlived the server:\n{self.log()}") from None
        return self.process.returncode


@dataclass
class Instances(Server):
    """Several servers on one store, spoken to as one: each request goes to the next
    instance in turn (no sticky routing), so a suite written for one server checks that any
    instance answers any request as that one server would. ``url`` is the first one's."""

    others: list[Server] = field(default_factory=list)
    _turn: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def of(cls, first: Server, *others: Server) -> Instances:
        return cls(url=first.url, process=first.process, log_path=first.log_path, others=list(others))

    def with_headers(self, headers: dict[str, str]) -> Server:
        return Instances(url=self.url, process=self.process, log_path=self.log_path, extra=self.extra, headers=headers,
                         others=self.others, _turn=self._turn)

    def base_url(self) -> str:
        urls = [self.url, *(other.url for other in self.others)]
        self._turn[0] += 1
        return urls[self._turn[0] % len(urls)]

    def log(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in (self.log_path, *(o.log_path for o in self.others)))


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("MOTUS_API_KEY", None)
    # Servers keep sessions in memory unless a test asks for a store: the default SQLite file
    # lives in the working directory, which every test server shares.
    env["MOTUS_STORE"] = "memory"
    env.pop("MOTUS_PARK_AFTER", None)
    if extra:
        env.update(extra)
    return env


def launch(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m motus ...`` in its own process group, output to ``log_path``."""
    log_file = open(log_path, "w")  # noqa: SIM115 - the child owns the descriptor's lifetime
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "motus", *args],
            cwd=ROOT,
            env=server_env(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    finally:
        log_file.close()


def wait_healthy(url: str, process: subprocess.Popen[str], log_path: Path, timeout: float = 30.0) -> None:
    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            return http.request("GET", url + "/health", timeout=5).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    wait_until(healthy, timeout=timeout, interval=0.02, what=f"{url}/health")


#: Process ids of servers that outlive a test by design (started by a ``shared`` factory,
#: such as ``shared_server``'s): ``no_leaks`` does not count them.
_SHARED_SERVERS: set[int] = set()


def keys_to_file(args: tuple[str, ...], folder: Path, name: str) -> tuple[str, ...]:
    """``args`` with their ``--api-key KEY`` options moved into an ``--api-key-file`` written
    in ``folder``. The server accepts the same keys either way; what differs is only the
    start: keys on the command line make ``motus serve start`` execute itself again to take
    them out of its process listing (a fresh interpreter, ~0.9 s of CPU), which
    ``tests/integration/serve/hardening/test_hardening.py`` tests once, not in every keyed
    test. Arguments that already name a key file are left as they are."""
    if "--api-key-file" in args or not any(arg == "--api-key" or arg.startswith("--api-key=") for arg in args):
        return args
    kept: list[str] = []
    keys: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--api-key":
            keys.append(next(rest))
        elif arg.startswith("--api-key="):
            keys.append(arg.split("=", 1)[1])
        else:
            kept.append(arg)
    path = folder / name
    path.write_text("".join(f"{key}\n" for key in keys))
    return (*kept, "--api-key-file", str(path))


class Starter:
    """``start(agent, *args, env=None, health_timeout=30, keys_on_command_line=False) ->
    Server``: launch ``motus serve start`` and wait (up to ``health_timeout`` seconds) until
    it is healthy. ``--api-key`` options reach the server in a key file (``keys_to_file``)
    unless ``keys_on_command_line``, which also starts a real ``python -m motus`` (a server
    forked from the launcher's template lists the template's command line, not its own). Inside ``with start.together():`` a start only
    launches; the block's end waits for all of them, so several instances boot at once
    instead of one after another (their servers must not be used inside the block)."""

    def __init__(self, tmp_dir: Path, shared: bool = False) -> None:
        self._tmp_dir = tmp_dir
        self._shared = shared  # its servers outlive the tests that use them: not leaks
        self.servers: list[Server] = []
        self._pending: list[Server] | None = None  # launched inside ``together``, not yet waited for

    def __call__(self, agent: str, *args: str, env: dict[str, str] | None = None, health_timeout: float = 30.0,
                 keys_on_command_line: bool = False) -> Server:
        port = free_port()
        log_path = self._tmp_dir / f"server-{len(self.servers)}.log"
        if not keys_on_command_line:
            args = keys_to_file(args, self._tmp_dir, f"server-{len(self.servers)}.keys")
        command = ["serve", "start", agent, "--port", str(port), *args]
        if launcher.usable(env) and not keys_on_command_line:
            process = launcher.start(command, log_path, server_env(env), ROOT, base_env=server_env())
        else:
            process = launch(command, log_path, env)
        server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
        self.servers.append(server)
        if self._shared:
            _SHARED_SERVERS.add(process.pid)
        if self._pending is None:
            wait_healthy(server.url, process, log_path, health_timeout)
        else:
            self._pending.append(server)
        return server

    @contextmanager
    def together(self) -> Iterator[None]:
        """Launch the servers started in the block at once; wait for all of them at its end."""
        if self._pending is not None:
            raise RuntimeError("start.together() does not nest")
        self._pending = pending = []
        try:
            yield
        finally:
            self._pending = None
        for server in pending:
            wait_healthy(server.url, server.process, server.log_path)


@contextmanager
def server_factory(tmp_dir: Path, shared: bool = False) -> Iterator[Starter]:
    """Yield a :class:`Starter`; stop every server it started on exit. ``shared``: for a
    module-scoped fixture, whose servers outlive the tests and are no leak of theirs."""
    start = Starter(tmp_dir, shared)
    try:
        yield start
    finally:
        _SHARED_SERVERS.difference_update(server.process.pid for server in start.servers)
        stop_all(start.servers)


def stop_all(servers: list[Server]) -> None:
    """Stop every server; fail (after trying them all) if any would not stop or left a process."""
    problems = []
    for server in servers:
        try:
            server.stop()
        except AssertionError as exc:
            problems.append(str(exc))
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """An empty folder for what a test's agents write (files they touch, pids they record)."""
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Starter]:
    """Factory: ``start_server("tests.agents:echo", "--workers", "2", env={...})``; several
    instances boot at once inside ``with start_server.together():``."""
    with server_factory(tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Factory like ``start_server``, but one server per (agent, arguments, environment) for the
    whole module: the first test that asks starts it, the others reuse it, and it is stopped
    (with the same check that nothing it started survives) when the module's tests are done.

    For tests that do not depend on each other: each works on sessions of its own and asserts
    nothing about the server as a whole that another test changes (its session count or
    list, metrics totals, its log as a whole, its worker processes, a kill or a stop). A test
    that needs any of that starts its own server with ``start_server``.
    """
    servers: dict[tuple[object, ...], Server] = {}
    with server_factory(tmp_path_factory.mktemp("shared"), shared=True) as start:

        def get(agent: str, *args: str, env: dict[str, str] | None = None) -> Server:
            key = (agent, args, tuple(sorted((env or {}).items())))
            server = servers.get(key)
            if server is None:
                server = servers[key] = start(agent, *args, env=env)
            elif server.process.poll() is not None:
                raise AssertionError(f"a shared server exited with {server.process.returncode}:\n{server.log()}")
            return server

        yield get


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves child processes or threads running after it ends. A child
    counts when the test started it (its start time, ``processes.started_since``); the
    verdict "none left" is always psutil's full scan."""
    threads_before = set(threading.enumerate())
    started = processes.now_ticks()
    # A PostgreSQL cluster that outlives the test (``pg_cluster``) is our child, and a new
    # one after a test's ``restart()``: its server is the cluster's to stop, not a leak.
    clusters_before = pg.live_clusters()
    yield

    def new_children(exact: bool = False) -> set[int]:
        # The session's cluster may first be asked for inside a test (getfixturevalue): it
        # outlives the test by design.
        kept = {c.pid for c in [*clusters_before, *pg.live_clusters()] if c.pid is not None and (c in clusters_before or c.session_scoped)}
        kept |= launcher.template_pids()  # the servers' templates live for the session
        return processes.started_since(started, exact=exact) - kept - _SHARED_SERVERS

    def clean(exact: bool) -> bool:
        return not new_children(exact) and not (set(threading.enumerate()) - threads_before)

    deadline = time.monotonic() + 10
    try:
        wait_until(lambda: clean(exact=False), timeout=10, interval=0.05, what="the test's processes and threads to end")
        wait_until(lambda: clean(exact=True), timeout=max(0.1, deadline - time.monotonic()), interval=0.05,
                   what="the test's processes and threads to end")
    except AssertionError:
        leftovers = new_children(exact=True)
        leftover_children = [psutil.Process(pid).cmdline() for pid in leftovers if psutil.pid_exists(pid)]
        leftover_threads = [t.name for t in set(threading.enumerate()) - threads_before]
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"test leaked processes {leftover_children} or threads {leftover_threads}")


def _true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pg.Cluster]:
    """A started PostgreSQL cluster for this test process, stopped (and its files removed)
    at the end of the session. Skips where PostgreSQL is missing; fails instead under
    ``CI`` or ``MOTUS_REQUIRE_POSTGRES`` (set by ``.ci/run``)."""
    bin_dir = pg.find_pg_bin()
    if bin_dir is None:
        message = "PostgreSQL is not installed (apt-get install postgresql): no initdb under /usr/lib/postgresql/*/bin or on PATH"
        if _true("CI") or _true("MOTUS_REQUIRE_POSTGRES"):  # in CI a missing PostgreSQL is a failure
            pytest.fail(message)
        pytest.skip(message)
    with pg.Cluster(bin_dir) as cluster:
        cluster.session_scoped = True
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: pg.Cluster) -> str:
    """``postgresql://postgres@127.0.0.1:PORT/NAME`` of a new, empty database on ``pg_cluster``."""
    return pg_cluster.create_database()
