"""The operator's approval policy (``--approval-policy FILE``): who may answer which
interrupts, whatever the agent's code says.

The file is TOML::

    [tool.wire_money]          # the approvals of this tool
    approvers = ["finance"]    # roles (API keys: NAME=SECRET:ROLE,ROLE), at least one
    self_approval = false      # the key that sent the turn's message may not answer

    quorum = 2                 # two different keys must approve each call

    [type.user_input]          # every interrupt of this type (ask_user_question's)
    approvers = ["ops"]

A tool's table wins over its interrupt type's, and the file wins over what a tool declares
in code (``@tool(approvers=...)``, ``motus.api.approvers``): the agent is code the operator
deploys, the file is what the operator reviews. Field by field: a field the table leaves out
keeps what the code says (a table naming approvers keeps the code's quorum), and a table
may loosen the code only by saying so (``quorum = 1``, ``self_approval = true``). A table
needs at least one field; a quorum counts approvals, so only a ``[tool.NAME]`` table or
``[type.tool_approval]`` may have one.

Guarantees: a file that cannot be read or is not exactly this shape, a role that no key
able to write has (nobody could ever answer), a quorum larger than the keys that could
approve, or a file on a server without API keys (no
one can be told apart) stops the start with one line naming the problem. The policy is read
once at start and never changes while the server runs; every instance on a shared store
must be given the same file (each checks the answers it takes). Thread safety: immutable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from motus.api.approvers import POLICY_KEYS, effective, quorum_problem, shown_fields, valid_roles


class PolicyError(ValueError):
    """The policy file cannot be used; the message is one line naming why."""


@dataclass(frozen=True)
class ApprovalPolicy:
    """Per tool and per interrupt type: ``{"approvers": [...], "self_approval": bool, "quorum": int}``."""

    path: str
    tools: Mapping[str, Mapping[str, Any]]
    types: Mapping[str, Mapping[str, Any]]

    def for_payload(self, payload: Any) -> Mapping[str, Any] | None:
        """The file's policy for an interrupt with this payload, or None (the tool's own, if any, applies)."""
        if not isinstance(payload, Mapping):
            return None
        kind = payload.get("type")
        if kind == "tool_approval":
            tool = payload.get("tool_name")
            if isinstance(tool, str) and tool in self.tools:
                return self.tools[tool]
        return self.types.get(kind) if isinstance(kind, str) else None

    def shown(self, payload: Any) -> Any:
        """The payload as clients see it: with the policy that governs it, this file's fields
        in place of the tool's (the stored payload is not changed: replays compare against it)."""
        override = self.for_payload(payload)
        if override is None:
            return payload
        return {**{k: v for k, v in payload.items() if k not in POLICY_KEYS}, **shown_fields(effective(payload, override))}

    def allowed_grants(self, grants: Iterable[str]) -> tuple[str, ...]:
        """The session's grants a turn's process may use: none for a tool this file covers (it
        is asked every time). Applied at every dispatch to a process, so a grant given before
        the file existed cannot run a covered tool in a turn replayed after a restart."""
        return tuple(sorted(grant for grant in grants if not self.covers_tool(grant)))

    def covers_tool(self, tool: str) -> bool:
        """Whether approvals of ``tool`` follow the file (then it is never remembered)."""
        return tool in self.tools or "tool_approval" in self.types

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(role for table in (*self.tools.values(), *self.types.values()) for role in table.get("approvers", ()))


def load_policy(path: str, key_roles: Mapping[str, Iterable[str]] | None) -> ApprovalPolicy:
    """Read and check the policy file. ``key_roles``: each name of a key that may write,
    with its roles (None: the server has no API keys)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise PolicyError("--approval-policy needs Python 3.11 or later (it reads TOML with tomllib)") from None
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise PolicyError(f"Cannot read --approval-policy {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"--approval-policy {path} is not valid TOML: {_one_line(str(exc))}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"--approval-policy {path} is not UTF-8 text") from None
    except RecursionError:
        raise PolicyError(f"--approval-policy {path} nests arrays or tables too deeply") from None
    unknown = sorted(set(data) - {"tool", "type"})
    if unknown:
        raise PolicyError(f"--approval-policy {path}: unknown table [{unknown[0]}] (use [tool.NAME] or [type.NAME])")
    tables = {section: _tables(path, section, data.get(section, {})) for section in ("tool", "type")}
    policy = ApprovalPolicy(path, tables["tool"], tables["type"])
    if key_roles is None:
        raise PolicyError(f"--approval-policy {path} needs API keys with roles (--api-key NAME=SECRET:ROLE): "
                          "without keys nobody can be told apart")
    keys = [frozenset(roles) for roles in key_roles.values()]  # one per person: a quorum counts names
    missing = sorted(policy.roles - {role for roles in keys for role in roles})
    if missing:
        raise PolicyError(f"--approval-policy {path} names the role {missing[0]!r}, which no API key that may write has: "
                          "nobody could answer those interrupts")
    for section, tables in (("tool", policy.tools), ("type", policy.types)):
        for name, table in tables.items():
            quorum = table.get("quorum", 1)
            approvers = set(table.get("approvers", ()))
            able = sum(1 for roles in keys if not approvers or roles & approvers)
            if quorum > able:
                whose = f"with the role {' or '.join(sorted(approvers))}" if approvers else "that may write"
                raise PolicyError(f"--approval-policy {path}: [{section}.{_one_line(name)}] needs {quorum} approvals, "
                                  f"and only {able} API key{'' if able == 1 else 's'} {whose}: it could never be approved")
    return policy


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _tables(path: str, section: str, tables: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(tables, dict):
        raise PolicyError(f"--approval-policy {path}: [{section}] must hold tables such as [{section}.NAME]")
    checked: dict[str, dict[str, Any]] = {}
    for name, table in tables.items():
        where = f"--approval-policy {path}: [{section}.{_one_line(name)}]"
        if not isinstance(table, dict):
            raise PolicyError(f"{where} must be a table")
        unknown = sorted(set(table) - set(POLICY_KEYS))
        if unknown:
            raise PolicyError(f"{where} has an unknown key {unknown[0]!r} ({', '.join(POLICY_KEYS)})")
        fields: dict[str, Any] = {}
        if "approvers" in table:
            roles = table["approvers"]
            if not valid_roles(roles):
                raise PolicyError(f"{where}: approvers must be a non-empty list of role names")
            fields["approvers"] = sorted(set(roles))
        if "self_approval" in table:
            if not isinstance(table["self_approval"], bool):
                raise PolicyError(f"{where}: self_approval must be true or false")
            fields["self_approval"] = table["self_approval"]  # true too: it may loosen the code's
        if "quorum" in table:
            problem = quorum_problem(table["quorum"])
            if problem:
                raise PolicyError(f"{where}: {problem}")
            if section == "type" and name != "tool_approval":
                raise PolicyError(f"{where}: a quorum counts approvals, so only [tool.NAME] and [type.tool_approval] may have one")
            fields["quorum"] = table["quorum"]  # 1 too: it may lower the code's
        if not fields:
            raise PolicyError(f"{where} is empty: give approvers, self_approval or quorum")
        checked[name] = fields
    return checked
