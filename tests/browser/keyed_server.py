"""A real motus server behind an API key, for the page's 401 handling.

``python -m tests.browser.keyed_server PORT KEY`` serves ``tests.ui_agents:agent`` with
``AgentServer`` on Werkzeug's threaded server, and answers 401 to every API request that
lacks ``Authorization: Bearer KEY``; the web chat's files (blueprint ``motus_ui``) and
``/health`` stay public, as the API-key issue asks. It stands in for ``motus serve`` until
the server has its own key option. SIGTERM stops it cleanly.
"""

from __future__ import annotations

import hmac
import signal
import sys
import threading

from flask import jsonify, request
from werkzeug.serving import make_server

from motus.serve.server import AgentServer
from motus.serve.ui import BLUEPRINT_NAME


def main() -> None:
    port, key = int(sys.argv[1]), sys.argv[2]
    agent_server = AgentServer("tests.ui_agents:agent", max_workers=2)
    app = agent_server.app

    @app.before_request
    def require_key():  # type: ignore[no-untyped-def]
        if request.blueprint == BLUEPRINT_NAME or request.path == "/health":
            return None
        if hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {key}"):
            return None
        return jsonify(detail="Missing or invalid API key"), 401

    httpd = make_server("127.0.0.1", port, app, threaded=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown).start())
    try:
        httpd.serve_forever()
    finally:
        agent_server.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
