"""The tests' HTTP helper (``tests/support/http.py``): its short path (``http.client``) answers
as ``requests`` would, against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.conftest import refused_url
from tests.support import http


class Handler(BaseHTTPRequestHandler):
    """``/echo`` answers what it got; ``/old`` redirects to ``/echo``; ``/twice`` repeats a
    header; ``/slow`` never answers in time."""

    def _answer(self) -> None:
        if self.path.startswith("/old"):
            self.send_response(308)
            self.send_header("Location", "/echo")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/slow"):
            self.server.release.wait(10)  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "body": self.rfile.read(length).decode(),
                           "content_type": self.headers.get("Content-Type")}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        if self.path.startswith("/twice"):
            self.send_header("X-Seen", "a")
            self.send_header("X-Seen", "b")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_plain_request_is_answered_as_requests_answers_it(url: str) -> None:
    for send in (http.request, requests.request):
        response = send("POST", url + "/echo", params={"wait": "true", "gone": None}, json={"a": [1, "é"]}, timeout=5)
        assert response.status_code == 201 and response.ok
        assert response.json() == {"method": "POST", "path": "/echo?wait=true", "body": '{"a": [1, "\\u00e9"]}',
                                   "content_type": "application/json"}
        assert response.encoding == "utf-8" and response.url == url + "/echo?wait=true"
        assert response.request.method == "POST"


def test_repeated_headers_are_joined_and_a_redirect_is_followed(url: str) -> None:
    assert http.request("GET", url + "/twice", timeout=5).headers["x-seen"] == "a, b"
    moved = http.request("GET", url + "/old", timeout=5)
    assert moved.status_code == 200 and moved.json()["path"] == "/echo" and [r.status_code for r in moved.history] == [308]


def test_failures_are_requests_exceptions(url: str) -> None:
    with refused_url() as refused, pytest.raises(requests.ConnectionError):
        http.request("GET", refused + "/echo", timeout=5)
    with pytest.raises(requests.ReadTimeout):
        http.request("GET", url + "/slow", timeout=0.2)
