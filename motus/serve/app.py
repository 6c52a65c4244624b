"""The Flask app: thin views over ``AgentServer``.

Views validate bodies with the models of ``schemas.py``, call the server, and let errors
travel as exceptions to the handlers registered once here:

- ``ServeError`` (domain: 404 unknown session or interrupt, 409 busy, 503 limit) and the
  422 (``Unprocessable``) or 400 raised by the body parser -> ``{"detail": "..."}`` with its
  status;
- any ``HTTPException`` (unknown route, wrong method, body too large) -> JSON too;
- anything else -> logged with its traceback, and a JSON 500 that names no internals. No
  request is expected to reach it; bad input is answered with a 4xx and changes nothing.

``create_app`` starts nothing: the pool starts on the first API request in the serving
process (or earlier, when the CLI starts it eagerly after gunicorn forks).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from motus.durable.jsonshape import MAX_JSON_DEPTH, json_cost_problem, json_depth_exceeds, key_with_lone_surrogate
from motus.models import ChatMessage
from motus.serve.origin import check_request

from motus.api.approvers import approval_record
from motus.api.schemas import (
    Approval,
    AuditEntry,
    CreateSessionRequest,
    Grant,
    HealthResponse,
    InterruptInfo,
    MessageAccepted,
    ResumeAccepted,
    ResumeRequest,
    RetitleRequest,
    SendMessageRequest,
    SessionResponse,
    SessionSummary,
    WhoAmI,
)
from motus.serve.errors import BadRequest, CustomIdsDisabled, ReadOnlyKey, ServeError, TooManyWaiters, Unauthorized, Unprocessable
from motus.serve.inbox_json import inbox_text
from motus.serve.live import describe_turn
from motus.serve.logs import install_request_log
from motus.serve.streams import event_stream, isoformat
from motus.serve.turns import PendingInterrupt, SessionStatus, SessionView
from motus.serve.waiting import current as current_ticket

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

#: A session may be created with at most this many messages of history (validated one by one,
#: each costs a few KiB while it is checked).
MAX_STATE_MESSAGES = 10_000

#: Long polls wait 30 s unless the client asks otherwise (never longer than ``--max-wait``).
DEFAULT_WAIT_SECONDS = 30.0

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


#: Endpoints anyone may call, even when API keys are configured.
PUBLIC_ENDPOINTS = {"motus_api.health"}


def create_app(server: Any) -> Flask:
    """Build the WSGI app for ``server`` (an ``AgentServer``)."""
    app = Flask("motus.serve")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config["MAX_CONTENT_LENGTH"] = server.max_request_bytes
    app.extensions["motus"] = server
    install_request_log(app)  # first: a refused request is logged too
    app.before_request(_refuse_cross_site)
    app.register_blueprint(api)
    app.register_error_handler(ServeError, _serve_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    if server.ui:
        from motus.serve.ui import register_ui

        register_ui(app)
    return app


api = Blueprint("motus_api", __name__)


def _server() -> Any:
    return current_app.extensions["motus"]


def _refuse_cross_site() -> None:
    """Pages the user happens to visit must not drive the server (see ``origin.py``)."""
    server = _server()
    check_request(request.method, request.headers, server.host, server.allowed_hosts)


@api.after_request
def _no_store(response: Response) -> Response:
    """API answers hold sessions, interrupts and tool arguments: never keep them in a cache."""
    response.headers["Cache-Control"] = "no-store"
    return response


@api.before_request
def _authenticate_and_start() -> None:
    server = _server()
    caller = server.api_keys.identify(request.headers.get("Authorization"))
    if request.endpoint in PUBLIC_ENDPOINTS:
        return
    if caller is None:
        given = "a wrong API key" if request.headers.get("Authorization") else "no API key"
        raise Unauthorized(f"Unauthorized: this server requires an API key and the request carried {given}; send 'Authorization: Bearer <key>'")
    if not caller.can_write and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise ReadOnlyKey(
            f"Forbidden: API key {caller.name!r} is read-only; it may list and watch, and {request.method} "
            f"{request.path} changes something: use a key without ':read'"
        )
    g.caller = caller
    server.start()


# -- helpers ----------------------------------------------------------------------------


def _json(model: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = jsonify(model.model_dump(mode="json"))
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _body(model: type[M], allow_empty: bool = False) -> M:
    """The request body as ``model``. A body that is missing, not JSON, not an object or
    not of the schema is a 422, as the reference product (FastAPI) answers every body
    problem; a body past a size or shape limit is a 400, one that is too large a 413."""
    return _validated(model, _json_object(allow_empty))


def _json_object(allow_empty: bool = False) -> dict[str, Any]:
    """The request body parsed as a JSON object, within the limits on its shape."""
    raw = _read_body()
    if not raw:  # whitespace alone is not JSON: only a truly empty body means "no body"
        if not allow_empty:
            raise Unprocessable("Request body is required: send a JSON object")
        data: Any = {}
    else:
        problem = json_cost_problem(raw)  # counted before parsing: what parsing would cost
        if problem:
            raise BadRequest(problem)
        try:
            data = json.loads(raw, parse_constant=_not_json)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Unprocessable(f"Malformed JSON body: {exc}") from None
        except RecursionError:
            raise BadRequest("Malformed JSON body: nested too deeply") from None
    if not isinstance(data, dict):
        raise Unprocessable(f"Request body must be a JSON object, got {type(data).__name__}")
    if json_depth_exceeds(data):
        raise BadRequest(f"Request body nested too deeply: the limit is {MAX_JSON_DEPTH} levels")
    key = key_with_lone_surrogate(data)
    if key is not None:
        raise Unprocessable(
            f"Invalid request body: the object key {json.dumps(key)} holds a lone surrogate (half of a UTF-16 pair), "
            "which cannot be stored as text; send the whole character"
        )
    return data


def _not_json(name: str) -> Any:
    # Python's parser takes NaN and Infinity, which are not JSON: refused, so that what is
    # stored can be sent back as JSON (and dumped without pydantic's JSON mode, which copies
    # every string).
    raise ValueError(f"{name} is not a JSON value")


def _validated(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        detail = f"Invalid request body: {describe_validation_error(exc)}"
        if all(error.get("loc", ())[:1] == ("webhook",) for error in exc.errors()):
            raise BadRequest(detail) from None  # a webhook that may not be called: 400 naming why
        raise Unprocessable(detail) from None


def _read_body() -> bytes:
    """The whole body, or 413 past the limit, also for chunked bodies with no length. A body
    the server cannot read (a malformed chunk, a client that hung up mid-body) is a 400."""
    try:
        return _read_body_unchecked()
    except HTTPException:
        raise  # 413, and the 408 of a body that did not arrive within --read-timeout
    except Exception as exc:  # gunicorn's chunk parser and socket errors: the client's fault
        raise BadRequest(f"Could not read the request body: {type(exc).__name__}: {str(exc)[:200]}") from None


def _read_body_unchecked() -> bytes:
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.content_length is not None:
        return request.get_data(cache=True)  # werkzeug answers 413 above the limit
    if not request.environ.get("wsgi.input_terminated"):
        return b""  # neither a length nor chunked: HTTP says there is no body
    stream = request.environ["wsgi.input"]
    chunks, size = [], 0
    while True:
        chunk = stream.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise RequestEntityTooLarge()
    return b"".join(chunks)


def _message_body() -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A ``SendMessageRequest`` as the message to store and its webhook. ``user_params``,
    the one field of free shape, is kept as parsed (JSON types only, see ``_not_json``)
    instead of being copied by the model and again by its dump: an object of short keys at
    the body's value limit cost about 20 times its size with the two copies."""
    data = _json_object()
    user_params = data.get("user_params")
    if isinstance(user_params, dict):
        del data["user_params"]
    body = _validated(SendMessageRequest, data)
    del data
    webhook = body.webhook.model_dump(mode="json") if body.webhook else None
    message = body.model_dump(exclude={"webhook"})
    del body
    if isinstance(user_params, dict):
        message["user_params"] = user_params
    return message, webhook


def _create_body() -> tuple[list[dict[str, Any]], str | None]:
    """The ``state`` and ``title`` of a create request (``CreateSessionRequest``), each
    message checked and normalized in place, one model at a time: a model per message, all
    at once, would cost about 35 times the body (a state of 10,000 ``{"content": ""}``)."""
    data = _json_object(allow_empty=True)
    state = data.pop("state", None)
    title = _validated(CreateSessionRequest, data).title  # the rest of the body
    return _state_of(state), title


def _state_of(state: Any) -> list[dict[str, Any]]:
    if state is None:
        return []
    if not isinstance(state, list):
        raise Unprocessable(f"Invalid request body: state: Input should be a valid list of messages, got {type(state).__name__}")
    if len(state) > MAX_STATE_MESSAGES:
        raise BadRequest(
            f"state holds {len(state)} messages; a session may be created with at most {MAX_STATE_MESSAGES}"
        )
    problems: list[str] = []
    failed = 0
    for index, item in enumerate(state):
        try:
            message = ChatMessage.model_validate(item)
        except ValidationError as exc:
            failed += exc.error_count()
            problems.extend(_error_parts(exc, ("state", index))[: 5 - len(problems)])
            continue
        if not failed:
            state[index] = message.model_dump()  # JSON types only (see _not_json)
    if failed:
        raise Unprocessable(f"Invalid request body: {_summary(problems, failed)}")
    return state


def describe_validation_error(exc: ValidationError) -> str:
    return _summary(_error_parts(exc))


def _error_parts(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    return [
        f"{'.'.join(str(item) for item in prefix + tuple(error.get('loc', ()))) or 'body'}: {error.get('msg', 'invalid')}"
        for error in exc.errors()
    ]


def _summary(parts: list[str], total: int | None = None) -> str:
    """The first few problems, and how many more there are."""
    more = (len(parts) if total is None else total) - min(len(parts), 5)
    return "; ".join(parts[:5] + ([f"and {more} more"] if more > 0 else []))


def _shown_payload(payload: Any) -> Any:
    """An interrupt's payload as clients see it: with the policy the server enforces (the
    operator's ``--approval-policy`` fields in place of what the tool declared)."""
    return _server().turns.shown_payload(payload)


def _quorum_fields(item: PendingInterrupt, sender: str | None) -> dict[str, Any]:
    """An interrupt's ``approvals`` (those that count) and ``approvals_needed`` when its
    policy asks for a quorum; nothing otherwise. ``sender``: the key that sent the turn's
    message (its approval does not count where the policy forbids it)."""
    quorum, given = _server().turns.quorum_state(item.payload, item.approvals, sender)
    if quorum <= 1:
        return {}
    # At least one: a quorum met already (lowered since it was asked) waits for the approval that completes it.
    return {"approvals": [Approval(**approval_record(a, isoformat)) for a in given], "approvals_needed": max(quorum - len(given), 1)}


def _session_response(view: SessionView, sender: str | None = None) -> SessionResponse:
    """A session as the API shows it; ``sender``: the key that sent its live turn's message."""
    interrupts = None
    if view.status is SessionStatus.INTERRUPTED:
        interrupts = [
            InterruptInfo(
                interrupt_id=item.interrupt_id, type=item.type, payload=_shown_payload(item.payload),
                created_at=isoformat(item.created_at), expires_at=isoformat(item.expires_at), **_quorum_fields(item, sender),
            )
            for item in view.interrupts
        ]
    return SessionResponse(
        session_id=view.session_id,
        status=view.status.value,
        response=view.response,
        error=view.error,
        interrupts=interrupts,
    )


def _query(name: str) -> str | None:
    values = request.args.getlist(name)
    if len(values) > 1:
        raise BadRequest(f"Query parameter {name!r} given {len(values)} times; give it once")
    return values[0] if values else None


def _flag(name: str) -> bool:
    value = (_query(name) or "false").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"Query parameter {name!r} must be true or false, got {value!r}")


def _seconds(name: str, default: float, cap: float) -> float:
    raw = _query(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"Query parameter {name!r} must be a number of seconds, got {raw!r}") from None
    if math.isnan(value) or value < 0:
        raise BadRequest(f"Query parameter {name!r} must be a number of seconds >= 0, got {raw!r}")
    return min(value, cap)


def _count(name: str) -> int | None:
    """A positive whole number given as query parameter ``name``, or None when not given."""
    raw = _query(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise BadRequest(f"Query parameter {name!r} must be a whole number >= 1, got {raw!r}")
    return int(raw)


# -- routes ---------------------------------------------------------------------------------


@api.get("/health")
def health() -> Response:
    return _json(HealthResponse(**_server().health()))


@api.get("/whoami")
def whoami() -> Response:
    """Who this request's key is: its name, roles and whether it is read-only (a client
    offers only the answers it may give; the server checks every answer anyway)."""
    caller = g.caller
    return _json(WhoAmI(name=caller.name, roles=sorted(caller.roles), read_only=not caller.can_write))


@api.get("/metrics")
def metrics() -> Response:
    """Prometheus metrics (text format; OpenMetrics when asked for). A read-only key may
    read them; ``--metrics-port`` serves them without a key on a port of their own."""
    body, content_type = _server().metrics.render(request.headers.get("Accept"))
    return Response(body, content_type=content_type)


@api.get("/openapi.json")
def openapi() -> Response:
    from motus.serve.openapi import openapi_document

    return jsonify(openapi_document(auth=bool(_server().api_keys)))


@api.post("/sessions")
def create_session() -> Response:
    return _create(None, *_create_body())


@api.put("/sessions/<session_id>")
def put_session(session_id: str) -> Response:
    if not _server().allow_custom_ids:
        raise CustomIdsDisabled(
            "Custom session IDs are not enabled; start the server with --allow-custom-ids",
            headers={"Allow": "GET, DELETE"},
        )
    # Any spelling uuid.UUID reads (upper case, no dashes...) is accepted and kept as given,
    # as in the reference product: the client goes on using the id it chose.
    try:
        uuid.UUID(session_id)
    except ValueError:
        shown = session_id if len(session_id) <= 80 else session_id[:77] + "..."
        raise BadRequest(f"Session ID must be a valid UUID (like {uuid.uuid4()}), got {shown!r}") from None
    return _create(session_id, *_create_body())


def _create(session_id: str | None, state: list[dict[str, Any]], title: str | None) -> Response:
    view = _server().turns.create(session_id=session_id, state=state, title=title)
    return _json(_session_response(view), 201, {"Location": f"/sessions/{view.session_id}"})


@api.patch("/sessions/<session_id>")
def retitle_session(session_id: str) -> Response:
    """Set the session's title (beyond the guide); 200 with the session's summary."""
    _server().turns.get(session_id)  # 404 for an unknown session before judging the body
    body = _body(RetitleRequest)
    _server().turns.retitle(session_id, body.title, by=g.caller.name)
    return jsonify(_session_row(_server().turns.summary(session_id), titles=True))


@api.get("/sessions")
def list_sessions() -> Response:
    """The guide's rows; each with its ``title`` too with ``?titles=true`` (beyond the guide:
    the default answer stays the reference's exactly)."""
    titles = _flag("titles")
    return jsonify([_session_row(item, titles) for item in _server().turns.list()])


def _session_row(item: Any, titles: bool) -> dict[str, Any]:
    summary = SessionSummary(session_id=item.session_id, total_messages=item.total_messages, status=item.status, title=item.title)
    return summary.model_dump(mode="json", exclude=None if titles else {"title"})


#: Seconds a client refused a long-poll slot is asked to wait before it tries again.
WAITER_RETRY_AFTER = 1


#: A long poll that got a thread slot waits this long on its thread before its worker holds
#: it without one (``waiting.Ticket.thread_until``): most turns end within it, and a wait
#: that ends on its thread is not served a second time.
ON_THREAD_SECONDS = 0.5


def _take_waiter(waiters: Any) -> Any:
    """A long-poll slot for this request, or a 503 with ``Retry-After``: past the cap a
    ``?wait=true`` is refused, not answered at once (a client that long-polls in a loop would
    then spin). Returns the slots to give one back to, or None when none was taken.

    A request its worker can hold without a thread (``waiting``) is never refused: with a
    slot it waits ``ON_THREAD_SECONDS`` on its thread first, without one it is held at once;
    served again after a park, it takes no slot at all. Should the worker's cap be reached
    before it waits, it waits on its thread regardless: one request a thread, so at most
    ``--threads`` beyond the cap."""
    ticket = current_ticket()
    if waiters is None or (ticket is not None and ticket.deadline is not None):
        return None  # no cap, or a held poll served again: its event came, never refuse it
    holdable = ticket is not None and ticket.may_hold()
    if waiters.acquire(blocking=False):
        if holdable:
            ticket.thread_until = time.monotonic() + ON_THREAD_SECONDS  # type: ignore[union-attr]
        return waiters
    if holdable:
        return None
    raise TooManyWaiters(
        "Too many long polls waiting at once (the request threads left for them, see --threads, "
        "once --max-waiting are held without one); "
        f"try again in {WAITER_RETRY_AFTER} s, or open an event stream (GET /sessions/{{id}}/events)",
        headers={"Retry-After": str(WAITER_RETRY_AFTER)},
    )


@contextmanager
def _long_poll_slot() -> Iterator[None]:
    """Around a long poll's wait: its slot (``_take_waiter``), given back however the wait
    ends (a ``Parked`` included), and the long-poll gauge."""
    waiters = _take_waiter(_server().waiters)
    try:
        with _server().metrics.long_poll():
            yield
    finally:
        if waiters is not None:
            waiters.release()


@api.get("/sessions/<session_id>")
def get_session(session_id: str) -> Response:
    turns = _server().turns
    cap = _server().max_wait
    timeout = _seconds("timeout", min(DEFAULT_WAIT_SECONDS, cap), cap)  # checked even when unused
    if _flag("wait"):
        with _long_poll_slot():
            turns.wait(session_id, timeout)  # until it changes; what it is then is read below
    view, live = turns.get_with_live(session_id)  # one moment: interrupts and steps agree
    response = _session_response(view, live.by if live is not None else None)
    if view.status in (SessionStatus.RUNNING, SessionStatus.INTERRUPTED) and live is not None:
        quorum = {item.interrupt_id: info.model_dump(mode="json", include={"approvals", "approvals_needed"})
                  for item, info in zip(view.interrupts, response.interrupts or []) if info.approvals is not None}
        response.turn = describe_turn(
            live.turn_id, live.message, live.journal, isoformat, live.started_at, live.by, live.history_at,
            quorum=quorum, shown=_shown_payload,
        )
    return _json(response)


@api.delete("/sessions/<session_id>")
def delete_session(session_id: str) -> Response:
    _server().delete(session_id)
    return Response(status=204)


@api.post("/sessions/<session_id>/messages")
def send_message(session_id: str) -> Response:
    message, webhook = _message_body()
    if webhook is not None:
        why = _server().webhooks.never_deliverable(webhook["url"])
        if why is not None:  # refused now, not only in a log line at the end of the turn
            raise BadRequest(f"Invalid request body: webhook.url: {why}")
    _server().send_message(session_id, message, webhook, by=g.caller.name)
    return _json(
        MessageAccepted(session_id=session_id, status="running"), 202, {"Location": f"/sessions/{session_id}"}
    )


@api.get("/sessions/<session_id>/messages")
def get_messages(session_id: str) -> Response:
    """The stored history, as the guide says; with ``?senders=true`` (beyond the guide) each
    user message that started a turn also says who sent it and when (``sent_by``,
    ``sent_at``), where the server knows."""
    if not _flag("senders"):
        return jsonify(_server().turns.messages(session_id))
    messages, senders = _server().turns.messages_and_senders(session_id)
    for index, sender in senders.items():
        if index < len(messages):
            messages[index] = {**messages[index], "sent_by": sender.get("by"), "sent_at": isoformat(sender.get("at"))}
    return jsonify(messages)


@api.post("/sessions/<session_id>/resume")
def resume(session_id: str) -> Response:
    _server().turns.get(session_id)  # 404 for an unknown session before judging the body
    body = _body(ResumeRequest)
    answered = _server().answer(session_id, body.interrupt_id, body.value, by=g.caller.name, roles=g.caller.roles)
    return _json(ResumeAccepted(session_id=session_id, status=answered.status.value, approvals_needed=answered.needed,
                                detail=answered.progress and f"{answered.progress}; the call waits for "
                                f"{answered.needed} more from {'another key' if answered.needed == 1 else 'other keys'}"))


@api.get("/interrupts")
def inbox() -> Response:
    """Pending interrupts across every session, oldest first (the approvals inbox); with
    ``?limit=N`` the oldest N (an approver cannot act on thousands at once, and each read
    of all of them is megabytes). ``X-Total-Count`` says how many wait in all."""
    status = _query("status") or "pending"
    if status != "pending":
        raise BadRequest(f"Query parameter 'status' must be 'pending' (the inbox lists what waits on a person), got {status!r}")
    kind = _query("type") or None
    limit = _count("limit")
    cap = _server().max_wait
    timeout = _seconds("timeout", min(DEFAULT_WAIT_SECONDS, cap), cap)
    turns = _server().turns
    if _flag("wait"):
        with _long_poll_slot():
            turns.wait_inbox(kind, timeout)  # until there is one (the answer is the inbox as it is then)

    # Written as text from each item's kept text, not through InboxItem (the schema):
    # thousands of items are one answer on a request thread holding the GIL, and an open
    # Inbox view asks for it at every change (motus.serve.inbox_json); made once a change.
    def render(found: list[Any], counts: Any) -> tuple[bytes, int]:
        return inbox_text(found, turns.shown_payload, turns.quorum_state, _compact_json, limit, counts), len(found)

    text, total = turns.inbox_answer(kind, limit, render, size=lambda answer: len(answer[0]))
    response = current_app.response_class(text, mimetype=current_app.json.mimetype)  # type: ignore[attr-defined]
    response.headers["X-Total-Count"] = str(total)  # with ?limit, how many wait in all
    return response


def _compact_json(value: Any) -> str:
    """JSON text as ``jsonify`` writes it (the app's settings, no spaces)."""
    return current_app.json.dumps(value, separators=(",", ":"))


@api.get("/events")
def all_events() -> Response:
    return event_stream(_server(), None, request.headers.get("Last-Event-ID"), _query("after"), _client_socket())


@api.get("/sessions/<session_id>/events")
def session_events(session_id: str) -> Response:
    _server().turns.get(session_id)  # 404 for an unknown session
    return event_stream(_server(), session_id, request.headers.get("Last-Event-ID"), _query("after"), _client_socket())


def _client_socket() -> Any:
    """The client's socket where the WSGI server hands it over (gunicorn and Werkzeug do)."""
    return request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")


@api.get("/sessions/<session_id>/grants")
def list_grants(session_id: str) -> Response:
    grants = _server().turns.grants(session_id)
    return jsonify([
        Grant(tool_name=tool, granted_by=grant.get("by") or "", granted_at=isoformat(grant.get("at")) or "").model_dump(mode="json")
        for tool, grant in sorted(grants.items())
    ])


@api.delete("/sessions/<session_id>/grants/<tool_name>")
def revoke_grant(session_id: str, tool_name: str) -> Response:
    _server().turns.revoke(session_id, tool_name, by=g.caller.name)
    return Response(status=204)


@api.get("/sessions/<session_id>/audit")
def audit(session_id: str) -> Response:
    records = _server().turns.audit(session_id)
    return jsonify([
        AuditEntry(kind=record.kind, at=isoformat(record.at) or "", by=record.by, **_audit_data(record.data)).model_dump(mode="json")
        for record in records
    ])


def _audit_data(data: dict[str, Any]) -> dict[str, Any]:
    """An audit record's fields as clients read them: a quorum's approvals with ISO times."""
    shown = dict(data)
    for key in ("approvals", "not_counted"):
        if isinstance(data.get(key), list):
            shown[key] = [approval_record(a, isoformat) if isinstance(a, dict) else a for a in data[key]]
    return shown


# -- errors ---------------------------------------------------------------------------------


def _serve_error(exc: ServeError) -> Response:
    response = jsonify({"detail": exc.detail})
    response.status_code = exc.status_code
    response.headers.update(exc.headers)
    return response


def _http_error(exc: HTTPException) -> Response:
    if exc.code == 404:
        detail = f"Not found: no route for {request.method} {request.path}"
    elif exc.code == 413:
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        detail = f"Request body too large: the limit is {limit} bytes (--max-request-bytes)"
    elif exc.code == 405:
        allowed = ", ".join(sorted(exc.valid_methods or ()))  # type: ignore[attr-defined]
        detail = f"Method {request.method} is not allowed on {request.path}; allowed: {allowed}"
    else:
        detail = f"{exc.name}: {exc.description}" if exc.description else exc.name
    response = jsonify({"detail": detail})
    response.status_code = exc.code or 500
    if exc.code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
        response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
    return response


def _unexpected_error(exc: Exception) -> Response:
    log.exception("unexpected error serving %s %s", request.method, request.path)
    response = jsonify({"detail": "Internal server error"})
    response.status_code = 500
    return response
