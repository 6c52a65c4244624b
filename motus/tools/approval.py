"""The approval gate behind ``@tool(requires_approval=...)``.

``requires_approval=True`` puts :func:`approval_gate` first in the tool's input
guardrail chain, so it runs before any guardrail the user wrote. The gate pauses the
turn with::

    interrupt({"type": "tool_approval", "tool_name": <name>, "tool_args": {...}})

and reads the resume value (see :func:`parse_approval`):

* ``{"approved": true}`` runs the tool with the model's arguments.
* ``{"approved": true, "tool_args": {...}}`` runs it with the arguments the person
  edited (merged over the model's, validated again); the model is told which arguments
  actually ran.
* ``{"approved": false}``, a missing ``approved``, or any value of the wrong shape (not
  an object, ``approved`` not a bool, ``tool_args`` not an object) raises
  :class:`~motus.guardrails.ToolRejected` (defined with the other guardrail verdicts, and
  importable from here and from :mod:`motus.tools` too); the model sees ``{"error": "User rejected <tool>"}``, or
  ``"User rejected <tool>: <reason>"`` when the rejection carries a string ``reason``.
  A malformed value never crashes the turn: refusing is the safe reading.

``requires_approval`` may also be a callable (sync or async) that receives the tool
arguments it declares and returns whether this call needs a person; ``False`` runs
the tool without pausing.

**Remembered grants.** An approval carrying ``"remember": "session"`` approves this call and
every later call of the tool in the same session: the gate then lets them through without a
pause (a predicate gate still consults its predicate first, so a call it waves through is
never asked). The server records the grant (``GET /sessions/{id}/grants``); revoking it
takes effect from the session's next turn.

**Who may approve.** ``approvers=[...]``, ``self_approval=False`` and ``quorum=N`` on the tool
go into each of its interrupts; the server refuses (403) an answer from a key the policy leaves
out, and with a quorum resumes the call only once N different keys approved it
(:mod:`motus.api.approvers`). Such a tool is never remembered for the session (a grant would
let later calls through with nobody asked): an answer with ``remember`` is a 422, and a grant
recorded before the tool had a policy is not used.

**Expiry.** ``approval_timeout=S`` gives the approval a deadline: if nobody answers within S
seconds, the server resolves it as a rejection with the reason ``Approval timed out after S
s`` (recorded as resolved by ``timeout``), so an abandoned approval never runs the tool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from motus.guardrails import Guardrail, ToolRejected, call_with_declared

log = logging.getLogger(__name__)

__all__ = ["ToolRejected", "ApprovalDecision", "EditedArguments", "parse_approval", "approval_gate"]


@dataclass(frozen=True)
class ApprovalDecision:
    """What a resume value means: approve or not, edited arguments, a reason for refusing."""

    approved: bool
    tool_args: dict[str, Any] | None = None
    reason: str | None = None


class EditedArguments(dict):  # type: ignore[type-arg]
    """A patch returned by the approval gate: the person changed the tool's arguments."""


def parse_approval(value: Any) -> ApprovalDecision:
    """Read a resume value as an approval decision; anything malformed is a rejection."""
    if not isinstance(value, dict):
        log.warning("approval resume value is %s, not an object: treated as a rejection", type(value).__name__)
        return ApprovalDecision(approved=False)
    approved = value.get("approved")
    reason = value.get("reason")
    reason = reason.strip() if isinstance(reason, str) and reason.strip() else None
    if approved is not True:
        if approved is not None and not isinstance(approved, bool):
            log.warning("approval resume value has approved of type %s (not a bool): treated as a rejection", type(approved).__name__)
        return ApprovalDecision(approved=False, reason=reason)
    tool_args = value.get("tool_args")
    if tool_args is not None and not isinstance(tool_args, dict):
        log.warning("approval carried tool_args of type %s, not an object: treated as a rejection", type(tool_args).__name__)
        return ApprovalDecision(approved=False, reason="the approval's edited arguments were not an object")
    return ApprovalDecision(approved=True, tool_args=tool_args)


def timed_out_reason(seconds: float) -> str:
    return f"Approval timed out after {seconds:g} s"


def approval_gate(
    tool_name: str, requires_approval: bool | Callable[..., Any] = True, approval_timeout: float | None = None,
    policy: dict[str, Any] | None = None,
) -> Guardrail:
    """Build the input guardrail that asks a person before ``tool_name`` runs. ``policy``:
    who may answer (``motus.api.approvers.policy_fields``), written into each interrupt."""
    policy = dict(policy or {})

    async def approval(**arguments: Any) -> dict[str, Any] | None:
        if callable(requires_approval) and not await call_with_declared(requires_approval, arguments):
            return None
        from motus.durable.interrupt import interrupt, session_grants, was_asked  # worker-only machinery

        grants = session_grants()
        shown = to_jsonable_python(arguments)
        payload = {"type": "tool_approval", "tool_name": tool_name, "tool_args": shown, **policy}
        if tool_name in grants and not policy and not was_asked(payload):
            return None  # approved for the session earlier (and, on a replay, not asked the first time)
        if approval_timeout is None:
            value = await interrupt(payload)
        else:
            rejected = {"approved": False, "reason": timed_out_reason(approval_timeout)}
            value = await interrupt(payload, timeout=approval_timeout, default=rejected)
        decision = parse_approval(value)
        if not decision.approved:
            raise ToolRejected.by_user(tool_name, decision.reason)
        if isinstance(value, dict) and value.get("remember") == "session" and not policy:
            grants.add(tool_name)
        if decision.tool_args is not None and decision.tool_args != {k: shown.get(k) for k in decision.tool_args}:
            return EditedArguments(decision.tool_args)
        return None

    approval.__name__ = f"approve_{tool_name}"
    approval.__qualname__ = approval.__name__
    return approval
