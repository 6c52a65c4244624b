"""Webhook delivery, off the request path.

When a turn ends in ``idle`` or ``error`` (never on an interrupt) and its message asked for a
webhook, the server POSTs ``{"session_id","status","response","error","messages"|null}`` to
the URL, with ``Authorization: Bearer <token>`` when a token was given and a 10 second
timeout. A failed delivery is logged (without the token) and never changes the session.

Deliveries run in order on one daemon thread owned by this object; ``close`` lets queued
deliveries finish for a bounded time, then gives up on the rest (and says so in the log).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import requests

from motus.serve.turns import TurnEnd

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0


def webhook_body(end: TurnEnd) -> dict[str, Any]:
    include = bool(end.webhook and end.webhook.get("include_messages"))
    return {
        "session_id": end.session_id,
        "status": end.status.value,
        "response": end.response,
        "error": end.error,
        "messages": end.messages if include else None,
    }


class WebhookSender:
    def __init__(self, allow: list[str] | None = None, exposed: bool = False) -> None:
        self.allow = list(allow or ())
        self.exposed = exposed
        self._queue: queue.Queue[TurnEnd | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="motus-webhooks", daemon=True)
        self._started = False
        self._lock = threading.Lock()

    def send(self, end: TurnEnd) -> None:
        if not end.webhook:
            return
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()
        self._queue.put(end)

    def close(self, timeout: float = TIMEOUT_SECONDS) -> None:
        with self._lock:
            started = self._started
        if not started:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("webhook deliveries still queued at shutdown were abandoned")

    def _run(self) -> None:
        while True:
            end = self._queue.get()
            if end is None:
                return
            deliver(end)


def deliver(end: TurnEnd) -> bool:
    webhook = end.webhook or {}
    url = webhook.get("url")
    headers = {"Content-Type": "application/json"}
    if webhook.get("token"):
        headers["Authorization"] = f"Bearer {webhook['token']}"
    try:
        response = requests.post(url, json=webhook_body(end), headers=headers, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        log.warning("webhook for session %s to %s failed: %s", end.session_id, url, type(exc).__name__)
        return False
    if response.status_code >= 400:
        log.warning("webhook for session %s to %s answered HTTP %s", end.session_id, url, response.status_code)
        return False
    return True
