"""The settings table (``motus/serve/config.py``) checked against every way of starting a
server: ``motus serve start`` and ``flask motus serve`` (their click options), the WSGI
entry point (``MOTUS_*``), and ``AgentServer``'s keywords. Each setting has the same default
three ways, and a value given any way reaches the same place in the server. The README's
table of options is the one the code renders."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from motus.serve import config
from motus.serve.cli import server_factory, start
from motus.serve.config import SETTINGS, ConfigError, server_from_env, settings_from_env
from motus.serve.flask_cli import serve_command
from motus.serve.server import AgentServer


ROOT = Path(__file__).resolve().parents[3]
AGENT = "tests.agents:echo"
#: Settings ``AgentServer.run()`` takes rather than the constructor (the serving process').
RUN_KEYWORDS = {"port", "log_level", "log_format", "read_timeout"}
#: Settings neither takes: their values become another one's (the file's keys join --api-key).
NEITHER = {"api_key_file"}

#: A value other than the default for each setting: (CLI arguments, environment value, the
#: value it parses to). A new setting needs a line here.
SAMPLES: dict[str, tuple[list[str], str, Any]] = {
    "host": (["--host", "0.0.0.0"], "0.0.0.0", "0.0.0.0"),
    "port": (["--port", "9001"], "9001", 9001),
    "workers": (["--workers", "3"], "3", 3),
    "ttl": (["--ttl", "60"], "60", 60.0),
    "timeout": (["--timeout", "5.5"], "5.5", 5.5),
    "max_sessions": (["--max-sessions", "7"], "7", 7),
    "session_cache": (["--session-cache", "50"], "50", 50),
    "shutdown_timeout": (["--shutdown-timeout", "0"], "0", 0.0),
    "store": (["--store", "sqlite:///{tmp}/s.db"], "sqlite:///{tmp}/s.db", "sqlite:///{tmp}/s.db"),
    "lease_seconds": (["--lease-seconds", "4"], "4", 4.0),
    "park_after": (["--park-after", "45"], "45", 45.0),
    "max_live_turns": (["--max-live-turns", "3"], "3", 3),
    "allow_custom_ids": (["--allow-custom-ids"], "1", True),
    "log_level": (["--log-level", "debug"], "debug", "debug"),
    "ui": (["--no-ui"], "0", False),
    "threads": (["--threads", "40"], "40", 40),
    "api_keys": (["--api-key", "key-one", "--api-key", "key-two"], "key-one,key-two", ["key-one", "key-two"]),
    "max_request_bytes": (["--max-request-bytes", "4096"], "4096", 4096),
    "max_wait": (["--max-wait", "12"], "12", 12.0),
    "max_interrupts": (["--max-interrupts", "3"], "3", 3),
    "api_key_file": (["--api-key-file", "{tmp}/keys"], "{tmp}/keys", "{tmp}/keys"),
    "approval_policy": (["--approval-policy", "{tmp}/policy.toml"], "{tmp}/policy.toml", "{tmp}/policy.toml"),
    "allowed_hosts": (["--allowed-host", "a.example", "--allowed-host", "b.example"], "a.example,b.example", ["a.example", "b.example"]),
    "webhook_allow": (["--webhook-allow", "10.0.0.0/8"], "10.0.0.0/8", ["10.0.0.0/8"]),
    "max_streams": (["--max-streams", "10"], "10", 10),
    "max_waiting": (["--max-waiting", "500"], "500", 500),
    "webhook_secret": (["--webhook-secret", "s3cret"], "s3cret", "s3cret"),
    "log_format": (["--log-format", "json"], "json", "json"),
    "metrics_port": (["--metrics-port", "9100"], "9100", 9100),
    "read_timeout": (["--read-timeout", "2.5"], "2.5", 2.5),
}

#: Where a setting's value lands in a built server.
REACHES: dict[str, Callable[[AgentServer], Any]] = {
    "host": lambda server: server.host,
    "workers": lambda server: server.max_workers,
    "ttl": lambda server: (server.ttl, server.turns.ttl),
    "timeout": lambda server: server.timeout,
    "max_sessions": lambda server: server.turns.max_sessions,
    "session_cache": lambda server: server.turns.session_cache,
    "shutdown_timeout": lambda server: server.shutdown_timeout,
    "store": lambda server: server.store.url,
    "park_after": lambda server: server.park_after,
    "max_live_turns": lambda server: server.turns.max_live_turns,
    "allow_custom_ids": lambda server: server.allow_custom_ids,
    "ui": lambda server: server.ui,
    "threads": lambda server: (server.threads, server.streams.limit, server.waiters and server.waiters._initial_value),  # type: ignore[attr-defined]
    "api_keys": lambda server: sorted(server.api_keys.names),
    "api_key_file": lambda server: sorted(server.api_keys.names),
    "max_request_bytes": lambda server: (server.max_request_bytes, server.app.config["MAX_CONTENT_LENGTH"]),
    "max_wait": lambda server: server.max_wait,
    "max_interrupts": lambda server: (server.max_interrupts, server.turns.max_interrupts),
    "allowed_hosts": lambda server: server.allowed_hosts,
    "webhook_allow": lambda server: server.webhook_allow,
    "max_streams": lambda server: server.streams.limit,
    "max_waiting": lambda server: server.max_waiting,
    "webhook_secret": lambda server: server.webhooks.secret,
    "metrics_port": lambda server: server.metrics_port,
}


@pytest.fixture(autouse=True)
def _no_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env_var, raising=False)


def _cli_params(command: click.Command, args: list[str]) -> dict[str, Any]:
    return command.make_context(command.name or "start", [AGENT, *args]).params


def _signature_default(setting: config.Setting) -> Any:
    if setting.name in RUN_KEYWORDS:
        return inspect.signature(AgentServer.run).parameters[setting.name].default
    default = inspect.signature(AgentServer).parameters[setting.server_keyword or ""].default
    return tuple(default or ()) if setting.kind == "list" else default


def _fill(value: Any, tmp: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{tmp}", str(tmp))
    if isinstance(value, list):
        return [_fill(item, tmp) for item in value]
    return value


def test_every_setting_has_a_sample_and_a_keyword_somewhere() -> None:
    assert set(SAMPLES) == {setting.name for setting in SETTINGS}
    server_keywords = set(inspect.signature(AgentServer).parameters)
    for setting in SETTINGS:
        if setting.name in RUN_KEYWORDS:
            assert setting.server_keyword is None and setting.name in inspect.signature(AgentServer.run).parameters
        elif setting.name in NEITHER:
            assert setting.server_keyword is None
        else:
            assert setting.server_keyword in server_keywords, setting.name


def test_both_commands_take_the_same_options() -> None:
    described = [(param.name, param.opts, param.default, param.multiple) for param in start.params]
    assert described == [(param.name, param.opts, param.default, param.multiple) for param in serve_command.params]
    assert [param.opts[0] for param in start.params if isinstance(param, click.Option)] == [setting.flag for setting in SETTINGS]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.name)
def test_one_default_three_ways(setting: config.Setting) -> None:
    expected = setting.default
    for command in (start, serve_command):
        assert _cli_params(command, [])[setting.name] == expected, command.name
    assert settings_from_env({})[setting.name] == expected
    assert settings_from_env({setting.env_var: ""})[setting.name] == expected  # empty = unset
    if setting.name in NEITHER:
        return
    assert _signature_default(setting) == expected, f"AgentServer's default for {setting.name}"


def test_run_binds_and_threads_as_the_server_was_built() -> None:
    parameters = inspect.signature(AgentServer.run).parameters
    assert parameters["host"].default is None and parameters["threads"].default is None


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.name)
def test_a_value_given_any_way_reaches_the_same_place(setting: config.Setting, tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("# keys\nkey-one\n\nkey-two\n")
    args, raw, expected = (_fill(part, tmp_path) for part in SAMPLES[setting.name])
    assert expected != setting.default and raw.strip()

    cli = _cli_params(start, args)
    env = settings_from_env({setting.env_var: raw})
    assert _cli_params(serve_command, args)[setting.name] == cli[setting.name]
    assert (list(cli[setting.name]) if setting.kind == "list" else cli[setting.name]) == expected
    assert env[setting.name] == expected
    assert config.server_kwargs(cli) == config.server_kwargs(env)

    where = REACHES.get(setting.name)
    if where is None:
        return
    base = {} if setting.name == "store" else {"store": "memory"}
    by_cli = server_factory({**cli, **base})()
    by_env = server_from_env({"MOTUS_AGENT": AGENT, "MOTUS_STORE": "memory", setting.env_var: raw})
    keyword = setting.server_keyword
    if keyword:
        by_python = AgentServer(AGENT, **base, **{keyword: expected})
    else:  # the key file: its keys are API keys
        by_python = AgentServer(AGENT, **base, api_keys=config.read_key_file(expected))
    assert where(by_cli) == where(by_env) == where(by_python)
    assert where(by_python) != where(AgentServer(AGENT, store="memory")), "the sample changes nothing"


def test_the_live_turn_budget_is_four_a_worker_and_at_least_eight() -> None:
    assert [config.default_live_turns(workers) for workers in (1, 2, 3, 16)] == [8, 8, 12, 64]
    assert AgentServer(AGENT, store="memory", max_workers=5).turns.max_live_turns == 20
    assert AgentServer(AGENT, store="memory", max_live_turns=0).turns.max_live_turns == 0  # no budget


def test_never_parks_never() -> None:
    assert _cli_params(start, ["--park-after", "never"])["park_after"] is None
    assert settings_from_env({"MOTUS_PARK_AFTER": " Never "})["park_after"] is None
    durable = {"MOTUS_AGENT": AGENT, "MOTUS_STORE": "sqlite:///unused.db"}
    assert server_from_env(durable).park_after == config.DURABLE_PARK_AFTER
    assert server_from_env({**durable, "MOTUS_PARK_AFTER": "never"}).park_after is None


def test_no_arguments_serve_as_no_flags() -> None:
    """``AgentServer(agent)`` is the server ``motus serve start agent`` and the WSGI app build
    with nothing given (apart from the store, which would be a file here)."""
    by_cli = server_factory({**_cli_params(start, []), "store": "memory"})()
    by_env = server_from_env({"MOTUS_AGENT": AGENT, "MOTUS_STORE": "memory"})
    by_python = AgentServer(AGENT, store="memory")
    for name, where in REACHES.items():
        assert where(by_cli) == where(by_env) == where(by_python), name


def test_long_polls_are_capped_from_the_threads() -> None:
    server = AgentServer(AGENT, store="memory")
    assert server.streams.limit == 64
    assert server.waiters is not None and server.waiters._initial_value == 128 - config.RESERVED_THREADS - 64  # type: ignore[attr-defined]
    few = server_from_env({"MOTUS_AGENT": AGENT, "MOTUS_STORE": "memory", "MOTUS_THREADS": "20"})
    assert few.streams.limit == 20 - config.RESERVED_THREADS - 1
    assert few.waiters is not None and few.waiters._initial_value == 1  # type: ignore[attr-defined]
    assert AgentServer(AGENT, store="memory", max_waiters=0).waiters is None  # explicitly no cap


@pytest.mark.parametrize(
    ("name", "raw"),
    [("max_sessions", "many"), ("max_sessions", "-1"), ("park_after", "soon"), ("ui", "maybe"), ("log_level", "loud"), ("max_wait", "0")],
)
def test_a_bad_value_names_its_variable(name: str, raw: str) -> None:
    setting = config.BY_NAME[name]
    with pytest.raises(ConfigError, match=setting.env_var):
        settings_from_env({setting.env_var: raw})
    if setting.kind != "flag":  # a flag takes no value on the command line
        with pytest.raises(click.BadParameter):
            _cli_params(start, [setting.flag, raw])


@pytest.mark.parametrize(
    "setting", [s for s in SETTINGS if isinstance(getattr(s.type, "inner", s.type), click.FloatRange)], ids=lambda setting: setting.name
)
def test_no_number_of_seconds_is_nan(setting: config.Setting) -> None:
    """NaN passes every range check (each comparison with it is false). The old CLI refused
    ``--park-after nan``; taken, a NaN park time or deadline at the top of the timer heap
    stops every later timer (no turn times out) and spins the housekeeping thread."""
    for raw in ("nan", "NaN", " -nan "):
        with pytest.raises(ConfigError, match=setting.env_var):
            settings_from_env({setting.env_var: raw})
        with pytest.raises(click.BadParameter):
            _cli_params(start, [setting.flag, raw])
        with pytest.raises(click.BadParameter):
            _cli_params(serve_command, [setting.flag, raw])


def test_a_bad_secret_is_not_repeated() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_env({"MOTUS_METRICS_PORT": "x"})
    assert "'x'" in str(caught.value)
    secret = config.Setting("s", "--s", click.IntRange(0), 0, "", secret=True)
    with pytest.raises(ConfigError) as hidden:
        secret.parse("postgresql://u:pw@h/db")
    assert "pw" not in str(hidden.value) and "(hidden)" in str(hidden.value)


def test_wsgi_needs_the_agent() -> None:
    with pytest.raises(SystemExit, match="MOTUS_AGENT"):
        server_from_env({})
    with pytest.raises(SystemExit, match="MOTUS_MAX_WAIT"):
        server_from_env({"MOTUS_AGENT": AGENT, "MOTUS_MAX_WAIT": "never"})


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"MOTUS_STORE": "postgresq://user:s3cret@db.example/motus"}, "Unsupported store URL 'postgresq://user:***@db.example/motus'"),
        ({"MOTUS_STORE": "postgresql://user:s3cret@db.example:port/motus"}, "Store URL 'postgresql://user:***@db.example:port/motus'"),
        ({"MOTUS_AGENT": "tests.no_such_module:agent"}, "Could not import module 'tests.no_such_module'"),
        ({"MOTUS_API_KEY": "s3cret-key-1,s3cret-key-1"}, "Two API keys have the same secret"),
    ],
    ids=["misspelt-store", "store-port", "agent", "same-key-twice"],
)
def test_wsgi_stops_with_one_line_that_repeats_no_secret(env: dict[str, str], says: str) -> None:
    """What the server itself refuses (the store URL, the agent, the keys) stops the WSGI
    import as a value that does not parse does: one line, not a traceback, and never the
    password of a store URL."""
    with pytest.raises(SystemExit) as caught:
        server_from_env({"MOTUS_AGENT": AGENT, "MOTUS_STORE": "memory", **env})
    message = str(caught.value.code)
    assert message.startswith(says) and "\n" not in message and "s3cret" not in message


def test_the_top_level_wsgi_is_the_packaged_one() -> None:
    text = (ROOT / "wsgi.py").read_text()
    assert "from motus.serve.wsgi import app" in text
    assert [line for line in text.splitlines() if line and not line.startswith(("from ", '"""'))] == []


def test_the_readme_table_is_the_settings_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config.options_table() in readme, "README.md's table of options is stale: paste `python -m motus.serve.config`"
    table = readme.split("<!-- options table", 1)[1].split("<!-- end of options table -->", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    documented = {row.split("`")[1].split()[0]: row.split(" | ")[2] for row in rows}
    assert list(documented) == [setting.flag for setting in SETTINGS]
    for setting in SETTINGS:
        assert documented[setting.flag] == setting.documented_default().replace("|", "\\|"), setting.flag


@pytest.mark.parametrize(
    ("values", "secret"),
    [
        ({"store": "memory"}, False),
        ({"store": "sqlite:///.motus/a.sqlite3"}, False),
        ({"store": "postgresql://postgres@127.0.0.1:5432/motus"}, False),
        ({"store": "postgresql://motus:pw@db.internal/motus"}, True),
        ({"store": "postgresql://motus:@db.internal/motus"}, True),
        ({"store": "postgresql://db.internal/motus?password=pw"}, True),
        ({"store": "memory", "api_keys": ("alice=s3cret",)}, True),
        ({"store": "memory", "api_key_file": "/etc/motus/keys"}, True),
        ({"store": "memory", "webhook_secret": "w"}, True),
    ],
)
def test_holds_secrets_names_what_an_agent_must_not_read(values: dict, secret: bool) -> None:
    """What decides whether the zygote may be forked from the serving process (whose memory
    and environment block its workers share) or must be a fresh interpreter."""
    assert config.holds_secrets(values, environ={}) is secret


@pytest.mark.parametrize(
    ("environ", "secret"),
    [
        ({"MOTUS_STORE": "postgresql://motus:pw@db.internal/motus"}, True),
        ({"MOTUS_STORE": "memory"}, False),
        ({"MOTUS_WEBHOOK_SECRET": "w"}, True),
        ({"MOTUS_API_KEY": "alice=s3cret"}, True),
        ({"MOTUS_STORE": "postgresql://postgres@127.0.0.1/motus"}, False),
    ],
)
def test_a_secret_in_the_environment_counts_whatever_the_options_chose(environ: dict, secret: bool) -> None:
    """The original environment block stays readable in /proc whatever the options override."""
    assert config.holds_secrets({"store": "memory"}, environ=environ) is secret
