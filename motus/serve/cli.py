"""``motus serve ...``: ``start`` runs a server; the client commands are added by
``motus.client.commands``. The same server options serve ``flask motus serve``.

``start`` checks the agent import path before anything listens (a clear message and exit
code 2 on a bad path) and checks that the port is free, then runs gunicorn with one worker
process and ``--threads`` request threads; the agent server is built inside that worker.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from motus.serve import config
from motus.serve.agents import AgentLoadError, AgentNotSendable, load_agent
from motus.serve.auth import ENV_VAR as ENV_VAR_API_KEY
from motus.serve.auth import split_keys
from motus.serve.config import LOG_LEVELS as LOG_LEVELS  # re-exported: their old home
from motus.serve.config import RESERVED_THREADS as RESERVED_THREADS
from motus.serve.config import web_chat_address as web_chat_address
from motus.serve.zygote_process import flush_stdio


def resolve_store(opts: dict[str, Any]) -> str:
    """The store URL to serve from, checked now: a store that cannot be opened (malformed
    URL, unwritable path, in use by another server, newer schema) stops the start with one
    line and exit code 2, before anything listens."""
    from motus.serve.store import StoreError, default_store_url, store_from_url

    url = opts["store"] or default_store_url(opts["agent"])
    try:
        store_from_url(url).check()
    except StoreError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    return url


def read_key_file(path: str | None) -> list[str]:
    """API keys from a file, one per line (blank lines and ``#`` comments ignored); an
    unreadable or empty file is a usage error."""
    try:
        return config.read_key_file(path)
    except config.ConfigError as exc:
        raise click.UsageError(str(exc)) from None


#: Set in a re-executed ``motus serve start``: the descriptor its API keys arrive on.
KEYS_FD_VAR = "MOTUS_API_KEY_FD"


def hide_keys_by_reexec(keys: list[str]) -> None:
    """Start ``motus serve start`` again with the API keys in neither its environment nor its
    command line: they travel through an inherited pipe instead.

    A process' ``/proc/PID/environ`` keeps the block it was started with whatever
    ``os.environ`` does later, and ``/proc/PID/cmdline`` is readable by every local user; an
    agent could read the key that approves its own tool calls in its parents' entries.
    ``execve`` replaces both (same pid, so a supervisor sees nothing change)."""
    if not keys or os.environ.get(KEYS_FD_VAR):
        return
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--api-key":
            skip = True
        elif not arg.startswith("--api-key="):
            argv.append(arg)
    read_end, write_end = os.pipe()
    os.write(write_end, "\n".join(keys).encode())  # far below a pipe's buffer
    os.close(write_end)
    os.set_inheritable(read_end, True)
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR_API_KEY}
    env[KEYS_FD_VAR] = str(read_end)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "motus", *argv], env)


def keys_from_reexec() -> list[str]:
    """The keys a re-executed ``motus serve start`` was handed (see ``hide_keys_by_reexec``)."""
    fd = os.environ.pop(KEYS_FD_VAR, None)
    if not fd:
        return []
    with os.fdopen(int(fd), "rb") as pipe:
        return [key for key in pipe.read().decode().split("\n") if key]


def server_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every way of starting a server shares: the settings table's
    (``config.SETTINGS``)."""
    return config.click_options(func)


def configure_logging(level: str, log_format: str = "text") -> None:
    from motus.serve.logs import configure_logging as configure

    configure(level, log_format)


def check_agent_path(agent: str) -> None:
    """Import the agent now, from the current folder too (as ``python -m`` would). An agent
    no worker may load (a lambda, a nested function) stops the start with one line, exit 2."""
    from motus.serve.zygote import agent_import

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with agent_import():  # what the import opens is the agent's: a forked zygote keeps it
            load_agent(agent)
    except AgentNotSendable as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    except AgentLoadError as exc:
        raise click.UsageError(str(exc)) from None


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise click.ClickException(f"Port {port} on {host} is already in use; choose another with --port") from None
            raise click.ClickException(f"Cannot listen on {host}:{port}: {exc.strerror}") from None


def check_metrics_port(opts: dict[str, Any]) -> None:
    """``--metrics-port``: another port than ``--port``, and free."""
    port = opts.get("metrics_port")
    if port is None:
        return
    if port == opts["port"]:
        raise click.UsageError("--metrics-port must differ from --port")
    try:
        check_port_free(opts["host"], port)
    except click.ClickException as exc:
        raise click.ClickException(exc.message.replace("--port", "--metrics-port")) from None


def warn_if_exposed(host: str, api_keys: tuple[str, ...]) -> None:
    """Binding beyond loopback with no key lets anyone approve tool calls: say so."""
    from motus.serve.auth import ApiKeys, exposure_warning

    try:
        keys = ApiKeys.from_sources(api_keys)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    warning = exposure_warning(host, keys)
    if warning:
        click.secho(warning, fg="yellow", err=True)


def check_approval_policy(path: str | None, api_keys: tuple[str, ...]) -> Any:
    """The policy file, read and checked (None without one). One nobody could satisfy
    (unreadable, misshapen, a role no key has, no keys) stops the start with one line
    and exit code 2, before gunicorn starts."""
    if not path:
        return None
    from motus.serve.auth import ApiKeys
    from motus.serve.policy import PolicyError, load_policy

    keys = ApiKeys.from_sources(api_keys)
    try:
        return load_policy(path, keys.writers if keys else None)
    except PolicyError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)


def server_factory(opts: dict[str, Any]) -> Callable[[], Any]:
    """Builds the server the options describe, where it will serve (in gunicorn's worker)."""

    def build() -> Any:
        try:
            return config.build_server(opts["agent"], opts)
        except config.ConfigError as exc:
            raise click.UsageError(str(exc)) from None

    return build


class _ServeGroup(click.Group):
    """``motus serve``: ``start`` and ``openapi`` are here; the client commands (``chat``,
    ``send``, ...) are added from ``motus.client.commands`` the first time one is asked for or
    the list is shown. A server's start never needs them, and importing them (requests, the
    terminal chat) cost each start ~0.1 s of CPU in the process gunicorn forks its worker from."""

    _client_loaded = False

    def _load_client(self) -> None:
        if not self._client_loaded:
            from motus.client import commands as client_commands

            client_commands.register(self)
            self._client_loaded = True

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_client()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and not self._client_loaded:
            self._load_client()
            command = super().get_command(ctx, cmd_name)
        return command


@click.group("serve", cls=_ServeGroup)
def serve() -> None:
    """Serve an agent over HTTP, or talk to a served one."""


@serve.command("start")
@server_options
def start(**opts: Any) -> None:
    """Serve AGENT (module.path:attribute) with gunicorn: one process, many threads."""
    from motus.serve.gunicorn import run_gunicorn

    configure_logging(opts["log_level"], opts["log_format"])
    given = list(opts["api_keys"]) or split_keys(os.environ.get(ENV_VAR_API_KEY, ""))
    hide_keys_by_reexec(given)  # returns only once the keys are out of environ and argv
    handed = keys_from_reexec()
    if handed:
        opts["api_keys"] = tuple(handed)
    check_agent_path(opts["agent"])
    check_port_free(opts["host"], opts["port"])
    check_metrics_port(opts)
    opts["store"] = resolve_store(opts)
    keys = tuple(opts["api_keys"]) + tuple(read_key_file(opts.get("api_key_file")))
    warn_if_exposed(opts["host"], keys)
    # Read once, here: gunicorn's worker (and any it starts again) inherits the policy, so
    # a file edited or broken later changes nothing until the server is started again.
    opts["approval_policy"] = check_approval_policy(opts.get("approval_policy"), keys)
    if not config.holds_secrets(opts):
        from motus.serve.processes import allow_early_zygote

        allow_early_zygote()  # the zygote forks from the serving process: nothing to keep from it
    sys.argv = sys.argv[:1]  # gunicorn must not parse our options as its own
    # What the agent's import printed and Python still buffers: written now, once, or every
    # process forked from this one (the gunicorn worker, the zygote, each turn's worker)
    # would write its copy again when it ends.
    flush_stdio()
    run_gunicorn(
        server_factory(opts),
        host=opts["host"],
        port=opts["port"],
        threads=opts["threads"],
        shutdown_timeout=opts["shutdown_timeout"],
        max_waiting=opts["max_waiting"],
        log_level=opts["log_level"],
        read_timeout=opts["read_timeout"],
        log_format=opts["log_format"],
    )


@serve.command("openapi")
@click.option("--auth", is_flag=True, help="Include the bearer security scheme (as a keyed server serves it).")
def openapi(auth: bool) -> None:
    """Print the OpenAPI document of the REST API."""
    import json

    from motus.serve.openapi import openapi_document

    click.echo(json.dumps(openapi_document(auth=auth), indent=2))

