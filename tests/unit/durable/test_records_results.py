"""``protocol.unchanged_prefix`` and ``protocol.resulting_state``: how a worker sends back
only the changed part of a history, and how the server puts the whole one together again."""

from __future__ import annotations

import pytest

from motus.durable.records import Result, result_problem, resulting_state, unchanged_prefix

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


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (1, True),
        (0, False),
        (1, 1.0),
        (0.0, -0.0),
        (float("nan"), float("nan")),  # never equal: such a message is simply written again
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # keys in another order are written in that order
        ({"tags": ["a"]}, {"tags": ["a", "b"]}),
        ({"n": {"x": 1}}, {"n": {"x": 1.0}}),
        ([1, [2]], [1, [2.0]]),
        (None, 0),
        ("1", 1),
    ],
)
def test_values_python_calls_equal_and_json_does_not_are_a_change(before: object, after: object) -> None:
    old = [{"role": "user", "content": "x", "user_params": {"v": before}}]
    new = [{"role": "user", "content": "x", "user_params": {"v": after}}]
    assert unchanged_prefix(old, new) == 0
    assert unchanged_prefix(old, [{"role": "user", "content": "x", "user_params": {"v": before}}]) == (0 if before != before else 1)


def test_equal_nested_values_are_kept() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
               "user_params": {"a": [1, 2.5, {"b": None, "c": True}], "d": -0.0}}
    copy = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
            "user_params": {"a": [1, 2.5, {"b": None, "c": True}], "d": -0.0}}
    assert unchanged_prefix([message], [copy, REPLY]) == 1


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (Result(response=REPLY, state=[A]), None),
        (Result(response=REPLY, state=[]), None),
        (Result(response=None, state=[A]), "its response is not a dict (NoneType)"),  # type: ignore[arg-type]
        (Result(response=REPLY, state=None), "its state is not a list (NoneType)"),  # type: ignore[arg-type]
        (Result(response=REPLY, state=(A,)), "its state is not a list (tuple)"),  # type: ignore[arg-type]
        (Result(response=REPLY, state=[A, 5]), "its state holds something other than a dict (int)"),  # type: ignore[list-item]
        (Result(response=REPLY, state=[{"content": object()}]), "it is not JSON: TypeError: Object of type object is not JSON serializable"),
        (Result(response={"content": {1}}, state=[]), "it is not JSON: TypeError: Object of type set is not JSON serializable"),
    ],
)
def test_result_problem(result: Result, problem: str | None) -> None:
    assert result_problem(result) == problem
