"""Who may talk to the server from a browser: content types, Host names and Origins.

A keyless server on 127.0.0.1 is reachable by every web page its user opens. Three checks,
run before anything else on every request (the web chat's page included), keep those pages
out, while every real client (``requests``/``httpx`` with ``json=``, curl with ``-H
'Content-Type: application/json'``, our client, CLI and web chat) keeps working:

- **Content type.** A request that carries a body must say ``application/json`` (a
  ``+json`` type or a charset parameter is fine): 415 otherwise. A page can send
  ``text/plain`` or a form without a CORS preflight; it cannot send ``application/json``.
- **Host (DNS rebinding).** When the server is bound to a loopback address it answers only
  to loopback names (``localhost``, ``127.0.0.1``, ``[::1]``, any port), plus the names given
  with ``--allowed-host``; otherwise 400. A page whose own name is re-pointed at 127.0.0.1
  is then not "same origin" with anything we serve.
- **Origin.** A request whose ``Origin`` header is present and is not this server's own
  origin (the scheme and the ``Host`` it was sent to) is refused with 403. Browsers send
  ``Origin`` on every cross-site write; non-browser clients do not send it at all.

All three answer before authentication and before the body is read, and change nothing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from werkzeug.datastructures import Headers

from motus.serve.auth import is_loopback
from motus.serve.errors import HostNotAllowed, OriginNotAllowed, UnsupportedMediaType

BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def split_host(value: str) -> str:
    """The host name of a ``Host`` header value, without the port, lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :] if end >= 0 else ""
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return value  # malformed ("[::1", "[::1].evil"): kept whole, so it is no loopback name
        return value[: end + 1]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def has_body(method: str, headers: Headers) -> bool:
    if method not in BODY_METHODS:
        return False
    length = headers.get("Content-Length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "chunked" in headers.get("Transfer-Encoding", "").lower()


def is_json_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_request(method: str, headers: Headers, bound_host: str, allowed_hosts: list[str]) -> None:
    """Raise the error a request from a page that should not reach us deserves, if any."""
    host_header = headers.get("Host", "")
    host = split_host(host_header)
    if is_loopback(bound_host):
        allowed = {name.lower() for name in allowed_hosts}
        if not (is_loopback(host) or host in allowed):
            raise HostNotAllowed(
                f"Host {host_header!r} is not allowed: this server listens on {bound_host} and answers "
                "only to loopback names (localhost, 127.0.0.1, [::1]); add a name with --allowed-host"
            )
    origin = headers.get("Origin")
    if origin is not None and not _same_origin(origin, host_header, allowed_hosts):
        raise OriginNotAllowed(
            f"Origin {origin!r} is not allowed: cross-site requests are refused; this server's "
            f"own pages are served from {host_header}"
        )
    if has_body(method, headers) and not is_json_type(headers.get("Content-Type")):
        given = headers.get("Content-Type") or "none"
        raise UnsupportedMediaType(
            f"Unsupported Content-Type {given!r}: send the body as JSON with 'Content-Type: application/json'"
        )


def _same_origin(origin: str, host_header: str, allowed_hosts: list[str]) -> bool:
    """The page's origin is the host the request was sent to (ports compared with the
    origin's scheme's default), or a name given with ``--allowed-host`` (a proxy that
    rewrites ``Host``). The scheme is not compared: behind a TLS proxy we see plain HTTP."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False  # "null" (sandboxed frames, file: pages) and anything odd
    default_port = "443" if parts.scheme == "https" else "80"
    origin_netloc = _with_port(parts.netloc, default_port)
    if origin_netloc == _with_port(host_header, default_port):
        return True
    return split_host(parts.netloc) in {name.lower() for name in allowed_hosts}


def _with_port(netloc: str, default_port: str) -> str:
    netloc = netloc.strip().lower()
    host = split_host(netloc)
    port = netloc[len(host) + 1 :] if len(netloc) > len(host) + 1 else ""
    return f"{host}:{port or default_port}"
