"""Webhook delivery, off the request path, and kept from reaching where it should not.

When a turn ends in ``idle`` or ``error`` and its message asked for a webhook, the server POSTs
``{"session_id","status","response","error","messages"|null}`` to the URL, with
``Authorization: Bearer <token>`` when a token was given (else HTTP basic auth when the URL
carries ``user:password@``). A webhook may choose its events (``"events": ["interrupted",
"idle", "error"]``; the default is the guide's idle and error); an ``interrupted`` delivery
adds ``"interrupts"``, the turn's pending interrupts. A failed delivery is logged and never
changes the session; there are no retries.

**Signed** when the server has a secret (``--webhook-secret``): the body then also carries
``"timestamp"`` (unix seconds), and the headers ``X-Motus-Timestamp`` (the same number) and
``X-Motus-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes, keyed by the secret>``.
A receiver recomputes the HMAC over the raw body, compares in constant time, and refuses a
timestamp too far from its own clock (the body's timestamp is signed, so it cannot be
replaced to replay an old delivery).

**Checked when the message is posted** (``check_url``, used by the request schema, so a bad
URL is refused with a message naming the problem): http or https only, a well-formed host
(DNS labels, a dotted-quad IPv4 address or a bracketed IPv6 one), a port from 1 to 65535, no
whitespace or control characters, at most ``MAX_URL_LENGTH`` characters. A token may not
hold control characters. Turns recorded before these checks are checked again at delivery.

**Checked at delivery time, on the resolved addresses** (``refusal``): the host is resolved
once, every address it resolves to is checked, and the connection is then made to a checked
address itself (plain sockets, not a library that would resolve the name again), so DNS
cannot swap the address between check and use. For https the TLS handshake sends the
original host name (SNI) and the certificate is verified against it. Always refused:
link-local (169.254.0.0/16, fe80::/10; this covers most cloud metadata endpoints), the
remaining cloud metadata addresses (fd00:ec2::254, 100.100.100.200), 0.0.0.0/8, the
unspecified address, multicast, broadcast and 240.0.0.0/4. When the server is bound to a
non-loopback address (``exposed``), also loopback (127.0.0.0/8, ::1) and private ranges
(10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 and the other non-global ranges), unless
``allow`` (the ``--webhook-allow CIDR|HOST`` server option) covers the address or names the
host (case-insensitively). IPv4 addresses embedded in IPv6 ones (IPv4-mapped, NAT64, 6to4)
are judged as the IPv4 address. If any resolved address is refused the delivery is refused,
and nothing is connected to. Proxy environment variables are not used.

**One attempt is bounded**: no redirects (a 3xx answer is a failed delivery), at most
``MAX_RESPONSE_BYTES`` of the response read, and ``TIMEOUT_SECONDS`` in total from the name
lookup to the last byte read (every socket operation gets the time that is left, not a fresh
timeout). Only the status decides: a 2xx is delivered, anything else failed. A name lookup
cannot be interrupted; it is bounded by the system resolver's own timeout.

**Threads**: deliveries run on at most ``DELIVERY_THREADS`` threads, started as needed, from
a queue of at most ``MAX_QUEUED`` waiting deliveries (past that, a delivery is dropped with a
log line). Deliveries of one session stay in order: a session's next delivery waits until its
previous one is done, and a thread never takes a delivery of a session that is being
delivered to, so a slow endpoint holds one thread and delays only its own session's
deliveries (unless ``DELIVERY_THREADS`` slow endpoints are being waited on at once: each
holds its thread for at most ``TIMEOUT_SECONDS``). Each delivery runs inside a catch-all: no
exception of any kind ends a delivery thread.

**Logs** name the session and the URL as ``scheme://host:port/path`` (``redact``): never the
``user:password@`` part or the query string, and never the token.

``close`` lets queued deliveries finish for a bounded time, then cuts the ones in progress
short, logs what was abandoned, and stops every delivery thread.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import ssl
import threading
import time
import traceback
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import quote, unquote, urlsplit

from motus.serve.events import isoformat
from motus.serve.metrics import NO_METRICS, Hooks

if TYPE_CHECKING:
    from motus.serve.turns import TurnEnd

log = logging.getLogger(__name__)

#: One delivery attempt, from the name lookup to the last byte read, in seconds.
TIMEOUT_SECONDS = 10.0
#: At most this much of a response (headers and body) is read.
MAX_RESPONSE_BYTES = 64 * 1024
#: Longest webhook URL accepted, in characters.
MAX_URL_LENGTH = 2048
#: Deliveries run on at most this many threads at once.
DELIVERY_THREADS = 4
#: Deliveries waiting for a thread; past this, new ones are dropped (and logged).
MAX_QUEUED = 1000
#: How long ``close`` waits, in all, for queued deliveries before giving up on them.
CLOSE_SECONDS = 10.0

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_USERINFO_BAD = re.compile(r"[^A-Za-z0-9\-._~%!$&'()*+,;=:]")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
# Characters left as they are in the request target; everything else is percent-encoded.
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:-._~%"


# -- URLs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookURL:
    """A checked webhook URL, taken apart."""

    scheme: str  # "http" or "https"
    host: str  # as it is resolved and verified: lower case, IDNA-encoded, IPv6 without brackets
    port: int
    target: str  # path and query, percent-encoded, for the request line
    path: str  # path only, for logs
    username: str | None
    password: str | None
    ip: IPAddress | None  # the host, when it is an address literal

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    def redacted(self) -> str:
        host = f"[{self.host}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.host
        # Never the path: Slack, Discord and Teams webhooks keep their secret in it.
        return f"{self.scheme}://{host}:{self.port}/..."


def check_url(url: object) -> WebhookURL:
    """Take ``url`` apart, or raise ``ValueError`` with a message naming what is wrong."""
    if not isinstance(url, str):
        raise ValueError(f"must be a string, got {type(url).__name__}")
    if not url:
        raise ValueError("must not be empty")
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"is {len(url)} characters long; the limit is {MAX_URL_LENGTH}")
    for index, char in enumerate(url):
        if char.isspace():
            raise ValueError(f"contains whitespace ({char!r} at position {index}); percent-encode it")
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise ValueError(f"contains a control or invisible character ({_escape(char)} at position {index})")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise ValueError("must be an http:// or https:// URL")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a well-formed URL: {exc}") from None
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if not at:
        userinfo = ""
    if not hostport:
        raise ValueError("has no host")
    host, port_text = _split_hostport(hostport)
    ascii_host, ip = _check_host(host)
    port = _check_port(port_text, scheme)
    username = password = None
    if userinfo:
        bad = _USERINFO_BAD.search(userinfo)
        if bad:
            raise ValueError(f"has a character {_printable(bad.group())!r} in its user:password part that must be percent-encoded")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user)
        password = unquote(secret) if colon else ""
    path = parts.path or "/"
    target = path + (f"?{parts.query}" if parts.query else "")
    target = quote(target, safe=_TARGET_SAFE)
    return WebhookURL(scheme, ascii_host, port, target, quote(path, safe=_TARGET_SAFE), username, password, ip)


def check_token(token: object) -> None:
    """Raise ``ValueError`` if ``token`` cannot be sent as a bearer token in a header."""
    if token is None:
        return
    if not isinstance(token, str):
        raise ValueError(f"must be a string, got {type(token).__name__}")
    for index, char in enumerate(token):
        if ord(char) < 0x20 or ord(char) == 0x7F or not char.isprintable():
            raise ValueError(f"contains a control character at position {index}")
    try:
        token.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("must be ASCII (or Latin-1) to be sent in a header") from None


def redact(url: object) -> str:
    """``scheme://host:port/path`` of ``url`` for a log line: no credentials, no query."""
    if not isinstance(url, str):
        return "<no URL>"
    try:
        return check_url(url).redacted()
    except ValueError:
        pass
    try:  # not a URL we would deliver to: show what can be shown, escaped
        parts = urlsplit(str(url)[:MAX_URL_LENGTH])
        host = parts.netloc.rpartition("@")[2]
        return _printable(f"{parts.scheme}://{host}/...")[:200]
    except Exception:  # noqa: BLE001 - a log line must not fail
        return "<unparseable URL>"


def _split_hostport(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        end = hostport.find("]")
        if end == -1:
            raise ValueError("has an IPv6 address with no closing ']'")
        host, after = hostport[: end + 1], hostport[end + 1 :]
        if after and not after.startswith(":"):
            raise ValueError(f"has something after the IPv6 address that is not a port: {after!r}")
        return host, after[1:]
    if hostport.count(":") > 1:
        raise ValueError("has an IPv6 address that is not in brackets (write http://[::1]:8080/)")
    host, _, port = hostport.partition(":")
    return host, port


def _check_host(host: str) -> tuple[str, IPAddress | None]:
    if host.startswith("["):
        inner = host[1:-1]
        if "%" in inner:
            raise ValueError("has an IPv6 zone id (like %eth0), which webhooks do not accept")
        try:
            return str(ipaddress.IPv6Address(inner)), ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"has a host {host!r} that is not a valid IPv6 address") from None
    if not host:
        raise ValueError("has no host")
    name = host.lower()
    if not name.isascii():
        try:
            import idna

            name = idna.encode(name, uts46=True).decode("ascii")
        except Exception:  # noqa: BLE001 - idna raises several kinds; all mean the same here
            raise ValueError(f"has a host {_printable(host)!r} that is not a valid international domain name") from None
    bare = name[:-1] if name.endswith(".") else name
    if not bare:
        raise ValueError(f"has a host {host!r} that is not well-formed: it is empty")
    labels = bare.split(".")
    if _NUMERIC_LABEL.match(labels[-1]):
        try:
            ip = ipaddress.IPv4Address(bare)
        except ValueError:
            raise ValueError(f"has a host {host!r} that looks like an IPv4 address but is not a valid one (write four decimal numbers 0-255)") from None
        return str(ip), ip
    if len(bare) > 253:
        raise ValueError(f"has a host name {len(bare)} characters long; the limit is 253")
    for label in labels:
        if not label:
            raise ValueError(f"has a host {_printable(host)!r} that is not well-formed: it has an empty label")
        if not _LABEL.match(label):
            raise ValueError(
                f"has a host {_printable(host)!r} that is not well-formed: label {_printable(label)!r} "
                "must be 1-63 letters, digits, hyphens or underscores, not starting or ending with a hyphen"
            )
    return name, None


def _check_port(text: str, scheme: str) -> int:
    if not text:
        return _DEFAULT_PORTS[scheme]
    if not text.isdigit() or not text.isascii() or not 1 <= int(text) <= 65535:
        raise ValueError(f"has a port {_printable(text)[:20]!r} that is not a number from 1 to 65535")
    return int(text)


def _escape(char: str) -> str:
    return f"U+{ord(char):04X}"


def _printable(text: str) -> str:
    """``text`` with anything that could forge or garble a log line escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)


# -- addresses ----------------------------------------------------------------------------------


def _nets(*cidrs: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c) for c in cidrs]


#: Refused wherever the server is bound, whatever ``allow`` says.
ALWAYS_REFUSED: list[tuple[list[Any], str]] = [
    (_nets("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (_nets("fd00:ec2::254/128", "100.100.100.200/32"), "a cloud metadata address"),
    (_nets("0.0.0.0/8"), "a 'this network' address (0.0.0.0/8)"),
    (_nets("::/128"), "the unspecified address"),
    (_nets("224.0.0.0/4", "ff00::/8"), "a multicast address"),
    (_nets("255.255.255.255/32"), "the broadcast address"),
    (_nets("240.0.0.0/4"), "a reserved address"),
]
#: Refused too when the server is bound to a non-loopback address, unless allowed.
EXPOSED_REFUSED: list[tuple[list[Any], str]] = [
    (_nets("127.0.0.0/8", "::1/128"), "a loopback address"),
    (_nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10"), "a private address"),
    (_nets("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV6_LOOPBACK = ipaddress.ip_address("::1")


@dataclass(frozen=True)
class Allow:
    """What ``--webhook-allow`` lets through: networks, and host names (lower case)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allow:
        """``CIDR`` or address or host name each; ``ValueError`` naming a bad one."""
        networks, hosts = [], set()
        for entry in entries:
            text = str(entry).strip()
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if "/" in text or ":" in text:
                raise ValueError(f"--webhook-allow {text!r} is neither a CIDR, an address nor a host name")
            try:
                name, _ = _check_host(text)
            except ValueError as exc:
                raise ValueError(f"--webhook-allow {text!r}: {exc}") from None
            hosts.add(name.rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def permits(self, host: str, address: IPAddress) -> bool:
        if host.rstrip(".").lower() in self.hosts:
            return True
        return any(address.version == net.version and address in net for net in self.networks)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def refusal(address: IPAddress, *, exposed: bool = False, allow: Allow | None = None, host: str = "") -> str | None:
    """Why a webhook may not be sent to ``address`` (reached through ``host``), or None."""
    allow = allow or Allow()
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        why = refusal(embedded, exposed=exposed, allow=allow, host=host)
        return None if why is None else f"{why} (as {embedded}, embedded in {address})"
    for networks, what in ALWAYS_REFUSED:
        if any(address.version == net.version and address in net for net in networks):
            return f"{what}, refused always"
    if address.version == 6 and address in _IPV4_COMPATIBLE and address != _IPV6_LOOPBACK:
        return "an IPv4-compatible IPv6 address (deprecated), refused always"
    if not exposed or allow.permits(host, address):
        return None
    for networks, what in EXPOSED_REFUSED:
        if any(address.version == net.version and address in net for net in networks):
            return f"{what}, refused because the server is bound to a non-loopback address (allow it with --webhook-allow)"
    if not address.is_global:
        return "a non-global address, refused because the server is bound to a non-loopback address (allow it with --webhook-allow)"
    return None


# -- one delivery -------------------------------------------------------------------------------


class DeliveryFailed(Exception):
    """One attempt failed; the message says why (and holds no secret)."""


class Refused(DeliveryFailed):
    """The URL resolves to an address webhooks may not reach."""


class _Cancel:
    """Lets ``close`` cut a delivery in progress short, from another thread."""

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
    def __init__(self, seconds: float, cancel: _Cancel) -> None:
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


def webhook_body(end: TurnEnd, timestamp: int | None = None) -> dict[str, Any]:
    include = bool(end.webhook and end.webhook.get("include_messages"))
    body: dict[str, Any] = {
        "session_id": end.session_id,
        "status": end.status.value,
        "response": end.response,
        "error": end.error,
        "messages": end.messages if include else None,
    }
    if end.interrupts is not None:  # times as the events and the inbox show them
        body["interrupts"] = [
            {**item, "created_at": isoformat(item.get("created_at")), "expires_at": isoformat(item.get("expires_at"))}
            for item in end.interrupts
        ]
    if timestamp is not None:
        body["timestamp"] = timestamp
    return body


SECRET_ENV_VAR = "MOTUS_WEBHOOK_SECRET"
SIGNATURE_HEADER = "X-Motus-Signature"
TIMESTAMP_HEADER = "X-Motus-Timestamp"


def sign(secret: str, body: bytes) -> str:
    """The ``X-Motus-Signature`` value for ``body``."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def deliver(
    end: TurnEnd,
    *,
    allow: Allow | None = None,
    exposed: bool = False,
    timeout: float = TIMEOUT_SECONDS,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
    cancel: _Cancel | None = None,
    secret: str | None = None,
) -> bool:
    """One attempt to POST ``end``'s webhook (signed when ``secret`` is given); True if
    delivered. Logs every failure; raises nothing it expects (the sender catches the rest)."""
    webhook = end.webhook or {}
    raw_url = webhook.get("url")
    try:
        url = check_url(raw_url)
        check_token(webhook.get("token"))
    except ValueError as exc:
        log.warning("webhook for session %s to %s not sent: the URL or token %s", end.session_id, redact(raw_url), exc)
        return False
    shown = url.redacted()
    timestamp = int(time.time()) if secret else None
    try:
        body = json.dumps(webhook_body(end, timestamp), allow_nan=False).encode("utf-8")
    except (ValueError, TypeError) as exc:
        log.warning("webhook for session %s to %s not sent: the body cannot be encoded as JSON (%s)", end.session_id, shown, type(exc).__name__)
        return False
    started = time.monotonic()
    try:
        signed = {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, body)} if secret else {}
        status, note = _attempt(url, body, webhook.get("token"), allow or Allow(), exposed, timeout, resolver, ssl_context,
                                cancel or _Cancel(), signed)
    except Refused as exc:
        log.warning("webhook for session %s to %s refused: %s", end.session_id, shown, exc)
        return False
    except DeliveryFailed as exc:
        log.warning("webhook for session %s to %s failed: %s", end.session_id, shown, exc)
        return False
    except TimeoutError:
        log.warning("webhook for session %s to %s failed: timed out (%.0f s in total to connect, send and be answered)", end.session_id, shown, timeout)
        return False
    except ssl.SSLCertVerificationError as exc:
        log.warning("webhook for session %s to %s failed: certificate not valid for %s (%s)", end.session_id, shown, url.host, exc.verify_message)
        return False
    except (OSError, ssl.SSLError) as exc:
        log.warning("webhook for session %s to %s failed: %s", end.session_id, shown, _describe(exc))
        return False
    if note:
        log.warning("webhook for session %s to %s: response %s", end.session_id, shown, note)
    if 200 <= status < 300:
        log.debug("webhook for session %s to %s delivered in %.2f s (HTTP %s)", end.session_id, shown, time.monotonic() - started, status)
        return True
    if 300 <= status < 400:
        log.warning("webhook for session %s to %s answered HTTP %s (redirects are not followed)", end.session_id, shown, status)
    else:
        log.warning("webhook for session %s to %s answered HTTP %s", end.session_id, shown, status)
    return False


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None)
    return f"{name} ({reason})" if isinstance(reason, str) and reason else name


def _attempt(
    url: WebhookURL,
    body: bytes,
    token: str | None,
    allow: Allow,
    exposed: bool,
    timeout: float,
    resolver: Resolver | None,
    ssl_context: ssl.SSLContext | None,
    cancel: _Cancel,
    headers: dict[str, str] | None = None,
) -> tuple[int, str | None]:
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


def _connect(addresses: list[tuple[int, tuple[Any, ...]]], deadline: _Deadline, cancel: _Cancel) -> socket.socket:
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
            errors.append(f"{sockaddr[0]}: {_describe(exc)}")
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


# -- the sender ---------------------------------------------------------------------------------


class WebhookSender:
    """Delivers webhooks on a bounded pool of threads, from a bounded queue, in order per
    session (see the module docstring). ``send`` never blocks and never raises."""

    def __init__(
        self,
        allow: list[str] | None = None,
        exposed: bool = False,
        *,
        threads: int = DELIVERY_THREADS,
        max_queued: int = MAX_QUEUED,
        timeout: float = TIMEOUT_SECONDS,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
        secret: str | None = None,
    ) -> None:
        self.secret = secret or None
        self.allow_entries = list(allow or ())
        self.allow = self._parse_allow(self.allow_entries)
        self.exposed = exposed
        self.max_threads = max(1, threads)
        self.max_queued = max(1, max_queued)
        self.timeout = timeout
        self._resolver = resolver
        self._ssl_context = ssl_context
        self._cond = threading.Condition()
        self._pending: dict[str, deque[TurnEnd]] = {}  # per session, in order
        self._ready: deque[str] = deque()  # sessions with pending deliveries and none running
        self._running: dict[str, _Cancel] = {}  # session -> its delivery in progress
        self._queued = 0
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._stop = False
        self.metrics: Hooks = NO_METRICS  # the server's metrics (see metrics.py)

    @staticmethod
    def _parse_allow(entries: list[str]) -> Allow:
        good = []
        for entry in entries:
            try:
                Allow.parse([entry])
                good.append(entry)
            except ValueError as exc:
                log.error("%s; ignored", exc)
        return Allow.parse(good)

    def send(self, end: TurnEnd) -> None:
        if not end.webhook:
            return
        try:
            self._enqueue(end)
        except BaseException as exc:  # noqa: BLE001 - a turn's end must never fail here
            log.error("webhook for session %s not queued: %s", end.session_id, type(exc).__name__)

    def _enqueue(self, end: TurnEnd) -> None:
        with self._cond:
            if self._closing:
                dropped = "the server is shutting down"
            elif self._queued >= self.max_queued:
                dropped = f"{self._queued} deliveries are already queued (the limit)"
            else:
                dropped = None
                self._pending.setdefault(end.session_id, deque()).append(end)
                self._queued += 1
                if end.session_id not in self._running and len(self._pending[end.session_id]) == 1:
                    self._ready.append(end.session_id)
                    self._wake()
        if dropped:
            self.metrics.webhook("dropped")
            log.warning("webhook for session %s to %s dropped: %s", end.session_id, redact(end.webhook.get("url") if end.webhook else None), dropped)

    def _wake(self, coming: int = 0) -> None:
        """Under the lock: see that every ready session has a thread coming for it
        (``coming``: threads about to look for work that are not counted as idle)."""
        if len(self._ready) > self._idle + coming and len(self._threads) < self.max_threads and not self._stop:
            thread = threading.Thread(target=self._run, name=f"motus-webhooks-{len(self._threads) + 1}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._ready and not self._stop:
                    self._cond.wait()
                self._idle -= 1
                if self._stop:
                    return
                session_id = self._ready.popleft()
                end = self._pending[session_id].popleft()
                self._queued -= 1
                cancel = _Cancel()
                self._running[session_id] = cancel
            try:
                delivered = deliver(
                    end, allow=self.allow, exposed=self.exposed, timeout=self.timeout,
                    resolver=self._resolver, ssl_context=self._ssl_context, cancel=cancel, secret=self.secret,
                )
                self.metrics.webhook("delivered" if delivered else "failed")
            except BaseException as exc:  # noqa: BLE001 - nothing may end a delivery thread
                self.metrics.webhook("error")
                log.error("webhook for session %s to %s failed unexpectedly: %s", session_id, _safe_redact(end), type(exc).__name__)
                log.debug("where: %s", "".join(traceback.format_tb(exc.__traceback__)))
            finally:
                with self._cond:
                    del self._running[session_id]
                    if self._pending.get(session_id):
                        self._ready.append(session_id)
                    else:
                        self._pending.pop(session_id, None)
                    self._wake(coming=1)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Let queued deliveries finish for up to ``timeout`` seconds in all, then cut short
        the ones in progress, log what was abandoned, and stop every delivery thread."""
        deadline = time.monotonic() + timeout
        grace = min(1.0, timeout / 2)
        with self._cond:
            if self._stop:
                return
            self._closing = True
            while self._queued or self._running:
                left = deadline - grace - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            abandoned = [end for queue in self._pending.values() for end in queue]
            self._pending.clear()
            self._ready.clear()
            self._queued = 0
            cut = list(self._running.items())
            self._stop = True
            threads = list(self._threads)
            self._cond.notify_all()
        for _session, cancel in cut:
            cancel.cancel()
        if abandoned:
            shown = ", ".join(f"{end.session_id} to {_safe_redact(end)}" for end in abandoned[:10])
            more = f" and {len(abandoned) - 10} more" if len(abandoned) > 10 else ""
            log.warning("%d webhook deliveries still queued at shutdown were abandoned: %s%s", len(abandoned), shown, more)
        if cut:
            log.warning("%d webhook deliveries in progress at shutdown were cut short: sessions %s", len(cut), ", ".join(s for s, _ in cut))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.warning("webhook delivery threads %s did not stop in time", ", ".join(alive))


def _safe_redact(end: TurnEnd) -> str:
    try:
        return redact((end.webhook or {}).get("url"))
    except BaseException:  # noqa: BLE001
        return "<unknown URL>"
