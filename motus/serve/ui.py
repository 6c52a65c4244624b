"""The built-in web chat served at ``/ui/``.

``register_ui(app)`` mounts a Blueprint named ``motus_ui`` that serves one static page
(``ui/static/index.html``) and its assets. The page is plain HTML, CSS and JavaScript
shipped inside the package: no build step, and it never asks anything of another origin.
It talks to the session API of the same server (``/sessions...``), exactly like any other
client, so it needs nothing from the server beyond that API.

Guarantees:

- ``GET /ui`` redirects to ``/ui/`` (query string kept); ``GET /ui/`` is the page;
  ``GET /ui/<file>`` is an asset from ``ui/static`` and nothing outside it.
- Every response of the blueprint carries a strict Content-Security-Policy: scripts,
  styles, images and requests only from this origin, no inline script, no framing, no
  plugins. Text from the agent or an interrupt payload is inserted as text by the page,
  and the policy is the second line of defence if that ever slips.
- The UI's files are public: they hold no data, and the API key check guards the API
  blueprint only. When the server requires a key, the page asks for it on the first 401
  from the session API, keeps it for the browser tab (``sessionStorage``) and sends it as
  ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, Response, redirect, request, send_from_directory, url_for

#: Name of the blueprint (``request.blueprint`` of the UI's requests).
BLUEPRINT_NAME = "motus_ui"

#: Where the page and its assets live inside the package.
STATIC_DIR = Path(__file__).resolve().parent / "ui" / "static"

#: The page may load and fetch only from its own origin, and run no inline code.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def create_blueprint() -> Blueprint:
    """Build the ``/ui`` blueprint (a fresh one per app, so apps never share state)."""
    blueprint = Blueprint(BLUEPRINT_NAME, __name__, url_prefix="/ui")

    @blueprint.get("")
    def ui_root() -> Response:
        """``/ui`` -> ``/ui/`` so the page's relative asset paths resolve under ``/ui/``."""
        query = request.query_string.decode("latin-1")
        return redirect(url_for(".index") + (f"?{query}" if query else ""), code=308)

    @blueprint.get("/")
    def index() -> Response:
        response = send_from_directory(STATIC_DIR, "index.html")
        # The page is tiny; always revalidate so an upgraded package is picked up at once.
        response.cache_control.no_cache = True
        return response

    @blueprint.get("/<path:filename>")
    def asset(filename: str) -> Response:
        # send_from_directory refuses paths that leave STATIC_DIR (404), so ``..`` is safe.
        response = send_from_directory(STATIC_DIR, filename)
        response.cache_control.no_cache = True
        return response

    @blueprint.after_request
    def secure(response: Response) -> Response:
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return blueprint


def register_ui(app: Flask) -> None:
    """Mount the web chat on ``app`` under ``/ui/``."""
    app.register_blueprint(create_blueprint())
