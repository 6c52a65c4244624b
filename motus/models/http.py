"""JSON over HTTP for the model clients: timeouts, retries with backoff, clean errors.

:class:`JsonTransport` posts one JSON body and returns the decoded JSON reply. What it
guarantees:

* Every request has a connect timeout and a read timeout.
* A request is retried (up to ``max_retries`` times, waiting ``backoff * 2**attempt``
  seconds capped at ``max_backoff``, or the server's ``Retry-After`` when it sends one,
  capped at ``max_retry_after``) only when a retry cannot bill a generation twice:

  - the connection was never made, so the request cannot have reached the provider:
    connection refused, the host name did not resolve, the connect timed out
    (``requests.ConnectTimeout``, or a ``requests.ConnectionError`` caused by urllib3's
    ``NewConnectionError`` / ``NameResolutionError``);
  - the provider answered 429, 408 or 5xx. This assumes that a provider that answers
    with one of these statuses did not run (or does not bill) the generation, as OpenAI,
    OpenRouter and Anthropic document for rate limits, overload and server errors.

  Anything that fails after the connection was made is **not** retried, because the body
  may already have gone out and the provider may be generating (and billing) it: a
  connection reset or closed before the reply, a read timeout, a broken reply, a TLS
  error. Each call opens a fresh connection, so there is no stale pooled connection whose
  reset would be safe to retry. Such a failure is a :class:`ModelError` saying it was not
  retried; the caller decides whether asking again is worth a possible second bill.
* Every failure is a :class:`~motus.models.base.ModelError` naming the provider, the
  status and the provider's own message. Every message goes through :func:`scrub`, which
  removes the API key (also URL-encoded, and its first or last 8+ characters when a
  provider echoes part of it), any ``Bearer`` token, and anything that looks like a
  provider key (``sk-...``, ``sk-ant-...``, ``or-...``) or a long token after "key",
  "token" or "secret".

Each call uses its own short-lived ``requests.Session``: nothing is opened at import or
construction time (the agent module is imported before worker processes fork), and no
socket outlives the call.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from motus.durable.journal import current, digest
from motus.models.base import ModelError

log = logging.getLogger(__name__)

__all__ = ["JsonTransport", "scrub"]

_RETRY_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class JsonTransport:
    """POST JSON to one provider, with retries; see the module docstring for the guarantees."""

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        headers: Mapping[str, str],
        secret: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._secret = secret
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._sleep = sleep

    def __repr__(self) -> str:  # never show headers: they hold the key
        return f"<JsonTransport {self.provider} {self.base_url}>"

    def scrub(self, text: str) -> str:
        """``text`` without this transport's API key or anything like a secret: see :func:`scrub`."""
        return scrub(text, self._secret)

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            seconds = _parse_retry_after(retry_after)
            if seconds is not None:
                return max(0.0, min(seconds, self.max_retry_after))
        return min(self.max_backoff, self.backoff * (2**attempt))

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``base_url + path``; return the JSON object the provider sent.

        Inside a served turn the call goes through the turn's journal: a replayed turn gets
        the recorded reply and the provider is not asked (or billed) again.
        """
        journal = current()
        if journal is None:
            return self._post(path, body)
        label = f"{self.provider} {path}"
        return journal.call_sync("model", digest([self.base_url, path, body]), label, lambda: self._post(path, body))

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        import requests  # imported on first use: serving a plain function agent never needs it

        url = f"{self.base_url}/{path.lstrip('/')}"
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self._headers}
        attempt = 0
        while True:
            retry_after: str | None = None
            try:
                with requests.Session() as session:
                    response = session.post(url, data=data, headers=headers, timeout=(self.connect_timeout, self.read_timeout))
            except requests.ConnectionError as exc:
                if not request_not_sent(exc):
                    raise ModelError(
                        f"{self.provider}: the connection to {self.base_url} failed once open "
                        f"({self.scrub(_innermost_name(exc))}); not retried, because the request may have "
                        "reached the provider, which may be generating (and billing) a reply",
                        provider=self.provider,
                    ) from None
                failure = ModelError(
                    f"{self.provider}: could not connect to {self.base_url}: {self.scrub(_innermost_name(exc))}",
                    provider=self.provider,
                    retryable=True,
                )
            except requests.Timeout:
                raise ModelError(
                    f"{self.provider}: no reply from {self.base_url} within {self.read_timeout:g}s",
                    provider=self.provider,
                ) from None
            except requests.RequestException as exc:
                raise ModelError(f"{self.provider}: request failed: {self.scrub(str(exc))}", provider=self.provider) from None
            else:
                if response.status_code < 400:
                    return self._decode(response)
                failure = ModelError(
                    f"{self.provider} returned HTTP {response.status_code}: {self.scrub(_error_text(response))}",
                    provider=self.provider,
                    status=response.status_code,
                    retryable=response.status_code in _RETRY_STATUSES,
                )
                retry_after = response.headers.get("Retry-After")
            if not failure.retryable or attempt >= self.max_retries:
                if failure.retryable and self.max_retries:
                    failure.args = (f"{failure.args[0]} (gave up after {attempt + 1} attempts)",)
                raise failure
            delay = self._delay(attempt, retry_after)
            log.warning("%s (attempt %s of %s); retrying in %.2fs", failure, attempt + 1, self.max_retries + 1, delay)
            self._sleep(delay)
            attempt += 1

    def _decode(self, response: Any) -> dict[str, Any]:
        try:
            value = response.json()
        except ValueError:
            raise ModelError(
                f"{self.provider} returned HTTP {response.status_code} with a body that is not JSON: "
                f"{self.scrub(response.text[:200])!r}",
                provider=self.provider,
                status=response.status_code,
            ) from None
        if not isinstance(value, dict):
            raise ModelError(f"{self.provider} returned JSON that is not an object", provider=self.provider)
        return value


def request_not_sent(exc: BaseException) -> bool:
    """True if ``exc`` (from ``requests``) proves the request never reached the server.

    That is a connect that timed out or failed (refused, unreachable, a name that did not
    resolve): urllib3 raises ``ConnectTimeoutError`` (``NewConnectionError`` and
    ``NameResolutionError`` are its subclasses) only while opening the socket, before a
    byte of the request is written. Anything else (a reset, a closed connection, a TLS or
    proxy error, an unknown cause) may have happened after the body went out: False.
    """
    import requests
    from urllib3.exceptions import ConnectTimeoutError

    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, (requests.exceptions.SSLError, requests.exceptions.ProxyError)):
        return False
    for cause in _causes(exc):
        if isinstance(cause, (ConnectTimeoutError, ConnectionRefusedError, socket.gaierror)):
            return True
    return False


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it wraps: in its arguments, its ``reason`` (urllib3's
    ``MaxRetryError``) and its ``__cause__``. Not ``__context__``: an exception that was
    merely being handled nearby proves nothing about this request."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        current = stack.pop()
        if any(current is known for known in seen):
            continue
        seen.append(current)
        reason = getattr(current, "reason", None)
        linked = [*current.args, reason, current.__cause__]
        stack.extend(item for item in linked if isinstance(item, BaseException))
    return seen


def _innermost_name(exc: BaseException) -> str:
    """The class name of the socket error under ``exc`` (``ConnectionResetError``), else of ``exc``."""
    import requests

    causes = [cause for cause in _causes(exc) if isinstance(cause, OSError) and not isinstance(cause, requests.RequestException)]
    return type(causes[-1] if causes else exc).__name__


# --------------------------------------------------------------------------- scrubbing secrets

#: ``Bearer <token>``, whatever the token looks like.
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9\-._~+/]+=*")
#: Provider-style keys (OpenAI ``sk-...``/``sk-proj-...``, Anthropic ``sk-ant-...``, OpenRouter
#: ``sk-or-...``/``or-...``), and a long token after "key", "token", "secret" or "password"
#: (``key=...``, ``"token": "..."``). Group 1 is kept; group 2 is replaced if it looks random.
_KEYLIKE = (
    re.compile(r"(\b)((?:sk|or)-[A-Za-z0-9_\-]{16,})"),
    re.compile(r"(?i)((?:key|token|secret|password)[\s\"'`:=]{1,4})([A-Za-z0-9+/_\-.]{20,}={0,2})"),
)

#: The shortest fragment of the key that is scrubbed when a provider echoes only part of it.
_MIN_FRAGMENT = 8


def scrub(text: str, secret: str | None = None) -> str:
    """``text`` with ``secret`` and anything that looks like a credential replaced by ``***``.

    Removed: the secret itself and its URL-encoded forms; its first or last ``n >= 8``
    characters (a provider that echoes ``sk-proj-****abcd1234``); ``Bearer <token>``;
    provider-style keys (``sk-...``, ``sk-ant-...``, ``or-...``: 16+ characters after the
    dash) and a run of 20+ base64-ish characters after "key", "token", "secret" or
    "password", when they hold a digit or both cases (so words such as
    ``invalid_authentication`` stay). A pure function of its arguments.
    """
    if secret:
        variants = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret), urllib.parse.quote(secret)}
        for variant in sorted(variants, key=len, reverse=True):
            text = text.replace(variant, "***")
        for size in range(len(secret) - 1, _MIN_FRAGMENT - 1, -1):
            for fragment in (secret[:size], secret[-size:]):
                text = text.replace(fragment, "***")
    text = _BEARER.sub(r"\1***", text)
    for pattern in _KEYLIKE:
        text = pattern.sub(_scrub_if_random, text)
    return text


def _scrub_if_random(match: re.Match[str]) -> str:
    token = match.group(2)
    random = any(c.isdigit() for c in token) or (any(c.islower() for c in token) and any(c.isupper() for c in token))
    return match.group(1) + "***" if random else match.group(0)


def _parse_retry_after(value: str) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


def _error_text(response: Any) -> str:
    """The provider's own error message, from ``{"error": {"message": ...}}`` or the raw body."""
    try:
        body = response.json()
    except ValueError:
        text = (response.text or "").strip()
        return text[:500] or (response.reason or "no details")
    return provider_error_message(body) or json.dumps(body)[:500]


def provider_error_message(body: Any) -> str | None:
    """The message of an error object as OpenAI, OpenRouter and Anthropic send it."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        message = error.get("message") or error.get("type")
        kind = error.get("type") or error.get("code")
        if message and kind and str(kind) not in str(message):
            return f"{message} ({kind})"
        return str(message) if message else json.dumps(error)[:500]
    if isinstance(error, str):
        return error
    if isinstance(body.get("message"), str):
        return body["message"]
    return None
