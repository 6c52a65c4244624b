"""Stored records the store tests write: journal entries of each kind, and a session row."""

from __future__ import annotations

from typing import Any

from motus.serve.journal import pack
from motus.serve.protocol import INTERRUPT, MODEL, TOOL, JournalEntry
from motus.serve.store import SessionRecord, TurnRecord

#: A NUL, a lone surrogate, a bidi override, a non-ASCII letter: stored and read back exactly.
MESSAGE = {"role": "user", "content": "h\u00e9llo \u0000 there \ud800 \u202e"}
REPLY = {"role": "assistant", "content": "hi"}

PENDING = JournalEntry(
    seq=1, kind=INTERRUPT, key='{"type": "tool_approval"}', label="tool_approval", ref="int-1",
    payload={"type": "tool_approval", "args": {"path": "/tmp", "n": [1, 2.5, None]}},
)
ANSWERED = JournalEntry(
    seq=2, kind=INTERRUPT, key='{"type": "color"}', label="color", done=True, value=pack(("ok", "blue")), ref="int-2",
    payload={"type": "color"}, answered_at=1767225600.25, answered_by="ops",
)
MODEL_CALL = JournalEntry(seq=3, kind=MODEL, key="d41d8cd9", label="chat", done=True, value=b"\x00\x01\xffraw bytes")
STARTED = JournalEntry(seq=4, kind=TOOL, key="delete_db:{}", label="delete_db")

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} \u0000 \ud800"} for i in range(100)]


def session(session_id: str = "s1", turn: TurnRecord | None = None, **changes: Any) -> SessionRecord:
    fields: dict[str, Any] = {
        "session_id": session_id, "status": "interrupted" if turn else "idle", "state": [MESSAGE, REPLY],
        "response": REPLY, "error": None, "turn_id": turn.turn_id if turn else 0, "touched": 1767225600.5, "turn": turn,
    }
    fields.update(changes)
    return SessionRecord(**fields)


def live_turn(turn_id: int = 1) -> TurnRecord:
    return TurnRecord(turn_id=turn_id, message=MESSAGE, webhook={"url": "https://hook.example/x", "secret": "s"}, deadline=1767229200.0)
