"""API keys: who may drive (and so approve through) a served agent.

With one or more keys configured, every API request except ``GET /health`` must carry
``Authorization: Bearer <key>``. A missing or wrong key is answered 401 with
``WWW-Authenticate: Bearer`` before the request body is even read, so it changes nothing.

Guarantees:

- The presented key is compared with every configured key using ``hmac.compare_digest``
  (no early exit on the first match), so timing does not reveal which key or how much of one
  matched. Several keys allow rotation: add the new key, move clients, drop the old one.
- Keys never appear in a response, an error message or a log line; ``ApiKeys`` prints as
  the number of keys it holds.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterable

ENV_VAR = "MOTUS_API_KEY"


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()) -> None:
        cleaned = []
        for key in keys:
            key = key.strip()
            if key:
                cleaned.append(key.encode())
        self._keys = tuple(cleaned)

    @classmethod
    def from_sources(cls, keys: Iterable[str] = (), env: dict[str, str] | None = None) -> ApiKeys:
        """Keys given explicitly, else ``MOTUS_API_KEY`` (several may be comma-separated)."""
        given = [key for key in keys if key]
        if given:
            return cls(given)
        raw = (env if env is not None else os.environ).get(ENV_VAR, "")
        return cls(raw.split(","))

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._keys)} keys)"

    def allows(self, authorization: str | None) -> bool:
        """True when auth is off, or the header is ``Bearer <one of the keys>``."""
        if not self._keys:
            return True
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        candidate = presented.strip().encode()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        return matched


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    if host.startswith("[") != host.endswith("]"):
        return False  # "[::1" or "::1]": malformed, never loopback
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") else host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, keys: ApiKeys) -> str | None:
    """The start-up warning for a server anyone on the network can drive, if any."""
    if keys or is_loopback(host):
        return None
    return (
        f"Warning: serving on {host} without an API key: anyone who can reach this port can "
        f"send messages and approve tool calls. Set one with --api-key KEY or {ENV_VAR}=KEY, "
        "and have clients send 'Authorization: Bearer KEY'."
    )
