"""Who may answer an approval: a tool's policy as written into its interrupt, and the
server's reading of it (``motus.api.approvers``). Pure functions; the HTTP behaviour is in
``tests/integration/serve/approvals/test_workflow.py``."""

from __future__ import annotations

import pytest

from motus.api.approvers import policy_fields, refusal, unrememberable
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
