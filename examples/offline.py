"""Which model an example runs: a real one when its provider's key is set, else an offline
scripted stand-in. Either way the server's log says which, and why (logged at import,
which the server does once before it listens, in the process whose log you read; the
processes that run turns import the example again without a log handler)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("examples")


def forced_offline() -> bool:
    """``MOTUS_EXAMPLE_OFFLINE`` set to anything but empty or ``0``."""
    return os.environ.get("MOTUS_EXAMPLE_OFFLINE", "").strip() not in ("", "0")


def real_model(example: str, key_env: str, default_model: str, try_saying: str) -> str | None:
    """The model to run (``MOTUS_EXAMPLE_MODEL``, else ``default_model``) when ``key_env`` is
    set and the example is not forced offline; None for the scripted one. Logs the choice."""
    offline = forced_offline()
    if os.environ.get(key_env, "").strip() and not offline:
        model = os.environ.get("MOTUS_EXAMPLE_MODEL", default_model)
        log.info("%s: model %s (%s is set)", example, model, key_env)
        return model
    why = "MOTUS_EXAMPLE_OFFLINE is set" if offline else f"{key_env} is not set"
    log.info(
        "%s: using the offline scripted model because %s; it picks tools by keywords (try %r). "
        "Set %s for a real model.", example, why, try_saying, key_env,
    )
    return None
