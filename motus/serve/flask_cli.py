"""``flask motus serve AGENT [options]``: the same server on Werkzeug's threaded server.

Loaded by Flask's CLI through the ``flask.commands`` entry point. Werkzeug's reloader is
never used: it would restart (and re-fork) the process that owns the worker pool.
"""

from __future__ import annotations

from typing import Any

import click
from flask.cli import AppGroup

from motus.serve.cli import (
    check_agent_path,
    check_port_free,
    configure_logging,
    read_key_file,
    resolve_store,
    server_factory,
    server_options,
    warn_if_exposed,
)

motus_group = AppGroup("motus", help="motus agent serving.")


@motus_group.command("serve", with_appcontext=False)
@server_options
def serve_command(**opts: Any) -> None:
    """Serve AGENT (module.path:attribute) on Werkzeug's threaded server."""
    from werkzeug.serving import run_simple

    configure_logging(opts["log_level"])
    check_agent_path(opts["agent"])
    check_port_free(opts["host"], opts["port"])
    opts["store"] = resolve_store(opts)
    warn_if_exposed(opts["host"], tuple(opts["api_keys"]) + tuple(read_key_file(opts.get("api_key_file"))))
    server = server_factory(opts)()
    server.start()
    try:
        run_simple(opts["host"], opts["port"], server.app, threaded=True, use_reloader=False, use_debugger=False)
    finally:
        server.shutdown()
