"""Who may answer an approval: the policy a tool names, in the form the tool writes into its
interrupt and the server reads back when someone answers it.

A tool declares it in code::

    @tool(requires_approval=True, approvers=["ops"], self_approval=False, quorum=2)
    def wire_money(...): ...

and its ``tool_approval`` interrupts carry it next to the call::

    {"type": "tool_approval", "tool_name": "wire_money", "tool_args": {...},
     "approvers": ["ops"], "self_approval": false, "quorum": 2}

``approvers``: a resume must come from a key with at least one of these roles (API keys get
roles as ``NAME=SECRET:ops,finance``). ``self_approval: false``: the key that sent the turn's
message may not answer it. ``quorum: N`` (approvals only): the call runs once N different
keys approved it; each approval before the last is recorded and the interrupt stays pending,
one rejection resolves it as rejected. A payload without any of these keys has no policy:
any key that may write answers it, as before. The interrupt is the record, so the policy survives a restart,
a replay and another instance reading it from the store, and every client (the inbox, the
web and terminal chats) can show who may answer.

Guarantees: the check fails closed. A policy field of the wrong shape (not a list of role
names, not a bool) refuses every answer, naming why; a server without API keys, where every
caller is ``anonymous`` with no role, refuses answers a policy restricts (it cannot tell
people apart). Pure functions, no I/O: safe below the server (the tool imports this).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: A role: letters, digits, ``_``, ``-`` and ``.``, as a key's name.
ROLE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: The caller's name on a server without API keys (``motus.serve.auth.ANONYMOUS``).
ANONYMOUS = "anonymous"


#: The policy fields a payload or a policy file may carry.
POLICY_KEYS = ("approvers", "self_approval", "quorum")

#: The largest quorum: more approvers than people would ever gather for one call.
MAX_QUORUM = 10


def policy_fields(approvers: Iterable[str] | None, self_approval: bool = True, quorum: int = 1) -> dict[str, Any]:
    """The payload fields of a tool's policy (none when it has none). Raises ``ValueError``
    naming the problem, when the tool is defined, for a policy that could never be met."""
    fields: dict[str, Any] = {}
    if approvers is not None:
        if isinstance(approvers, str):
            raise ValueError(f"approvers must be a list of roles, not the string {approvers!r}: write approvers=[{approvers!r}]")
        roles = list(approvers)
        if not roles:
            raise ValueError("approvers=[] would let nobody approve: list at least one role, or leave approvers out")
        bad = [role for role in roles if not isinstance(role, str) or not ROLE.fullmatch(role)]
        if bad:
            raise ValueError(f"approvers: {bad[0]!r} is not a role name (letters, digits, '_', '-', '.'; at most 64)")
        fields["approvers"] = sorted(set(roles))
    if not isinstance(self_approval, bool):
        raise ValueError(f"self_approval must be True or False, got {self_approval!r}")
    if not self_approval:
        fields["self_approval"] = False
    problem = quorum_problem(quorum)
    if problem:
        raise ValueError(problem)
    if quorum > 1:
        fields["quorum"] = quorum
    return fields


def quorum_problem(quorum: Any) -> str | None:
    """Why ``quorum`` is not a policy's quorum (a whole number from 1 to ``MAX_QUORUM``)."""
    if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= MAX_QUORUM:
        return f"quorum must be a whole number of approvals from 1 to {MAX_QUORUM}, got {quorum!r}"
    return None


def quorum_of(policy: Mapping[str, Any] | None) -> int:
    """How many different keys must approve under ``policy`` (1 without one); 0 when its
    quorum is malformed (``refusal`` then refuses every answer)."""
    if policy is None:
        return 1
    quorum = policy.get("quorum", 1)
    return 0 if quorum_problem(quorum) else quorum


def is_tool_approval(payload: Any) -> bool:
    """Whether an interrupt's payload is a ``tool_approval``: the only kind a tool writes its
    policy into, and the only kind a quorum counts."""
    return isinstance(payload, Mapping) and payload.get("type") == "tool_approval"


def is_approval(payload: Any, value: Any) -> bool:
    """Whether ``value`` approves a ``tool_approval`` interrupt (as the gate reads it,
    ``motus.tools.approval.parse_approval``): only approvals count towards a quorum."""
    return is_tool_approval(payload) and isinstance(value, Mapping) and value.get("approved") is True


def quorum_refusal(payload: Any, value: Any, caller: str, approved_by: Iterable[str], quorum: int) -> tuple[int, str] | None:
    """Why this answer may not count towards a quorum of ``quorum`` approvals that
    ``approved_by`` gave so far, as (HTTP status, message), or None. The same key cannot
    approve twice (a two-person rule needs two people); an approval cannot edit the call's
    arguments (each approver must approve the same call); an answer whose ``approved`` is not
    a bool is refused (the gate would read it as a rejection). A rejection always counts. A
    quorum met already (lowered since, or approvals given before a restart) is completed by
    the next approval, whoever of those who may gives it."""
    if quorum <= 1 or not is_tool_approval(payload):
        return None
    what = describe(payload)
    if not isinstance(value, Mapping) or not isinstance(value.get("approved"), bool):
        # The gate reads anything else as a rejection: under a quorum that would be one
        # person's veto sent by mistake (a client's "true" string), so it is refused instead.
        return 422, (f"{what} needs {quorum} approvals, so an answer must be an object whose \"approved\" is "
                     "true or false")
    if not is_approval(payload, value):
        return None
    given = list(approved_by)
    if caller in given and len(given) < quorum:
        return 403, (f"{what} needs approvals from {quorum} different keys, and API key {caller!r} has approved it "
                     f"already; {progress(quorum, given)}")
    if value.get("tool_args") is not None:
        return 422, (f"{what} needs {quorum} approvals of the same call, so an approval cannot edit its arguments: "
                     "approve it as it is, or reject it")
    return None


def counted(approvals: Iterable[Mapping[str, Any]], policy: Mapping[str, Any] | None,
            key_roles: Mapping[str, Iterable[str]] | None, sender: str | None = None) -> list[Mapping[str, Any]]:
    """The approvals given so far that still count: each from a key the server still has
    (``key_roles``: each writing key's name and roles) with a role the policy names, and not
    from the turn's ``sender`` where the policy forbids it. A key removed, stripped of its
    role, or a policy changed since it approved (a restart with another file) takes the
    approval back; it is kept in the turn, and counts again if the key comes back."""
    if key_roles is None:
        return []
    approvers = set(policy.get("approvers") or ()) if policy is not None else set()
    no_sender = policy is not None and policy.get("self_approval") is False
    kept = []
    for approval in approvals:
        name = str(approval.get("by"))
        roles = key_roles.get(name)
        if roles is not None and (not approvers or approvers & set(roles)) and not (no_sender and name == sender):
            kept.append(approval)
    return kept


def approval_record(approval: Mapping[str, Any], isoformat: Any = None) -> dict[str, Any]:
    """One approval as records and clients show it: ``{"by", "at"}`` (``at`` through
    ``isoformat`` when given, else the wall clock as stored)."""
    at = approval.get("at")
    return {"by": approval.get("by"), "at": isoformat(at) if isoformat is not None else at}


def progress(quorum: int, approved_by: Iterable[str]) -> str:
    """``1 of 2 approvals: alice``: where a quorum stands, for people."""
    names = list(approved_by)
    return f"{len(names)} of {quorum} approvals" + (f": {', '.join(names)}" if names else "")


def valid_roles(value: Any) -> bool:
    """Whether ``value`` is a policy's ``approvers``: a non-empty list of role names."""
    return isinstance(value, list) and bool(value) and all(isinstance(r, str) and ROLE.fullmatch(r) for r in value)


def effective(payload: Any, override: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
    """The policy that governs an interrupt: the fields a tool wrote into its
    ``tool_approval`` payload, with the operator's (``override``, from the server's policy
    file, for any interrupt type) in place of each field the file gives. Field by field, so
    a file written to name approvers keeps the quorum the code asks for, and lowers it only
    by saying so (``quorum = 1``). None when nothing restricts who answers."""
    own: dict[str, Any] = {}
    if is_tool_approval(payload):
        own = {key: payload[key] for key in POLICY_KEYS if key in payload}
    if override is not None:
        return {**own, **override}
    return own or None


def shown_fields(policy: Mapping[str, Any] | None) -> dict[str, Any]:
    """A policy as a payload shows it: without the fields that say the default (anyone may
    approve, the sender too, one approval)."""
    if policy is None:
        return {}
    defaults = {"self_approval": True, "quorum": 1}
    return {key: value for key, value in policy.items() if key not in defaults or value != defaults[key]}


def describe(payload: Any) -> str:
    """How a refusal names the interrupt: ``the approval of wire_money``, ``the user_input request``."""
    if is_tool_approval(payload):
        return f"the approval of {payload.get('tool_name')!s}"
    kind = payload.get("type") if isinstance(payload, Mapping) else None
    return f"the {kind!s} request"


def refusal(
    payload: Any, caller: str, roles: Iterable[str], sender: str | None, override: Mapping[str, Any] | None = None
) -> str | None:
    """Why ``caller`` (a key's name, with ``roles``) may not answer an interrupt with this
    payload in a turn whose message ``sender`` sent; None when it may. ``override``: the
    operator's policy for it (``motus.serve.policy``), which wins over the payload's."""
    policy = effective(payload, override)
    if policy is None:
        return None
    what = describe(payload)
    approvers = policy.get("approvers")
    if approvers is not None:
        if not valid_roles(approvers):
            return f"{what} has a malformed approvers list, so nobody may answer it"
        if caller == ANONYMOUS:
            return (f"{what} needs a key with the role {_roles(approvers)}, and this server has no API keys "
                    "(give keys roles with --api-key NAME=SECRET:ROLE)")
        if not set(roles) & set(approvers):
            return f"{what} needs a key with the role {_roles(approvers)}; API key {caller!r} has none of them"
    quorum = quorum_of(policy)
    if not quorum:
        return f"{what} has a malformed quorum, so nobody may answer it"
    if quorum > 1 and caller == ANONYMOUS:
        return (f"{what} needs approvals from {quorum} different keys, and this server has no API keys, "
                "so it cannot tell them apart")
    self_approval = policy.get("self_approval", True)
    if not isinstance(self_approval, bool):
        return f"{what} has a malformed self_approval, so nobody may answer it"
    if not self_approval:
        if caller == ANONYMOUS:
            return (f"{what} may not be answered by the key that sent the turn's message, and this server has "
                    "no API keys, so it cannot tell who sent it")
        if sender is None or sender == caller:
            return f"{what} may not be answered by the key that sent the turn's message ({caller!r})"
    return None


def unrememberable(payload: Any, value: Any, override: Mapping[str, Any] | None = None) -> str | None:
    """Why this answer may not be remembered for the session, or None. A remembered grant
    lets later calls of the tool through with no one asked, whoever sent them and with any
    arguments: that would undo a policy saying who approves each call, so a tool with one
    is never remembered."""
    if effective(payload, override) is not None and isinstance(value, Mapping) and value.get("remember") is not None:
        return (f"{describe(payload)} names who may approve each call, so it cannot be "
                "remembered for the session: answer it without \"remember\"")
    return None


def _roles(approvers: list[str]) -> str:
    quoted = [repr(role) for role in approvers]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
