"""WSGI entry point for running motus under gunicorn directly::

    MOTUS_AGENT=examples.serving.hitl_agent:agent gunicorn -w 1 -k gthread --threads 64 wsgi:app

Options come from the environment: ``MOTUS_AGENT`` (required), ``MOTUS_WORKERS``,
``MOTUS_TTL``, ``MOTUS_TIMEOUT``, ``MOTUS_MAX_SESSIONS``, ``MOTUS_SHUTDOWN_TIMEOUT``,
``MOTUS_ALLOW_CUSTOM_IDS``, ``MOTUS_UI`` (1/0), ``MOTUS_STORE`` (a store URL),
``MOTUS_PARK_AFTER`` (seconds or ``never``). Importing this module starts nothing: the
pool starts with the first request, in the process that serves it. Sessions live in one
process, so a second gunicorn worker is refused at boot with an explanation.
"""

from __future__ import annotations

import os
import sys

from motus.serve.server import AgentServer


def _env_flag(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0").strip().lower() in {"1", "true", "yes", "on"}


def _env_number(name: str) -> float:
    raw = os.environ.get(name, "0")
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None


def _park_after() -> float | None | str:
    raw = os.environ.get("MOTUS_PARK_AFTER", "").strip().lower()
    if not raw:
        return "default"
    if raw == "never":
        return None
    return _env_number("MOTUS_PARK_AFTER")


if "MOTUS_AGENT" not in os.environ:
    raise SystemExit("Set MOTUS_AGENT to the agent's import path, e.g. MOTUS_AGENT=examples.serving.hitl_agent:agent")

if "gunicorn" in sys.modules:
    from motus.serve.gunicorn import claim_single_worker

    claim_single_worker()

server = AgentServer(
    os.environ["MOTUS_AGENT"],
    max_workers=int(_env_number("MOTUS_WORKERS")),
    ttl=_env_number("MOTUS_TTL"),
    timeout=_env_number("MOTUS_TIMEOUT"),
    max_sessions=int(_env_number("MOTUS_MAX_SESSIONS")),
    shutdown_timeout=float(os.environ.get("MOTUS_SHUTDOWN_TIMEOUT", "30") or 30),
    allow_custom_ids=_env_flag("MOTUS_ALLOW_CUSTOM_IDS", False),
    ui=_env_flag("MOTUS_UI", True),
    store=os.environ.get("MOTUS_STORE") or None,
    park_after=_park_after(),
    max_streams=int(os.environ.get("MOTUS_MAX_STREAMS", "64") or 64),
    webhook_secret=os.environ.get("MOTUS_WEBHOOK_SECRET") or None,
)
app = server.app
