"""Who may answer an approval: a tool's policy as written into its interrupt, and the
server's reading of it (``motus.api.approvers``). Pure functions; the HTTP behaviour is in
``tests/integration/serve/approvals/test_workflow.py``."""

from __future__ import annotations

import pytest

from motus.api.approvers import counted, effective, is_approval, policy_fields, progress, quorum_of, quorum_refusal, refusal, unrememberable
from motus.tools import tool


def approval(**policy: object) -> dict[str, object]:
    return {"type": "tool_approval", "tool_name": "wire_money", "tool_args": {"amount": 5}, **policy}


def test_a_tool_writes_its_policy_into_the_payload_only_when_it_has_one() -> None:
    assert policy_fields(None) == {}
    assert policy_fields(["ops", "finance", "ops"]) == {"approvers": ["finance", "ops"]}
    assert policy_fields(None, self_approval=False) == {"self_approval": False}


@pytest.mark.parametrize(
    ("approvers", "self_approval", "message"),
    [
        ("ops", True, "not the string 'ops'"),
        ([], True, "would let nobody approve"),
        (["o p"], True, "'o p' is not a role name"),
        ([1], True, "1 is not a role name"),
        (None, "no", "self_approval must be True or False"),
    ],
)
def test_a_policy_nobody_could_meet_is_refused_when_the_tool_is_defined(approvers: object, self_approval: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy_fields(approvers, self_approval)  # type: ignore[arg-type]


def test_the_decorator_takes_the_policy_and_needs_requires_approval_for_it() -> None:
    with pytest.raises(ValueError, match="need requires_approval"):
        tool(lambda amount: amount, name="wire", approvers=["finance"])
    gated = tool(lambda amount: amount, name="wire", requires_approval=True, approvers=["finance"], self_approval=False)
    assert gated.approval_policy == {"approvers": ["finance"], "self_approval": False}


def test_without_a_policy_anyone_who_may_write_answers() -> None:
    assert refusal(approval(), "alice", (), "alice") is None
    assert refusal(approval(), "anonymous", (), "anonymous") is None
    assert refusal({"type": "user_input", "approvers": ["x"]}, "alice", (), "alice") is None  # only approvals have one


def test_a_listed_role_is_needed() -> None:
    payload = approval(approvers=["finance", "ops"])
    assert refusal(payload, "bob", {"finance"}, "alice") is None
    assert refusal(payload, "alice", {"sales"}, "alice") == (
        "the approval of wire_money needs a key with the role 'finance' or 'ops'; API key 'alice' has none of them"
    )
    assert "this server has no API keys" in (refusal(payload, "anonymous", (), "anonymous") or "")


def test_the_sender_may_not_answer_where_the_tool_forbids_it() -> None:
    payload = approval(self_approval=False)
    assert refusal(payload, "bob", (), "alice") is None
    assert refusal(payload, "alice", (), "alice") == (
        "the approval of wire_money may not be answered by the key that sent the turn's message ('alice')"
    )
    assert refusal(payload, "bob", (), None) is not None  # a turn whose sender nobody recorded: nobody
    assert "cannot tell who sent it" in (refusal(payload, "anonymous", (), "anonymous") or "")


@pytest.mark.parametrize(
    "policy",
    [{"approvers": "finance"}, {"approvers": []}, {"approvers": ["fin ance"]}, {"approvers": [None]}, {"self_approval": "no"}],
)
def test_a_malformed_policy_refuses_everyone(policy: dict[str, object]) -> None:
    why = refusal(approval(**policy), "bob", {"finance"}, "alice")
    assert why is not None and "malformed" in why


def test_an_approval_with_a_policy_is_never_remembered() -> None:
    assert unrememberable(approval(), {"approved": True, "remember": "session"}) is None
    assert unrememberable(approval(approvers=["finance"]), {"approved": True}) is None
    for policy in ({"approvers": ["finance"]}, {"self_approval": False}):
        why = unrememberable(approval(**policy), {"approved": True, "remember": "session"})
        assert why is not None and "cannot be remembered" in why


def test_a_quorum_is_written_only_above_one_and_refused_when_it_could_never_be_met() -> None:
    assert policy_fields(["finance"], quorum=2) == {"approvers": ["finance"], "quorum": 2}
    assert policy_fields(None, quorum=1) == {}
    for bad in (0, -1, 11, 2.0, True, "2"):
        with pytest.raises(ValueError, match="quorum must be a whole number of approvals from 1 to 10"):
            policy_fields(["finance"], quorum=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need requires_approval"):
        tool(quorum=2)(lambda: None)


def test_a_quorum_counts_approvals_from_different_keys_of_the_same_call() -> None:
    payload = approval(approvers=["finance"], quorum=2)
    policy = effective(payload)
    assert quorum_of(policy) == 2 and quorum_of(None) == 1 and quorum_of({"quorum": "2"}) == 0
    yes = {"approved": True}
    assert quorum_refusal(payload, yes, "bob", [], 2) is None
    assert quorum_refusal(payload, yes, "bob", ["bob"], 2) == (
        403, "the approval of wire_money needs approvals from 2 different keys, and API key 'bob' has approved it "
        "already; 1 of 2 approvals: bob")
    assert quorum_refusal(payload, {"approved": False}, "bob", ["bob"], 2) is None  # a rejection always counts
    status, why = quorum_refusal(payload, {"approved": True, "tool_args": {"amount": 1}}, "carol", ["bob"], 2) or (0, "")
    assert status == 422 and "cannot edit its arguments" in why
    assert quorum_refusal(payload, yes, "bob", ["bob"], 1) is None  # no quorum: nothing counted
    assert not is_approval(payload, {"approved": "true"}) and not is_approval({"type": "confirm"}, yes)
    assert progress(2, ["bob"]) == "1 of 2 approvals: bob" and progress(3, []) == "0 of 3 approvals"


def test_a_quorum_cannot_be_met_by_callers_who_cannot_be_told_apart() -> None:
    payload = approval(quorum=2)
    assert "needs approvals from 2 different keys, and this server has no API keys" in (refusal(payload, "anonymous", set(), None) or "")
    assert refusal(payload, "bob", set(), "alice") is None  # any key that may write, two of them
    assert refusal(approval(quorum=0), "bob", {"finance"}, "alice") == "the approval of wire_money has a malformed quorum, so nobody may answer it"


def test_only_approvals_of_keys_still_able_to_approve_count() -> None:
    given = [{"by": "bob", "at": 1.0}, {"by": "carol", "at": 2.0}, {"by": "gone", "at": 3.0}]
    keys = {"bob": {"ops"}, "carol": {"finance", "ops"}}
    assert [a["by"] for a in counted(given, {"approvers": ["finance"], "quorum": 2}, keys)] == ["carol"]
    assert [a["by"] for a in counted(given, {"quorum": 2}, keys)] == ["bob", "carol"]
    assert counted(given, {"quorum": 2}, None) == []


def test_a_quorum_met_already_is_completed_by_the_next_approval_and_a_malformed_answer_is_refused() -> None:
    payload = approval(quorum=2)
    assert quorum_refusal(payload, {"approved": True}, "bob", ["bob", "carol"], 2) is None  # lowered since: met
    for value in ({"approved": "true"}, {"approved": 1}, True, None, [True]):
        status, why = quorum_refusal(payload, value, "bob", [], 2) or (0, "")
        assert status == 422 and "\"approved\" is true or false" in why, value
    assert quorum_refusal({"type": "confirm"}, "anything", "bob", [], 2) is None  # only approvals have a quorum
