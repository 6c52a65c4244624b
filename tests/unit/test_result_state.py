"""``protocol.unchanged_prefix`` and ``protocol.resulting_state``: how a worker sends back
only the changed part of a history, and how the server puts the whole one together again."""

from __future__ import annotations

import pytest

from motus.serve.protocol import Result, resulting_state, unchanged_prefix

A, B, C, D = ({"role": "user", "content": x} for x in "abcd")
REPLY = {"role": "assistant", "content": "r"}


@pytest.mark.parametrize(
    ("old", "new", "kept"),
    [
        ([], [], 0),
        ([], [A], 0),
        ([A, B], [A, B], 2),
        ([A, B], [A, B, C, REPLY], 2),
        ([A, B, C], [A, {"role": "user", "content": "b, edited"}, C], 1),
        ([A, B, C], [A, B], 2),
        ([A, B, C], [B, C], 0),
        ([A, B], [A, C, B], 1),
        ([A, B], [], 0),
        # Equal by value, not the same objects: a copy counts as unchanged.
        ([A, B], [dict(A), dict(B), C], 2),
        # A field added (or one that differs only in type) is a change.
        ([A], [{**A, "name": "n"}], 0),
        ([{"role": "user", "content": "1"}], [{"role": "user", "content": 1}], 0),
    ],
)
def test_unchanged_prefix(old: list[dict], new: list[dict], kept: int) -> None:
    assert unchanged_prefix(old, new) == kept
    # And the server puts back exactly ``new`` from what a worker sends.
    assert resulting_state(old, Result(response=REPLY, state=new[kept:], kept=kept)) == (new, kept)


@pytest.mark.parametrize("kept", [-1, 3, 10**9, True, 1.0, "1", None])
def test_a_kept_no_worker_of_ours_sends_keeps_nothing(kept: object) -> None:
    """A process the agent wrote to itself could send anything: the state is then exactly the
    list it sent, and nothing is taken from the job's history."""
    state, used = resulting_state([A, B], Result(response=REPLY, state=[C], kept=kept))  # type: ignore[arg-type]
    assert (state, used) == ([C], 0)


def test_the_job_state_is_not_changed() -> None:
    job_state = [A, B]
    state, _ = resulting_state(job_state, Result(response=REPLY, state=[C], kept=2))
    state.append(D)
    assert job_state == [A, B]
