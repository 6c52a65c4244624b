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
"""

from __future__ import annotations

from http.cookiejar import DefaultCookiePolicy
from typing import Any

import requests

def loopback_session() -> requests.Session:
    """A session for loopback servers: no proxy lookups, no cookies. It keeps connections
    alive; a test that wants that (the fuzz suite's own client) uses one of its own."""
    session = requests.Session()
    session.trust_env = False
    session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
    return session


_SESSION = loopback_session()
_SESSION.headers["Connection"] = "close"


def request(method: str, url: str, **kwargs: Any) -> requests.Response:
    """``requests.request``, through the shared session (see the module docstring)."""
    return _SESSION.request(method, url, **kwargs)
