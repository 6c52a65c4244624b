"""What the chat shows and asks: each interrupt rendered and answered, errors in one line.

Built on :mod:`motus.client.terminal` (every string from the server or the agent goes
through its :func:`~motus.client.terminal.visible`); the chat that calls these is
:mod:`motus.client.chat`. The ``format_*`` functions, :func:`boxed`, :func:`parse_choices`,
:func:`error_summary` and :func:`describe_error` are pure; the ``answer_*`` functions read
from a :class:`~motus.client.terminal.Console`.

How each interrupt is answered (the resume ``value``). When several are pending at once,
each says so first: ``Approval 1 of 2``.

- ``tool_approval``: the tool and its arguments are shown; ``Approve? [y/N]``.
  ``y`` -> ``{"approved": true}``; ``e`` edits the arguments first: the current arguments
  are the starting text of the line (where readline can do that; else they are printed
  above it), the keys typed replace the agent's (the server merges them the same way),
  and the merged arguments are shown before asking again; approving then sends
  ``{"approved": true, "tool_args": <the merged arguments>}``. Anything else rejects, with
  an optional reason -> ``{"approved": false[, "reason": "..."]}``. A payload with
  ``"editable": false`` (the agent cannot apply edited arguments) offers no ``e``.
- ``user_input``: every question with its header and numbered options (a ``markdown``
  preview in a box), plus a last "(Other: type your own answer)" choice. ``Choice:`` takes
  one number, or several (``1,3``) for ``multiSelect`` questions, whose answer is the chosen
  labels joined by ", ". -> ``{"answers": {question: answer}}``.
- any other type (a custom interrupt): its own ``title`` and ``prompt`` if the payload has
  them, the payload as JSON, and an answer line: a JSON value, or plain text, which is sent
  as a string (and the chat says so). An empty line leaves it unanswered
  (:data:`motus.client.SKIP`).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from motus.api import approvers
from motus.client.library import SKIP, ClientError, InterruptInfo
from motus.client.terminal import Console, visible, visible_json

OTHER_LABEL = "(Other: type your own answer)"

#: What a numbered interrupt is called: "Approval 1 of 2".
_KIND_NAMES = {"tool_approval": "Approval", "user_input": "Question"}


# --------------------------------------------------------------------------- answering


def answer_interrupt(info: InterruptInfo, console: Console, position: tuple[int, int] | None = None) -> Any:
    """Show one interrupt, ask the person, return the resume value (or ``SKIP``).

    ``position`` is ``(n, total)`` when ``total`` interrupts are waiting together: the
    interrupt is then introduced as ``Approval n of total`` (``Question``, ``Request``).
    """
    if position is not None and position[1] > 1:
        kind = _KIND_NAMES.get(info.type, "Request")
        console.say(f"\n{kind} {position[0]} of {position[1]}")
    if info.type == "tool_approval":
        return answer_tool_approval(info.payload, console)
    if info.type == "user_input":
        questions = _valid_questions(info.payload)
        if questions is not None:
            return answer_user_input(questions, console)
        console.note("[warn] malformed user_input payload (questions need question, header and options with labels)")
    return answer_custom(info.type, info.payload, console)


def who_may_approve(payload: dict[str, Any]) -> str | None:
    """The tool's approver policy in words (``motus.api.approvers``), or None without one."""
    approvers = payload.get("approvers")
    roles = [str(role) for role in approvers] if isinstance(approvers, list) else []
    quorum = quorum_of(payload)
    parts = []
    if roles:
        who = "a key" if quorum == 1 else f"{quorum} different keys"
        parts.append(f"{who} with the role " + " or ".join(visible(role) for role in roles))
    elif quorum > 1:
        parts.append(f"{quorum} different keys")
    if payload.get("self_approval") is False:
        parts.append("not the key that sent the message")
    return "Who may approve: " + ", ".join(parts) if parts else None


def answer_tool_approval(payload: dict[str, Any], console: Console) -> dict[str, Any]:
    tool_name = payload.get("tool_name") or "(unnamed tool)"
    proposed = payload.get("tool_args")
    args = proposed
    # false: the agent cannot apply edited arguments; a quorum: every approver approves the same call
    editable = payload.get("editable") is not False and quorum_of(payload) == 1
    console.say(f"\nThe agent wants to run: {visible(tool_name)}")
    policy = who_may_approve(payload)
    if policy is not None:
        console.say(policy)
    while True:
        console.say(format_arguments(args))
        if editable:
            console.say("(y = approve, e = edit the arguments first, n or Enter = reject)")
        else:
            console.say("(y = approve, n or Enter = reject; this tool's arguments cannot be edited)")
        reply = console.ask("Approve? [y/N] ").strip().lower()
        if reply in ("y", "yes"):
            return {"approved": True, "tool_args": args} if args != proposed else {"approved": True}
        if reply in ("e", "edit") and not editable:
            console.say("This tool's arguments cannot be edited: approve or reject them as they are.")
            continue
        if reply in ("e", "edit"):
            args = _edit_arguments(console, args)
            console.say("With your edits it runs with:" if args != proposed else "Unchanged: it runs with the agent's arguments:")
            continue
        reason = console.ask("Reason (optional, Enter to skip): ").strip()
        return {"approved": False, "reason": reason} if reason else {"approved": False}


def quorum_of(payload: dict[str, Any]) -> int:
    """How many keys must approve (``payload["quorum"]``), 1 when it says nothing or nonsense."""
    return max(approvers.quorum_of(payload), 1)


def answer_own_approval(payload: dict[str, Any], progress: str, console: Console) -> Any:
    """A key that approved already, under a quorum: it may not approve again, only reject
    (as the web card offers). Returns the rejection, or ``SKIP`` to leave it waiting."""
    console.say(f"\nThe agent wants to run: {visible(payload.get('tool_name') or '(unnamed tool)')}")
    console.say(f"You approved this already ({visible(progress)}); it waits for another key's approval.")
    if console.ask("Reject it instead? [y/N] ").strip().lower() not in ("y", "yes"):
        return SKIP
    reason = console.ask("Reason (optional, Enter to skip): ").strip()
    return {"approved": False, "reason": reason} if reason else {"approved": False}


def answer_user_input(questions: list[dict[str, Any]], console: Console) -> dict[str, Any]:
    answers: dict[str, str] = {}
    for question in questions:
        console.say("")
        console.say(format_question(question, console.unicode))
        options = question["options"]
        multi = bool(question.get("multiSelect"))
        while True:
            try:
                picks = parse_choices(console.ask("Choice: "), len(options) + 1, multi)
                break
            except ValueError as exc:
                console.say(visible(exc))
        chosen = []
        for number in picks:
            if number <= len(options):
                chosen.append(str(options[number - 1]["label"]))
            else:
                chosen.append(_ask_nonempty(console, "Your answer: "))
        answers[str(question["question"])] = ", ".join(chosen)
    return {"answers": answers}


def answer_custom(kind: str, payload: dict[str, Any], console: Console) -> Any:
    """A custom interrupt: its own words, the payload, and a JSON value or plain text back."""
    console.say("")
    console.say(format_custom(kind, payload))
    while True:
        text = console.ask("Your answer (JSON, or plain text to send as a string; Enter to leave it unanswered): ").strip()
        if not text:
            console.note("[info] interrupt left unanswered")
            return SKIP
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if text[0] in "{[\"":
                # Meant as JSON (an object, a list, a quoted string): sending it as text would
                # only hide the typo from the person.
                console.say(f"Not valid JSON ({exc.msg}); fix it, or answer with plain text.")
                continue
            console.say(f"(Not JSON, so it is sent as the string {visible_json(text)}.)")
            return text


def _edit_arguments(console: Console, current: Any) -> Any:
    """Ask for edited arguments; return them merged over ``current`` (keys typed win)."""
    start = visible_json(current if current is not None else {})
    console.say("Edit the arguments as a JSON object: keys you give replace the agent's, the others keep its values.")
    if not console.can_prefill:
        console.say("Current arguments: " + start)
    while True:
        text = console.ask("Arguments (Enter keeps them): ", initial=start).strip()
        if not text:
            return current
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            console.say(f"Not valid JSON: {exc.msg}.")
            continue
        if isinstance(value, dict):
            return {**current, **value} if isinstance(current, dict) else value
        console.say("The arguments must be a JSON object, e.g. {\"path\": \"/tmp/x\"}.")


def _ask_nonempty(console: Console, prompt: str) -> str:
    while True:
        text = console.ask(prompt).strip()
        if text:
            return text


# --------------------------------------------------------------------------- rendering (pure)


def format_arguments(args: Any) -> str:
    """Tool arguments one per line, ``  name: value``: strings as text, the rest as JSON.

    Control and bidi characters are escaped (:func:`visible`). A string with line feeds is
    a block: ``  name: (N lines)``, then each line as ``    | line``, so no part of a value
    can pass for another argument.
    """
    if args is None or args == {}:
        return "  (no arguments)"
    if not isinstance(args, dict):
        return "  " + visible_json(args)
    lines = []
    for name, value in args.items():
        if isinstance(value, str) and "\n" in value:
            parts = value.split("\n")
            lines.append(f"  {visible(name)}: ({len(parts)} lines)")
            lines.extend("    | " + visible(part) for part in parts)
        else:
            lines.append(f"  {visible(name)}: {visible(value) if isinstance(value, str) else visible_json(value)}")
    return "\n".join(lines)


def format_question(question: dict[str, Any], unicode: bool = True) -> str:
    """A question with its header, numbered options and previews, and the Other choice."""
    header = question.get("header")
    text = visible(question["question"])
    lines = [f"[{visible(header)}] {text}" if header else text]
    if question.get("multiSelect"):
        lines.append("(choose one or more, separated by commas, e.g. 1,3)")
    options = question["options"]
    for number, option in enumerate(options, start=1):
        description = option.get("description")
        lines.append(f"  {number}. {visible(option['label'])}" + (f" - {visible(description)}" if description else ""))
        if option.get("markdown"):
            lines.extend(boxed(str(option["markdown"]), indent="     ", unicode=unicode))
    lines.append(f"  {len(options) + 1}. {OTHER_LABEL}")
    return "\n".join(lines)


def boxed(text: str, indent: str = "", unicode: bool = True) -> list[str]:
    """``text`` in a box, for monospace previews (controls escaped; line feeds kept)."""
    text = visible(text, multiline=True)
    top, side, bottom = ("┌", "│", "└") if unicode else ("+", "|", "+")
    rule = ("─" if unicode else "-") * max(8, min(60, max(len(line) for line in text.splitlines() or [""]) + 2))
    return [indent + top + rule, *(f"{indent}{side} {line}" for line in text.splitlines()), indent + bottom + rule]


def parse_choices(text: str, count: int, multi: bool) -> list[int]:
    """``"1, 3"`` -> ``[1, 3]``: 1-based choices, de-duplicated in order.

    Raises ValueError with a message for the person when the text is not one number
    (several, separated by commas or spaces, if ``multi``) between 1 and ``count``.
    """
    parts = [part for part in text.replace(",", " ").split() if part]
    expected = f"a number from 1 to {count}" + (", or several separated by commas" if multi else "")
    if not parts or (len(parts) > 1 and not multi):
        raise ValueError(f"Please enter {expected}.")
    picks: list[int] = []
    for part in parts:
        if not part.isdigit() or not 1 <= int(part) <= count:
            raise ValueError(f"{part!r} is not a choice. Please enter {expected}.")
        if int(part) not in picks:
            picks.append(int(part))
    return picks


def _valid_questions(payload: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The payload's questions if every one can be rendered, else None."""
    questions = payload.get("questions")
    if not isinstance(questions, list) or not questions:
        return None
    for question in questions:
        if not isinstance(question, dict) or not isinstance(question.get("question"), str):
            return None
        options = question.get("options")
        if not isinstance(options, list) or not all(isinstance(o, dict) and "label" in o for o in options):
            return None
    return questions


def error_summary(error: str | None) -> str:
    """The last line of an agent's traceback (``ValueError: boom``), or the whole message."""
    if not error:
        return "the turn failed"
    lines = [line for line in error.strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback (most recent call last)"):
        return lines[-1].strip()
    return error.strip()


def format_custom(kind: str, payload: dict[str, Any]) -> str:
    """A custom interrupt: ``[kind] title``, its ``prompt``, then the whole payload as JSON.

    ``title`` and ``prompt`` are the payload's own words for the person, when it has them
    (strings; the prompt may span lines); with neither, the first line says that the agent
    is waiting for an answer.
    """
    words = [
        visible(text.strip(), multiline=name == "prompt")
        for name in ("title", "prompt")
        if isinstance(text := payload.get(name), str) and text.strip()
    ]
    lead = "\n".join(words) if words else "The agent is waiting for an answer."
    return f"[{visible(kind)}] {lead}\n{visible_json(payload, indent=2)}"


def describe_error(exc: ClientError) -> str:
    """One line for a person: what failed and, for 401, what to do about it (controls escaped)."""
    if exc.status is None:
        return visible(exc.detail)
    try:
        phrase = HTTPStatus(exc.status).phrase
    except ValueError:
        phrase = "HTTP error"
    detail = str(exc.detail)
    if detail.lower().startswith(phrase.lower() + ":"):
        detail = detail[len(phrase) + 1:].lstrip()  # "401 Unauthorized: Unauthorized: ..." said it twice
    text = f"{exc.status} {phrase}: {visible(detail)}"
    if exc.status == 401:
        text += " (set --api-key or MOTUS_API_KEY)"
    return text
