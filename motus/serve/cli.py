"""``motus serve ...``: ``start`` runs a server; the client commands are added by
``motus.client.commands``. The same server options serve ``flask motus serve``.

``start`` checks the agent import path before anything listens (a clear message and exit
code 2 on a bad path) and checks that the port is free, then runs gunicorn with one worker
process and ``--threads`` request threads; the agent server is built inside that worker.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from motus.serve.agents import AgentLoadError, AgentNotSendable, load_agent
from motus.serve.auth import ENV_VAR as ENV_VAR_API_KEY
from motus.serve.webhooks import SECRET_ENV_VAR as WEBHOOK_SECRET_ENV_VAR

log = logging.getLogger(__name__)

#: Request threads long polls may never take, so resumes and health checks always get one.
RESERVED_THREADS = 8

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def _parse_park_after(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None | str:
    if value is None:
        return "default"
    if value.strip().lower() == "never":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise click.BadParameter(f"expected a number of seconds or 'never', got {value!r}") from None
    if not seconds >= 0:
        raise click.BadParameter(f"expected seconds >= 0 or 'never', got {value!r}")
    return seconds


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
    """API keys from a file, one per line (blank lines and ``#`` comments ignored)."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise click.UsageError(f"Cannot read --api-key-file {path}: {exc.strerror}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise click.UsageError(f"--api-key-file {path} holds no key")
    return keys


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
    """The options every way of starting a server shares."""
    options = [
        click.argument("agent"),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind."),
        click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535)),
        click.option("--workers", default=0, type=click.IntRange(0), help="Turns running at once (default: CPU count)."),
        click.option("--ttl", default=0.0, type=click.FloatRange(0), help="Sweep idle/error sessions untouched this long (s); 0 = never."),
        click.option("--timeout", default=0.0, type=click.FloatRange(0), help="Kill a turn after this many seconds; 0 = never."),
        click.option("--max-sessions", default=10000, show_default=True, type=click.IntRange(0), help="Cap on sessions; 0 = unlimited."),
        click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(0), help="Wait this long for running turns on shutdown; 0 = as long as they take. With a durable store, turns still running then are replayed at the next start."),
        click.option("--store", "store", default=None, envvar="MOTUS_STORE", metavar="URL", help="Where sessions live: memory, sqlite:///PATH, or postgresql://USER:PASSWORD@HOST:PORT/DB for several instances (default: sqlite:///.motus/<module>.<attr>.sqlite3; $MOTUS_STORE)."),
        click.option("--lease-seconds", "lease_seconds", default=15.0, show_default=True, envvar="MOTUS_LEASE_SECONDS", type=click.FloatRange(1), help="PostgreSQL: an instance that has not renewed its lease for this long is taken for gone, and its turns are taken over by the others."),
        click.option("--park-after", "park_after", default=None, envvar="MOTUS_PARK_AFTER", metavar="SECONDS|never", callback=_parse_park_after, help="End the process of a turn that has waited on a person this long; a resume replays it (default: 30 with a durable store, never with memory)."),
        click.option("--allow-custom-ids", is_flag=True, help="Allow PUT /sessions/{id} with a client-chosen UUID."),
        click.option("--log-level", default="info", type=click.Choice(LOG_LEVELS, case_sensitive=False), show_default=True),
        click.option("--no-ui", "no_ui", is_flag=True, help="Do not serve the web chat at /ui/."),
        click.option("--threads", default=128, show_default=True, type=click.IntRange(1), help="HTTP request threads (each long poll holds one)."),
        click.option("--api-key", "api_keys", multiple=True, metavar="KEY", help="Require 'Authorization: Bearer KEY' (repeat to accept several keys; default: $MOTUS_API_KEY, comma-separated)."),
        click.option("--max-request-bytes", default=10 * 1024 * 1024, show_default=True, type=click.IntRange(1024), help="Refuse larger request bodies with 413."),
        click.option("--max-wait", default=300.0, show_default=True, type=click.FloatRange(0.1), help="Longest a long poll may wait (s)."),
        click.option("--max-interrupts", default=64, show_default=True, type=click.IntRange(0), help="Interrupts one turn may have pending at once; 0 = no limit."),
        click.option("--api-key-file", "api_key_file", default=None, metavar="PATH", help="Read API keys from a file, one per line (keeps them out of `ps`); recommended over --api-key."),
        click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", help="Accept this Host header too (repeatable); a loopback-bound server otherwise accepts only loopback names."),
        click.option("--webhook-allow", "webhook_allow", multiple=True, metavar="CIDR|HOST", help="Let webhooks reach this network or host even where it would be refused (repeatable)."),
        click.option("--max-streams", default=64, show_default=True, type=click.IntRange(0), help="Event streams (GET /events) open at once; each holds a request thread; 0 = no cap."),
        click.option("--webhook-secret", "webhook_secret", default=None, envvar=WEBHOOK_SECRET_ENV_VAR, metavar="SECRET", help="Sign webhook deliveries (X-Motus-Signature: sha256=HMAC of the body); default: $MOTUS_WEBHOOK_SECRET."),
        click.option("--log-format", "log_format", default="text", show_default=True, type=click.Choice(["text", "json"]), help="Log lines as text, or one JSON object per line; each request is logged (at info) with its request id."),
        click.option("--metrics-port", "metrics_port", default=None, type=click.IntRange(1, 65535), metavar="PORT", help="Also serve Prometheus metrics at /metrics on this port of --host, without an API key (GET /metrics on the main port asks for one when keys are set)."),
        click.option("--read-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1), help="Drop a client that takes longer than this to send its request headers or body (s)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def configure_logging(level: str, log_format: str = "text") -> None:
    from motus.serve.logs import configure_logging as configure

    configure(level, log_format)


def check_agent_path(agent: str) -> None:
    """Import the agent now, from the current folder too (as ``python -m`` would). An agent
    no worker may load (a lambda, a nested function) stops the start with one line, exit 2."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
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


def web_chat_address(host: str, port: int) -> str:
    """The URL to open for the web chat of a server bound to ``host:port``.

    A wildcard address (``0.0.0.0``, ``::``) is not one to browse to: this machine's
    loopback stands in for it (other machines use this machine's own name or address).
    """
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/ui/"


def stream_budget(opts: dict[str, Any]) -> int:
    """``--max-streams``, at most the threads left once long polls get one and
    ``RESERVED_THREADS`` are kept back (0, "no cap", means exactly that many)."""
    room = max(1, opts["threads"] - RESERVED_THREADS - 1)
    wanted = opts.get("max_streams", 64)
    return room if not wanted else min(wanted, room)


def server_factory(opts: dict[str, Any]) -> Callable[[], Any]:
    def build() -> Any:
        from motus.serve.server import AgentServer

        configure_logging(opts["log_level"], opts.get("log_format", "text"))
        server = AgentServer(
            opts["agent"],
            max_workers=opts["workers"],
            ttl=opts["ttl"],
            timeout=opts["timeout"],
            max_sessions=opts["max_sessions"],
            shutdown_timeout=opts["shutdown_timeout"],
            allow_custom_ids=opts["allow_custom_ids"],
            ui=not opts["no_ui"],
            api_keys=list(opts["api_keys"]) + read_key_file(opts.get("api_key_file")),
            host=opts["host"],
            allowed_hosts=list(opts.get("allowed_hosts") or ()),
            webhook_allow=list(opts.get("webhook_allow") or ()),
            max_request_bytes=opts["max_request_bytes"],
            max_wait=opts["max_wait"],
            max_interrupts=opts["max_interrupts"],
            # Long polls and event streams share the request threads, and together must leave
            # RESERVED_THREADS for resumes and health checks: streams get up to --max-streams,
            # long polls what remains (a poll past its cap answers at once instead of waiting).
            max_waiters=max(1, opts["threads"] - RESERVED_THREADS - stream_budget(opts)),
            max_streams=stream_budget(opts),
            webhook_secret=opts.get("webhook_secret"),
            store=opts["store"],
            lease_seconds=opts.get("lease_seconds", 15.0),
            park_after=opts["park_after"],
            metrics_port=opts.get("metrics_port"),
        )
        if not opts["no_ui"] and opts.get("port"):
            log.info("web chat: %s", web_chat_address(opts["host"], opts["port"]))
        return server

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
    given = list(opts["api_keys"]) or [key for key in os.environ.get(ENV_VAR_API_KEY, "").split(",") if key.strip()]
    hide_keys_by_reexec(given)  # returns only once the keys are out of environ and argv
    handed = keys_from_reexec()
    if handed:
        opts["api_keys"] = tuple(handed)
    check_agent_path(opts["agent"])
    check_port_free(opts["host"], opts["port"])
    check_metrics_port(opts)
    opts["store"] = resolve_store(opts)
    warn_if_exposed(opts["host"], tuple(opts["api_keys"]) + tuple(read_key_file(opts.get("api_key_file"))))
    sys.argv = sys.argv[:1]  # gunicorn must not parse our options as its own
    run_gunicorn(
        server_factory(opts),
        host=opts["host"],
        port=opts["port"],
        threads=opts["threads"],
        shutdown_timeout=opts["shutdown_timeout"],
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

