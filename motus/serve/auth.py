"""API keys: who may drive (and so approve through) a served agent, and under which name.

With one or more keys configured, every API request except ``GET /health`` must carry
``Authorization: Bearer <key>``. A missing or wrong key is answered 401 with
``WWW-Authenticate: Bearer`` before the request body is even read, so it changes nothing.

A key is written ``SECRET`` (named ``default``), ``NAME=SECRET``, or either followed by
``:read`` (a read-only key: it may list and watch, and gets 403 on anything that writes).
A named key may carry roles: ``NAME=SECRET:ops,finance`` (``read`` among them makes it
read-only). Roles decide who may answer an interrupt whose tool names its approvers
(``@tool(requires_approval=True, approvers=["ops"])``, see ``motus.serve.policy``). The roles
are the text after the secret's last ``:`` when it is a comma-separated list of names; a
bare secret only ever ends in ``:read``, so a bare secret with a ``:`` stays whole.
Two keys with one secret are refused (which name and scope would it be?). The name is
what the audit records as who resolved an interrupt. ``NAME`` is letters, digits, ``_``,
``-`` and ``.``; a bare secret that itself contains ``=`` is read as named only when the part
before the first ``=`` is a valid name and the rest is not empty and does not start with
``=`` (so base64 padding such as ``abc==`` stays a bare secret); write ``default=SECRET`` to
be unambiguous.

Guarantees:

- The presented key is compared with every configured key using ``hmac.compare_digest``
  (no early exit on the first match), so timing does not reveal which key or how much of one
  matched. Several keys allow rotation: add the new key, move clients, drop the old one.
- Keys never appear in a response, an error message or a log line; ``ApiKeys`` prints as
  the number of keys it holds. Names are not secret.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from motus.api.approvers import ANONYMOUS, ROLE  # one caller name and one name syntax for keys and policies

ENV_VAR = "MOTUS_API_KEY"

#: The name of a key given without one, and of every caller on a server without keys.
DEFAULT_NAME = "default"
READ, WRITE = "read", "write"

#: A key's name: the same characters as a role (``motus.api.approvers.ROLE``).
_NAME = ROLE


@dataclass(frozen=True)
class Caller:
    """Who made a request: the key's name, scope and roles."""

    name: str
    scope: str = WRITE
    roles: frozenset[str] = frozenset()

    @property
    def can_write(self) -> bool:
        return self.scope == WRITE


NOBODY_NEEDED = Caller(ANONYMOUS, WRITE)


#: A comma-separated list of roles, as it ends a named key.
_ROLES = re.compile(rf"{ROLE.pattern}(?:,{ROLE.pattern})*")


@dataclass(frozen=True)
class _Key:
    name: str
    secret: bytes
    scope: str
    roles: frozenset[str]


def parse_key(text: str) -> tuple[str, str, str, frozenset[str]]:
    """``(name, secret, scope, roles)`` of one ``--api-key`` value (see the module docstring)."""
    text = text.strip()
    scope = WRITE
    name, eq, rest = text.partition("=")
    named = bool(eq and _NAME.fullmatch(name) and rest and not rest.startswith("="))
    if named:
        secret = rest
    else:
        name, secret = DEFAULT_NAME, text
    roles: frozenset[str] = frozenset()
    head, colon, tail = secret.rpartition(":")
    if colon and head and (tail == "read" or (named and _ROLES.fullmatch(tail))):
        listed = tail.split(",")
        secret, roles = head, frozenset(role for role in listed if role != "read")
        if "read" in listed:
            scope = READ
    return name, secret, scope, roles


def split_keys(raw: str) -> list[str]:
    """The keys of a comma-separated list (``MOTUS_API_KEY``). A piece that is a role name
    right after a key with roles continues that key's roles (``alice=S:ops,finance`` is one
    key), so a key after a key with roles must be written with its name (``NAME=SECRET``)."""
    keys: list[str] = []
    for piece in raw.replace("\n", ",").split(","):
        piece = piece.strip()
        if not piece:
            continue
        if keys and "=" not in piece and ROLE.fullmatch(piece) and parse_key(keys[-1] + "," + piece)[3] > parse_key(keys[-1])[3]:
            keys[-1] += "," + piece
        else:
            keys.append(piece)
    return keys


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()) -> None:
        parsed = []
        for raw in keys:
            if not raw.strip():
                continue
            name, secret, scope, roles = parse_key(raw)
            if secret:
                parsed.append(_Key(name, secret.encode(), scope, roles))
        if any(key.name == ANONYMOUS for key in parsed):
            # The name of every caller on a server without keys: a key so named could not be
            # told from one, in the audit or by an approval policy.
            raise ValueError(f"The API key name {ANONYMOUS!r} is reserved (it names callers on a server without keys); choose another")
        secrets = [key.secret for key in parsed]
        if len(set(secrets)) != len(secrets):
            # Which name and scope would a request get? Refuse rather than pick one.
            raise ValueError("Two API keys have the same secret; give each key a secret of its own")
        self._keys = tuple(parsed)

    @classmethod
    def from_sources(cls, keys: Iterable[str] = (), env: dict[str, str] | None = None) -> ApiKeys:
        """Keys given explicitly, else ``MOTUS_API_KEY`` (several may be comma-separated, see
        ``split_keys``)."""
        given = [key for key in keys if key]
        if given:
            return cls(given)
        raw = (env if env is not None else os.environ).get(ENV_VAR, "")
        return cls(split_keys(raw))

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._keys)} keys)"

    @property
    def names(self) -> list[str]:
        return [key.name for key in self._keys]

    def describe(self) -> str:
        """Each key's name with its scope and roles, never its secret: ``alice, bob (finance),
        viewer (read-only)``, for the start-up log."""
        shown = []
        for key in self._keys:
            notes = (["read-only"] if key.scope == READ else []) + sorted(key.roles)
            shown.append(f"{key.name} ({', '.join(notes)})" if notes else key.name)
        return ", ".join(shown)

    @property
    def roles(self) -> frozenset[str]:
        """Every role some key that may write has (a read-only key answers nothing)."""
        return frozenset(role for key in self._keys if key.scope == WRITE for role in key.roles)

    @property
    def writers(self) -> dict[str, frozenset[str]]:
        """Each name of a key that may write, with its roles. By name: two keys of one name
        (an old and a new secret, during a rotation) are one person, so they count once
        towards a quorum, and one approval of theirs is that person's."""
        named: dict[str, frozenset[str]] = {}
        for key in self._keys:
            if key.scope == WRITE:
                named[key.name] = named.get(key.name, frozenset()) | key.roles
        return named

    def identify(self, authorization: str | None) -> Caller | None:
        """Who the header says the caller is: ``anonymous`` when auth is off, the matching
        key's name and scope, or None for a missing or wrong key."""
        if not self._keys:
            return NOBODY_NEEDED
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return None
        candidate = presented.strip().encode()
        found: _Key | None = None
        for key in self._keys:  # every key is compared: no early exit
            if hmac.compare_digest(candidate, key.secret) and found is None:
                found = key
        return Caller(found.name, found.scope, found.roles) if found is not None else None

    def allows(self, authorization: str | None) -> bool:
        """True when auth is off, or the header is ``Bearer <one of the keys>``."""
        return self.identify(authorization) is not None


@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an address, or a bracketed IPv6 address) is this machine.
    Cached: every request asks it of its ``Host`` header, and parsing an address with
    ``ipaddress`` is most of what the check costs; the cache is bounded, so odd hosts only
    push each other out."""
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
