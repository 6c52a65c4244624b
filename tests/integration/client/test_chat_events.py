"""``motus serve chat`` waits on the session's event stream where the server has one, and
long-polls a server without (the reference product, stood in for by a proxy that answers
404 on the events routes and passes everything else to a real server)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.conftest import Server, server_factory, wait_until
from tests.integration.client.terminal import Terminal

AGENT = "tests.agents.ui:agent"  # "gate <path>" runs until <path> exists, then replies "gate opened"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("chat-events")) as start:
        yield start(AGENT)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(*args: str) -> Terminal:
        term = Terminal("serve", "chat", *args)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def open_streams(server: Server) -> int:
    return server.get("/health").json()["open_streams"]


def test_the_chat_waits_on_the_event_stream(server, terminal, tmp_path) -> None:
    gate = tmp_path / "gate"
    chat = terminal(server.url)
    chat.expect_literal("Type /quit")
    before = open_streams(server)
    chat.send(f"gate {gate}")
    wait_until(lambda: open_streams(server) == before + 1, what="the chat's event stream to open")
    gate.touch()
    chat.expect_literal("gate opened")
    wait_until(lambda: open_streams(server) == before, what="the chat's event stream to close")
    chat.send("/quit")
    assert chat.wait_exit() == 0


class _NoEvents(BaseHTTPRequestHandler):
    """Forwards to ``upstream``, except the events routes: 404, as the reference server."""

    upstream = ""
    seen: list[str] = []

    def _forward(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        if self.path.split("?")[0].endswith("/events"):
            body = b'{"detail": "Not Found"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        answer = requests.request(self.command, self.upstream + self.path, data=data, headers=headers, timeout=120)
        self.send_response(answer.status_code)
        for name in ("Content-Type", "Location"):
            if name in answer.headers:
                self.send_header(name, answer.headers[name])
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


def test_the_chat_long_polls_a_server_without_event_streams(server, terminal, tmp_path) -> None:
    handler = type("Handler", (_NoEvents,), {"upstream": server.url, "seen": []})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    proxy.daemon_threads = True
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        gate = tmp_path / "gate"
        chat = terminal(f"http://127.0.0.1:{proxy.server_port}")
        chat.expect_literal("Type /quit")
        chat.send(f"gate {gate}")
        wait_until(lambda: any("wait=true" in line for line in handler.seen), what="a long poll")
        gate.touch()
        chat.expect_literal("gate opened")
        chat.send(f"gate {gate}")  # the second turn goes straight to long polls
        chat.expect_literal("gate opened")
        chat.send("/quit")
        assert chat.wait_exit() == 0
        assert len([line for line in handler.seen if "/events" in line]) == 1, handler.seen
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
