"""Logs an operator can use: ``--log-format text`` (the default) or ``json``, and one line per
request.

- ``json``: one JSON object per line, for every logger of the server process (gunicorn's
  own included): ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``pid``, ``message``,
  ``exception`` when there is a traceback, and the request's fields below when the line
  was written while serving a request.
- Each request the application answers is logged once, at ``info``, by ``motus.access``:
  ``request_id``, ``session_id`` (when the request names one, or created one), ``method``,
  ``path`` (never the query string), ``status`` and ``duration_ms`` (to the response's
  headers: an event stream's line is written when it starts). The request id is the
  client's ``X-Request-Id`` when it is sane (1 to 128 letters, digits, ``.``, ``_``,
  ``:``, ``-``), else a new one; it is echoed in the response's ``X-Request-Id``.
  gunicorn's own access log stays off, so there is one line per request. A request the
  worker refuses before the application sees it (a head or body past a limit, a client too
  slow to send it) has no line of its own: those are counted in gunicorn's periodic warning.
- A held long poll answered with a copy of an alike request's answer (see
  ``motus.serve.gunicorn.worker``) has its own line, request id and count, marked ``alike``.
- Never logged: headers (so no API key), query strings (where a client might put a token),
  bodies (messages, resume values, webhook tokens).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from motus.serve import waiting

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
REQUEST_ID_HEADER = "X-Request-Id"
#: A client's request id is kept only if it is this: bounded, and safe in any log format.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Paths and session ids are cut to this many characters in a log line.
MAX_LOGGED_CHARS = 256

access_log = logging.getLogger("motus.access")

#: The fields of the request being served by this thread (None outside a request).
_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("motus_request", default=None)


def request_id_from(header: str | None) -> str:
    """The client's request id if it is sane, else a new one."""
    if header and SANE_REQUEST_ID.fullmatch(header):
        return header
    return os.urandom(16).hex()  # as random as uuid4().hex, at a tenth of its cost


def printable(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with control characters, quotes, backslashes
    and non-ASCII escaped, so that a client cannot forge a line of a text log."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return json.dumps(text)[1:-1]


# -- formatters ---------------------------------------------------------------------------------


def _request_fields(record: logging.LogRecord) -> dict[str, Any] | None:
    fields = getattr(record, "motus_request", None)
    return fields if fields is not None else _current.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        fields = _request_fields(record)
        if fields:
            if getattr(record, "motus_request", None) is not None:  # the access line: its fields say the rest
                entry["message"] = f"{fields['method']} {fields['path']} {fields['status']}"
            for key, value in fields.items():
                if value is not None:
                    entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """The classic line; a line written while serving a request ends with its request id
    (and session id)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _request_fields(record)
        if fields and record.name != access_log.name:  # the access line names them itself
            extra = f" request_id={fields['request_id']}"
            if fields.get("session_id"):
                extra += f" session_id={fields['session_id']}"
            first, newline, rest = line.partition("\n")  # after the message, before a traceback
            line = first + extra + newline + rest
        return line


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format``, as ``logging.basicConfig`` would: a
    process whose root logger has handlers already (an embedding application, pytest) keeps
    them, and a later call only sets the format of the handler an earlier one added."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level.upper())
        for handler in root.handlers:
            handler.motus_handler = True  # type: ignore[attr-defined]
    for handler in root.handlers:
        if getattr(handler, "motus_handler", False):
            handler.setFormatter(formatter(log_format))


def gunicorn_logger_class(log_format: str) -> Any:
    """gunicorn's logger with every handler writing ``log_format`` (None: gunicorn's own)."""
    if log_format != "json":
        return None
    from gunicorn.glogging import Logger

    class JsonGunicornLogger(Logger):
        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            for logger in (self.error_log, self.access_log):
                for handler in logger.handlers:
                    handler.setFormatter(JsonFormatter())

    return JsonGunicornLogger


# -- the request log ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    """What the request log says of an answer, but its request id and duration: kept on a
    waiting request's ticket, so that a copy of the answer sent to an alike request (see
    ``motus.serve.gunicorn.worker``) is counted and logged as its own request."""

    method: str  # printable
    endpoint: str | None
    status: int
    path: str  # printable
    session_id: str | None  # printable
    streamed: bool = False


def log_answer(app: Any, answered: Answered, request_id: str, duration_ms: float | None, alike: bool = False) -> None:
    """Count one answer in the metrics and write its access log line (``alike``: a copy of
    another request's answer, served without running the view)."""
    log_answers(app, answered, [request_id], duration_ms, alike)


def log_answers(app: Any, answered: Answered, request_ids: list[str], duration_ms: float | None, alike: bool = False) -> None:
    """``log_answer`` for several answers alike but for their request ids (the copies of one
    answer): counted in one step, an access log line each."""
    metrics = getattr(app.extensions.get("motus"), "metrics", None)
    if metrics is not None:
        metrics.request(answered.method, answered.endpoint, answered.status, len(request_ids))
    if not access_log.isEnabledFor(logging.INFO):
        return
    session = f" session_id={answered.session_id}" if answered.session_id else ""
    for request_id in request_ids:
        line: dict[str, Any] = {"request_id": request_id, "session_id": answered.session_id, "method": answered.method,
                                "path": answered.path, "status": answered.status, "duration_ms": duration_ms}
        if answered.streamed:
            line["streamed"] = True
        if alike:
            line["alike"] = True
        access_log.info(
            "%s %s %s %.1f ms request_id=%s%s%s", answered.method, answered.path, answered.status, duration_ms or 0.0,
            request_id, session, " (a copy of an alike request's answer)" if alike else "", extra={"motus_request": line},
        )


def install_request_log(app: Any) -> None:
    """Log every request ``app`` answers (see the module docstring). Installed before any
    other ``before_request``, so a refused request is logged too."""
    from flask import g, request

    def begin() -> None:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        g.motus_request_started = time.perf_counter()
        session_id = (request.view_args or {}).get("session_id")
        g.motus_request_token = _current.set({
            "request_id": request_id,
            "session_id": printable(session_id, 128) if isinstance(session_id, str) else None,
        })

    def end(response: Any) -> Any:
        fields = _current.get()
        if fields is None:  # begin did not run (another app's hook raised first)
            return response
        response.headers[REQUEST_ID_HEADER] = fields["request_id"]
        started = g.get("motus_request_started")
        duration_ms = round((time.perf_counter() - started) * 1000, 3) if started is not None else None
        status = response.status_code
        if fields["session_id"] is None and status == 201:
            location = response.headers.get("Location") or ""
            if location.startswith("/sessions/"):
                fields["session_id"] = printable(location[len("/sessions/"):], 128)
        answered = Answered(printable(request.method, 16), request.endpoint, status, printable(request.path),
                            fields["session_id"], response.is_streamed)
        ticket = waiting.current()
        if ticket is not None:
            ticket.answered = answered  # for the alike requests the worker answers with a copy
        log_answer(app, answered, fields["request_id"], duration_ms)
        return response

    def teardown(_exc: BaseException | None) -> None:
        token = g.pop("motus_request_token", None)
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # set in another context (cannot happen with one thread per request)
                _current.set(None)

    app.before_request_funcs.setdefault(None, []).insert(0, begin)
    app.after_request(end)
    app.teardown_request(teardown)
