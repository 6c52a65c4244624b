"""The tests' one HTTP client for their own servers: ``request(method, url, **kwargs)``;
``loopback_session()`` for a test that needs a session of its own.

``requests.get`` and its siblings build a ``Session`` for every call, and a session that
trusts the environment looks every proxy variable up twice a request. Measured against a test
server (``GET /sessions/{id}``, 1,000 requests, three rounds): 2.0-2.4 ms of the test process's
CPU a request that way, 1.3-1.7 ms through this one session. The suite sends tens of thousands.

What stays as it was:

- **A connection a request** (``Connection: close``). A pooled connection left idle for the
  server's keep-alive (5 s) can be closed just as the next POST goes out on it, a reset no
  client avoids without retrying the POST; and several tests count a server's connections.
- **No cookies.** The session's jar accepts none, so nothing one server says reaches
  another (they all live on 127.0.0.1).
- **No proxies.** The environment is not consulted (``trust_env``): tests talk to loopback.

The compatibility tests (``tests/compat``) keep calling ``requests`` directly, as the
reference product's clients do. One session serves every thread: its mutable parts are
urllib3's pools (locked) and the jar (locked, and empty).

**A shorter path for a plain request.** Even through one session, ``requests`` spends
~0.85 ms of CPU a request on its adapters and urllib3 that ``http.client`` does not (measured
against a test server: 1.2-1.3 ms a request against 0.35-0.42 ms). A request with only
``params``, ``json``, ``data``, ``headers`` and ``timeout`` to an ``http://`` URL is prepared
by ``requests`` itself (the same URL, headers and body), sent with ``http.client``, and
answered as a real ``requests.Response`` (status, headers with repeated ones joined as urllib3
joins them, body, encoding, ``url``, ``request``, ``elapsed``); its failures are the
exceptions ``requests`` raises (``ConnectionError``, ``ConnectTimeout``, ``ReadTimeout``).
Anything else (``stream``, ``allow_redirects``, a redirect answered) goes through the session.
"""

from __future__ import annotations

import datetime
import http.client
import time
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers

def loopback_session() -> requests.Session:
    """A session for loopback servers: no proxy lookups, no cookies. It keeps connections
    alive; a test that wants that (the fuzz suite's own client) uses one of its own."""
    session = requests.Session()
    session.trust_env = False
    session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
    return session


_SESSION = loopback_session()
_SESSION.headers["Connection"] = "close"


#: The keyword arguments the shorter path takes; any other sends the request through the session.
_PLAIN = frozenset({"params", "json", "data", "headers", "timeout"})


def request(method: str, url: str, **kwargs: Any) -> requests.Response:
    """``requests.request``, through the shared session (see the module docstring)."""
    if kwargs.keys() <= _PLAIN and url.startswith("http://"):
        response = _plain(method, url, **kwargs)
        if response is not None:
            return response
    return _SESSION.request(method, url, **kwargs)


def _plain(method: str, url: str, headers: dict[str, Any] | None = None, timeout: Any = None, **body: Any) -> requests.Response | None:
    """The request sent with ``http.client``; None for a redirect (the session follows it)."""
    merged = dict(_SESSION.headers)
    merged.update(headers or {})
    prepared = requests.Request(method, url, headers={k: v for k, v in merged.items() if v is not None}, **body).prepare()
    parts = urlsplit(prepared.url)
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=connect)
    try:
        try:
            connection.connect()
        except TimeoutError as exc:
            raise requests.ConnectTimeout(f"{url}: {exc}") from exc
        except OSError as exc:
            raise requests.ConnectionError(f"{url}: {exc}") from exc
        connection.sock.settimeout(read)
        try:
            connection.request(method, target, body=prepared.body, headers=dict(prepared.headers))
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            raise requests.ReadTimeout(f"{url}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise requests.ConnectionError(f"{url}: {exc!r}") from exc
    finally:
        connection.close()
    if 300 <= answer.status < 400 and answer.getheader("Location"):
        return None  # nothing was done: the session sends it again and follows the redirect
    response = requests.Response()
    response.status_code = answer.status
    response.reason = answer.reason
    response.headers = CaseInsensitiveDict()
    for name, value in answer.getheaders():
        response.headers[name] = f"{response.headers[name]}, {value}" if name in response.headers else value
    response._content = content  # noqa: SLF001  (what requests sets once it has read the body)
    response.encoding = get_encoding_from_headers(response.headers)
    response.url = prepared.url
    response.request = prepared
    response.elapsed = datetime.timedelta(seconds=time.perf_counter() - started)
    return response
