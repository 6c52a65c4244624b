"""The page as ``motus serve`` serves it (gunicorn, no browser): routes, headers, ``--no-ui``."""

from __future__ import annotations

import requests

from motus.serve.ui import CONTENT_SECURITY_POLICY
from tests.browser.conftest import UI_AGENT


def test_the_server_serves_the_page_and_no_ui_turns_it_off(start_server):
    server = start_server(UI_AGENT)
    redirect = server.get("/ui", allow_redirects=False)
    assert redirect.status_code == 308
    assert redirect.headers["Location"] == "/ui/"
    page = server.get("/ui/")
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    for asset in ("app.js", "dom.js", "cards.js", "loop.js", "style.css", "favicon.svg"):
        assert server.get(f"/ui/{asset}").status_code == 200
    assert server.get("/ui/nope.js").status_code == 404
    # The API is untouched by the UI's headers.
    assert "Content-Security-Policy" not in server.get("/health").headers

    bare = start_server(UI_AGENT, "--no-ui")
    assert bare.get("/ui/").status_code == 404
    assert bare.get("/ui/app.js").status_code == 404
    assert requests.get(bare.url + "/health", timeout=5).status_code == 200
