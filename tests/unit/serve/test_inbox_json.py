"""``motus.serve.inbox_json``: the inbox's answer written without the API's models is, byte
for byte, what ``jsonify`` wrote of ``InboxItem(...).model_dump(mode="json")`` items (the
model is the oracle here, built the way the view built it before)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from flask import Flask, jsonify

from motus.api.approvers import approval_record
from motus.api.schemas import Approval, InboxContext, InboxItem
from motus.serve.events import isoformat
from motus.serve.inbox_json import inbox_text
from motus.serve.live import MAX_TEXT, message_text
from motus.serve.turns.queries import InboxEntry, TurnContext
from motus.serve.turns.state import PendingInterrupt

T0 = 1_764_000_000.123456


def by_model(entries: list[InboxEntry], shown: Any, quorum_state: Any) -> list[dict[str, Any]]:
    """The items as the view built them through the models."""
    counts = Counter(entry.session_id for entry in entries)
    seen: Counter[str] = Counter()
    items = []
    for entry in entries:
        item, context = entry.item, entry.context
        seen[entry.session_id] += 1
        quorum, given = quorum_state(item.payload, item.approvals, context.by)
        extra: dict[str, Any] = {}
        if quorum > 1:
            extra = {"approvals": [Approval(**approval_record(a, isoformat)) for a in given],
                     "approvals_needed": max(quorum - len(given), 1)}
        items.append(InboxItem(
            session_id=entry.session_id, interrupt_id=item.interrupt_id, type=item.type, payload=shown(item.payload),
            created_at=isoformat(item.created_at), expires_at=isoformat(item.expires_at), **extra,
            context=InboxContext(
                session_title=context.title, message=message_text(context.message), sent_by=context.by,
                sent_at=isoformat(context.started_at), agent_text=context.agent_text,
            ),
            position=seen[entry.session_id], of=counts[entry.session_id],
        ).model_dump(mode="json"))
    return items


def no_quorum(_payload: Any, _approvals: Any, _sender: str | None) -> tuple[int, list[Any]]:
    return 1, []


def quorum_from_payload(payload: Any, approvals: Any, sender: str | None) -> tuple[int, list[Any]]:
    """A stand-in for ``Machine.quorum_state``: the payload's ``quorum``; the sender's own
    approval does not count."""
    quorum = payload.get("quorum", 1)
    return quorum, [a for a in approvals if a.get("by") != sender] if quorum > 1 else []


def entry(session_id: str, payload: dict[str, Any], ref: str = "int-1", context: TurnContext | None = None,
          **times: Any) -> InboxEntry:
    return InboxEntry(session_id, PendingInterrupt(ref, payload, **times),
                      context or TurnContext(None, None, None, None, None))


APP = Flask(__name__)
APP.json.sort_keys = False  # type: ignore[attr-defined]  # as motus.serve.app sets it


def jsonified(items: list[dict[str, Any]]) -> str:
    """The answer's text as the app's ``jsonify`` writes it (its JSON settings)."""
    with APP.app_context():
        return jsonify(items).get_data(as_text=True)


def text_of(entries: list[InboxEntry], shown: Any = lambda p: p, quorum_state: Any = no_quorum, limit: int | None = None) -> str:
    """``inbox_text`` of ``entries``, written with the app's JSON settings."""
    with APP.app_context():
        return inbox_text(entries, shown, quorum_state, lambda value: APP.json.dumps(value, separators=(",", ":")), limit).decode()


def same(entries: list[InboxEntry], shown: Any = lambda p: p, quorum_state: Any = no_quorum) -> None:
    """The answer's text is jsonify's of the model's items (key order included): the first
    time (each item's text written and kept) and again (the kept texts joined)."""
    oracle = jsonified(by_model(entries, shown, quorum_state))
    for _ in range(2):
        assert text_of(entries, shown, quorum_state) == oracle
    assert all("text" in entry.rendered for entry in entries)


APPROVAL = {"type": "tool_approval", "tool_name": "delete_file", "arguments": {"path": "/tmp/x"}}


def test_a_bare_approval() -> None:
    same([entry("s1", APPROVAL)])


def test_times_and_a_whole_context() -> None:
    context = TurnContext("Logs", {"role": "user", "content": "delete the old logs"}, "alice", T0, "I will look first.")
    same([entry("s1", APPROVAL, context=context, created_at=T0, expires_at=T0 + 3600)])


def test_a_long_message_is_cut_as_the_model_cut_it() -> None:
    context = TurnContext(None, {"role": "user", "content": "x" * (MAX_TEXT + 10)}, None, None, None)
    same([entry("s1", APPROVAL, context=context)])
    context = TurnContext(None, {"role": "user", "content": [{"type": "text", "text": "parts"}]}, None, None, None)
    same([entry("s1", APPROVAL, context=context)])


@pytest.mark.parametrize("approvals", [(), ({"by": "bob", "at": T0},), ({"by": "bob", "at": T0}, {"by": "carol", "at": None})],
                         ids=["none-yet", "one", "met-already"])
def test_a_quorum_shows_its_approvals_and_how_many_more(approvals: tuple[dict[str, Any], ...]) -> None:
    payload = {**APPROVAL, "quorum": 2}
    context = TurnContext(None, {"role": "user", "content": "pay"}, "alice", T0, None)
    same([entry("s1", payload, context=context, approvals=approvals)], quorum_state=quorum_from_payload)


def test_the_senders_own_approval_is_not_counted() -> None:
    payload = {**APPROVAL, "quorum": 2}
    context = TurnContext(None, None, "alice", None, None)
    same([entry("s1", payload, context=context, approvals=({"by": "alice", "at": T0},))], quorum_state=quorum_from_payload)


def test_items_are_numbered_within_their_session() -> None:
    entries = [entry("s1", APPROVAL, "a"), entry("s2", APPROVAL, "b"), entry("s1", {"type": "user_input", "question": "?"}, "c"),
               entry("s1", APPROVAL, "d")]
    items = json.loads(text_of(entries))
    assert [(i["session_id"], i["position"], i["of"]) for i in items] == [("s1", 1, 3), ("s2", 1, 1), ("s1", 2, 3), ("s1", 3, 3)]
    same(entries)
    same(entries[1:])  # the same entries in another list: their kept texts, numbered anew
    for limit in (1, 2, 4, 9):  # the oldest only, each numbered among all its session's
        assert text_of(entries, limit=limit) == jsonified(by_model(entries, lambda p: p, no_quorum)[:limit])


def test_an_inbox_with_no_items_is_an_empty_list() -> None:
    same([])


@pytest.mark.parametrize("payload", [
    {"type": "custom", "values": (1, 2, (3,)), "nested": {"deep": [{"x": None}]}},
    {"type": "custom", "text": "naïve ✓ \u202e", "lone": "\udc80"},
    {"type": "custom", "big": 2**70, "small": -0.0, "nan": float("nan"), "inf": float("inf")},
    {"type": 7, "no": "string type"},
    {"question": "no type at all"},
], ids=["tuples", "unicode", "numbers", "odd-type", "no-type"])
def test_odd_payloads_are_shown_as_the_model_showed_them(payload: dict[str, Any]) -> None:
    same([entry("s1", payload)])


def test_the_shown_payload_is_the_policys() -> None:
    def shown(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "quorum": 3, "roles": ["finance"]}

    same([entry("s1", APPROVAL)], shown=shown)


def test_a_top_level_key_with_a_lone_surrogate_is_shown_as_the_model_showed_it() -> None:
    """``interrupt()`` and the server's check of an ``Interrupt`` let such a key through (a
    value too, which the tests above cover). The model's ``payload: dict[str, Any]`` validated
    each top-level key, putting U+FFFD in place of the surrogate; pydantic-core cannot encode
    the key as it is, so converting the payload as given raises (a 500 for the whole inbox)."""
    same([entry("s1", {"type": "confirm", "\udc80": 1, "a\ud800b": "v"})])


def test_a_nested_key_with_a_lone_surrogate_is_shown_replaced_not_a_500() -> None:
    """The model raised here (a 500 for the whole inbox); such keys are refused at the door
    now (``interrupt()``, the server's check of a worker's ``Interrupt``), but an earlier
    motus stored them."""
    items = json.loads(text_of([entry("s1", {"type": "confirm", "a": [{"\udc80": {"\ud800x": 1}}], "v": "\udc80"})]))
    assert items[0]["payload"] == {"type": "confirm", "a": [{"\ufffd" * 3: {"\ufffd" * 3 + "x": 1}}], "v": "\udc80"}
