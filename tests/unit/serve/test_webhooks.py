"""Webhook URLs, addresses and delivery (``motus.serve.webhooks``), against real sockets.

``Receiver`` is a raw HTTP endpoint on loopback whose answer the path picks (``/ok``,
``/redirect``, ``/huge``, ``/drip-head``, ``/drip-body``, ``/hang``, ``/gate``); the
integration tests use it too. Every connection it accepts is recorded, so a test can show that
a refused address was never connected to.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from motus.serve import webhooks
from motus.serve.turns import SessionStatus, TurnEnd
from motus.serve.webhooks import sender as webhook_sender
from motus.serve.webhooks import Allow, WebhookSender, check_token, check_url, deliver, redact, refusal

# -- a raw HTTP endpoint ------------------------------------------------------------------------


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    sni: str | None = None
    at: float = field(default_factory=time.monotonic)


class Receiver:
    """A raw HTTP/1.1 endpoint on ``host`` (loopback). The request path picks the answer:

    - ``/redirect`` 302 to ``/ok``; ``/status/NNN`` that status;
    - ``/huge`` 200 with a 100 MB body written until the client goes away;
    - ``/drip-head`` a status line, then a header byte every 0.1 s, forever;
    - ``/drip-body`` a complete head, then a body byte every 0.1 s, forever;
    - ``/hang`` nothing at all; ``/gate`` 204 once ``release`` is set;
    - anything else 204.

    ``ended[path]`` is when the endpoint saw the client go away (for the endless ones).
    ``close`` stops every loop and joins every thread it started.
    """

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Request] = []
        self.connections = 0
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.release = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._tls = tls
        self._sni = threading.local()  # the handshake runs in the connection's thread
        if tls is not None:
            tls.sni_callback = self._remember_sni
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, name="receiver-accept")
        self._accepter.start()

    def url(self, path: str = "/ok", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def _remember_sni(self, _sock: object, name: str | None, _context: ssl.SSLContext) -> None:
        self._sni.name = name

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                self.connections += 1
                self._cond.notify_all()
            thread = threading.Thread(target=self._serve, args=(conn,), name="receiver-conn")
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            sni = None
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
                sni = getattr(self._sni, "name", None)
            request = self._read(conn)
            if request is None:
                return
            request.sni = sni
            with self._cond:
                self.requests.append(request)
                self.started[request.path] = time.monotonic()
                self._cond.notify_all()
            self._answer(conn, request.path)
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _read(conn: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return Request(path=lines[0].split(" ")[1], headers=headers, body=body)

    def _answer(self, conn: socket.socket, path: str) -> None:
        if path == "/redirect":
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif path.startswith("/status/"):
            conn.sendall(f"HTTP/1.1 {path[8:11]} Whatever\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        elif path == "/huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n")
            self._until_gone(conn, path, b"x" * 65536, 0)
        elif path == "/drip-head":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            self._until_gone(conn, path, b"X", 0.1)
        elif path == "/drip-body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            self._until_gone(conn, path, b"x", 0.1)
        elif path == "/hang":
            self._stop.wait(30)
        elif path == "/gate":
            while not self.release.wait(0.05):
                if self._stop.is_set():
                    return
            conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    def _until_gone(self, conn: socket.socket, path: str, data: bytes, interval: float) -> None:
        conn.settimeout(1)
        try:
            for _ in range(2000):
                if self._stop.wait(interval):
                    return
                conn.sendall(data)
        except OSError:
            with self._cond:
                self.ended[path] = time.monotonic()
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[Receiver], object], timeout: float = 10, what: str = "the receiver") -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: predicate(self), timeout), f"timed out waiting for {what}: {self.requests}"

    def paths(self) -> list[str]:
        with self._cond:
            return [r.path for r in self.requests]

    def close(self) -> None:
        self._stop.set()
        self.release.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._accepter.join(10)
        for thread in self._threads:
            thread.join(10)
        assert not self._accepter.is_alive() and not [t for t in self._threads if t.is_alive()]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


def ended(session_id: str = "s1", url: str = "http://127.0.0.1:9/x", **webhook: object) -> TurnEnd:
    return TurnEnd(
        session_id=session_id,
        status=SessionStatus.IDLE,
        response={"role": "assistant", "content": "done"},
        error=None,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done"}],
        webhook={"url": url, **webhook},
    )


def fake_dns(table: dict[str, list[str]], calls: list[str] | None = None) -> webhooks.Resolver:
    """A resolver answering ``table`` (names not in it resolve for real)."""

    def resolve(host: str, port: int, *args: object) -> list[tuple]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            return socket.getaddrinfo(host, port, *args)  # type: ignore[arg-type]
        found = []
        for address in table[host]:
            if ":" in address:
                found.append((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0)))
            else:
                found.append((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port)))
        return found

    return resolve


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(record.getMessage() for record in caplog.records)


# -- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "target", "host_header"),
    [
        ("http://example.com", "example.com", 80, "/", "example.com"),
        ("HTTPS://Example.COM:8443/a/b?x=1&y=2#frag", "example.com", 8443, "/a/b?x=1&y=2", "example.com:8443"),
        ("http://127.0.0.1:8080/hook", "127.0.0.1", 8080, "/hook", "127.0.0.1:8080"),
        ("http://[::1]:8080/hook", "::1", 8080, "/hook", "[::1]:8080"),
        ("https://[2001:DB8::1]/", "2001:db8::1", 443, "/", "[2001:db8::1]"),
        ("http://user:p%40ss@hooks.example/x", "hooks.example", 80, "/x", "hooks.example"),
        ("http://my_host.internal./x", "my_host.internal.", 80, "/x", "my_host.internal."),
        ("https://bücher.example/ü", "xn--bcher-kva.example", 443, "/%C3%BC", "xn--bcher-kva.example"),
        ("http://localhost:1/", "localhost", 1, "/", "localhost:1"),
    ],
)
def test_check_url_accepts(url: str, host: str, port: int, target: str, host_header: str) -> None:
    checked = check_url(url)
    assert (checked.host, checked.port, checked.target, checked.host_header) == (host, port, target, host_header)


def test_check_url_takes_credentials_apart() -> None:
    checked = check_url("http://us%3Aer:p%40ss@hooks.example/x")
    assert (checked.username, checked.password) == ("us:er", "p@ss")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://a..b/", "'a..b' that is not well-formed: it has an empty label"),
        ("http://.example/", "empty label"),
        ("http://-bad-.example/", "label '-bad-'"),
        ("http://" + "a" * 64 + ".example/", "must be 1-63"),
        ("http://exa$mple.com/", "label 'exa$mple'"),
        ("ftp://example.com/", "must be an http:// or https:// URL"),
        ("javascript:alert(1)", "must be an http:// or https:// URL"),
        ("example.com/hook", "must be an http:// or https:// URL"),
        ("http:example.com", "must be an http:// or https:// URL"),
        ("http:///path", "has no host"),
        ("http://:80/", "has no host"),
        ("http://user@/", "has no host"),
        ("http://example.com:0/", "port '0'"),
        ("http://example.com:65536/", "port '65536'"),
        ("http://example.com:http/", "port 'http'"),
        ("http://1.2.3.256/", "not a valid one"),
        ("http://127.1/", "not a valid one"),
        ("http://0x7f.0.0.1/", "not a valid one"),
        ("http://2130706433/", "not a valid one"),
        ("http://[::1/", "not a well-formed URL"),
        ("http://[zz::1]/", "IPv6 address"),
        ("http://[fe80::1%25eth0]/", "zone id"),
        ("http://::1/", "not in brackets"),
        ("http://[::1]x/", "not a port"),
        ("http://exa mple.com/", "whitespace (' ' at position 10)"),
        ("http://example.com/a b", "whitespace"),
        ("http://example.com/\r\nX-Evil: 1", "whitespace"),
        ("http://example.com/\x00", "control or invisible character (U+0000"),
        ("http://example.com/\x7f", "U+007F"),
        ("http://example.com/\u202e", "U+202E"),
        ("http://example.com/\u200b", "U+200B"),
        ("http://example.com/" + "a" * 2100, "characters long; the limit is 2048"),
        ("http://us\\er@example.com/", "user:password part"),
        ("http://\u2603\u2603..example/", "not a valid international domain name"),
        ("", "must not be empty"),
    ],
)
def test_check_url_refuses_naming_the_problem(url: str, needle: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_url(url)
    assert needle in str(caught.value)


def test_check_url_refuses_non_strings() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        check_url(None)


@pytest.mark.parametrize("token", [None, "abc.DEF-123_~+/=", "with space", "caf\u00e9"])
def test_check_token_accepts(token: str | None) -> None:
    check_token(token)


@pytest.mark.parametrize(("token", "needle"), [("a\r\nX-Evil: 1", "control character"), ("a\x00", "control"), ("\u2603", "ASCII"), (5, "string")])
def test_check_token_refuses(token: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_token(token)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # Never the path either: Slack, Discord and Teams webhooks keep their secret in it.
        ("http://user:s3cret@Hooks.Example:8080/p/a?sig=t0ps3cret#frag", "http://hooks.example:8080/..."),
        ("https://hooks.example/x?token=abc", "https://hooks.example:443/..."),
        ("http://[::1]/x", "http://[::1]:80/..."),
        ("http://us:pw@a..b/p?q=1", "http://a..b/..."),  # not deliverable, still no credentials or query
        ("gopher://us:pw@\x1bx/red", "gopher://\\u001bx/..."),
        (None, "<no URL>"),
    ],
)
def test_redact_keeps_no_credentials_or_query(url: object, shown: str) -> None:
    assert redact(url) == shown


# -- addresses ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "exposed", "allow", "host", "needle"),
    [
        # refused wherever the server is bound, whatever is allowed
        ("169.254.169.254", False, [], "", "link-local"),
        ("169.254.169.254", True, ["169.254.0.0/16"], "", "link-local"),
        ("fe80::1", False, [], "", "link-local"),
        ("fd00:ec2::254", False, ["fd00::/8"], "", "cloud metadata"),
        ("100.100.100.200", False, [], "", "cloud metadata"),
        ("0.0.0.0", False, [], "", "this network"),
        ("0.1.2.3", False, [], "", "this network"),
        ("::", False, [], "", "unspecified"),
        ("224.0.0.1", False, [], "", "multicast"),
        ("ff02::1", False, [], "", "multicast"),
        ("255.255.255.255", False, [], "", "broadcast"),
        ("::ffff:169.254.169.254", False, [], "", "link-local"),
        ("64:ff9b::a9fe:a9fe", False, [], "", "link-local"),
        ("2002:a9fe:a9fe::1", False, [], "", "link-local"),
        ("::7f00:1", False, [], "", "IPv4-compatible"),
        # loopback and private: fine on a loopback-bound server
        ("127.0.0.1", False, [], "", None),
        ("::1", False, [], "", None),
        ("10.1.2.3", False, [], "", None),
        ("192.168.1.1", False, [], "", None),
        # ... refused on an exposed one unless allowed
        ("127.0.0.1", True, [], "", "loopback"),
        ("127.8.9.10", True, [], "", "loopback"),
        ("::1", True, [], "", "loopback"),
        ("::ffff:127.0.0.1", True, [], "", "loopback"),
        ("10.1.2.3", True, [], "", "private"),
        ("172.16.0.1", True, [], "", "private"),
        ("172.31.255.255", True, [], "", "private"),
        ("192.168.1.1", True, [], "", "private"),
        ("fc00::1", True, [], "", "private"),
        ("fd12:3456::1", True, [], "", "private"),
        ("100.64.0.1", True, [], "", "carrier-grade NAT"),
        ("192.0.2.1", True, [], "", "non-global"),
        ("127.0.0.1", True, ["127.0.0.1/32"], "", None),
        ("127.0.0.1", True, ["127.0.0.1"], "", None),
        ("127.0.0.2", True, ["127.0.0.1/32"], "", "loopback"),
        ("10.9.8.7", True, ["10.0.0.0/8"], "", None),
        ("::ffff:10.9.8.7", True, ["10.0.0.0/8"], "", None),
        ("127.0.0.1", True, ["Hooks.Internal"], "hooks.internal", None),
        ("127.0.0.1", True, ["hooks.internal"], "other.internal", "loopback"),
        # public addresses: always fine
        ("8.8.8.8", True, [], "", None),
        ("2606:4700:4700::1111", True, [], "", None),
        ("172.32.0.1", True, [], "", None),
    ],
)
def test_refusal(address: str, exposed: bool, allow: list[str], host: str, needle: str | None) -> None:
    why = refusal(ipaddress.ip_address(address), exposed=exposed, allow=Allow.parse(allow), host=host)
    if needle is None:
        assert why is None
    else:
        assert why is not None and needle in why, why


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "not a host", "a..b", "::1/200"])
def test_bad_allow_entries_are_named(entry: str) -> None:
    with pytest.raises(ValueError, match="--webhook-allow"):
        Allow.parse([entry])


def test_sender_ignores_a_bad_allow_entry_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    sender = WebhookSender(allow=["10.0.0.0/8", "a..b", "Hooks.Example"], exposed=True)
    assert sender.allow.hosts == frozenset({"hooks.example"})
    assert [str(n) for n in sender.allow.networks] == ["10.0.0.0/8"]
    assert "'a..b'" in log_text(caplog)
    sender.close()


# -- one delivery -------------------------------------------------------------------------------


def test_delivers_with_the_original_host_to_the_checked_address(receiver: Receiver) -> None:
    calls: list[str] = []
    url = receiver.url("/hook?x=1", host="hooks.test")
    assert deliver(ended(url=url, token="t0k", include_messages=True), resolver=fake_dns({"hooks.test": ["127.0.0.1"]}, calls))
    [request] = receiver.requests
    assert calls == ["hooks.test"]  # resolved once: the connection went to that answer
    assert request.path == "/hook?x=1"
    assert request.headers["host"] == f"hooks.test:{receiver.port}"
    assert request.headers["authorization"] == "Bearer t0k"
    assert request.headers["content-type"] == "application/json"
    import json

    body = json.loads(request.body)
    assert body["session_id"] == "s1" and body["status"] == "idle" and len(body["messages"]) == 2


def test_credentials_in_the_url_become_basic_auth_and_stay_out_of_the_log(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "motus.serve.webhooks")
    assert deliver(ended(url=receiver.url("/ok?sig=qu3ry").replace("http://", "http://alice:pa55word@")))
    assert receiver.requests[0].headers["authorization"] == "Basic YWxpY2U6cGE1NXdvcmQ="
    assert not deliver(ended(url=receiver.url("/status/500?sig=qu3ry").replace("http://", "http://alice:pa55word@"), token="t0ken"))
    assert receiver.requests[1].headers["authorization"] == "Bearer t0ken"  # the token wins
    text = log_text(caplog)
    assert f"http://127.0.0.1:{receiver.port}/... answered HTTP 500" in text and "/status" not in text
    assert "pa55word" not in text and "alice" not in text and "qu3ry" not in text and "t0ken" not in text


def test_redirects_are_not_followed(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    assert not deliver(ended(url=receiver.url("/redirect")))
    assert receiver.paths() == ["/redirect"]
    assert "answered HTTP 302 (redirects are not followed)" in log_text(caplog)


def test_a_huge_body_is_cut_off_at_64_kib(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    started = time.monotonic()
    assert deliver(ended(url=receiver.url("/huge")))  # the 200 decides
    assert time.monotonic() - started < 5
    assert f"cut off after {webhooks.MAX_RESPONSE_BYTES} bytes" in log_text(caplog)
    receiver.wait_for(lambda r: "/huge" in r.ended, what="the endpoint to see the client go")


@pytest.mark.parametrize(("path", "delivered", "needle"), [("/drip-head", False, "timed out"), ("/drip-body", True, "cut off after 2 s")])
def test_the_deadline_is_in_total_not_per_read(receiver: Receiver, caplog: pytest.LogCaptureFixture, path: str, delivered: bool, needle: str) -> None:
    # A byte every 0.1 s: a per-read timeout would never fire.
    started = time.monotonic()
    assert deliver(ended(url=receiver.url(path)), timeout=2.0) is delivered
    took = time.monotonic() - started
    assert 1.9 < took < 3.0, took
    assert needle in log_text(caplog)
    receiver.wait_for(lambda r: path in r.ended, what="the endpoint to see the client go")


def test_a_silent_endpoint_times_out(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    started = time.monotonic()
    assert not deliver(ended(url=receiver.url("/hang")), timeout=1.0)
    assert time.monotonic() - started < 2.0
    assert "timed out" in log_text(caplog)


@pytest.mark.parametrize(
    ("table", "exposed", "allow", "needle"),
    [
        ({"meta.test": ["169.254.169.254"]}, False, [], "meta.test resolves to 169.254.169.254, a link-local address, refused always"),
        ({"meta.test": ["127.0.0.1"]}, True, [], "meta.test resolves to 127.0.0.1, a loopback address"),
        ({"meta.test": ["8.8.8.8", "127.0.0.1"]}, True, [], "resolves to 127.0.0.1"),  # every address is checked
        ({"meta.test": ["::1"]}, True, ["127.0.0.1/32"], "resolves to ::1, a loopback address"),
        ({"meta.test": ["169.254.169.254"]}, True, ["meta.test", "169.254.0.0/16"], "link-local"),
    ],
)
def test_refused_addresses_are_never_connected_to(
    receiver: Receiver, caplog: pytest.LogCaptureFixture, table: dict, exposed: bool, allow: list[str], needle: str
) -> None:
    url = receiver.url("/ok", host="meta.test")
    assert not deliver(ended(url=url), resolver=fake_dns(table), exposed=exposed, allow=Allow.parse(allow))
    assert " refused: meta.test resolves to " in log_text(caplog) and needle in log_text(caplog)
    assert receiver.connections == 0


def test_address_literals_are_checked_too(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    assert not deliver(ended(url=receiver.url("/ok")), exposed=True)
    assert "refused: 127.0.0.1 is a loopback address" in log_text(caplog)
    assert not deliver(ended(url="http://169.254.169.254/latest/meta-data/"))
    assert "refused: 169.254.169.254 is a link-local address, refused always" in log_text(caplog)
    assert receiver.connections == 0


@pytest.mark.parametrize("allow", [["127.0.0.1/32"], ["hooks.test"], ["HOOKS.TEST."]])
def test_allowed_addresses_are_delivered_to_on_an_exposed_server(receiver: Receiver, allow: list[str]) -> None:
    url = receiver.url("/ok", host="hooks.test")
    assert deliver(ended(url=url), resolver=fake_dns({"hooks.test": ["127.0.0.1"]}), exposed=True, allow=Allow.parse(allow))
    assert receiver.paths() == ["/ok"]


def test_every_address_is_tried_in_turn(receiver: Receiver) -> None:
    # ::1 first (nothing listens there on this port), then 127.0.0.1.
    url = receiver.url("/ok", host="hooks.test")
    assert deliver(ended(url=url), resolver=fake_dns({"hooks.test": ["::1", "127.0.0.1"]}))
    assert receiver.paths() == ["/ok"]


@pytest.mark.parametrize(
    ("webhook", "needle"),
    [
        ({"url": "http://a..b/"}, "not sent: the URL or token has a host 'a..b'"),
        ({"url": None}, "must be a string"),
        ({"url": "http://127.0.0.1:9/", "token": "a\r\nX-Evil: 1"}, "control character"),
    ],
)
def test_unchecked_webhooks_from_older_records_are_not_sent(caplog: pytest.LogCaptureFixture, webhook: dict, needle: str) -> None:
    end = ended()
    end = TurnEnd(**{**end.__dict__, "webhook": webhook})
    assert not deliver(end)
    assert needle in log_text(caplog)
    assert "X-Evil" not in log_text(caplog)


def test_connection_refused_is_a_failed_delivery(caplog: pytest.LogCaptureFixture) -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    assert not deliver(ended(url=f"http://127.0.0.1:{port}/x"))
    assert "cannot connect" in log_text(caplog)


# -- https: connect to the checked address, verify the certificate against the name ----------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA and a certificate for ``hooks.test`` it signed (made with the openssl CLI)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make test certificates")
    folder = tmp_path_factory.mktemp("tls")
    files = {"ca": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    (folder / "leaf.ext").write_text("subjectAltName=DNS:hooks.test\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=motus test CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=hooks.test"],
        ["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "cert.pem", "-days", "2", "-extfile", "leaf.ext"],
    ):
        subprocess.run([openssl, *command], cwd=folder, check=True, capture_output=True, timeout=60)
    return files


@pytest.fixture
def tls_receiver(tls_files: dict[str, Path]) -> Iterator[Receiver]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    receiver = Receiver(tls=context)
    yield receiver
    receiver.close()


def test_https_pins_the_checked_address_and_verifies_the_name(tls_receiver: Receiver, tls_files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    client = ssl.create_default_context(cafile=str(tls_files["ca"]))
    calls: list[str] = []
    dns = fake_dns({"hooks.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}, calls)
    assert deliver(ended(url=tls_receiver.url("/ok", host="hooks.test", scheme="https")), resolver=dns, ssl_context=client)
    [request] = tls_receiver.requests
    assert request.sni == "hooks.test" and request.headers["host"] == f"hooks.test:{tls_receiver.port}"
    assert calls == ["hooks.test"]
    # Same address, a name the certificate does not carry: refused by verification.
    assert not deliver(ended(url=tls_receiver.url("/ok", host="other.test", scheme="https")), resolver=dns, ssl_context=client)
    assert "certificate not valid for other.test" in log_text(caplog)
    # An untrusted issuer (the default context does not know the test CA).
    assert not deliver(ended(url=tls_receiver.url("/ok", host="hooks.test", scheme="https")), resolver=dns)
    assert len(tls_receiver.requests) == 1


# -- the sender ---------------------------------------------------------------------------------


@pytest.fixture
def sender() -> Iterator[WebhookSender]:
    sender = WebhookSender()
    yield sender
    sender.close(timeout=5)
    assert not [t for t in threading.enumerate() if t.name.startswith("motus-webhooks")]


def test_no_exception_of_any_kind_ends_delivery(sender: WebhookSender, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = webhook_sender.deliver
    kinds = iter([KeyError, ValueError, KeyboardInterrupt, SystemExit, MemoryError])

    def flaky(end: TurnEnd, **kwargs: object) -> bool:
        if end.session_id.startswith("bad"):
            raise next(kinds)("x")
        return real(end, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(webhook_sender, "deliver", flaky)  # what the delivery threads call
    for n in range(5):
        sender.send(ended(session_id=f"bad{n}", url=receiver.url(f"/bad{n}")))
    sender.send(ended(session_id="stored", url="http://a..b/"))  # a record from before the checks
    for n in range(5):
        sender.send(ended(session_id="good", url=receiver.url(f"/good{n}")))
    receiver.wait_for(lambda r: len(r.requests) == 5, what="the good deliveries")
    assert receiver.paths() == [f"/good{n}" for n in range(5)]
    text = log_text(caplog)
    for kind in ("KeyError", "ValueError", "KeyboardInterrupt", "SystemExit", "MemoryError"):
        assert f"failed unexpectedly: {kind}" in text
    assert "webhook for session stored to http://a..b/... not sent" in text


def test_a_slow_endpoint_delays_only_its_own_session(sender: WebhookSender, receiver: Receiver) -> None:
    sender.send(ended(session_id="slow", url=receiver.url("/gate")))
    sender.send(ended(session_id="slow", url=receiver.url("/after-gate")))
    receiver.wait_for(lambda r: "/gate" in r.paths(), what="the slow delivery to start")
    for n in range(10):
        sender.send(ended(session_id=f"fast{n % 3}", url=receiver.url(f"/fast{n}")))
    receiver.wait_for(lambda r: len(r.requests) == 11, timeout=5, what="the other sessions' deliveries")
    assert "/after-gate" not in receiver.paths()  # the slow session's next one waits its turn
    fast = [p for p in receiver.paths() if p.startswith("/fast")]
    for session in range(3):  # in order per session
        mine = [p for p in fast if int(p[5:]) % 3 == session]
        assert mine == sorted(mine, key=lambda p: int(p[5:]))
    receiver.release.set()
    receiver.wait_for(lambda r: "/after-gate" in r.paths(), what="the slow session's next delivery")


def test_deliveries_of_one_session_stay_in_order(receiver: Receiver) -> None:
    sender = WebhookSender(threads=4)
    try:
        for n in range(30):
            sender.send(ended(session_id=f"s{n % 2}", url=receiver.url(f"/{n % 2}/{n}")))
        receiver.wait_for(lambda r: len(r.requests) == 30, what="every delivery")
    finally:
        sender.close(timeout=5)
    for session in ("0", "1"):
        numbers = [int(p.split("/")[2]) for p in receiver.paths() if p.split("/")[1] == session]
        assert numbers == sorted(numbers) and len(numbers) == 15


def test_a_full_queue_drops_and_says_so(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    sender = WebhookSender(threads=1, max_queued=2)
    try:
        sender.send(ended(session_id="first", url=receiver.url("/gate")))
        receiver.wait_for(lambda r: r.paths() == ["/gate"], what="the first delivery to start")
        sender.send(ended(session_id="second", url=receiver.url("/2")))
        sender.send(ended(session_id="third", url=receiver.url("/3")))
        sender.send(ended(session_id="dropped", url=receiver.url("/4?sig=s3cret").replace("http://", "http://u:pw@"), token="t0k"))
        text = log_text(caplog)
        assert f"webhook for session dropped to http://127.0.0.1:{receiver.port}/... dropped: 2 deliveries are already queued" in text
        assert "s3cret" not in text and "pw@" not in text and "t0k" not in text
        receiver.release.set()
        receiver.wait_for(lambda r: len(r.requests) == 3, what="the queued deliveries")
    finally:
        sender.close(timeout=5)
    assert receiver.paths() == ["/gate", "/2", "/3"]


def test_close_is_bounded_and_says_what_it_abandoned(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    sender = WebhookSender(threads=2)
    sender.send(ended(session_id="a", url=receiver.url("/hang")))
    sender.send(ended(session_id="b", url=receiver.url("/hang")))
    sender.send(ended(session_id="a", url=receiver.url("/queued?q=secret")))
    receiver.wait_for(lambda r: len(r.requests) == 2, what="two deliveries in progress")
    started = time.monotonic()
    sender.close(timeout=1.0)
    assert time.monotonic() - started < 2.0
    assert not [t for t in threading.enumerate() if t.name.startswith("motus-webhooks")]
    text = log_text(caplog)
    assert f"1 webhook deliveries still queued at shutdown were abandoned: a to http://127.0.0.1:{receiver.port}/..." in text
    assert "2 webhook deliveries in progress at shutdown were cut short" in text
    assert "secret" not in text
    sender.send(ended(session_id="late", url=receiver.url("/late")))
    assert "webhook for session late" in log_text(caplog) and "the server is shutting down" in log_text(caplog)
    assert receiver.paths() == ["/hang", "/hang"]


def test_close_lets_queued_deliveries_finish(receiver: Receiver) -> None:
    sender = WebhookSender(threads=1)
    for n in range(5):
        sender.send(ended(session_id="s", url=receiver.url(f"/{n}")))
    sender.close(timeout=10)
    assert receiver.paths() == [f"/{n}" for n in range(5)]
    assert not [t for t in threading.enumerate() if t.name.startswith("motus-webhooks")]


def test_a_sender_that_never_sent_closes_at_once() -> None:
    started = time.monotonic()
    WebhookSender().close()
    assert time.monotonic() - started < 0.5
