"""Who sent which message of a history, as a turn's end leaves it (``machine._senders``)."""

from __future__ import annotations

from motus.serve.turns.machine import SENDERS_KEPT, _senders
from motus.serve.turns.state import Session, Turn


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str) -> dict:
    return {"role": "assistant", "content": text}


def ended(history: list[dict], senders: dict, message: str, by: str | None, new: list[dict]) -> dict:
    session = Session(session_id="s", touched=0.0, state=history, senders=senders)
    turn = Turn(session_id="s", turn_id=2, message=user(message), webhook=None, deadline=None, started_at=50.0, by=by)
    return _senders(session, turn, new)


def test_an_agent_that_appends_keeps_every_sender_and_adds_the_turns() -> None:
    history = [user("a"), reply("A")]
    assert ended(history, {0: {"by": "alice", "at": 1.0}}, "b", "bob", [*history, user("b"), reply("B")]) == {
        0: {"by": "alice", "at": 1.0}, 2: {"by": "bob", "at": 50.0}}


def test_a_message_the_agent_did_not_store_where_its_turn_began_gets_no_sender() -> None:
    history = [user("a"), reply("A")]
    assert ended(history, {}, "b", "bob", [*history, user("rewritten b"), reply("B")]) == {}
    assert ended(history, {}, "b", "bob", history) == {}  # not stored at all
    assert ended(history, {}, "b", None, [*history, user("b")]) == {}  # nobody known


def test_a_rewritten_history_loses_the_senders_it_cannot_match_and_never_names_a_wrong_one() -> None:
    history = [user("a"), reply("A"), user("b"), reply("B")]
    known = {0: {"by": "alice", "at": 1.0}, 2: {"by": "bob", "at": 2.0}}
    summarised = [user("summary of a and b"), reply("ok"), user("c")]
    assert ended(history, known, "c", "carol", summarised) == {}  # index 2 now holds "c", not carol's turn start
    shorter = [user("a"), reply("A")]
    assert ended(history, known, "c", "carol", shorter) == {0: {"by": "alice", "at": 1.0}}


def test_only_the_newest_senders_are_kept() -> None:
    history = [message for n in range(SENDERS_KEPT) for message in (user(str(n)), reply(str(n)))]
    known = {2 * n: {"by": "alice", "at": float(n)} for n in range(SENDERS_KEPT)}
    after = ended(history, known, "last", "bob", [*history, user("last")])
    assert len(after) == SENDERS_KEPT and 0 not in after and after[len(history)] == {"by": "bob", "at": 50.0}
