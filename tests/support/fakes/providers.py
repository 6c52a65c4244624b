"""A fake model provider: a real HTTP server on 127.0.0.1 that answers from a script.

``FakeProvider`` runs a ``ThreadingHTTPServer`` in a thread. Each POST it receives is
recorded (path, headers, JSON body) and answered with the next scripted :class:`Reply`;
when the script runs out it answers 400 with a message saying so (400 is not retried,
so a missing reply fails the test quickly instead of looping through retries).

The reply builders produce the two protocols motus speaks:
``openai_text`` / ``openai_tool_calls`` (chat completions) and ``anthropic_text`` /
``anthropic_tool_use`` (Messages API). Nothing here knows about motus: the server only
sees HTTP, so the clients under test are exercised exactly as against the real APIs.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted HTTP answer."""

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    #: When set, the answer is held back until the event is set (a provider that is slow to reply).
    hold: threading.Event | None = None


@dataclass
class Recorded:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: Any


class FakeProvider:
    """A scripted provider server; ``with FakeProvider() as fake: fake.script(...)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: deque[Reply] = deque()
        self._received = threading.Condition(self._lock)
        self.requests: list[Recorded] = []
        #: Replies whose client had hung up before they were written (a turn cancelled or a
        #: worker killed mid-call); counted rather than printed as a traceback.
        self.dropped = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-provider")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def script(self, *replies: Reply | dict[str, Any]) -> None:
        """Queue replies, answered in order; a dict is a 200 JSON reply."""
        with self._lock:
            self._script.extend(r if isinstance(r, Reply) else Reply(r) for r in replies)

    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def wait_for_requests(self, count: int, timeout: float = 20.0) -> list[Recorded]:
        """Block until at least ``count`` requests arrived (fails after ``timeout``)."""
        with self._received:
            if not self._received.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"fake provider got {len(self.requests)} requests, expected {count}")
            return list(self.requests)

    def _answer(self, record: Recorded) -> Reply:
        with self._received:
            self.requests.append(record)
            self._received.notify_all()
            if self._script:
                return self._script.popleft()
            number = len(self.requests)
        return Reply({"error": {"message": f"fake provider: no scripted reply left for request #{number}", "type": "test_script"}}, status=400)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: no lingering threads

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                reply = fake._answer(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if reply.hold is not None:
                    reply.hold.wait(30)
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    with fake._lock:
                        fake.dropped += 1

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                pass

        return Handler


# -- OpenAI chat completions ------------------------------------------------------------


def openai_text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


def openai_tool_calls(*calls: tuple[str, str, dict[str, Any]], content: str | None = None) -> dict[str, Any]:
    """A reply asking for tool calls, each ``(id, name, arguments)``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                        for call_id, name, arguments in calls
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
    }


def openai_error(message: str, status: int, kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> Reply:
    return Reply({"error": {"message": message, "type": kind}}, status=status, headers=headers or {})


# -- Anthropic Messages -----------------------------------------------------------------


def anthropic_text(text: str) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 12, "output_tokens": 4},
    }


def anthropic_tool_use(*calls: tuple[str, str, dict[str, Any]], text: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": call_id, "name": name, "input": arguments} for call_id, name, arguments in calls]
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 30, "output_tokens": 9},
    }


def anthropic_error(message: str, status: int, kind: str = "invalid_request_error") -> Reply:
    return Reply({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``role: tool`` messages of an OpenAI request body."""
    return [m for m in body["messages"] if m.get("role") == "tool"]
