"""Model clients against real HTTP servers on loopback speaking each provider's protocol."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
import requests
from urllib3.exceptions import MaxRetryError, NameResolutionError, NewConnectionError, ProtocolError

from motus.models import AnthropicChatClient, ChatMessage, ModelError, OpenAIChatClient, OpenRouterChatClient
from motus.models.http import request_not_sent, scrub
from motus.models.messages import FunctionCall, ToolCall
from tests.conftest import refused_url
from tests.support.fakes.fixtures import fake_provider  # noqa: F401 - fixture
from tests.support.fakes.providers import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_text,
    anthropic_tool_use,
    openai_error,
    openai_text,
    openai_tool_calls,
)

KEY = "sk-test-0123456789-secret"
TOOL = {"name": "delete_file", "description": "Delete a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}

HISTORY = [
    ChatMessage.system_message("Be brief."),
    ChatMessage.user_message("delete a.txt", user_params={"tenant": "x"}),
    ChatMessage.assistant_message(None, tool_calls=[ToolCall(id="call_1", function=FunctionCall(name="delete_file", arguments='{"path": "a.txt"}'))]),
    ChatMessage.tool_message('{"error": "User rejected delete_file"}', tool_call_id="call_1", name="delete_file"),
]


class Sleeps(list):
    """Records the backoff delays a client asked for instead of waiting them out."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def openai(fake: FakeProvider, **kwargs: object) -> OpenAIChatClient:
    kwargs.setdefault("sleep", Sleeps())
    return OpenAIChatClient(api_key=KEY, base_url=fake.url, **kwargs)  # type: ignore[arg-type]


# -- OpenAI ---------------------------------------------------------------------------------


def test_openai_request_and_reply(fake_provider: FakeProvider) -> None:
    fake_provider.script(openai_tool_calls(("call_2", "delete_file", {"path": "b.txt"}), content="Trying b."))
    completion = openai(fake_provider, temperature=0).chat(model="gpt-test", messages=HISTORY, tools=[TOOL])

    request = fake_provider.requests[0]
    assert request.path == "/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "model": "gpt-test",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "delete a.txt"},  # user_params never leave motus
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "delete_file", "arguments": '{"path": "a.txt"}'}}]},
            {"role": "tool", "content": '{"error": "User rejected delete_file"}', "tool_call_id": "call_1"},
        ],
        "tools": [{"type": "function", "function": TOOL}],
    }
    assert completion.message == ChatMessage.assistant_message(
        "Trying b.", tool_calls=[ToolCall(id="call_2", function=FunctionCall(name="delete_file", arguments='{"path": "b.txt"}'))]
    )
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (20, 7, 27)
    assert completion.finish_reason == "tool_calls"


def test_images_are_sent_as_content_parts(fake_provider: FakeProvider) -> None:
    fake_provider.script(openai_text("a cat"))
    openai(fake_provider).chat(model="m", messages=[ChatMessage.user_message("what is it?", base64_image="AAAA")])
    assert fake_provider.requests[0].body["messages"][0]["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]


def test_key_and_base_url_come_from_the_environment(fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_provider.url + "/")
    fake_provider.script(openai_text("hi"))
    assert OpenAIChatClient().chat(model="m", messages=[ChatMessage.user_message("hi")]).message.content == "hi"
    assert fake_provider.requests[0].headers["authorization"] == "Bearer env-key"


@pytest.mark.parametrize(
    ("client_class", "variable"),
    [(OpenAIChatClient, "OPENAI_API_KEY"), (OpenRouterChatClient, "OPENROUTER_API_KEY"), (AnthropicChatClient, "ANTHROPIC_API_KEY")],
)
def test_a_missing_key_is_a_clear_error(client_class: type, variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ModelError, match=f"API key missing: set {variable} or pass api_key="):
        client_class()
    monkeypatch.setenv(variable, "  ")
    with pytest.raises(ModelError, match=variable):
        client_class()


def test_openrouter_defaults_and_headers(fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    monkeypatch.delenv("OPENROUTER_BASE_URL", raising=False)
    assert OpenRouterChatClient().base_url == "https://openrouter.ai/api/v1"
    monkeypatch.setenv("OPENROUTER_BASE_URL", fake_provider.url)
    fake_provider.script(openai_text("hi"))
    OpenRouterChatClient(app_url="https://example.test").chat(model="anthropic/claude-sonnet-4", messages=[ChatMessage.user_message("hi")])
    headers = fake_provider.requests[0].headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["x-title"] == "motus" and headers["http-referer"] == "https://example.test"


def test_provider_errors_carry_the_message_never_the_key(fake_provider: FakeProvider) -> None:
    fake_provider.script(openai_error(f"Incorrect API key provided: {KEY}", 401, "invalid_api_key"))
    with pytest.raises(ModelError) as caught:
        openai(fake_provider).chat(model="m", messages=[ChatMessage.user_message("hi")])
    text = str(caught.value)
    assert "OpenAI returned HTTP 401: Incorrect API key provided: ***" in text and "invalid_api_key" in text
    assert KEY not in text and KEY not in repr(caught.value)
    assert caught.value.status == 401
    assert len(fake_provider.requests) == 1  # a 4xx other than 429 is not retried


def test_an_error_object_in_a_200_reply_is_an_error(fake_provider: FakeProvider) -> None:
    fake_provider.script({"error": {"message": "No endpoints found for model x", "code": 404}})
    with pytest.raises(ModelError, match="OpenAI returned an error: No endpoints found for model x"):
        openai(fake_provider).chat(model="x", messages=[ChatMessage.user_message("hi")])


def test_a_reply_that_is_not_json_is_an_error(fake_provider: FakeProvider) -> None:
    fake_provider.script(Reply(b"<html>gateway</html>"))
    with pytest.raises(ModelError, match="not JSON"):
        openai(fake_provider).chat(model="m", messages=[ChatMessage.user_message("hi")])


def test_429_honours_retry_after_capped(fake_provider: FakeProvider) -> None:
    sleeps = Sleeps()
    fake_provider.script(
        openai_error("Rate limit reached", 429, "rate_limit", headers={"Retry-After": "2"}),
        openai_error("Rate limit reached", 429, "rate_limit", headers={"Retry-After": "3600"}),
        openai_text("finally"),
    )
    client = openai(fake_provider, sleep=sleeps, max_retry_after=5)
    assert client.chat(model="m", messages=[ChatMessage.user_message("hi")]).message.content == "finally"
    assert sleeps == [2.0, 5.0]
    assert len(fake_provider.requests) == 3


def test_5xx_backs_off_exponentially_then_gives_up(fake_provider: FakeProvider) -> None:
    sleeps = Sleeps()
    fake_provider.script(*[openai_error("upstream overloaded", status, "server_error") for status in (500, 502, 503)])
    client = openai(fake_provider, sleep=sleeps, max_retries=2, backoff=0.25)
    with pytest.raises(ModelError, match=r"HTTP 503: upstream overloaded .*\(gave up after 3 attempts\)") as caught:
        client.chat(model="m", messages=[ChatMessage.user_message("hi")])
    assert caught.value.retryable
    assert sleeps == [0.25, 0.5]
    assert len(fake_provider.requests) == 3


def test_connection_errors_are_retried_then_reported() -> None:
    sleeps = Sleeps()
    with refused_url() as base_url:
        client = OpenAIChatClient(api_key=KEY, base_url=base_url, sleep=sleeps, max_retries=2, backoff=0.01)
        with pytest.raises(ModelError, match=f"could not connect to {base_url}: ConnectionRefusedError") as caught:
            client.chat(model="m", messages=[ChatMessage.user_message("hi")])
    assert caught.value.retryable
    assert sleeps == [0.01, 0.02]
    assert KEY not in str(caught.value)


class RawProvider:
    """A loopback TCP server that reads each whole HTTP request, then does what ``mode`` says:

    - ``ok``: answers 200 with an OpenAI reply;
    - ``reset``: resets the connection (RST) without answering;
    - ``close``: closes the connection (FIN) without answering;
    - ``partial``: sends the status line, headers and half the body, then closes.

    Made with ``listening=False`` its port is bound but refuses connections until
    :meth:`listen` is called. ``requests`` counts the requests read whole.
    """

    def __init__(self, mode: str, *, listening: bool = True) -> None:
        self.mode = mode
        self.requests = 0
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._thread: threading.Thread | None = None
        if listening:
            self.listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def listen(self) -> None:
        if self._thread is None:
            self._socket.listen(8)
            self._thread = threading.Thread(target=self._serve, name="raw-provider")
            self._thread.start()

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept() below
        except OSError:
            pass  # never listened
        self._socket.close()
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            with conn:
                if not self._read_request(conn):
                    continue
                self.requests += 1
                self._answer(conn)

    @staticmethod
    def _read_request(conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def _answer(self, conn: socket.socket) -> None:
        body = json.dumps(openai_text("ok")).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        if self.mode == "ok":
            conn.sendall(head + body)
        elif self.mode == "partial":
            conn.sendall(head + body[: len(body) // 2])
        elif self.mode == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
        # "close": the with block closes it


@pytest.fixture
def raw_provider() -> Iterator[Callable[..., RawProvider]]:
    made: list[RawProvider] = []

    def make(mode: str, **kwargs: bool) -> RawProvider:
        made.append(RawProvider(mode, **kwargs))
        return made[-1]

    yield make
    for provider in made:
        provider.close()


def test_a_refused_connection_is_retried_and_the_retry_can_succeed(raw_provider) -> None:
    provider = raw_provider("ok", listening=False)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # between the attempts, the provider comes up
        sleeps.append(seconds)
        provider.listen()

    client = OpenAIChatClient(api_key=KEY, base_url=provider.url, sleep=sleep, max_retries=3, backoff=0.01)
    assert client.chat(model="m", messages=[ChatMessage.user_message("hi")]).message.content == "ok"
    assert sleeps == [0.01]
    assert provider.requests == 1


@pytest.mark.parametrize("mode", ["reset", "close", "partial"])
def test_a_failure_after_the_request_was_sent_is_not_retried(raw_provider, mode: str) -> None:
    """The provider read the whole request, then the connection broke: asking again could
    bill the generation twice, so the client reports it instead of retrying."""
    provider = raw_provider(mode)
    sleeps = Sleeps()
    client = OpenAIChatClient(api_key=KEY, base_url=provider.url, sleep=sleeps, max_retries=3, backoff=0.01)
    with pytest.raises(ModelError) as caught:
        client.chat(model="m", messages=[ChatMessage.user_message("hi")])
    assert not caught.value.retryable
    assert sleeps == []
    assert provider.requests == 1
    assert "gave up" not in str(caught.value) and KEY not in str(caught.value)
    if mode == "reset":
        assert "not retried" in str(caught.value) and "ConnectionResetError" in str(caught.value)


def _connection_error(reason: BaseException) -> requests.ConnectionError:
    return requests.ConnectionError(MaxRetryError(None, "/chat/completions", reason))  # type: ignore[arg-type]


def test_only_errors_that_prove_the_request_was_not_sent_count_as_not_sent() -> None:
    refused = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    dns = NameResolutionError("api.example.test", None, socket.gaierror(-2, "Name or service not known"))  # type: ignore[arg-type]
    assert request_not_sent(_connection_error(refused))
    assert request_not_sent(_connection_error(dns))
    assert request_not_sent(requests.ConnectTimeout("connect timed out"))

    reset = requests.ConnectionError(ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer")))
    assert not request_not_sent(reset)
    assert not request_not_sent(requests.ConnectionError("something unknown"))
    assert not request_not_sent(requests.exceptions.SSLError(_connection_error(refused)))
    assert not request_not_sent(requests.ReadTimeout("read timed out"))


# -- scrub ----------------------------------------------------------------------------------

SECRET = "sk-proj-AbCdEf0123456789GhIjKl/+xyz=="


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Incorrect API key provided: {SECRET}.", "Incorrect API key provided: ***."),
        (f"GET /v1?key={quote(SECRET, safe='')} failed", "GET /v1?key=*** failed"),
        (f"echoed {quote(SECRET)}!", "echoed ***!"),
        # OpenAI's way of echoing a key: its first and last characters around asterisks.
        ("Incorrect API key provided: sk-proj-AbCd**************Kl/+xyz==.", "Incorrect API key provided: ***" + "*" * 14 + "***."),
        (f"key starts {SECRET[:8]}, ends {SECRET[-8:]}", "key starts ***, ends ***"),
        (f"too short to tell: {SECRET[:7]} {SECRET[-7:]}", f"too short to tell: {SECRET[:7]} {SECRET[-7:]}"),
        ("header was Authorization: Bearer eyJhbGciOi.J9x_y-z~+/== (rejected)", "header was Authorization: Bearer *** (rejected)"),
        ("bearer t0k", "bearer ***"),
        ("another key sk-ant-api03-Zx9_Yw8-Vu7Ts6Rq5Po4 is not yours", "another key *** is not yours"),
        ("OpenRouter: sk-or-v1-0123456789abcdef0123 and or-0123456789abcdef0123", "OpenRouter: *** and ***"),
        ('{"api_key": "AIzaSyD-1234567890abcdefghij"}', '{"api_key": "***"}'),
        ("token=QWxhZGRpbjpvcGVuIHNlc2FtZQ== expired", "token=*** expired"),
        # Words, not secrets: left alone.
        ("token: invalid_authentication_credentials", "token: invalid_authentication_credentials"),
        ("ask for help with scikit-learn or sk-learn", "ask for help with scikit-learn or sk-learn"),
        ("max_tokens: must be positive", "max_tokens: must be positive"),
    ],
)
def test_scrub_removes_the_key_and_anything_like_a_secret(text: str, expected: str) -> None:
    assert scrub(text, SECRET) == expected


def test_scrub_without_a_key_still_removes_secrets_and_is_pure() -> None:
    assert scrub("Bearer abc.def sk-ant-api03-Zx9_Yw8-Vu7Ts6Rq5Po4", None) == "Bearer *** ***"
    assert scrub("nothing to hide", None) == "nothing to hide"
    text = f"x {SECRET} y"
    assert scrub(text, SECRET) == scrub(text, SECRET) == "x *** y"
    assert text == f"x {SECRET} y"


def test_provider_errors_scrub_a_partly_echoed_key(fake_provider: FakeProvider) -> None:
    fake_provider.script(openai_error(f"Incorrect API key provided: {KEY[:10]}****{KEY[-8:]}", 401, "invalid_api_key"))
    with pytest.raises(ModelError) as caught:
        openai(fake_provider).chat(model="m", messages=[ChatMessage.user_message("hi")])
    assert str(caught.value) == "OpenAI returned HTTP 401: Incorrect API key provided: ***" + "****" + "*** (invalid_api_key)"


def test_a_read_timeout_is_an_error_and_not_retried(fake_provider: FakeProvider) -> None:
    release = threading.Event()
    fake_provider.script(Reply(openai_text("too late"), hold=release))
    client = openai(fake_provider, read_timeout=0.2)
    try:
        with pytest.raises(ModelError, match="no reply from .* within 0.2s"):
            client.chat(model="m", messages=[ChatMessage.user_message("hi")])
    finally:
        release.set()
    assert len(fake_provider.requests) == 1


# -- Anthropic ------------------------------------------------------------------------------


def anthropic(fake: FakeProvider, **kwargs: object) -> AnthropicChatClient:
    kwargs.setdefault("sleep", Sleeps())
    return AnthropicChatClient(api_key=KEY, base_url=fake.url, **kwargs)  # type: ignore[arg-type]


def test_anthropic_request_conversion(fake_provider: FakeProvider) -> None:
    history = [
        *HISTORY,
        ChatMessage.assistant_message(
            "Two at once.",
            tool_calls=[
                ToolCall(id="call_3", function=FunctionCall(name="delete_file", arguments='{"path": "c"}')),
                ToolCall(id="call_4", function=FunctionCall(name="delete_file", arguments='{"path": "d"}')),
            ],
        ),
        ChatMessage.tool_message("Deleted c", tool_call_id="call_3", name="delete_file"),
        ChatMessage.tool_message("Deleted d", tool_call_id="call_4", name="delete_file"),
        ChatMessage.user_message("thanks"),
    ]
    fake_provider.script(anthropic_text("Done."))
    anthropic(fake_provider, max_tokens=512).chat(model="claude-test", messages=history, tools=[TOOL], temperature=0)

    request = fake_provider.requests[0]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY and request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body == {
        "model": "claude-test",
        "max_tokens": 512,
        "temperature": 0,
        "system": "Be brief.",
        "tools": [{"name": "delete_file", "description": "Delete a file.", "input_schema": TOOL["parameters"]}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "delete a.txt"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "delete_file", "input": {"path": "a.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": '{"error": "User rejected delete_file"}', "is_error": True}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Two at once."},
                    {"type": "tool_use", "id": "call_3", "name": "delete_file", "input": {"path": "c"}},
                    {"type": "tool_use", "id": "call_4", "name": "delete_file", "input": {"path": "d"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_3", "content": "Deleted c"},
                    {"type": "tool_result", "tool_use_id": "call_4", "content": "Deleted d"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
    }


def test_anthropic_reply_becomes_tool_calls(fake_provider: FakeProvider) -> None:
    fake_provider.script(anthropic_tool_use(("toolu_1", "delete_file", {"path": "x"}), ("toolu_2", "delete_file", {"path": "y"}), text="Deleting."))
    completion = anthropic(fake_provider).chat(model="claude-test", messages=[ChatMessage.user_message("go")], tools=[TOOL])
    assert completion.message.content == "Deleting."
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in completion.message.tool_calls or []] == [
        ("toolu_1", "delete_file", {"path": "x"}),
        ("toolu_2", "delete_file", {"path": "y"}),
    ]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (30, 9)
    assert completion.finish_reason == "tool_use"


def test_anthropic_errors_and_overload_retry(fake_provider: FakeProvider) -> None:
    sleeps = Sleeps()
    fake_provider.script(anthropic_error("Overloaded", 529, "overloaded_error"), anthropic_text("ok"))
    assert anthropic(fake_provider, sleep=sleeps).chat(model="c", messages=[ChatMessage.user_message("hi")]).message.content == "ok"
    assert len(sleeps) == 1

    fake_provider.script(anthropic_error("max_tokens: must be positive", 400))
    with pytest.raises(ModelError, match=r"Anthropic returned HTTP 400: max_tokens: must be positive \(invalid_request_error\)"):
        anthropic(fake_provider).chat(model="c", messages=[ChatMessage.user_message("hi")])
