"""The ``/ui`` blueprint on its own: routes, headers, and that the page needs nothing from elsewhere."""

from __future__ import annotations

import re

import pytest
from flask import Flask

from motus.serve.ui import CONTENT_SECURITY_POLICY, STATIC_DIR, register_ui


@pytest.fixture
def client():
    app = Flask(__name__)
    register_ui(app)

    @app.get("/sessions")
    def sessions():  # a neighbour route: the blueprint must not add headers to it
        return []

    return app.test_client()


def test_ui_redirects_to_slash_keeping_the_query(client):
    response = client.get("/ui?x=1")
    assert response.status_code == 308
    assert response.headers["Location"] == "/ui/?x=1"
    assert client.get("/ui").headers["Location"] == "/ui/"


def test_index_is_the_page_with_a_strict_policy(client):
    with client.get("/ui/") as response:
        response.direct_passthrough = False
        body = response.get_data()
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    assert b'<script type="module" src="app.js"></script>' in body
    policy = response.headers["Content-Security-Policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "no-cache" in response.headers["Cache-Control"]


@pytest.mark.parametrize(
    ("name", "mimetype"),
    [("app.js", "text/javascript"), ("cards.js", "text/javascript"), ("style.css", "text/css"), ("favicon.svg", "image/svg+xml")],
)
def test_assets_are_served_with_the_policy(client, name, mimetype):
    with client.get(f"/ui/{name}") as response:
        pass
    assert response.status_code == 200
    assert response.mimetype == mimetype
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/../ui.py", "/ui/%2e%2e/ui.py", "/ui/..%2fui.py"])
def test_missing_or_escaping_paths_are_404(client, path):
    assert client.get(path).status_code == 404


def test_other_routes_are_untouched(client):
    response = client.get("/sessions")
    assert response.status_code == 200
    assert "Content-Security-Policy" not in response.headers


def test_static_files_reference_no_other_origin():
    """No CDN, font or any URL with a scheme or ``//`` host: the page works offline."""
    names = sorted(p.name for p in STATIC_DIR.iterdir())
    assert {"index.html", "app.js", "style.css"} <= set(names)
    for path in STATIC_DIR.iterdir():
        text = path.read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), path.name
        assert not re.search(r"""(src|href|url\()\s*=?\s*["']?//""", text), path.name
        assert "@import" not in text, path.name


def test_page_has_no_inline_script_or_handlers():
    html = (STATIC_DIR / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="app.js">']
    assert not re.search(r"\son[a-z]+\s*=", html)
    assert "style=" not in html


def test_script_never_writes_html():
    """Everything from the agent is inserted as text; no module has an HTML sink at all."""
    modules = sorted(STATIC_DIR.glob("*.js"))
    assert len(modules) > 1
    for module in modules:
        script = module.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in script, (module.name, sink)


def test_modules_import_only_modules_that_ship():
    """The page's modules import each other by relative path only, and every import exists:
    a missing file would break the page in every browser, with no build step to catch it."""
    modules = {path.name: path.read_text() for path in STATIC_DIR.glob("*.js")}
    imported = {"app.js"}
    for name, script in modules.items():
        assert "require(" not in script, name
        for target in re.findall(r"""^import\s[^;]*?from\s+["']([^"']+)["'];""", script, flags=re.M | re.S):
            assert target.startswith("./") and "/" not in target[2:], (name, target)
            assert target[2:] in modules, (name, target)
            imported.add(target[2:])
    assert imported == set(modules), f"modules nothing imports: {set(modules) - imported}"
