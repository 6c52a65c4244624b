"""One webhook attempt over plain sockets, pinned to a checked address: ``attempt``.

**Pinned**: the host is resolved once, every address it resolves to is judged by the address
policy (``policy.refusal``), and the connection is then made to a checked address itself
(plain sockets, not a library that would resolve the name again), so DNS cannot swap the
address between check and use. If any resolved address is refused, the attempt is refused
(``Refused``) and nothing is connected to. For https the TLS handshake sends the original host
name (SNI) and the certificate is verified against it (``default_ssl_context``: the system's
CAs plus certifi's). Proxy environment variables are not used.

**Bounded**: no redirects (a 3xx is returned as it is), at most ``MAX_RESPONSE_BYTES`` of the
response read, and one deadline (the ``timeout`` given, ``TIMEOUT_SECONDS`` by default) from
the name lookup to the last byte read: every socket operation gets the time that is left, not
a fresh timeout. Only the status is returned, with a note when the body was cut off. A name
lookup cannot be interrupted; it is bounded by the system resolver's own timeout.

**Cancellable**: ``Cancel.cancel``, from another thread, shuts the attempt's socket down,
waking a blocked connect, send or receive, and the attempt fails with ``DeliveryFailed``.

Failures are raised, never logged: ``DeliveryFailed`` (with a message holding no secret),
``TimeoutError``, ``ssl.SSLError`` or ``OSError``; ``describe`` names the last two for a log
line. The request carries the body as JSON with ``Authorization: Bearer <token>`` when a token
is given, else HTTP basic auth when the URL carries ``user:password@``.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from motus.api.webhook_urls import WebhookURL
from motus.serve.webhooks.policy import Allow, refusal

#: One delivery attempt, from the name lookup to the last byte read, in seconds.
TIMEOUT_SECONDS = 10.0
#: At most this much of a response (headers and body) is read.
MAX_RESPONSE_BYTES = 64 * 1024

Resolver = Callable[..., Sequence[tuple[Any, ...]]]


class DeliveryFailed(Exception):
    """One attempt failed; the message says why (and holds no secret)."""


class Refused(DeliveryFailed):
    """The URL resolves to an address webhooks may not reach."""


class Cancel:
    """Lets another thread (the sender's ``close``) cut an attempt in progress short."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.cancelled = False

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            cancelled = self.cancelled
        if cancelled:
            raise DeliveryFailed("cut short: the server is shutting down")

    def detach(self) -> None:
        with self._lock:
            self._sock = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            sock = self._sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes a blocked recv/send
            except OSError:
                pass


class _Deadline:
    """The time left of one attempt; raises once it is over or the attempt is cancelled."""

    def __init__(self, seconds: float, cancel: Cancel) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.cancel = cancel

    def left(self, sock: socket.socket | None = None) -> float:
        """Seconds left (and set as ``sock``'s timeout), or ``TimeoutError``."""
        if self.cancel.cancelled:
            raise DeliveryFailed("cut short: the server is shutting down")
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if sock is not None:
            sock.settimeout(left)
        return left


_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """Verifying context: the system's CAs plus certifi's (what requests used), once."""
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            context = ssl.create_default_context()
            try:
                import certifi

                context.load_verify_locations(certifi.where())
            except Exception:  # noqa: BLE001 - the system store alone still verifies
                pass
            _ssl_context = context
        return _ssl_context


def describe(exc: BaseException) -> str:
    """``OSError`` or ``ssl.SSLError`` as a log line shows it: its type and reason."""
    name = type(exc).__name__
    reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None)
    return f"{name} ({reason})" if isinstance(reason, str) and reason else name


def attempt(
    url: WebhookURL,
    body: bytes,
    token: str | None,
    allow: Allow,
    exposed: bool,
    timeout: float,
    resolver: Resolver | None,
    ssl_context: ssl.SSLContext | None,
    cancel: Cancel,
    headers: dict[str, str] | None = None,
) -> tuple[int, str | None]:
    """POST ``body`` to ``url`` once, on a policy-checked address, within ``timeout`` seconds
    in all: the final status and, if the body was not read to its end, why. ``headers`` are
    added to the request (the signature). Raises as the module docstring says."""
    deadline = _Deadline(timeout, cancel)
    addresses = _resolve(url, resolver or socket.getaddrinfo)
    deadline.left()
    for family, sockaddr in addresses:
        address = ipaddress.ip_address(sockaddr[0].partition("%")[0])
        why = refusal(address, exposed=exposed, allow=allow, host=url.host)
        if why is not None:
            raise Refused(f"{address} is {why}" if url.ip is not None else f"{url.host} resolves to {address}, {why}")
    sock = _connect(addresses, deadline, cancel)
    try:
        if url.scheme == "https":
            context = ssl_context or default_ssl_context()
            tls = context.wrap_socket(sock, server_hostname=url.host, do_handshake_on_connect=False)
            sock = tls
            cancel.attach(sock)
            deadline.left(sock)
            tls.do_handshake()  # verifies the certificate against url.host, not the address
        _send_all(sock, _request_head(url, token, len(body), headers) + body, deadline)
        return _read_response(sock, deadline)
    finally:
        cancel.detach()
        try:
            sock.close()
        except OSError:
            pass


def _resolve(url: WebhookURL, resolver: Resolver) -> list[tuple[int, tuple[Any, ...]]]:
    flags = socket.AI_NUMERICHOST if url.ip is not None else 0
    try:
        infos = resolver(url.host, url.port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP, flags)
    except socket.gaierror as exc:
        raise DeliveryFailed(f"cannot resolve {url.host} ({exc.strerror})") from None
    seen, found = set(), []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6) or sockaddr[0] in seen:
            continue
        seen.add(sockaddr[0])
        found.append((family, sockaddr))
    if not found:
        raise DeliveryFailed(f"{url.host} resolves to no IPv4 or IPv6 address")
    return found


def _connect(addresses: list[tuple[int, tuple[Any, ...]]], deadline: _Deadline, cancel: Cancel) -> socket.socket:
    errors = []
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            cancel.attach(sock)
            deadline.left(sock)
            sock.connect(sockaddr)
            return sock
        except (OSError, DeliveryFailed) as exc:
            sock.close()
            if isinstance(exc, (TimeoutError, DeliveryFailed)):
                raise
            errors.append(f"{sockaddr[0]}: {describe(exc)}")
    raise DeliveryFailed("cannot connect: " + "; ".join(errors))


def _request_head(url: WebhookURL, token: str | None, length: int, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"POST {url.target} HTTP/1.1",
        f"Host: {url.host_header}",
        "User-Agent: motus-webhooks",
        "Accept: */*",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    elif url.username is not None:
        pair = f"{url.username}:{url.password or ''}".encode("latin-1", errors="replace")
        lines.append("Authorization: Basic " + base64.b64encode(pair).decode("ascii"))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send_all(sock: socket.socket, data: bytes, deadline: _Deadline) -> None:
    view = memoryview(data)
    while view:
        deadline.left(sock)
        sent = sock.send(view[:65536])
        view = view[sent:]


def _read_response(sock: socket.socket, deadline: _Deadline) -> tuple[int, str | None]:
    """The final status and, if the body was not read to its end, why. The head must arrive
    whole within the deadline and the size cap; the body is read until it ends, the cap or the
    deadline, whichever is first (it does not change the outcome)."""
    buffer = b""
    total = 0

    def more() -> bytes:
        nonlocal total
        deadline.left(sock)
        chunk = sock.recv(min(16384, MAX_RESPONSE_BYTES - total))
        total += len(chunk)
        return chunk

    while True:  # the head; interim 1xx heads are skipped
        end = buffer.find(b"\r\n\r\n")
        if end == -1:
            if total >= MAX_RESPONSE_BYTES:
                raise DeliveryFailed(f"response head larger than {MAX_RESPONSE_BYTES} bytes")
            chunk = more()
            if not chunk:
                raise DeliveryFailed("connection closed before a complete response" if total else "connection closed with no response")
            buffer += chunk
            continue
        head, buffer = buffer[:end], buffer[end + 4 :]
        status, headers = _parse_head(head)
        if 100 <= status < 200 and status != 101:
            continue
        break
    if status in (101, 204, 304) or 100 <= status < 200:
        return status, None
    length = headers.get("content-length")
    expected = int(length) if length is not None and length.isdigit() else None
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    got, tail = len(buffer), buffer[-7:]
    while True:
        if expected is not None and got >= expected:
            return status, None
        if chunked and (tail.endswith(b"\r\n0\r\n\r\n") or tail == b"0\r\n\r\n"):
            return status, None
        if total >= MAX_RESPONSE_BYTES:
            return status, f"cut off after {MAX_RESPONSE_BYTES} bytes"
        try:
            chunk = more()
        except (TimeoutError, socket.timeout):
            return status, f"cut off after {deadline.seconds:.0f} s"
        except OSError:
            return status, None  # the body is not needed; the status has arrived
        if not chunk:
            return status, None
        got += len(chunk)
        tail = (tail + chunk)[-7:]


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise DeliveryFailed("malformed response: not an HTTP status line")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
    return int(parts[1]), headers
