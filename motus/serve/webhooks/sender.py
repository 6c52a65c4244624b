"""Webhook delivery off the request path: ``WebhookSender``, and what one delivery sends.

**The body** (``webhook_body``): when a turn ends in ``idle`` or ``error`` and its message
asked for a webhook, the server POSTs ``{"session_id","status","response","error",
"messages"|null}`` to the URL. A webhook may choose its events (``"events": ["interrupted",
"idle", "error"]``; the default is the guide's idle and error); an ``interrupted`` delivery
adds ``"interrupts"``, the turn's pending interrupts.

**Signed** when the server has a secret (``--webhook-secret``): the body then also carries
``"timestamp"`` (unix seconds), and the headers ``X-Motus-Timestamp`` (the same number) and
``X-Motus-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes, keyed by the secret>``.
A receiver recomputes the HMAC over the raw body, compares in constant time, and refuses a
timestamp too far from its own clock (the body's timestamp is signed, so it cannot be
replaced to replay an old delivery).

**One delivery** (``deliver``) checks the URL and token again (turns recorded before the
checks of ``motus.api.webhook_urls`` existed), makes one attempt (``transport.attempt``,
which only connects to addresses the policy permits), and logs its outcome. Only the status
decides: a 2xx is delivered, anything else failed. A failed delivery is logged and never
changes the session; there are no retries.

**Threads**: deliveries run on at most ``DELIVERY_THREADS`` threads, started as needed, from
a queue of at most ``MAX_QUEUED`` waiting deliveries (past that, a delivery is dropped with a
log line). Deliveries of one session stay in order: a session's next delivery waits until its
previous one is done, and a thread never takes a delivery of a session that is being
delivered to, so a slow endpoint holds one thread and delays only its own session's
deliveries (unless ``DELIVERY_THREADS`` slow endpoints are being waited on at once: each
holds its thread for at most ``TIMEOUT_SECONDS``). Each delivery runs inside a catch-all: no
exception of any kind ends a delivery thread. The sender's queue and thread bookkeeping are
guarded by its one condition variable; a delivery in progress is reached from ``close`` only
through its ``Cancel``.

**Logs** name the session and the URL as ``scheme://host:port/...`` (``redact``): never the
``user:password@`` part, the path or the query string, and never the token.

``close`` lets queued deliveries finish for a bounded time, then cuts the ones in progress
short, logs what was abandoned, and stops every delivery thread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import threading
import time
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any

from motus.api.webhook_urls import check_token, check_url, redact
from motus.serve.events import isoformat
from motus.serve.metrics import NO_METRICS, Hooks
from motus.serve.webhooks.policy import Allow, refusal
from motus.serve.webhooks.transport import TIMEOUT_SECONDS, Cancel, DeliveryFailed, Refused, Resolver, attempt, describe

if TYPE_CHECKING:
    from motus.serve.turns import TurnEnd

# The package's name, as every webhook log line has always been logged under.
log = logging.getLogger("motus.serve.webhooks")

#: Deliveries run on at most this many threads at once.
DELIVERY_THREADS = 4
#: Deliveries waiting for a thread; past this, new ones are dropped (and logged).
MAX_QUEUED = 1000
#: How long ``close`` waits, in all, for queued deliveries before giving up on them.
CLOSE_SECONDS = 10.0


def webhook_body(end: TurnEnd, timestamp: int | None = None) -> dict[str, Any]:
    """What a delivery of ``end`` POSTs (before JSON encoding); ``timestamp`` when signed."""
    include = bool(end.webhook and end.webhook.get("include_messages"))
    body: dict[str, Any] = {
        "session_id": end.session_id,
        "status": end.status.value,
        "response": end.response,
        "error": end.error,
        "messages": end.messages if include else None,
    }
    if end.interrupts is not None:  # times as the events and the inbox show them
        body["interrupts"] = [
            {**item, "created_at": isoformat(item.get("created_at")), "expires_at": isoformat(item.get("expires_at"))}
            for item in end.interrupts
        ]
    if timestamp is not None:
        body["timestamp"] = timestamp
    return body


SECRET_ENV_VAR = "MOTUS_WEBHOOK_SECRET"
SIGNATURE_HEADER = "X-Motus-Signature"
TIMESTAMP_HEADER = "X-Motus-Timestamp"


def sign(secret: str, body: bytes) -> str:
    """The ``X-Motus-Signature`` value for ``body``."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def deliver(
    end: TurnEnd,
    *,
    allow: Allow | None = None,
    exposed: bool = False,
    timeout: float = TIMEOUT_SECONDS,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
    cancel: Cancel | None = None,
    secret: str | None = None,
) -> bool:
    """One attempt to POST ``end``'s webhook (signed when ``secret`` is given); True if
    delivered. Logs every failure; raises nothing it expects (the sender catches the rest)."""
    webhook = end.webhook or {}
    raw_url = webhook.get("url")
    try:
        url = check_url(raw_url)
        check_token(webhook.get("token"))
    except ValueError as exc:
        log.warning("webhook for session %s to %s not sent: the URL or token %s", end.session_id, redact(raw_url), exc)
        return False
    shown = url.redacted()
    timestamp = int(time.time()) if secret else None
    try:
        body = json.dumps(webhook_body(end, timestamp), allow_nan=False).encode("utf-8")
    except (ValueError, TypeError) as exc:
        log.warning("webhook for session %s to %s not sent: the body cannot be encoded as JSON (%s)", end.session_id, shown, type(exc).__name__)
        return False
    started = time.monotonic()
    try:
        signed = {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, body)} if secret else {}
        status, note = attempt(url, body, webhook.get("token"), allow or Allow(), exposed, timeout, resolver, ssl_context,
                               cancel or Cancel(), signed)
    except Refused as exc:
        log.warning("webhook for session %s to %s refused: %s", end.session_id, shown, exc)
        return False
    except DeliveryFailed as exc:
        log.warning("webhook for session %s to %s failed: %s", end.session_id, shown, exc)
        return False
    except TimeoutError:
        log.warning("webhook for session %s to %s failed: timed out (%.0f s in total to connect, send and be answered)", end.session_id, shown, timeout)
        return False
    except ssl.SSLCertVerificationError as exc:
        log.warning("webhook for session %s to %s failed: certificate not valid for %s (%s)", end.session_id, shown, url.host, exc.verify_message)
        return False
    except (OSError, ssl.SSLError) as exc:
        log.warning("webhook for session %s to %s failed: %s", end.session_id, shown, describe(exc))
        return False
    if note:
        log.warning("webhook for session %s to %s: response %s", end.session_id, shown, note)
    if 200 <= status < 300:
        log.debug("webhook for session %s to %s delivered in %.2f s (HTTP %s)", end.session_id, shown, time.monotonic() - started, status)
        return True
    if 300 <= status < 400:
        log.warning("webhook for session %s to %s answered HTTP %s (redirects are not followed)", end.session_id, shown, status)
    else:
        log.warning("webhook for session %s to %s answered HTTP %s", end.session_id, shown, status)
    return False


class WebhookSender:
    """Delivers webhooks on a bounded pool of threads, from a bounded queue, in order per
    session (see the module docstring). ``send`` never blocks and never raises."""

    def __init__(
        self,
        allow: list[str] | None = None,
        exposed: bool = False,
        *,
        threads: int = DELIVERY_THREADS,
        max_queued: int = MAX_QUEUED,
        timeout: float = TIMEOUT_SECONDS,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
        secret: str | None = None,
    ) -> None:
        self.secret = secret or None
        self.allow_entries = list(allow or ())
        self.allow = self._parse_allow(self.allow_entries)
        self.exposed = exposed
        self.max_threads = max(1, threads)
        self.max_queued = max(1, max_queued)
        self.timeout = timeout
        self._resolver = resolver
        self._ssl_context = ssl_context
        self._cond = threading.Condition()
        self._pending: dict[str, deque[TurnEnd]] = {}  # per session, in order
        self._ready: deque[str] = deque()  # sessions with pending deliveries and none running
        self._running: dict[str, Cancel] = {}  # session -> its delivery in progress
        self._queued = 0
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._stop = False
        self.metrics: Hooks = NO_METRICS  # the server's metrics (see metrics.py)

    def never_deliverable(self, url: str) -> str | None:
        """Why a webhook to ``url`` (a URL the schema accepted) could never be delivered by
        this server, or None: its host is a literal address the policy refuses (always, or
        here, bound beyond loopback, and not allowed). A host name is judged at delivery, on
        the addresses it then resolves to."""
        parsed = check_url(url)
        if parsed.ip is None:
            return None
        why = refusal(parsed.ip, exposed=self.exposed, allow=self.allow, host=parsed.host)
        return None if why is None else f"{parsed.ip} is {why}: a webhook there could never be delivered"

    @staticmethod
    def _parse_allow(entries: list[str]) -> Allow:
        good = []
        for entry in entries:
            try:
                Allow.parse([entry])
                good.append(entry)
            except ValueError as exc:
                log.error("%s; ignored", exc)
        return Allow.parse(good)

    def send(self, end: TurnEnd) -> None:
        if not end.webhook:
            return
        try:
            self._enqueue(end)
        except BaseException as exc:  # noqa: BLE001 - a turn's end must never fail here
            log.error("webhook for session %s not queued: %s", end.session_id, type(exc).__name__)

    def _enqueue(self, end: TurnEnd) -> None:
        with self._cond:
            if self._closing:
                dropped = "the server is shutting down"
            elif self._queued >= self.max_queued:
                dropped = f"{self._queued} deliveries are already queued (the limit)"
            else:
                dropped = None
                self._pending.setdefault(end.session_id, deque()).append(end)
                self._queued += 1
                if end.session_id not in self._running and len(self._pending[end.session_id]) == 1:
                    self._ready.append(end.session_id)
                    self._wake()
        if dropped:
            self.metrics.webhook("dropped")
            log.warning("webhook for session %s to %s dropped: %s", end.session_id, redact(end.webhook.get("url") if end.webhook else None), dropped)

    def _wake(self, coming: int = 0) -> None:
        """Under the lock: see that every ready session has a thread coming for it
        (``coming``: threads about to look for work that are not counted as idle)."""
        if len(self._ready) > self._idle + coming and len(self._threads) < self.max_threads and not self._stop:
            thread = threading.Thread(target=self._run, name=f"motus-webhooks-{len(self._threads) + 1}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._ready and not self._stop:
                    self._cond.wait()
                self._idle -= 1
                if self._stop:
                    return
                session_id = self._ready.popleft()
                end = self._pending[session_id].popleft()
                self._queued -= 1
                cancel = Cancel()
                self._running[session_id] = cancel
            try:
                delivered = deliver(
                    end, allow=self.allow, exposed=self.exposed, timeout=self.timeout,
                    resolver=self._resolver, ssl_context=self._ssl_context, cancel=cancel, secret=self.secret,
                )
                self.metrics.webhook("delivered" if delivered else "failed")
            except BaseException as exc:  # noqa: BLE001 - nothing may end a delivery thread
                self.metrics.webhook("error")
                log.error("webhook for session %s to %s failed unexpectedly: %s", session_id, _safe_redact(end), type(exc).__name__)
                log.debug("where: %s", "".join(traceback.format_tb(exc.__traceback__)))
            finally:
                with self._cond:
                    del self._running[session_id]
                    if self._pending.get(session_id):
                        self._ready.append(session_id)
                    else:
                        self._pending.pop(session_id, None)
                    self._wake(coming=1)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Let queued deliveries finish for up to ``timeout`` seconds in all, then cut short
        the ones in progress, log what was abandoned, and stop every delivery thread."""
        deadline = time.monotonic() + timeout
        grace = min(1.0, timeout / 2)
        with self._cond:
            if self._stop:
                return
            self._closing = True
            while self._queued or self._running:
                left = deadline - grace - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            abandoned = [end for queue in self._pending.values() for end in queue]
            self._pending.clear()
            self._ready.clear()
            self._queued = 0
            cut = list(self._running.items())
            self._stop = True
            threads = list(self._threads)
            self._cond.notify_all()
        for _session, cancel in cut:
            cancel.cancel()
        if abandoned:
            shown = ", ".join(f"{end.session_id} to {_safe_redact(end)}" for end in abandoned[:10])
            more = f" and {len(abandoned) - 10} more" if len(abandoned) > 10 else ""
            log.warning("%d webhook deliveries still queued at shutdown were abandoned: %s%s", len(abandoned), shown, more)
        if cut:
            log.warning("%d webhook deliveries in progress at shutdown were cut short: sessions %s", len(cut), ", ".join(s for s, _ in cut))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.warning("webhook delivery threads %s did not stop in time", ", ".join(alive))


def _safe_redact(end: TurnEnd) -> str:
    try:
        return redact((end.webhook or {}).get("url"))
    except BaseException:  # noqa: BLE001
        return "<unknown URL>"
