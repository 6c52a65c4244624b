"""Webhook delivery, off the request path, and kept from reaching where it should not.

When a turn ends (or is interrupted, if the webhook asks for that) and its message asked for a
webhook, the server POSTs the outcome to the webhook's URL, signed when it has a secret. The
pieces, each with its own guarantees:

- :mod:`motus.api.webhook_urls`: the URL and token checks (syntax only), shared with the
  request schema, so a bad URL is refused when the message is posted; re-exported here.
- :mod:`.policy`: which resolved addresses a delivery may reach (``refusal``, ``Allow``, the
  refused networks), tighter when the server is bound to a non-loopback address.
- :mod:`.transport`: one attempt over plain sockets, pinned to a checked address so DNS cannot
  swap it between check and use; one deadline in total, a bounded response read, no redirects,
  cancellable from another thread.
- :mod:`.sender`: the body and its signature, one delivery and its log lines, and
  ``WebhookSender``: a bounded queue, a bounded pool of delivery threads, per-session order,
  and ``close``.

The names other modules use are re-exported here (``WebhookSender``, ``SECRET_ENV_VAR``,
``check_url``, ``refusal``, ``deliver``, ...). Every log line of the package is logged under
``motus.serve.webhooks``.
"""

from __future__ import annotations

from motus.api.webhook_urls import MAX_URL_LENGTH, IPAddress, WebhookURL, check_token, check_url, redact
from motus.serve.webhooks.policy import ALWAYS_REFUSED, EXPOSED_REFUSED, Allow, refusal
from motus.serve.webhooks.sender import (
    CLOSE_SECONDS,
    DELIVERY_THREADS,
    MAX_QUEUED,
    SECRET_ENV_VAR,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookSender,
    deliver,
    sign,
    webhook_body,
)
from motus.serve.webhooks.transport import (
    MAX_RESPONSE_BYTES,
    TIMEOUT_SECONDS,
    DeliveryFailed,
    Refused,
    Resolver,
    default_ssl_context,
)

__all__ = [
    "ALWAYS_REFUSED",
    "Allow",
    "CLOSE_SECONDS",
    "DELIVERY_THREADS",
    "DeliveryFailed",
    "EXPOSED_REFUSED",
    "IPAddress",
    "MAX_QUEUED",
    "MAX_RESPONSE_BYTES",
    "MAX_URL_LENGTH",
    "Refused",
    "Resolver",
    "SECRET_ENV_VAR",
    "SIGNATURE_HEADER",
    "TIMEOUT_SECONDS",
    "TIMESTAMP_HEADER",
    "WebhookSender",
    "WebhookURL",
    "check_token",
    "check_url",
    "default_ssl_context",
    "deliver",
    "redact",
    "refusal",
    "sign",
    "webhook_body",
]
