"""The OpenAPI 3.1 document of the REST API, generated from the models the views use.

Every body and response schema comes from ``schemas.py`` (pydantic's JSON Schema, in
validation mode, so optional fields may be absent as they are on the wire), so the document
cannot drift from what the views accept and answer. Every error status a route can return
is listed with the ``ErrorResponse`` schema. ``motus serve openapi`` prints it; a running
server serves it at ``GET /openapi.json``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from motus import __version__
from motus.models import ChatMessage
from motus.api.schemas import (
    AuditEntry,
    CreateSessionRequest,
    ErrorResponse,
    Grant,
    HealthResponse,
    InboxItem,
    MessageAccepted,
    ResumeAccepted,
    ResumeRequest,
    RetitleRequest,
    SendMessageRequest,
    SessionResponse,
    SessionSummary,
    WhoAmI,
)

_MODELS: list[type[BaseModel]] = [
    AuditEntry,
    ChatMessage,
    CreateSessionRequest,
    ErrorResponse,
    Grant,
    HealthResponse,
    InboxItem,
    MessageAccepted,
    ResumeAccepted,
    ResumeRequest,
    RetitleRequest,
    SendMessageRequest,
    SessionResponse,
    SessionSummary,
    WhoAmI,
]

_REASONS = {
    400: "Bad request: a body past a shape limit (too many items, nested too deeply), a body that could not be read, a bad query parameter, a custom session ID that is not a UUID, a webhook that may not be called, or a Host name a loopback server does not answer to",
    401: "Missing or wrong API key",
    403: "A cross-site request (its Origin is not this server's), a read-only API key on a route that writes, or a resume from a key the interrupt's approver policy leaves out (a role it lacks, or the sender answering where the tool forbids it)",
    404: "Unknown session, an interrupt id that is not pending right now, or no such grant",
    405: "Custom session IDs are not enabled (start with --allow-custom-ids)",
    409: "The session is running or interrupted, or the id exists",
    413: "Request body larger than --max-request-bytes",
    414: "Request line (method, path and query) longer than the server reads",
    415: "A body that is not declared Content-Type: application/json",
    431: "Request header fields too large, or too many of them",
    422: "The body is missing, is not JSON, is not an object, or does not match the schema; the detail names the problem",
    503: "Session limit reached, every event stream or long-poll slot taken (--max-streams, --threads, once --max-waiting are held without a thread; Retry-After says when to try again), the session store unavailable or a session that kept changing while the request waited (Retry-After: 1), or the server is shutting down",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(
    summary: str,
    ok: tuple[int, str, dict[str, Any] | None],
    errors: list[int],
    body: tuple[str, bool] | None = None,
    params: list[dict[str, Any]] | None = None,
    headers: dict[str, Any] | None = None,
    auth: bool = True,
) -> dict[str, Any]:
    status, description, schema = ok
    success: dict[str, Any] = {"description": description}
    if schema is not None:
        success["content"] = _json_content(schema) if schema.get("type") != "event-stream" else {
            "text/event-stream": {"schema": {"type": "string"}}
        }
    if headers:
        success["headers"] = headers
    responses: dict[str, Any] = {str(status): success}
    # Every operation refuses a foreign Host (400), a cross-site Origin (403), and a request
    # line or head too large to read (414, 431: answered before any route is chosen); one
    # with a body also refuses a body that is not declared JSON (415) and one that is
    # missing, not JSON, not an object or not of the schema (422).
    with_body = {415, 422} if body is not None else set()
    codes = sorted(set(errors) | {400, 403, 414, 431} | with_body | ({401} if auth else set()))
    for code in codes:
        responses[str(code)] = {"description": _REASONS[code], "content": _json_content(_ref("ErrorResponse"))}
    if auth:
        responses["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        operation["parameters"] = params
    if body is not None:
        name, required = body
        operation["requestBody"] = {"required": required, "content": _json_content(_ref(name))}
    if not auth:
        operation["security"] = []
    return operation


_SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
_TOOL_NAME = {"name": "tool_name", "in": "path", "required": True, "schema": {"type": "string"}}
_STREAM = {"type": "event-stream"}
_LOCATION = {"Location": {"description": "Where to poll the session", "schema": {"type": "string"}}}
_TOTAL = {"X-Total-Count": {"description": "How many interrupts wait in all (more than listed with ?limit)", "schema": {"type": "integer"}}}


def openapi_document(auth: bool = False) -> dict[str, Any]:
    """The document; ``auth`` adds the bearer security scheme a keyed server enforces."""
    _, definitions = models_json_schema(
        [(model, "validation") for model in _MODELS], ref_template="#/components/schemas/{model}"
    )
    schemas = definitions.get("$defs", {})
    session = _ref("SessionResponse")
    wait_params = [
        _SESSION_ID,
        {"name": "wait", "in": "query", "required": False, "schema": {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]}, "description": "Long poll: return when the status is not running"},
        {"name": "timeout", "in": "query", "required": False, "schema": {"type": "number", "minimum": 0}, "description": "Seconds a long poll waits at most (capped by --max-wait)"},
    ]
    titles_param = {"name": "titles", "in": "query", "required": False, "schema": wait_params[1]["schema"], "description": "Add each session's title"}
    inbox_params = [
        {"name": "status", "in": "query", "required": False, "schema": {"type": "string", "enum": ["pending"]}},
        {"name": "type", "in": "query", "required": False, "schema": {"type": "string"}, "description": "Only interrupts of this type"},
        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}, "description": "Only the oldest this many (X-Total-Count says how many wait in all)"},
        *wait_params[1:],
    ]
    stream_params = [
        {"name": "after", "in": "query", "required": False, "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}, "description": "Start after this event id (as Last-Event-ID does)"},
        {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
    ]
    paths = {
        "/health": {
            "get": _operation("Server health", (200, "Health", _ref("HealthResponse")), [], auth=False),
        },
        "/openapi.json": {
            "get": _operation("This document", (200, "The OpenAPI document", {"type": "object"}), [], auth=auth),
        },
        "/sessions": {
            "post": _operation("Create a session", (201, "Created", session), [400, 413, 422, 503], body=("CreateSessionRequest", False), headers=_LOCATION, auth=auth),
            "get": _operation("List sessions", (200, "Sessions", {"type": "array", "items": _ref("SessionSummary")}), [400], params=[titles_param], auth=auth),
        },
        "/sessions/{session_id}": {
            "put": _operation("Create a session with a client-chosen UUID", (201, "Created", session), [400, 405, 409, 413, 422, 503], body=("CreateSessionRequest", False), params=[_SESSION_ID], headers=_LOCATION, auth=auth),
            "get": _operation("Get a session, or long poll it", (200, "The session", session), [400, 404, 503], params=wait_params, auth=auth),
            "delete": _operation("Delete a session (kills its turn)", (204, "Deleted", None), [404], params=[_SESSION_ID], auth=auth),
            "patch": _operation("Set the session's title", (200, "The session, titled", _ref("SessionSummary")), [400, 404, 413, 422, 503], body=("RetitleRequest", True), params=[_SESSION_ID], auth=auth),
        },
        "/sessions/{session_id}/messages": {
            "post": _operation("Send a message: starts a turn", (202, "Accepted", _ref("MessageAccepted")), [400, 404, 409, 413, 422, 503], body=("SendMessageRequest", True), params=[_SESSION_ID], headers=_LOCATION, auth=auth),
            "get": _operation("The session's stored messages, oldest first", (200, "Messages", {"type": "array", "items": _ref("ChatMessage")}), [404], params=[_SESSION_ID], auth=auth),
        },
        "/sessions/{session_id}/resume": {
            "post": _operation("Answer one pending interrupt", (200, "Delivered", _ref("ResumeAccepted")), [400, 403, 404, 413, 422], body=("ResumeRequest", True), params=[_SESSION_ID], auth=auth),
        },
        "/whoami": {
            "get": _operation("The key this request came with: name, roles, read-only", (200, "The key", _ref("WhoAmI")), [], auth=auth),
        },
        "/interrupts": {
            "get": _operation("The inbox: pending interrupts of every session, oldest first", (200, "Pending interrupts", {"type": "array", "items": _ref("InboxItem")}), [400, 503], params=inbox_params, headers=_TOTAL, auth=auth),
        },
        "/events": {
            "get": _operation("Server-sent events of every session", (200, "An event stream", _STREAM), [400, 503], params=stream_params, auth=auth),
        },
        "/sessions/{session_id}/events": {
            "get": _operation("Server-sent events of one session", (200, "An event stream", _STREAM), [400, 404, 503], params=[_SESSION_ID, *stream_params], auth=auth),
        },
        "/sessions/{session_id}/grants": {
            "get": _operation("Tools approved for the rest of the session", (200, "Grants", {"type": "array", "items": _ref("Grant")}), [404], params=[_SESSION_ID], auth=auth),
        },
        "/sessions/{session_id}/grants/{tool_name}": {
            "delete": _operation("Revoke a grant (from the session's next turn)", (204, "Revoked", None), [404], params=[_SESSION_ID, _TOOL_NAME], auth=auth),
        },
        "/sessions/{session_id}/audit": {
            "get": _operation("Who resolved which interrupt, and grants given and revoked, oldest first", (200, "Audit records", {"type": "array", "items": _ref("AuditEntry")}), [404], params=[_SESSION_ID], auth=auth),
        },
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "motus serve",
            "version": __version__,
            "description": "Serve an agent over HTTP; sessions, turns, and human-in-the-loop interrupts.",
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
