"""A throwaway PostgreSQL cluster for integration tests.

``Cluster().start()`` runs ``initdb`` into a fresh temporary directory and starts
``postgres`` listening on 127.0.0.1 on a free port (its unix socket in the same directory),
superuser ``postgres``, ``trust`` authentication, ``fsync=off``, ``max_connections=200``.
It returns only once a connection succeeds; if it fails, every process it started is gone
and the directory removed before the error propagates.

The server (the postmaster) is a child of the process that called ``start()``, so that
process reaps it; it gets SIGQUIT (immediate shutdown) if that process dies first
(``setpriv --pdeathsig``, where setpriv exists). initdb and postgres refuse to run as root:
as root, they run as the unprivileged user ``nobody``; otherwise as the current user.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import weakref
from itertools import count
from pathlib import Path

import psutil

from tests.support.processes import alive as _alive

#: Seconds allowed for initdb, for the server to accept a connection, and for it to exit.
INITDB_TIMEOUT = 120
START_TIMEOUT = 60
STOP_TIMEOUT = 30

#: The unprivileged user the cluster runs as when the tests run as root.
ROOT_RUNS_AS = "nobody"

_PORT_TAKEN = re.compile(r"could not bind|Address already in use|could not create any TCP/IP sockets")

_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


def live_clusters() -> list[Cluster]:
    """The clusters of this process that are started and not yet stopped."""
    return list(_live)


def find_pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb``, else the directory
    of ``initdb`` on ``PATH`` (the symlink's target's, if ``postgres`` sits next to it), else None."""

    def version(bin_dir: Path) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in bin_dir.parent.name.split("."))
        except ValueError:
            return (-1,)

    candidates = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if os.access(p, os.X_OK)]
    if candidates:
        return max(candidates, key=version)
    found = shutil.which("initdb")
    if found is None:
        return None
    resolved = Path(found).resolve().parent
    return resolved if (resolved / "postgres").exists() else Path(found).parent


class Cluster:
    """One PostgreSQL server on ``127.0.0.1:port``, its data in a temporary directory.

    ``stop()`` is idempotent and also runs on leaving a ``with`` block. ``kill()`` and
    ``restart()`` keep the data directory and the port, for tests of a database that goes
    away while in use and comes back.
    """

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or find_pg_bin()
        if found is None:
            raise FileNotFoundError("PostgreSQL is not installed: no initdb under /usr/lib/postgresql/*/bin or on PATH")
        self.bin_dir = Path(found)
        self.port: int = 0
        self.tmp_dir: Path | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._as_user, self._owner = _privilege_drop()
        self._names = count(1)
        #: Set for the session's cluster (``pg_cluster``): the leak check leaves it running.
        self.session_scoped = False

    # -- paths and addresses

    @property
    def data_dir(self) -> Path:
        assert self.tmp_dir is not None, "cluster not started"
        return self.tmp_dir / "data"

    @property
    def log_path(self) -> Path:
        assert self.tmp_dir is not None, "cluster not started"
        return self.tmp_dir / "postgres.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs, else None."""
        return self._server.pid if self._server is not None and self._server.poll() is None else None

    def log(self) -> str:
        """The server's log so far ("" before ``start()`` and after ``stop()``)."""
        if self.tmp_dir is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    # -- life cycle

    def start(self) -> Cluster:
        """initdb, then start the server; return once a connection succeeds. No-op if started."""
        if self.tmp_dir is not None:
            return self
        _live.add(self)
        try:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix="motus-pg-", dir=self._base_dir()))
            if self._owner is not None:
                os.chown(self.tmp_dir, *self._owner)
            self._run_tool(
                "initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                "--no-locale", "-E", "UTF8", "--no-sync",
            )  # fmt: skip
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.write(
                    "\n# tests/support/pg.py\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.tmp_dir}'\n"
                    "max_connections = 200\n"
                    "fsync = off\n"
                )
            self._launch(new_port_on_conflict=True)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """Stop the server at once, keeping its data directory: SIGQUIT to the postmaster
        (what ``pg_ctl stop -m immediate`` sends), SIGKILL to it and its children after
        ``STOP_TIMEOUT``. Returns once none of its processes is left. No-op if not running."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        if server.poll() is None:
            server.send_signal(signal.SIGQUIT)
            try:
                server.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        survivors = [p for p in procs if _alive(p)]
        if server.poll() is None or survivors:
            if server.poll() is None:
                server.kill()
            for proc in survivors:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            server.wait(10)
            psutil.wait_procs(survivors, timeout=10)
            if self.tmp_dir is not None:
                (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def restart(self) -> None:
        """``kill()``, then start the server again on the same port and data directory;
        return once a connection succeeds."""
        assert self.tmp_dir is not None, "cluster not started"
        self.kill()
        self._launch(new_port_on_conflict=False)

    def stop(self) -> None:
        """``kill()``, then remove the temporary directory. Idempotent."""
        try:
            self.kill()
        finally:
            if self.tmp_dir is not None:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)
                self.tmp_dir = None
            _live.discard(self)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- databases

    def create_database(self) -> str:
        """Create a new, uniquely named database; return its URL."""
        import psycopg
        from psycopg import sql

        name = f"motus_test_{next(self._names)}_{secrets.token_hex(4)}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    # -- internals

    def _launch(self, new_port_on_conflict: bool) -> None:
        """Start the postmaster and wait until it accepts a connection. On failure, kill it
        and raise; with ``new_port_on_conflict``, retry on another port if the port was taken."""
        for attempt in range(5):
            if not self.port or (new_port_on_conflict and attempt):
                self.port = _free_port()
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                with open(self.log_path, "ab") as log:
                    self._server = subprocess.Popen(
                        [*self._as_user, *_pdeathsig(), str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)],
                        cwd=self.tmp_dir,
                        env=self._env(),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                if self._wait_connectable():
                    return
            except BaseException:
                self.kill()
                raise
            self.kill()
            new_log = self.log()[log_start:]
            if not (new_port_on_conflict and _PORT_TAKEN.search(new_log)):
                raise RuntimeError(f"PostgreSQL did not start on port {self.port}:\n{new_log}")
        raise RuntimeError(f"PostgreSQL found no free port:\n{self.log()}")

    def _wait_connectable(self) -> bool:
        """True once a connection succeeds; False if the server exited first. Raises
        TimeoutError after ``START_TIMEOUT``."""
        import psycopg  # here, not at the top: conftest imports this module, psycopg or not

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self._server is not None
            if self._server.poll() is not None:
                return False
            try:
                with psycopg.connect(self.url(), connect_timeout=5):
                    return True
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL did not accept a connection on port {self.port} within {START_TIMEOUT}s:\n{self.log()}")
            time.sleep(0.02)

    def _run_tool(self, program: str, *args: str) -> None:
        """Run a PostgreSQL program to completion; on timeout, kill its process group."""
        proc = subprocess.Popen(
            [*self._as_user, str(self.bin_dir / program), *args],
            cwd=self.tmp_dir,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=INITDB_TIMEOUT)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{program} exited with {proc.returncode}:\n{output.decode(errors='replace')}")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.tmp_dir))
        return env

    def _base_dir(self) -> str:
        """The system temp directory, or /tmp if the cluster's user could not enter it or the
        socket path would be too long (unix socket paths are limited to 107 bytes)."""
        base = tempfile.gettempdir()
        if len(base) > 60 or (self._owner is not None and not _world_searchable(Path(base))):
            return "/tmp"
        return base


def _privilege_drop() -> tuple[list[str], tuple[int, int] | None]:
    """The command prefix that runs a program as the cluster's user, and that user's
    (uid, gid) when it is not us."""
    if os.geteuid() != 0:
        return [], None
    user = pwd.getpwnam(ROOT_RUNS_AS)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise FileNotFoundError("as root, starting PostgreSQL as nobody needs setpriv (util-linux)")
    return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"], (user.pw_uid, user.pw_gid)


def _pdeathsig() -> list[str]:
    """A prefix that gives the server SIGQUIT if its parent dies ([] without setpriv)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "QUIT", "--"] if setpriv else []




def _world_searchable(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
