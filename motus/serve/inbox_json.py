"""The inbox's answer (``GET /interrupts``) written as JSON text, item by item.

Guarantee: the text is, byte for byte, what ``jsonify`` writes of a list of
``InboxItem(...).model_dump(mode="json")`` for the same pending interrupts (the API's model
stays the schema: the OpenAPI document and the clients read it;
``tests/unit/serve/test_inbox_json.py`` holds the two side by side).

Why not the model: an inbox of thousands of pending approvals is one answer, built on a
request thread that holds the GIL all the while, so every other request waits for it. The
model costs ~25 us an item (validating the fields, then the serializer that drops the quorum
fields), four fifths of the answer's time besides the JSON text; these dicts a fraction of
that. The payload goes through pydantic-core's own conversion of arbitrary values
(``to_jsonable_python``, in Rust), the one the model's ``payload`` field used, so a value
the model would have shown in some form is shown in the same form (a NaN or an infinity as
``null``, as the model's JSON mode does, never as text no JSON parser reads).

Pure: no Flask, no server; the caller passes the two policy lookups it needs.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

from motus.api.approvers import approval_record
from motus.durable.jsonshape import without_lone_surrogate_keys
from motus.serve.events import isoformat
from motus.serve.live import message_text


class _Pending(Protocol):
    interrupt_id: str
    payload: Any
    created_at: float | None
    expires_at: float | None
    approvals: Any

    @property
    def type(self) -> str: ...


class _Context(Protocol):
    title: str | None
    message: Any
    by: str | None
    started_at: float | None
    agent_text: str | None


class _Entry(Protocol):
    session_id: str
    item: _Pending
    context: _Context
    #: The item's JSON text, once written (``inbox_text``).
    rendered: dict[str, Any]


def inbox_text(
    entries: Sequence[_Entry],
    shown_payload: Callable[[Any], Any],
    quorum_state: Callable[[Any, Any, str | None], tuple[int, Sequence[Mapping[str, Any]]]],
    dumps: Callable[[Any], str],
    limit: int | None = None,
    counts: Mapping[str, int] | None = None,
) -> bytes:
    """The answer for ``entries`` (oldest first, as the inbox lists them), as ``jsonify``
    writes it (UTF-8, its closing newline included), where ``dumps`` writes JSON without
    spaces as ``jsonify`` does: a list's text is its items' texts joined. Each item is
    numbered among its session's (``position`` of ``of``); with a ``limit``, the first items
    only, each still numbered among all its session's (``counts``: how many items each
    session has in ``entries``, when already known). ``shown_payload(payload)``: the
    payload as clients see it (with the enforced policy); ``quorum_state(payload, approvals,
    sender)``: its quorum and the approvals that count (``Machine.quorum_state``).

    Each item's text is written once and kept on its entry (``rendered``), with the position
    it was written for: an entry lives in the kept inbox until its session changes
    (``Queries.inbox``), and an open Inbox view reads the whole inbox at every change, so
    with thousands pending the answer is mostly joined, not made. What the text depends on
    besides the entry and its position (the policy's shown payload and quorum, the keys'
    roles) is fixed for the life of the server."""
    if counts is None:
        counts = Counter(map(_session_id, entries))
    seen: dict[str, int] = {}
    parts = []
    for entry in entries if limit is None else entries[:limit]:
        session_id = entry.session_id
        position = seen[session_id] = seen.get(session_id, 0) + 1
        of = counts[session_id]
        rendered = entry.rendered
        kept = rendered.get("text")  # one value (position, of, text): request threads share entries
        if kept is None or kept[0] != position or kept[1] != of:  # new, or in a list of one type
            kept = rendered["text"] = (position, of, dumps(_item(entry, shown_payload, quorum_state, position, of)).encode())
        parts.append(kept[2])
    if not parts:
        return b"[]\n"
    parts[0] = b"[" + parts[0]  # joined once: megabytes are copied once, not three times
    parts[-1] += b"]\n"
    return b",".join(parts)


_session_id = attrgetter("session_id")


def _item(
    entry: _Entry,
    shown_payload: Callable[[Any], Any],
    quorum_state: Callable[[Any, Any, str | None], tuple[int, Sequence[Mapping[str, Any]]]],
    position: int,
    of: int,
) -> dict[str, Any]:
    item, context = entry.item, entry.context
    shown: dict[str, Any] = {
        "interrupt_id": item.interrupt_id,
        "type": item.type,
        "payload": _jsonable(shown_payload(item.payload)),
        "created_at": isoformat(item.created_at),
        "expires_at": isoformat(item.expires_at),  # the inbox always shows both times
    }
    quorum, given = quorum_state(item.payload, item.approvals, context.by)
    if quorum > 1:  # only an interrupt with a quorum has these (at least one more is needed)
        shown["approvals"] = _approvals(given)
        shown["approvals_needed"] = max(quorum - len(given), 1)
    shown["session_id"] = entry.session_id
    shown["context"] = {
        "session_title": context.title,
        "message": message_text(context.message),
        "sent_by": context.by,
        "sent_at": isoformat(context.started_at),
        "agent_text": context.agent_text,
    }
    shown["position"] = position
    shown["of"] = of
    return shown


def _jsonable(payload: Any) -> Any:
    try:
        return to_jsonable_python(payload, inf_nan_mode="null")
    except UnicodeEncodeError:
        # An object key with a lone surrogate (pydantic-core writes keys as UTF-8): refused at
        # the door since, but an earlier motus stored such payloads. Shown with U+FFFD in its
        # place, as the model showed a top-level one, not a 500 for the whole inbox.
        return to_jsonable_python(without_lone_surrogate_keys(payload), inf_nan_mode="null")


def _approvals(given: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [approval_record(approval, isoformat) for approval in given]
