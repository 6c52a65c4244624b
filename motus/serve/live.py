"""What a live turn has done so far, for the person asked to approve its next step.

A session's ``state`` changes only when its turn ends, so an approver who opens a waiting
session elsewhere would see the approval card and nothing else. ``describe_turn`` builds the
``turn`` object of ``GET /sessions/{id}`` (and of the events) from the turn's journal: the
user message that started it, then each journal record in order: the model's replies (text
and tool calls with their arguments), tool results, steps and interrupts (pending, or
resolved by whom).

Model replies are recorded as the provider sent them; both wire shapes motus speaks are
read here (OpenAI chat completions: ``choices[0].message``; Anthropic messages:
``content`` blocks). Anything else is shown by its label only. Long texts are cut to
``MAX_TEXT`` characters, so the object stays small whatever the turn did.

Pure functions of a journal snapshot: the caller holds the session lock while taking the
snapshot, not while describing it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from motus.durable.journal import unpack
from motus.durable.jsonshape import json_depth_exceeds, without_lone_surrogate_keys
from motus.durable.records import INTERRUPT, MODEL, STEP, TOOL, JournalEntry

#: Texts (model replies, tool results, arguments) are cut to this many characters.
MAX_TEXT = 2000


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... ({len(text) - MAX_TEXT} more characters)"


def _shown(value: Any) -> Any:
    """A JSON-ready, bounded rendering of a recorded value. A recorded value may be anything
    picklable (a step's set, bytes, NaN): what is returned is plain JSON, never the value
    itself, so the response can always be serialised."""
    if isinstance(value, str):
        return _cut(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _cut(repr(value))
    if len(text) > MAX_TEXT or json_depth_exceeds(value):  # pydantic cannot write ~255 levels
        return _cut(text)
    shown = json.loads(text)
    # An object key holding a lone surrogate (a provider's JSON can spell one) cannot be
    # written by pydantic-core: shown with U+FFFD in its place, not a 500 for the session.
    return without_lone_surrogate_keys(shown)


def _outcome(entry: JournalEntry) -> tuple[str, Any]:
    """("ok", value) or ("error", "Type: message") of a finished record."""
    try:
        return "ok", unpack(entry.value)
    except (Exception, SystemExit) as exc:  # a recorded exception, rebuilt: show it, never raise it
        # (SystemExit too: the bytes are a worker's, and unpickling may call anything.)
        return "error", _cut(f"{type(exc).__name__}: {exc}")


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return _shown(json.loads(raw))
        except (ValueError, RecursionError):  # a model's arguments: anything, ``[[[[...`` too
            return _cut(raw)
    return _shown(raw)


def model_reply(reply: Any) -> dict[str, Any] | None:
    """``{"text", "tool_calls": [{"name", "arguments"}]}`` of a provider reply, or None."""
    if not isinstance(reply, dict):
        return None
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if not isinstance(message, dict):
            return None  # not the shape motus reads: shown by its label only
        tool_calls = message.get("tool_calls")
        calls = []
        for call in tool_calls if isinstance(tool_calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                calls.append({"name": str(function.get("name")), "arguments": _arguments(function.get("arguments"))})
        content = message.get("content")
        return {"text": _cut(content) if isinstance(content, str) else "", "tool_calls": calls}
    blocks = reply.get("content")
    if isinstance(blocks, list):
        texts, calls = [], []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "tool_use":
                calls.append({"name": str(block.get("name")), "arguments": _arguments(block.get("input"))})
        return {"text": _cut("".join(texts)), "tool_calls": calls}
    return None


def describe_step(
    entry: JournalEntry, isoformat: Any, quorum: Mapping[str, Any] | None = None,
    shown: Callable[[Any], Any] = lambda payload: payload,
) -> dict[str, Any]:
    """One step of a live turn. An interrupt's payload as ``shown`` makes it (the server's
    approval policy in place of the tool's), and a pending one's ``quorum`` fields, if it
    has a quorum (``approvals``, ``approvals_needed``, as the session shows them)."""
    step: dict[str, Any] = {"seq": entry.seq, "kind": entry.kind, "label": entry.label}
    if entry.kind == INTERRUPT:
        step.update(interrupt_id=entry.ref, type=entry.label, payload=shown(entry.payload), created_at=isoformat(entry.created_at))
        if entry.done:
            kind, value = _outcome(entry)
            step.update(status="resolved", by=entry.answered_by, at=isoformat(entry.answered_at), value=_shown(value))
        else:
            step.update(status="pending", expires_at=isoformat(entry.expires_at), **(quorum or {}))
        return step
    if not entry.done:
        step["status"] = "running"
        return step
    try:
        return dict(_finished_step(entry))  # a copy: the cached one is shared
    except TypeError:  # a field that cannot be hashed (no record of ours has one): not cached
        return dict(_finished_step.__wrapped__(entry))


@functools.lru_cache(maxsize=1024)
def _finished_step(entry: JournalEntry) -> dict[str, Any]:
    """A finished model call, tool or step, described once. Its record never changes (a new
    one is a new entry), and a live view is read at every change of a running turn: without
    this, every ``GET`` unpickled and re-rendered every step so far (18 ms for 100 model
    calls and tools, under the GIL). Keyed by the entry itself (a frozen dataclass whose
    ``value`` bytes keep their hash), so an entry that differs in anything is described anew."""
    step: dict[str, Any] = {"seq": entry.seq, "kind": entry.kind, "label": entry.label}
    kind, value = _outcome(entry)
    step["status"] = "done" if kind == "ok" else "failed"
    if entry.kind == MODEL:
        reply = model_reply(value) if kind == "ok" else None
        if reply is not None:
            step.update(reply)
        elif kind == "error":
            step["error"] = value
    elif entry.kind in (TOOL, STEP):
        step["result" if kind == "ok" else "error"] = _shown(value)
    return step


def _in_order(journal: Iterable[JournalEntry]) -> list[JournalEntry]:
    """The records by seq, without a model record inside another model record: a client of
    the user's own around one of motus's journals one reply twice (ReActAgent the outer
    record, the HTTP client its request inside it); it is shown once, as the outer one."""
    entries = sorted(journal, key=lambda e: e.seq)
    models = {entry.seq for entry in entries if entry.kind == MODEL}
    return [entry for entry in entries if not (entry.kind == MODEL and entry.parent in models)]


def agent_text(replies: Iterable[JournalEntry]) -> str | None:
    """What the agent said so far in a turn: the text of its finished model records, in
    order, a blank line between replies; None when it said nothing. A long text keeps its
    end, where the words that led to the pending question are. A reply journaled twice is
    read once (``_in_order``)."""
    texts = []
    for entry in _in_order(replies):
        if entry.kind != MODEL or not entry.done:
            continue
        text = describe_step(entry, _no_time).get("text")
        if isinstance(text, str) and text.strip():
            texts.append(text.strip())
    if not texts:
        return None
    joined = "\n\n".join(texts)
    return joined if len(joined) <= MAX_TEXT else f"({len(joined) - MAX_TEXT} characters before) ..." + joined[-MAX_TEXT:]


def message_text(message: Any) -> str | None:
    """The text of a chat message (its ``content``), cut to ``MAX_TEXT``; None without one."""
    content = message.get("content") if isinstance(message, dict) else None
    return _cut(content) if isinstance(content, str) else None


def _no_time(_at: Any) -> None:
    return None


def describe_turn(
    turn_id: int,
    message: dict[str, Any],
    journal: Iterable[JournalEntry],
    isoformat: Any,
    started_at: float | None = None,
    by: str | None = None,
    history_at: int | None = None,
    quorum: Mapping[str, Mapping[str, Any]] | None = None,
    shown: Callable[[Any], Any] = lambda payload: payload,
) -> dict[str, Any]:
    """The ``turn`` object: the message that started it, when and by whom (the name of the
    key that sent it), where its messages will start in the history (``history_at``: the
    history's length, which changes only when a turn ends), and what happened since.

    ``history_at`` lets a client that reads the session and then its messages tell that the
    turn ended between the two reads (the history is longer than ``history_at``): it then
    shows the stored messages, not the turn's steps beside them (which showed the reply
    twice). ``quorum``: per interrupt id with a quorum, its ``approvals`` and
    ``approvals_needed``; ``shown``: an interrupt's payload as clients see it."""
    return {
        "turn_id": turn_id,
        "started_at": isoformat(started_at),
        "sent_by": by,
        "history_at": history_at,
        "message": message,
        "steps": [describe_step(entry, isoformat, (quorum or {}).get(entry.ref or ""), shown) for entry in _in_order(journal)],
    }
