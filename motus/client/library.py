"""The Python client library for a ``motus serve`` server, built on ``requests``.

Import it as ``motus.client`` (the package re-exports everything public here).
``Client`` has one method per REST endpoint, each returning the pydantic model of the API
(serving-api.md), and ``run_turn`` / ``finish_turn`` drive a whole turn: send, long poll,
hand every pending interrupt to a callback, resume with what it returns, and return the
final response. The terminal chat (``motus.client.chat``) and the ``motus serve`` client
commands (``motus.client.commands``) are built on this module only.

Errors form one family rooted at :class:`ClientError`; every one carries ``status`` (the HTTP
status, or ``None`` when no response arrived) and ``detail`` (the server's ``detail`` field,
or a message saying what went wrong)::

    ClientError
    ├── ConnectionFailed      no answer: refused, reset, DNS, or the read timed out
    ├── APIError              the server answered 4xx/5xx (``status``, ``detail``)
    │   ├── Unauthorized      401: wrong or missing API key
    │   ├── Forbidden         403: a read-only key writing, or a key the approval's policy leaves out
    │   ├── NotFound          404: unknown or deleted session, interrupt not pending
    │   ├── Conflict          409: a turn is already running or interrupted; id exists
    │   └── Unavailable       503: the server's session limit is reached
    ├── TurnFailed            the turn ended in ``error``; ``session`` holds the state
    └── TurnPaused            ``run_turn`` only: the callback skipped an interrupt

Example::

    from motus.client import Client

    def answer(interrupt):
        if interrupt.type == "tool_approval":
            return {"approved": True}
        return {"answers": {}}

    with Client("http://127.0.0.1:8000") as client:
        session = client.create_session()
        reply = client.run_turn(session.session_id, "delete the old logs", answer)
        print(reply.content)
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

import requests
from pydantic import BaseModel, ValidationError

from motus.api.schemas import (
    AuditEntry,
    Grant,
    InboxItem,
    HealthResponse,
    InterruptInfo,
    MessageAccepted,
    ResumeAccepted,
    SessionResponse,
    SessionSummary,
    Webhook,
    WhoAmI,
)
from motus.client.events import Event, read_events
from motus.models import ChatMessage

log = logging.getLogger(__name__)

__all__ = [
    "APIError",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "HealthResponse",
    "InterruptHandler",
    "InterruptInfo",
    "MessageAccepted",
    "NotFound",
    "ResumeAccepted",
    "SKIP",
    "SessionResponse",
    "SessionSummary",
    "TurnFailed",
    "TurnPaused",
    "Unauthorized",
    "Unavailable",
    "Webhook",
    "WhoAmI",
]

#: Seconds one long poll asks the server to hold the request (``?wait=true&timeout=``).
DEFAULT_POLL_SECONDS = 25.0


# The response models are the HTTP API's shared ones (``motus.api.schemas``), which the
# server answers with, so the client and the server share one definition of the REST
# contract of serving-api.md, and the client loads no server module.

# --------------------------------------------------------------------------- errors


class ClientError(Exception):
    """Base of every error this module raises: ``status`` (or None) and ``detail``."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status

    def __str__(self) -> str:
        return self.detail if self.status is None else f"{self.status}: {self.detail}"


class ConnectionFailed(ClientError):
    """No HTTP answer: the server is not there, went away, or did not answer in time."""

    def __init__(self, url: str, detail: str | None = None) -> None:
        super().__init__(detail or f"Could not connect to {url}")
        self.url = url


class APIError(ClientError):
    """The server answered with an error status; ``detail`` is its ``detail`` field."""

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail, status)


class Unauthorized(APIError):
    """401: the server wants an API key (``Client(api_key=...)``) and got none or a wrong one."""


class Forbidden(APIError):
    """403: a read-only key tried to change something, or the key may not answer this
    interrupt (its tool names other approvers, or forbids the sender to approve)."""


class NotFound(APIError):
    """404: unknown or deleted session, or an interrupt that is not pending right now."""


class Conflict(APIError):
    """409: the session is running or interrupted, or a custom id already exists."""


class Unavailable(APIError):
    """503: the server cannot take more sessions (``--max-sessions``), or every event stream
    or long-poll slot is taken. ``retry_after``: the seconds its ``Retry-After`` asked the
    client to wait before trying again (None when it named none)."""

    def __init__(self, detail: str, status: int, retry_after: float | None = None) -> None:
        super().__init__(detail, status)
        self.retry_after = retry_after


class TurnFailed(ClientError):
    """The turn ended in ``error``; ``detail`` is the session's error, ``session`` its state."""

    def __init__(self, session: SessionResponse) -> None:
        super().__init__(session.error or "the turn failed without an error message")
        self.session = session


class TurnPaused(ClientError):
    """The interrupt callback returned :data:`SKIP`, so the session stays ``interrupted``."""

    def __init__(self, session: SessionResponse) -> None:
        pending = len(session.interrupts or [])
        super().__init__(f"the turn is paused on {pending} unanswered interrupt(s)")
        self.session = session


#: The error class of each status with one of its own (503: ``_api_error``, which adds the
#: server's ``Retry-After``).
_ERRORS_BY_STATUS: dict[int, type[APIError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
}


class _Skip:
    """Type of :data:`SKIP` (compared by identity)."""

    def __repr__(self) -> str:
        return "SKIP"


#: Return this from an interrupt callback to leave that interrupt pending (not resumed).
SKIP: Any = _Skip()

#: ``callback(interrupt) -> value`` posted as the resume ``value`` (or :data:`SKIP`).
InterruptHandler = Callable[[InterruptInfo], Any]


# --------------------------------------------------------------------------- client


def normalize_url(url: str) -> str:
    """``localhost:8000/`` -> ``http://localhost:8000``: add a scheme, drop trailing slashes."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


class Client:
    """Talks to one ``motus serve`` server. Safe to reuse; not meant to be shared by threads.

    ``timeout`` bounds every request (connect and read). A long poll (``wait=True``) reads
    for its own ``timeout`` plus this one, so a poll the server holds open on purpose is
    never mistaken for a dead server. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = normalize_url(base_url)
        self.timeout = timeout
        self._http = requests.Session()
        self._http.headers["Accept"] = "application/json"
        if api_key:
            self._http.headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:  # never shows the API key
        return f"Client({self.base_url!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ endpoints

    def health(self) -> HealthResponse:
        """``GET /health``."""
        return _parse(HealthResponse, self._request("GET", "/health"))

    def whoami(self) -> WhoAmI:
        """``GET /whoami``: the key this client sends (its name, roles, whether read-only).
        ``NotFound`` from a server without it (the reference product)."""
        return _parse(WhoAmI, self._request("GET", "/whoami"))

    def create_session(
        self,
        state: Iterable[ChatMessage | dict[str, Any]] | None = None,
        session_id: str | None = None,
        title: str | None = None,
    ) -> SessionResponse:
        """Create a session, optionally with preloaded ``state``, a custom ``session_id``
        and a ``title`` (by default the server takes the first user message's).

        A custom id uses ``PUT /sessions/{id}``, which the server allows only with
        ``--allow-custom-ids`` (405 otherwise, 400 for a non-UUID, 409 if it exists).
        """
        body: dict[str, Any] = {}
        if state is not None:
            body["state"] = [_message_dict(message) for message in state]
        if title is not None:
            body["title"] = title
        if session_id is None:
            data = self._request("POST", "/sessions", json=body)
        else:
            data = self._request("PUT", self._session_path(session_id), json=body)
        return _parse(SessionResponse, data)

    def list_sessions(self) -> list[SessionSummary]:
        """``GET /sessions``, each with its title (None from a server that keeps none)."""
        data = self._request("GET", "/sessions", params={"titles": "true"})
        return [_parse(SessionSummary, item) for item in _expect_list(data)]

    def set_title(self, session_id: str, title: str) -> SessionSummary:
        """``PATCH /sessions/{id}``: what people see for the session in lists and the inbox."""
        return _parse(SessionSummary, self._request("PATCH", self._session_path(session_id), json={"title": title}))

    def get_session(self, session_id: str, wait: bool = False, timeout: float | None = None) -> SessionResponse:
        """``GET /sessions/{id}``; with ``wait`` a long poll of up to ``timeout`` seconds.

        A long poll returns as soon as the session is not ``running``, or after
        ``timeout`` seconds (default ``DEFAULT_POLL_SECONDS``) with the session still
        ``running``.
        """
        if not wait:
            return _parse(SessionResponse, self._request("GET", self._session_path(session_id)))
        poll = DEFAULT_POLL_SECONDS if timeout is None else max(0.0, timeout)
        data = self._long_poll(self._session_path(session_id), {}, poll)
        return _parse(SessionResponse, data)

    def delete_session(self, session_id: str) -> None:
        """``DELETE /sessions/{id}``; kills a running or interrupted turn at once."""
        self._request("DELETE", self._session_path(session_id))

    def get_messages(self, session_id: str) -> list[ChatMessage]:
        """``GET /sessions/{id}/messages``: the stored state, oldest first."""
        data = self._request("GET", self._session_path(session_id) + "/messages")
        return [_parse(ChatMessage, item) for item in _expect_list(data)]

    def send_message(
        self,
        session_id: str,
        message: str | ChatMessage,
        *,
        role: str = "user",
        user_params: dict[str, Any] | None = None,
        webhook: Webhook | dict[str, Any] | None = None,
    ) -> MessageAccepted:
        """``POST /sessions/{id}/messages``: start a turn (409 while one is in progress).

        ``message`` is the content, or a whole ``ChatMessage`` (then ``role`` is ignored
        and ``user_params``, if given, replaces the message's own).
        """
        if isinstance(message, ChatMessage):
            body = message.model_dump(mode="json")
        else:
            body = {"role": role, "content": message}
        if user_params is not None:
            body["user_params"] = user_params
        if webhook is not None:
            # Raises pydantic.ValidationError (a ValueError) for a URL that is not http(s).
            body["webhook"] = Webhook.model_validate(webhook).model_dump(mode="json")
        data = self._request("POST", self._session_path(session_id) + "/messages", json=body)
        return _parse(MessageAccepted, data)

    def resume(self, session_id: str, interrupt_id: str, value: Any) -> ResumeAccepted:
        """``POST /sessions/{id}/resume``: answer one pending interrupt with ``value``."""
        body = {"interrupt_id": interrupt_id, "value": value}
        data = self._request("POST", self._session_path(session_id) + "/resume", json=body)
        return _parse(ResumeAccepted, data)

    # ------------------------------------------------------------------ turns

    def wait(self, session_id: str, poll_seconds: float = DEFAULT_POLL_SECONDS) -> SessionResponse:
        """Long poll until the session is not ``running``; returns it (any other status)."""
        while True:
            session = self.get_session(session_id, wait=True, timeout=poll_seconds)
            if session.status != "running":
                return session

    def finish_turn(
        self,
        session_id: str,
        on_interrupt: InterruptHandler,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
    ) -> SessionResponse:
        """Drive the turn in progress to its end and return the session as it ends.

        Each pending interrupt is handed to ``on_interrupt`` exactly once, and its return
        value is posted as the resume ``value``. Long polls that time out are simply
        repeated. Returns the session in ``idle`` or ``error``; or in ``interrupted`` when
        every interrupt still pending was skipped (the callback returned :data:`SKIP`) or
        waits for other keys' approvals (a quorum, ``payload["quorum"]``).

        A resume refused with 404 (someone else answered first, or the turn timed out or
        failed while the person was answering) is not an error here: it is logged as a
        warning naming why (who answered, and when), and the next poll shows what happened
        to the turn.

        Raises:
            NotFound: the session does not exist or was deleted during the turn.
            ConnectionFailed: the server went away.
        """
        handled: set[str] = set()
        while True:
            session = self.wait(session_id, poll_seconds)
            if session.status != "interrupted":
                return session
            fresh = [item for item in session.interrupts or [] if item.interrupt_id not in handled]
            if not fresh:
                return session  # only skipped interrupts remain: nothing more we can do
            for item in fresh:
                handled.add(item.interrupt_id)
                value = on_interrupt(item)
                if value is SKIP:
                    continue
                try:
                    accepted = self.resume(session_id, item.interrupt_id, value)
                    if accepted.approvals_needed:
                        # One approval of a quorum: the interrupt waits for other keys, and
                        # this returns with it pending, as for one skipped.
                        log.info("the approval of interrupt %s counted: %s", item.interrupt_id, accepted.detail)
                except NotFound as exc:
                    # Either the session is gone (the next poll raises NotFound) or the
                    # interrupt stopped being pending: answered by someone else (the detail
                    # says who and when) or the turn ended. The answer did not count: said
                    # as a warning, which the logging module shows even unconfigured.
                    log.warning("the answer to interrupt %s did not count: %s", item.interrupt_id, exc.detail)

    def run_turn(
        self,
        session_id: str,
        message: str | ChatMessage,
        on_interrupt: InterruptHandler,
        *,
        user_params: dict[str, Any] | None = None,
        webhook: Webhook | dict[str, Any] | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
    ) -> ChatMessage:
        """Send ``message``, answer interrupts with ``on_interrupt``, return the response.

        Raises:
            TurnFailed: the turn ended in ``error`` (``.detail`` is the session's error).
            TurnPaused: ``on_interrupt`` returned :data:`SKIP` and the session waits.
            Conflict: a turn is already in progress in this session.
            NotFound: the session does not exist or was deleted during the turn.
            ConnectionFailed: the server is not there or went away.
        """
        self.send_message(session_id, message, user_params=user_params, webhook=webhook)
        session = self.finish_turn(session_id, on_interrupt, poll_seconds)
        if session.status == "error":
            raise TurnFailed(session)
        if session.status == "interrupted":
            raise TurnPaused(session)
        if session.response is None:
            return ChatMessage.assistant_message(content=None)
        return session.response

    # ------------------------------------------------------------------ plumbing

    # ------------------------------------------------------------------ approvals workflow

    def inbox(
        self, type: str | None = None, wait: bool = False, timeout: float | None = None, limit: int | None = None
    ) -> list[InboxItem]:
        """``GET /interrupts``: pending interrupts of every session, oldest first (the oldest
        ``limit`` only, when given); with ``wait`` a long poll that returns as soon as there
        is one (or after ``timeout``)."""
        params: dict[str, Any] = {"status": "pending"}
        if type is not None:
            params["type"] = type
        if limit is not None:
            params["limit"] = limit
        if wait:
            poll = DEFAULT_POLL_SECONDS if timeout is None else max(0.0, timeout)
            data = self._long_poll("/interrupts", params, poll)
        else:
            data = self._request("GET", "/interrupts", params=params)
        return [_parse(InboxItem, item) for item in _expect_list(data)]

    def grants(self, session_id: str) -> list[Grant]:
        """``GET /sessions/{id}/grants``: tools approved for the rest of the session."""
        data = self._request("GET", self._session_path(session_id) + "/grants")
        return [_parse(Grant, item) for item in _expect_list(data)]

    def revoke_grant(self, session_id: str, tool_name: str) -> None:
        """``DELETE /sessions/{id}/grants/{tool}``: ask again from the session's next turn."""
        self._request("DELETE", self._session_path(session_id) + "/grants/" + quote(tool_name, safe=""))

    def audit(self, session_id: str) -> list[AuditEntry]:
        """``GET /sessions/{id}/audit``: who resolved what (and grants), oldest first."""
        data = self._request("GET", self._session_path(session_id) + "/audit")
        return [_parse(AuditEntry, item) for item in _expect_list(data)]

    def events(
        self,
        session_id: str | None = None,
        last_event_id: int | None = None,
        reconnect: bool = True,
        idle_timeout: float = 60.0,
    ) -> Iterator[Event]:
        """Every change of one session (or of all, without ``session_id``) as it happens.

        Starts after ``last_event_id`` if given, else at "now" (the first event is then the
        stream's ``ready``). A dropped connection is reopened with ``Last-Event-ID``, so
        nothing is missed or repeated (``reconnect=False`` raises ``ConnectionFailed``
        instead); while every stream slot is taken (503), it waits as the server's
        ``Retry-After`` says before trying again. A server that sends nothing, not even its keepalive, for
        ``idle_timeout`` seconds counts as dropped. Against a server without event streams
        (the reference product) the first call raises ``NotFound``: long-poll instead.
        The iterator ends when the session is deleted; close it to stop earlier.
        """
        path = "/events" if session_id is None else self._session_path(session_id) + "/events"
        last = last_event_id
        failures = 0
        retry_after: float | None = None  # what a 503 asked for
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                response = self._http.get(self.base_url + path, headers=headers, stream=True, timeout=(self.timeout, idle_timeout))
            except requests.RequestException:
                response = None
            if response is not None and response.status_code >= 400:
                error = _api_error(response)
                response.close()
                if response.status_code != 503 or not reconnect:
                    raise error
                retry_after = getattr(error, "retry_after", None)
                response = None
            if response is None:
                failures += 1
                if not reconnect or failures > 5:
                    raise ConnectionFailed(self.base_url)
                backoff = min(0.2 * 2 ** failures, 5.0)
                # A busy server says when to come back: never sooner than that.
                time.sleep(backoff if retry_after is None else min(max(retry_after, backoff), 60.0))
                retry_after = None
                continue
            try:
                for event in read_events(response.iter_lines(decode_unicode=True)):
                    failures = 0
                    if event.id is not None:
                        last = event.id
                    yield event
                    if session_id is not None and event.kind == "status" and event.data.get("status") == "deleted":
                        return
            except requests.RequestException:
                pass  # dropped: reconnect below
            finally:
                response.close()
            if not reconnect:
                raise ConnectionFailed(self.base_url, f"the event stream of {self.base_url} ended")

    def _session_path(self, session_id: str) -> str:
        return "/sessions/" + quote(session_id, safe="")

    def _long_poll(self, path: str, params: dict[str, Any], poll: float) -> Any:
        """``GET path?wait=true`` for up to ``poll`` seconds. A server whose long-poll slots
        are all taken answers 503 with ``Retry-After``: the client waits that long (never
        past the poll's end) and asks again, and once the poll's time is up it reads the
        current state without waiting, as a long poll that timed out would have returned."""
        deadline = time.monotonic() + poll
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                return self._request(
                    "GET", path, params={**params, "wait": "true", "timeout": _seconds(remaining)},
                    read_timeout=remaining + self.timeout,
                )
            except Unavailable as exc:
                if exc.retry_after is None:
                    raise  # not a full house of long polls: the caller decides
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._request("GET", path, params=params)
                time.sleep(min(max(exc.retry_after, 0.05), remaining))

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        read_timeout: float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body (None for 204), or raise."""
        url = self.base_url + path
        if read_timeout is None:
            read_timeout = self.timeout
        try:
            response = self._http.request(
                method, url, params=params, json=json, timeout=(self.timeout, read_timeout)
            )
        except requests.Timeout:
            raise ConnectionFailed(
                self.base_url, f"{self.base_url} did not answer within {read_timeout:g} seconds"
            ) from None
        except requests.RequestException:
            raise ConnectionFailed(self.base_url) from None
        if response.status_code >= 400:
            raise _api_error(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ClientError(
                f"{method} {path} answered with a body that is not JSON: {response.text[:200]!r}",
                response.status_code,
            ) from None


def _api_error(response: requests.Response) -> APIError:
    """The error an error status stands for, with the server's ``detail`` (and, for a 503,
    its ``Retry-After``)."""
    if response.status_code == 503:
        return Unavailable(_error_detail(response), 503, _retry_after(response))
    error_class = _ERRORS_BY_STATUS.get(response.status_code, APIError)
    return error_class(_error_detail(response), response.status_code)


def _retry_after(response: requests.Response) -> float | None:
    """``Retry-After`` in seconds (the delay form; a date or junk: None)."""
    try:
        value = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _error_detail(response: requests.Response) -> str:
    """The server's ``detail`` field, or the start of the body, or the status reason."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:500] if text else (response.reason or "error")
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)
    return json.dumps(body)[:500]


_M = TypeVar("_M", bound=BaseModel)


def _parse(model: type[_M], data: Any) -> _M:
    """Validate a server answer; a shape we do not understand is a ClientError, not a crash."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ClientError(f"unexpected {model.__name__} from the server: {exc}") from None


def _expect_list(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise ClientError(f"expected a JSON list from the server, got {type(data).__name__}")
    return data


def _message_dict(message: ChatMessage | dict[str, Any]) -> dict[str, Any]:
    if isinstance(message, ChatMessage):
        return message.model_dump(mode="json")
    try:
        return ChatMessage.model_validate(message).model_dump(mode="json")
    except ValidationError as exc:
        raise ValueError(f"state must be a list of chat messages: {exc}") from None


def _seconds(value: float) -> str:
    """Render a timeout for the query string: ``5`` not ``5.0``."""
    return f"{value:g}"
