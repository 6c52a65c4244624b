"""Webhook URLs and tokens taken apart and checked for syntax, before anything is resolved.

Part of the HTTP API's shared vocabulary (:mod:`motus.api`): the request schema
(:mod:`motus.api.schemas`) applies these checks when a message is posted, in the server and in
the client alike, and the server's webhook delivery (``motus.serve.webhooks``) applies them
again at delivery, to turns recorded before these checks. It imports neither the server
(``motus.serve``) nor the client (``motus.client``).

**What ``check_url`` accepts** (anything else is a ``ValueError`` whose message names the
problem): http or https only, a well-formed host (DNS labels, a dotted-quad IPv4 address or a
bracketed IPv6 one; an international name is IDNA-encoded), a port from 1 to 65535, no
whitespace or control characters, at most ``MAX_URL_LENGTH`` characters, and a
``user:password@`` part only of characters that need no encoding. ``check_token``: a token may
not hold control characters and must fit in a header (Latin-1).

Which addresses the host may resolve to is not decided here: that is the delivery's address
policy (``motus.serve.webhooks.policy``), on the resolved addresses.

**Logs** show a URL as ``redact`` makes it: ``scheme://host:port/...``, never the
``user:password@`` part, the path or the query string.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Union
from urllib.parse import quote, unquote, urlsplit

#: Longest webhook URL accepted, in characters.
MAX_URL_LENGTH = 2048

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_USERINFO_BAD = re.compile(r"[^A-Za-z0-9\-._~%!$&'()*+,;=:]")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
# Characters left as they are in the request target; everything else is percent-encoded.
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:-._~%"


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
    ascii_host, ip = check_host(host)
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


def check_host(host: str) -> tuple[str, IPAddress | None]:
    """``host`` (from a URL, or bracketed IPv6) as it is resolved and verified, and its
    address when it is an address literal; or ``ValueError`` naming what is wrong."""
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
