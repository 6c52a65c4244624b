"""Fixtures for the compatibility tests: a server started the way a reference user starts one.

``python_servers(tmp)`` yields ``start(*command) -> Server``: it runs ``python <command>
--port <free>`` (``-m tests.compat.serve_agent_fn ...``, or a script file) in its own
process group, waits for ``GET /health``, and stops every server it started at the end,
failing the test if a server or anything it started outlives that stop (``Server.stop``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server, free_port, server_env, stop_all, wait_healthy


@contextmanager
def python_servers(tmp_dir: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*command: str) -> Server:
        port = free_port()
        log_path = tmp_dir / f"compat-server-{len(servers)}.log"
        with open(log_path, "w") as log_file:
            process = subprocess.Popen(
                [sys.executable, *command, "--port", str(port)],
                cwd=ROOT,
                env=server_env(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        server = Server(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
        servers.append(server)
        wait_healthy(server.url, process, log_path)
        return server

    try:
        yield start
    finally:
        stop_all(servers)


@pytest.fixture
def start_python_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Factory: ``start_python_server("-m", "tests.compat.serve_agent_fn", "--allow-custom-ids")``."""
    with python_servers(tmp_path) as start:
        yield start
