"""What the HTTP model clients share: the key, the base URL and the :class:`JsonTransport`.

:class:`HttpChatClient` resolves the API key (argument, else ``$<api_key_env>``; missing:
:class:`~motus.models.base.ModelError` at construction) and the base URL (argument, else
``$<base_url_env>``, else ``default_base_url``), and builds the transport from the
timeout and retry arguments. A subclass sets the four class attributes, says which
headers carry the key in :meth:`~HttpChatClient._auth_headers` and implements ``chat``.
The key is only ever in the transport's headers and scrub secret: never in a repr.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from motus.models.base import ModelError
from motus.models.http import JsonTransport

__all__ = ["HttpChatClient", "resolve_key"]


def resolve_key(api_key: str | None, env_var: str, provider: str) -> str:
    key = api_key if api_key is not None else os.environ.get(env_var, "")
    if not key.strip():
        raise ModelError(f"{provider} API key missing: set {env_var} or pass api_key=", provider=provider)
    return key.strip()


class HttpChatClient:
    """Base of the model clients; arguments as documented on :class:`~motus.models.OpenAIChatClient`."""

    provider: str
    api_key_env: str
    base_url_env: str
    default_base_url: str

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        headers: Mapping[str, str] | None = None,
        **defaults: Any,
    ) -> None:
        key = resolve_key(api_key, self.api_key_env, self.provider)
        self.base_url = (base_url or os.environ.get(self.base_url_env) or self.default_base_url).rstrip("/")
        self.defaults = defaults
        self.transport = JsonTransport(
            provider=self.provider,
            base_url=self.base_url,
            headers={**self._auth_headers(key), **(headers or {})},
            secret=key,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_retry_after=max_retry_after,
            sleep=sleep,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def _auth_headers(self, key: str) -> dict[str, str]:
        """The provider's headers (the key among them), before the caller's ``headers``."""
        raise NotImplementedError
