"""The operator's approval policy file (``motus.serve.policy``): what it may say, and which
table governs an interrupt. The HTTP behaviour is in ``tests/integration/serve/approvals/test_workflow.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tomllib", reason="--approval-policy reads TOML with tomllib (Python 3.11+)")

from motus.api.approvers import refusal  # noqa: E402
from motus.serve.policy import PolicyError, load_policy  # noqa: E402

FILE = """
[tool.wire_money]
approvers = ["ops"]

[tool.drop_table]
approvers = ["dba", "ops"]
self_approval = false

[type.user_input]
self_approval = false
"""


def named(roles: list[set[str]] | None) -> dict[str, set[str]] | None:
    """Keys of these roles, one name each (as ``ApiKeys.writers`` gives them)."""
    return None if roles is None else {f"key{index}": set(each) for index, each in enumerate(roles)}


def written(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_a_tools_table_wins_over_its_type_and_over_the_tools_own_policy(tmp_path: Path) -> None:
    policy = load_policy(written(tmp_path, FILE + '\n[type.tool_approval]\napprovers = ["finance"]\n'), named([{"ops", "dba", "finance"}]))
    coded = {"type": "tool_approval", "tool_name": "wire_money", "tool_args": {}, "approvers": ["finance"], "self_approval": False}
    assert policy.for_payload(coded) == {"approvers": ["ops"]}
    assert policy.for_payload({"type": "tool_approval", "tool_name": "other"}) == {"approvers": ["finance"]}
    assert policy.for_payload({"type": "user_input", "questions": []}) == {"self_approval": False}
    assert policy.for_payload({"type": "confirm"}) is None
    override = policy.for_payload(coded)
    assert refusal(coded, "bob", {"finance"}, "alice", override) is not None  # the code's role no longer answers
    assert refusal(coded, "dave", {"ops"}, "alice", override) is None  # the file's does
    assert refusal(coded, "carol", {"ops"}, "carol", override) is not None  # the code's sender rule, left alone, holds
    question = {"type": "user_input"}
    assert refusal(question, "alice", set(), "alice", policy.for_payload(question)) == (
        "the user_input request may not be answered by the key that sent the turn's message ('alice')"
    )
    assert policy.covers_tool("anything")  # [type.tool_approval] covers every tool


def test_the_file_replaces_the_fields_it_gives_and_keeps_the_codes_others(tmp_path: Path) -> None:
    """A table naming approvers keeps the code's quorum (a file written to widen the roles
    must not drop a two-person rule unsaid); it lowers it only with ``quorum = 1``."""
    policy = load_policy(written(tmp_path, "[tool.wire_money]\napprovers = ['finance']\nquorum = 2\n"
                                           "[tool.release]\napprovers = ['finance', 'ops']\n"
                                           "[tool.refund]\nquorum = 1\nself_approval = true\n"),
                         named([{"finance"}, {"finance", "ops"}, {"ops"}]))
    coded = {"type": "tool_approval", "tool_name": "wire_money", "tool_args": {}, "quorum": 3, "self_approval": False}
    assert policy.for_payload(coded) == {"approvers": ["finance"], "quorum": 2}
    assert policy.shown(coded) == {"type": "tool_approval", "tool_name": "wire_money", "tool_args": {},
                                   "approvers": ["finance"], "quorum": 2, "self_approval": False}
    release = {"type": "tool_approval", "tool_name": "release", "tool_args": {}, "approvers": ["finance"], "quorum": 2}
    assert policy.shown(release)["quorum"] == 2 and policy.shown(release)["approvers"] == ["finance", "ops"]
    refund = {"type": "tool_approval", "tool_name": "refund", "tool_args": {}, "quorum": 2, "self_approval": False}
    assert policy.shown(refund) == {"type": "tool_approval", "tool_name": "refund", "tool_args": {}}  # loosened, said so


def test_a_file_quorum_counts_people_not_secrets(tmp_path: Path) -> None:
    """Two secrets of one name (a rotation) are one person: two finance secrets of bob's do
    not meet a quorum of two."""
    path = written(tmp_path, "[tool.x]\napprovers = ['finance']\nquorum = 2\n")
    with pytest.raises(PolicyError, match="needs 2 approvals, and only 1 API key with the role finance"):
        load_policy(path, {"bob": {"finance"}, "alice": set()})
    assert load_policy(path, {"bob": {"finance"}, "carol": {"finance"}}).for_payload({"type": "tool_approval", "tool_name": "x"})


@pytest.mark.parametrize(
    ("text", "roles", "message"),
    [
        ("[tool.x]\napprovers = ['finance']\n", [{"ops"}], "names the role 'finance', which no API key that may write has"),
        ("[tool.x]\napprovers = ['ops']\n", None, "needs API keys with roles"),
        ("[tools.x]\napprovers = ['ops']\n", [{"ops"}], "unknown table [tools]"),
        ("[tool.x]\napprover = ['ops']\n", [{"ops"}], "unknown key 'approver'"),
        ("[tool.x]\napprovers = 'ops'\n", [{"ops"}], "non-empty list of role names"),
        ("[tool.x]\napprovers = []\n", [{"ops"}], "non-empty list of role names"),
        ("[tool.x]\nself_approval = 'no'\n", [{"ops"}], "self_approval must be true or false"),
        ("[tool.x]\n", [{"ops"}], "is empty"),
        ("[tool.x]\nquorum = 0\n", [{"ops"}], "quorum must be a whole number of approvals from 1 to 10, got 0"),
        ("[tool.x]\nquorum = 2.0\n", [{"ops"}], "quorum must be a whole number"),
        ("[tool.x]\nquorum = true\n", [{"ops"}], "quorum must be a whole number"),
        ("[type.user_input]\nquorum = 2\n", [{"ops"}, {"ops"}], "only [tool.NAME] and [type.tool_approval] may have one"),
        ("[tool.x]\napprovers = ['ops']\nquorum = 2\n", [{"ops"}, {"finance"}],
         "[tool.x] needs 2 approvals, and only 1 API key with the role ops: it could never be approved"),
        ("[tool.x]\nquorum = 3\n", [{"ops"}, set()], "needs 3 approvals, and only 2 API keys that may write"),
        ("[tool]\nx = 1\n", [{"ops"}], "[tool.x] must be a table"),
        ("[tool.x\n", [{"ops"}], "is not valid TOML"),
        ("[tool.\"a\\nb\"]\nself_approval = 1\n", [{"ops"}], "[tool.a b]: self_approval must be true or false"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", [{"ops"}], "nests arrays or tables too deeply"),
    ],
)
def test_a_file_nobody_could_satisfy_is_refused_with_one_line(tmp_path: Path, text: str, roles: list[set[str]] | None, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        load_policy(written(tmp_path, text), named(roles))
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="Cannot read --approval-policy .*missing.toml"):
        load_policy(str(tmp_path / "missing.toml"), named([{"ops"}]))


def test_a_file_that_is_not_utf_8_is_refused_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(b'[tool.x]\napprovers = ["\xff\xfe"]\n')
    with pytest.raises(PolicyError, match="is not UTF-8 text"):
        load_policy(str(path), named([{"ops"}]))
