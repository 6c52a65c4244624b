"""The server's settings: one table, and everything built from it.

``SETTINGS`` is the only place a server setting's default, parser, command-line flag,
``MOTUS_*`` environment variable and help are written. From it:

- ``click_options`` gives the options of ``motus serve start`` and ``flask motus serve``;
- ``settings_from_env`` reads the environment for the WSGI entry point (``motus.serve.wsgi``,
  through ``server_from_env``);
- ``DEFAULTS`` gives ``AgentServer``'s keyword defaults, so ``AgentServer(agent)`` serves as
  ``motus serve start agent`` with no flags does;
- ``server_kwargs`` turns the values of any of them into ``AgentServer``'s keywords, and
  ``build_server`` builds the server from them (the CLI's worker and the WSGI module both);
- ``options_table`` renders the README's table of options (a test keeps the two equal).

Each value is parsed by the setting's click type whichever way it arrives, so a value the
CLI refuses is refused from the environment too, with the variable's name in the message.
Nothing here holds state; the table is immutable.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import click

from motus.serve.auth import split_keys

log = logging.getLogger(__name__)

#: The agent's import path under WSGI (the CLI takes it as its argument).
AGENT_ENV_VAR = "MOTUS_AGENT"
#: ``--park-after``'s default: 30 s with a durable store, never with ``memory``.
PARK_BY_STORE = "default"
#: With a durable store, a turn waiting on a person is parked after this many seconds.
DURABLE_PARK_AFTER = 30.0
#: Request threads long polls and event streams may never take, so resumes and health
#: checks always get one.
RESERVED_THREADS = 8

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting's value that cannot be used; the message names where it came from."""


class Seconds(click.FloatRange):
    """A number of seconds in a range, never NaN: every comparison with NaN is false, so it
    passes any range, and a NaN deadline or park time stuck at the top of the timer heap
    would stop every later timer and spin the housekeeping thread."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if isinstance(seconds, float) and math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


class _NeverOr(click.ParamType):
    """``inner``'s values, or ``never`` (``None``); ``PARK_BY_STORE`` passes as it is."""

    def __init__(self, inner: click.ParamType) -> None:
        self.inner = inner
        self.name = f"{inner.name}|never"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or value == PARK_BY_STORE:
            return value
        if isinstance(value, str) and value.strip().lower() == "never":
            return None
        try:
            return self.inner.convert(value.strip() if isinstance(value, str) else value, param, ctx)
        except click.BadParameter:
            self.fail(f"expected a number of seconds >= 0 or 'never', got {value!r}", param, ctx)


@dataclass(frozen=True)
class Setting:
    """One server setting.

    ``name`` is its key in the CLI's parsed options and in ``settings_from_env``'s result;
    ``keyword`` is ``AgentServer``'s keyword for it (``None``: the serving process' own, not
    the server's: port, logging, the read timeout). ``kind`` is ``value``, ``flag`` (a
    boolean; ``negated`` when the flag turns it off, as ``--no-ui``) or ``list`` (the flag
    repeats; the variable holds a comma-separated list). ``cli_env``: the CLI reads the
    variable too (where it did before this table; the others are for WSGI only). ``secret``:
    a value that approves or reaches something; pass it in the environment, never on a
    command line every local user can read. ``shown`` is the default as documented, where
    the value alone would mislead (0 workers = the CPU count).
    """

    name: str
    flag: str
    type: click.ParamType
    default: Any
    help: str
    env: str = ""
    keyword: str | None = ""
    kind: str = "value"
    negated: bool = False
    cli_env: bool = False
    secret: bool = False
    metavar: str | None = None
    split: Callable[[str], list[str]] | None = None  # a list's own reading of its variable
    shown: str | None = None

    @property
    def env_var(self) -> str:
        return self.env or "MOTUS_" + self.flag.removeprefix("--").replace("-", "_").upper()

    @property
    def server_keyword(self) -> str | None:
        return self.name if self.keyword == "" else self.keyword

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` as this setting's environment variable holds it."""
        try:
            if self.kind == "flag":
                word = raw.strip().lower()
                if word not in _TRUE | _FALSE:
                    raise click.BadParameter(f"expected 1/0 (true/false, yes/no, on/off), got {raw!r}")
                return word in _TRUE
            if self.kind == "list":
                items = self.split(raw) if self.split is not None else raw.split(",")
                return [self.type.convert(item.strip(), None, None) for item in items if item.strip()]
            return self.type.convert(raw.strip(), None, None)
        except click.BadParameter as exc:
            if self.secret:  # click's message repeats the value
                raise ConfigError(f"{self.env_var}=(hidden): not a valid value for {self.flag}") from None
            raise ConfigError(f"{self.env_var}={raw!r}: {exc.message}") from None

    def click_option(self) -> Callable[[Any], Any]:
        extra: dict[str, Any] = {}
        if self.cli_env:
            extra["envvar"] = self.env_var
        if self.metavar:
            extra["metavar"] = self.metavar
        if self.kind == "flag":
            return click.option(self.flag, self.name, is_flag=True, flag_value=not self.default, default=self.default, help=self.help, **extra)
        if self.kind == "list":
            return click.option(self.flag, self.name, multiple=True, type=self.type, help=self.help, **extra)
        show = self.shown is None and self.default is not None and self.default != PARK_BY_STORE
        return click.option(self.flag, self.name, type=self.type, default=self.default, show_default=show, help=self.help, **extra)

    def documented_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.kind == "list":
            return "none"
        if self.kind == "flag":
            return "off"  # the flag is not given; its variable's default is the opposite when negated
        if self.default is None:
            return "none"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting("host", "--host", click.STRING, "127.0.0.1", "Address to bind."),
    Setting("port", "--port", click.IntRange(0, 65535), 8000, "Port to bind.", keyword=None),
    Setting("workers", "--workers", click.IntRange(0), 0, "Turns running at once (default: CPU count).", keyword="max_workers", shown="CPU count"),
    Setting("ttl", "--ttl", Seconds(0), 0.0, "Sweep idle/error sessions untouched this long (s); 0 = never."),
    Setting("timeout", "--timeout", Seconds(0), 0.0, "Kill a turn after this many seconds; 0 = never."),
    Setting("max_sessions", "--max-sessions", click.IntRange(0), 10000, "Cap on sessions; 0 = unlimited."),
    Setting(
        "session_cache", "--session-cache", click.IntRange(0), 2000,
        "Sessions a durable store's server keeps in memory beyond those it must (running, waiting with a process, timed); the rest are read from the store when used; 0 = all.",
        cli_env=True, metavar="N",
    ),
    Setting("shutdown_timeout", "--shutdown-timeout", Seconds(0), 30.0, "Wait this long for running turns on shutdown; 0 = as long as they take. With a durable store, turns still running then are replayed at the next start."),
    Setting(
        "store", "--store", click.STRING, None,
        "Where sessions live: memory, sqlite:///PATH, or postgresql://USER:PASSWORD@HOST:PORT/DB for several instances (default: sqlite:///.motus/<module>.<attr>.sqlite3; $MOTUS_STORE).",
        cli_env=True, secret=True, metavar="URL", shown="sqlite:///.motus/<module>.<attr>.sqlite3",
    ),
    Setting(
        "lease_seconds", "--lease-seconds", Seconds(1), 15.0,
        "PostgreSQL: an instance that has not renewed its lease for this long is taken for gone, and its turns are taken over by the others.",
        cli_env=True,
    ),
    Setting(
        "park_after", "--park-after", _NeverOr(Seconds(0)), PARK_BY_STORE,
        "End the process of a turn that has waited on a person this long; a resume replays it (default: 30 with a durable store, never with memory).",
        cli_env=True, metavar="SECONDS|never", shown="30 (durable store), never (memory)",
    ),
    Setting(
        "max_live_turns", "--max-live-turns", click.IntRange(0), None,
        "Turns waiting on a person that keep their process (about 3 MiB each); past it the longest-waiting park at once instead of after --park-after; 0 = no budget (default: 4 per worker, at least 8).",
        cli_env=True, metavar="N", shown="4 per worker, at least 8",
    ),
    Setting("allow_custom_ids", "--allow-custom-ids", click.BOOL, False, "Allow PUT /sessions/{id} with a client-chosen UUID.", kind="flag"),
    Setting("log_level", "--log-level", click.Choice(LOG_LEVELS, case_sensitive=False), "info", "Lowest level of log lines written.", keyword=None),
    Setting("ui", "--no-ui", click.BOOL, True, "Do not serve the web chat at /ui/.", env="MOTUS_UI", kind="flag", negated=True),
    Setting("threads", "--threads", click.IntRange(1), 128, "HTTP request threads (a waiting long poll or stream holds none under motus serve start, one elsewhere)."),
    Setting(
        "api_keys", "--api-key", click.STRING, (),
        "Require 'Authorization: Bearer KEY' (repeat to accept several keys; default: $MOTUS_API_KEY, comma-separated). "
        "NAME=SECRET names a key; NAME=SECRET:ROLE,ROLE gives it roles (who may approve a tool that names approvers); "
        "SECRET:read or NAME=SECRET:read makes it read-only.",
        kind="list", secret=True, metavar="KEY", split=split_keys,
    ),
    Setting("max_request_bytes", "--max-request-bytes", click.IntRange(1024), 10 * 1024 * 1024, "Refuse larger request bodies with 413."),
    Setting("max_wait", "--max-wait", Seconds(0.1), 300.0, "Longest a long poll may wait (s)."),
    Setting("max_interrupts", "--max-interrupts", click.IntRange(0), 64, "Interrupts one turn may have pending at once; 0 = no limit."),
    Setting(
        "approval_policy", "--approval-policy", click.STRING, None,
        "Who may answer which interrupts: a TOML file of [tool.NAME] and [type.NAME] tables, each with approvers "
        "(roles of API keys), self_approval = false and/or quorum = N (N different keys approve); it wins over "
        "what tools declare in code.",
        cli_env=True, metavar="PATH",
    ),
    Setting(
        "api_key_file", "--api-key-file", click.STRING, None,
        "Read API keys from a file, one per line (keeps them out of `ps`); recommended over --api-key.",
        keyword=None, metavar="PATH",
    ),
    Setting(
        "allowed_hosts", "--allowed-host", click.STRING, (),
        "Accept this Host header too (repeatable); a loopback-bound server otherwise accepts only loopback names.",
        kind="list", metavar="NAME",
    ),
    Setting(
        "webhook_allow", "--webhook-allow", click.STRING, (),
        "Let webhooks reach this network or host even where it would be refused (repeatable).",
        kind="list", metavar="CIDR|HOST",
    ),
    Setting("max_streams", "--max-streams", click.IntRange(0), 64, "Event streams (GET /events) holding a request thread at once (under motus serve start a waiting stream holds none; see --max-waiting); 0 = no cap."),
    Setting(
        "max_waiting", "--max-waiting", click.IntRange(0), 10_000,
        "Long polls and event streams held waiting without a thread (motus serve start, or gunicorn with -k motus.serve.gunicorn.MotusWorker); past it they wait on a request thread.",
        metavar="N",
    ),
    Setting(
        "webhook_secret", "--webhook-secret", click.STRING, None,
        "Sign webhook deliveries (X-Motus-Signature: sha256=HMAC of the body); default: $MOTUS_WEBHOOK_SECRET.",
        cli_env=True, secret=True, metavar="SECRET",
    ),
    Setting(
        "log_format", "--log-format", click.Choice(["text", "json"]), "text",
        "Log lines as text, or one JSON object per line; each request is logged (at info) with its request id.",
        keyword=None,
    ),
    Setting(
        "metrics_port", "--metrics-port", click.IntRange(1, 65535), None,
        "Also serve Prometheus metrics at /metrics on this port of --host, without an API key (GET /metrics on the main port asks for one when keys are set).",
        metavar="PORT",
    ),
    Setting(
        "read_timeout", "--read-timeout", Seconds(0.1), 10.0,
        "Drop a client that takes longer than this to send its request headers or body (s).",
        keyword=None,
    ),
)

BY_NAME: Mapping[str, Setting] = MappingProxyType({setting.name: setting for setting in SETTINGS})
#: Every setting's default by name (``AgentServer``'s keyword defaults come from here).
DEFAULTS: Mapping[str, Any] = MappingProxyType({setting.name: setting.default for setting in SETTINGS})


def click_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The agent argument and every setting's option, in the table's order."""
    for setting in reversed(SETTINGS):
        func = setting.click_option()(func)
    return click.argument("agent")(func)


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting's value from ``MOTUS_*`` (unset or empty: the default). A value that
    does not parse is a ``ConfigError`` naming the variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env_var, "")
        values[setting.name] = setting.parse(raw) if raw.strip() else setting.default
    return values


def read_key_file(path: str | None) -> list[str]:
    """API keys from a file, one per line (blank lines and ``#`` comments ignored)."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"Cannot read --api-key-file {path}: {exc.strerror}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key")
    return keys


def default_live_turns(workers: int) -> int:
    """``--max-live-turns`` when not given: 4 waiting turns per compute slot, at least 8. A
    waiting turn's process costs about 3 MiB; a parked one a few rows, and its resume a
    replay (about 9 ms here), so the budget only needs to cover answers given quickly."""
    return max(8, 4 * workers)


def stream_budget(threads: int, max_streams: int) -> int:
    """``--max-streams``, at most the threads left once long polls get one and
    ``RESERVED_THREADS`` are kept back (0, "no cap", means exactly that many)."""
    room = max(1, threads - RESERVED_THREADS - 1)
    return room if not max_streams else min(max_streams, room)


def waiter_budget(threads: int, max_streams: int) -> int:
    """Long polls waiting at once: what the streams and ``RESERVED_THREADS`` leave of
    ``threads`` (a poll past it answers at once instead of waiting)."""
    return max(1, threads - RESERVED_THREADS - stream_budget(threads, max_streams))


def server_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """``AgentServer``'s keywords from settings' values (any not given: the default);
    ``--api-key-file``'s keys join ``--api-key``'s."""
    kwargs = {
        setting.server_keyword: values.get(setting.name, setting.default)
        for setting in SETTINGS
        if setting.server_keyword
    }
    keys = list(values.get("api_keys") or ()) + read_key_file(values.get("api_key_file"))
    kwargs["api_keys"] = keys
    for name in ("allowed_hosts", "webhook_allow"):
        kwargs[name] = list(kwargs[name] or ())
    return kwargs


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


def holds_secrets(values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether a server built from these values holds something an agent must not read: an
    API key, a webhook secret, or a database URL with a password in it (whoever writes to
    the database answers interrupts). A URL without one grants nothing the agent's own user
    does not have (the password then comes from ``PGPASSWORD`` or ``~/.pgpass``, which the
    agent's process sees either way).

    The environment counts too, whatever the options chose: a forked zygote's workers can
    read the server's original environment block (``MOTUS_STORE=postgresql://...:PASSWORD@``
    beside ``--store memory`` is still there)."""
    environ = os.environ if environ is None else environ
    if values.get("api_keys") or values.get("api_key_file") or values.get("webhook_secret"):
        return True
    if environ.get(BY_NAME["api_keys"].env_var) or environ.get(BY_NAME["webhook_secret"].env_var):
        return True
    return any(_has_password(url) for url in (str(values.get("store") or ""), environ.get(BY_NAME["store"].env_var, "")))


def _has_password(url: str) -> bool:
    parts = urlsplit(url)
    return ":" in parts.netloc.rpartition("@")[0] or "password" in parse_qs(parts.query)


def build_server(agent: Any, values: Mapping[str, Any]) -> Any:
    """Configure logging and build the ``AgentServer`` these values describe (nothing starts)."""
    from motus.serve.logs import configure_logging
    from motus.serve.server import AgentServer

    configure_logging(values.get("log_level", DEFAULTS["log_level"]), values.get("log_format", DEFAULTS["log_format"]))
    server = AgentServer(agent, **server_kwargs(values))
    port = values.get("port", DEFAULTS["port"])
    if values.get("ui", True) and port:
        log.info("web chat: %s", web_chat_address(values.get("host", DEFAULTS["host"]), port))
    return server


def _doc_metavar(setting: Setting) -> str:
    if setting.metavar:
        return setting.metavar
    if isinstance(setting.type, click.Choice):
        return "|".join(str(choice) for choice in setting.type.choices)
    if isinstance(setting.type, click.FloatRange):
        return "SECONDS"
    if isinstance(setting.type, click.IntRange):
        return "N"
    return "ADDRESS"


def agent_from_env(environ: Mapping[str, str]) -> str:
    """``MOTUS_AGENT`` (``SystemExit`` with one line if it is not set)."""
    agent = environ.get(AGENT_ENV_VAR, "").strip()
    if not agent:
        raise SystemExit(f"Set {AGENT_ENV_VAR} to the agent's import path, e.g. {AGENT_ENV_VAR}=examples.serving.hitl_agent:agent")
    return agent


def server_from_env(environ: Mapping[str, str] | None = None) -> Any:
    """The ``AgentServer`` the environment describes, as the WSGI entry point builds it
    (``SystemExit`` with one line naming the variable if it cannot be built)."""
    from motus.serve.agents import AgentLoadError
    from motus.serve.store import StoreError

    environ = os.environ if environ is None else environ
    agent = agent_from_env(environ)
    try:
        return build_server(agent, settings_from_env(environ))
    except (ConfigError, AgentLoadError, StoreError, ValueError) as exc:
        # ValueError: AgentServer's own checks (an agent no worker can load, two API keys
        # with one secret). Each message is one line that says what to fix.
        raise SystemExit(str(exc)) from None


def options_table() -> str:
    """The README's table of server options (Markdown), from ``SETTINGS``."""
    rows = ["| Option | Environment (WSGI) | Default | What it does |", "|---|---|---|---|"]
    for setting in SETTINGS:
        flag = setting.flag if setting.kind == "flag" else f"{setting.flag} {_doc_metavar(setting)}"
        env = f"`{setting.env_var}`"
        if setting.kind == "flag":
            env += " (0 = given)" if setting.negated else " (1 = given)"
        elif setting.kind == "list":
            env += " (comma-separated)"
        if setting.cli_env:
            env += ", CLI too"
        help_text = setting.help
        if setting.secret:
            help_text += " Secret: prefer the environment (or a file) to the command line."
        cells = [f"`{flag}`", env, setting.documented_default(), help_text]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m motus.serve.config: print the README's table
    print(options_table(), end="")
