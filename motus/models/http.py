"""JSON over HTTP for the model clients: timeouts, retries with backoff, clean errors.

:class:`JsonTransport` posts one JSON body and returns the decoded JSON reply. What it
guarantees:

* Every request has a connect timeout and a read timeout.
* 429, 5xx, 408 and connection failures (refused, reset, connect timeout) are retried up to
  ``max_retries`` times, waiting ``backoff * 2**attempt`` seconds (capped at
  ``max_backoff``), or the server's ``Retry-After`` when it sends one (capped at
  ``max_retry_after``). A read timeout is not retried: the provider may still be
  working on (and billing) the request.
* Every failure is a :class:`~motus.models.base.ModelError` naming the provider, the
  status and the provider's own message; the API key is scrubbed from every message.

Each call uses its own short-lived ``requests.Session``: nothing is opened at import or
construction time (the agent module is imported before worker processes fork), and no
socket outlives the call.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from motus.models.base import ModelError

log = logging.getLogger(__name__)

__all__ = ["JsonTransport"]

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
        """``text`` with the API key replaced, so no message ever shows it."""
        if self._secret and self._secret in text:
            text = text.replace(self._secret, "***")
        return text

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
        from motus.serve.journal import current, digest

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
                failure = ModelError(
                    f"{self.provider}: could not connect to {self.base_url}: {self.scrub(type(exc).__name__)}",
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
