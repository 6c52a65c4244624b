"""Client commands of ``motus serve``: chat, health, create, sessions, get, delete, messages, send.

Every command is a thin layer over :class:`motus.client.Client`. Output is readable text by
default and the API's JSON with ``--json`` (except ``chat``, which is interactive). Every
command takes ``--api-key`` (default: ``$MOTUS_API_KEY``), sent as ``Authorization: Bearer``
and never printed.

Failures never show a traceback: a server that is not there prints
``Error: Could not connect to URL``; an HTTP error prints its status and the server's
``detail``; both exit with status 1. Ctrl-C exits with 130.

Nothing the server sent is printed raw: the text output shows control and bidi characters
as escapes (``\\x1b``, ``\\r``, ``\\u202e``; see :func:`motus.client.chat.visible`), and
``--json`` prints JSON in which those characters are ``\\uXXXX`` escapes
(:func:`motus.client.chat.visible_json`): still valid JSON that decodes to exactly what the
server sent, so scripts lose nothing and a terminal shows no raw escape sequence.

``--param KEY=VALUE`` values become the message's ``user_params``: ``42`` -> int,
``1.5`` -> float, ``true``/``false`` -> bool, anything else (including ``nan``, ``inf``
and an empty value) stays a string.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from motus.client.library import (
    DEFAULT_POLL_SECONDS,
    Client,
    ClientError,
    ConnectionFailed,
    SessionResponse,
    SessionSummary,
    Webhook,
)
from motus.client.chat import EXIT_INTERRUPTED, Chat, Console, describe_error, visible, visible_json
from motus.api.approvers import progress
from motus.client.prompts import quorum_of, who_may_approve
from motus.client.terminal import format_message

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def register(group: click.Group) -> None:
    """Add the client commands to the ``motus serve`` group."""
    for command in (chat, health, create, sessions, get, delete, messages, send, inbox, resume):
        group.add_command(command)


# --------------------------------------------------------------------------- shared pieces


def parse_params(pairs: tuple[str, ...] | list[str]) -> dict[str, Any] | None:
    """``["n=3", "x=1.5", "debug=true", "name=Bob"]`` -> typed ``user_params`` (None if empty).

    Raises click.BadParameter for an item without ``=`` or with an empty key.
    """
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--param")
        params[key] = coerce_value(value)
    return params or None


def coerce_value(text: str) -> Any:
    """``"42"`` -> 42, ``"-1.5"`` -> -1.5, ``"true"`` -> True; anything else unchanged."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text  # "nan", "inf" stay strings


def _common(command: F) -> F:
    """``--api-key`` for every command."""
    return click.option(
        "--api-key",
        envvar="MOTUS_API_KEY",
        default=None,
        metavar="KEY",
        help="API key sent as 'Authorization: Bearer KEY' (default: $MOTUS_API_KEY).",
    )(command)


def _json_option(command: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of text.")(command)


_param_option = click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Add to the message's user_params (repeatable; numbers and true/false are converted).",
)


def _handle_errors(command: F) -> F:
    """Turn client errors into one line on stderr and exit status 1 (130 for Ctrl-C)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConnectionFailed as exc:
            click.echo(f"Error: {visible(exc.detail)}", err=True)
        except ClientError as exc:
            click.echo(f"Error: {describe_error(exc)}", err=True)
        except KeyboardInterrupt:
            click.echo("\nInterrupted.", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _print_json(data: Any) -> None:
    click.echo(visible_json(data, indent=2))


def _fetch_and_print(
    url: str,
    api_key: str | None,
    as_json: bool,
    fetch: Callable[[Client], T],
    to_json: Callable[[T], Any],
    to_text: Callable[[T], str],
) -> None:
    """Call ``fetch`` with a client of ``url``, then print its result as JSON (``--json``) or text."""
    with Client(url, api_key=api_key) as client:
        result = fetch(client)
    if as_json:
        _print_json(to_json(result))
    else:
        click.echo(to_text(result))


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines()) if text else prefix.rstrip()


# --------------------------------------------------------------------------- readable output


def format_session(session: SessionResponse) -> str:
    lines = [f"session_id: {visible(session.session_id)}", f"status: {visible(session.status)}"]
    if session.response is not None:
        lines.append("response:")
        lines.append(_indent(format_message(session.response), "  "))
    if session.error:
        lines.append("error:")
        lines.append(_indent(visible(session.error.rstrip(), multiline=True), "  "))
    for item in session.interrupts or []:
        lines.append(f"interrupt {visible(item.interrupt_id)} ({visible(item.type)}):")
        lines.append(_indent(visible_json(item.payload, indent=2), "  "))
    return "\n".join(lines)


def format_sessions(rows: list[SessionSummary]) -> str:
    if not rows:
        return "No sessions."
    ids = [visible(row.session_id) for row in rows]
    width = max(len("SESSION ID"), *(len(sid) for sid in ids))
    lines = [f"{'SESSION ID':<{width}}  {'STATUS':<11}  {'MESSAGES':<8}  TITLE"]
    lines.extend(
        f"{sid:<{width}}  {visible(row.status):<11}  {row.total_messages:<8}  {visible(getattr(row, 'title', None) or '')}".rstrip()
        for sid, row in zip(ids, rows)
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


@click.command()
@click.argument("url")
@click.argument("message", required=False)
@click.option("--session", "session_id", metavar="ID", help="Join this existing session (only /delete deletes it).")
@click.option("--keep", is_flag=True, help="With MESSAGE: keep the session after the turn ends, and print its id.")
@_param_option
@_common
def chat(url: str, message: str | None, session_id: str | None, keep: bool, params: tuple[str, ...], api_key: str | None) -> None:
    """Chat with the agent at URL: one MESSAGE, or a REPL without it.

    Interrupts are answered in the terminal: tool approvals (y/N, e to edit the
    arguments), questions with numbered options and an Other answer, and any other type
    with a JSON value or plain text. Ctrl-C cancels the question or the wait without
    answering anything; leaving (/quit, Ctrl-D, Ctrl-C twice) keeps the session and prints
    how to rejoin it with --session; /delete deletes it. A one-shot MESSAGE deletes the
    session it created once its turn has ended, unless --keep.
    """
    user_params = parse_params(params)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    runner = Chat(Client(url, api_key=api_key), Console(), session_id=session_id, keep=keep, user_params=user_params)
    sys.exit(runner.run(message))


@click.command()
@click.argument("url")
@click.option("--type", "kind", default=None, metavar="TYPE", help="Only interrupts of this type: tool_approval (a gated tool), user_input (ask_user_question), or a type an agent gave interrupt().")
@click.option("--wait", is_flag=True, help="Long poll: return as soon as something is pending.")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(0), help="How long --wait waits (s).")
@click.option("--limit", default=None, type=click.IntRange(1), metavar="N", help="Only the oldest N (with thousands waiting).")
@_json_option
@_common
@_handle_errors
def inbox(url: str, kind: str | None, wait: bool, timeout: float, limit: int | None, as_json: bool, api_key: str | None) -> None:
    """List the interrupts waiting on a person, across every session, oldest first."""
    _fetch_and_print(
        url,
        api_key,
        as_json,
        lambda client: client.inbox(type=kind, wait=wait, timeout=timeout, limit=limit),
        lambda items: [item.model_dump(mode="json") for item in items],
        format_inbox,
    )


#: What ``motus serve inbox`` ends with: how to answer one of the items it listed.
ANSWER_HINT = (
    "Answer one with: motus serve resume URL SESSION INTERRUPT VALUE, where VALUE is JSON: "
    """'{"approved": true}' or '{"approved": false, "reason": "..."}' for tool_approval, """
    """'{"answers": {"<question>": "<label>"}}' for user_input; or open the session in the """
    "chat: motus serve chat URL --session SESSION"
)


#: The longest message or agent text an inbox block shows (the rest is ``motus serve get``'s).
INBOX_TEXT = 300


def format_inbox(items: list[Any]) -> str:
    """One block per session, its pending interrupts numbered within it: the session's
    title, the message that started the turn (who sent it, when), what the agent said
    before asking, then each item: what it asks, since when; then how to answer."""
    if not items:
        return "Nothing is waiting on a person."
    sessions: dict[str, list[Any]] = {}
    for item in items:
        sessions.setdefault(item.session_id, []).append(item)
    blocks = []
    for session_id, group in sessions.items():
        context = getattr(group[0], "context", None)
        title = getattr(context, "session_title", None)
        lines = [f"Session {visible(session_id)}" + (f": {visible(title)}" if title else "")]
        message = getattr(context, "message", None)
        if message:
            sender = getattr(context, "sent_by", None)
            when = getattr(context, "sent_at", None)
            who = f" from {visible(sender)}" if sender and sender != "anonymous" else ""  # (no keys: nobody to name)
            lines.append(f"  message{who}{f' at {visible(when)}' if when else ''}: {_excerpt(message)}")
        agent_text = getattr(context, "agent_text", None)
        if agent_text:
            lines.append(f"  the agent said: {_excerpt(agent_text)}")
        for index, item in enumerate(group, 1):
            number = f"{index} of {len(group)}: " if len(group) > 1 else ""
            expires = f"  expires {visible(item.expires_at)}" if item.expires_at else ""
            lines.append(f"  {number}[{visible(item.type)}] {_asks(item)}")
            lines.append(f"    interrupt {visible(item.interrupt_id)}  since {visible(item.created_at)}{expires}")
            policy = who_may_approve(item.payload) if item.type == "tool_approval" else None
            if policy:
                lines.append(f"    {policy}")
            approvals = getattr(item, "approvals", None)
            if approvals is not None:  # a quorum: where it stands
                lines.append(f"    {progress(quorum_of(item.payload), [visible(a.by) for a in approvals])}")
        blocks.append("\n".join(lines))
    return "\n\n".join([*blocks, ANSWER_HINT])


def _asks(item: Any) -> str:
    payload = item.payload
    if item.type == "tool_approval":
        return f"approve {visible(payload.get('tool_name'))} {visible_json(payload.get('tool_args'))}"
    if isinstance(payload.get("prompt") or payload.get("title"), str):
        return visible(payload.get("title") or payload.get("prompt"))
    questions = payload.get("questions")
    if isinstance(questions, list) and questions and all(isinstance(q, dict) for q in questions):
        return " / ".join(visible(q.get("question", "?")) for q in questions)
    return visible_json(payload)


def _excerpt(text: str) -> str:
    """``text`` on one line, cut to ``INBOX_TEXT`` characters."""
    line = " ".join(str(text).split())
    return visible(line if len(line) <= INBOX_TEXT else line[: INBOX_TEXT - 3] + "...")


@click.command()
@click.argument("url")
@click.argument("session_id", metavar="SESSION")
@click.argument("interrupt_id", metavar="INTERRUPT")
@click.argument("value", metavar="VALUE")
@_json_option
@_common
@_handle_errors
def resume(url: str, session_id: str, interrupt_id: str, value: str, as_json: bool, api_key: str | None) -> None:
    """Answer a pending interrupt with VALUE (JSON), as listed by `motus serve inbox`.

    A tool approval: '{"approved": true}', or '{"approved": false, "reason": "..."}'. An
    interrupt someone already answered is refused (exit 1), naming who answered it and when.
    """
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({visible(exc)}); quote it for the shell, e.g. '{{\"approved\": true}}'", param_hint="VALUE") from None
    with Client(url, api_key=api_key) as client:
        accepted = client.resume(session_id, interrupt_id, parsed)
    if as_json:
        _print_json(accepted.model_dump(mode="json"))
    else:
        click.echo(f"Answered; session {visible(accepted.session_id)} is {visible(accepted.status)}.")
        if accepted.approvals_needed:  # one approval of a quorum: it waits for other keys
            click.echo(visible(accepted.detail or f"It needs {accepted.approvals_needed} more approval(s) from other keys."))


@click.command()
@click.argument("url")
@_json_option
@_common
@_handle_errors
def health(url: str, as_json: bool, api_key: str | None) -> None:
    """Show the server's health: workers and session count."""
    _fetch_and_print(
        url,
        api_key,
        as_json,
        lambda client: client.health(),
        lambda result: result.model_dump(mode="json"),
        lambda result: "\n".join(f"{visible(key)}: {visible(value)}" for key, value in result.model_dump().items()),
    )


@click.command()
@click.argument("url")
@click.option("--id", "session_id", metavar="ID", help="Use this UUID (the server needs --allow-custom-ids).")
@click.option(
    "--state",
    "state_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Preload the history from a JSON file holding a list of messages ('-' for stdin).",
)
@_json_option
@_common
@_handle_errors
def create(url: str, session_id: str | None, state_file: str | None, as_json: bool, api_key: str | None) -> None:
    """Create a session and print its id."""
    state = _read_state(state_file) if state_file else None
    _fetch_and_print(
        url,
        api_key,
        as_json,
        lambda client: client.create_session(state=state, session_id=session_id),
        lambda session: session.model_dump(mode="json"),
        lambda session: visible(session.session_id),
    )


def _read_state(path: str) -> list[Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        state = json.loads(text)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="--state") from None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{path} is not valid JSON: {exc}", param_hint="--state") from None
    if not isinstance(state, list):
        raise click.BadParameter(f"{path} must hold a JSON list of messages", param_hint="--state")
    return state


@click.command()
@click.argument("url")
@_json_option
@_common
@_handle_errors
def sessions(url: str, as_json: bool, api_key: str | None) -> None:
    """List the server's sessions."""
    _fetch_and_print(
        url,
        api_key,
        as_json,
        lambda client: client.list_sessions(),
        lambda rows: [row.model_dump(mode="json") for row in rows],
        format_sessions,
    )


@click.command()
@click.argument("url")
@click.argument("session_id", metavar="ID")
@click.option("--wait", is_flag=True, help="Long poll: return once the session is not running.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_POLL_SECONDS,
    show_default=True,
    help="With --wait: give up after this many seconds (the session may still be running).",
)
@_json_option
@_common
@_handle_errors
def get(url: str, session_id: str, wait: bool, timeout: float, as_json: bool, api_key: str | None) -> None:
    """Show a session: status, response, error and pending interrupts."""
    with Client(url, api_key=api_key) as client:
        session = client.get_session(session_id, wait=wait, timeout=timeout if wait else None)
    _print_session(session, as_json)


def _print_session(session: SessionResponse, as_json: bool) -> None:
    if as_json:
        _print_json(session.model_dump(mode="json"))
    else:
        click.echo(format_session(session))


@click.command()
@click.argument("url")
@click.argument("session_id", metavar="ID")
@_json_option
@_common
@_handle_errors
def delete(url: str, session_id: str, as_json: bool, api_key: str | None) -> None:
    """Delete a session (a running or interrupted turn is stopped)."""
    with Client(url, api_key=api_key) as client:
        client.delete_session(session_id)
    if as_json:
        _print_json({"session_id": session_id, "deleted": True})
    else:
        click.echo(f"Deleted session {visible(session_id)}")


@click.command()
@click.argument("url")
@click.argument("session_id", metavar="ID")
@_json_option
@_common
@_handle_errors
def messages(url: str, session_id: str, as_json: bool, api_key: str | None) -> None:
    """Show a session's stored messages, oldest first."""
    with Client(url, api_key=api_key) as client:
        history = client.get_messages(session_id)
    if as_json:
        _print_json([message.model_dump(mode="json") for message in history])
    elif not history:
        click.echo("No messages.")
    else:
        click.echo("\n".join(format_message(message) for message in history))


@click.command()
@click.argument("url")
@click.argument("session_id", metavar="ID")
@click.argument("message")
@click.option("--role", type=click.Choice(["user", "system", "assistant", "tool"]), default="user", show_default=True)
@click.option("--wait", is_flag=True, help="Wait until the turn ends or pauses on an interrupt, then show the session.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="With --wait: give up after this many seconds (default: wait as long as it takes).",
)
@click.option("--webhook-url", metavar="URL", help="POST the outcome here when the turn ends.")
@click.option("--webhook-token", metavar="TOKEN", help="Sent to the webhook as 'Authorization: Bearer TOKEN'.")
@click.option("--webhook-include-messages", is_flag=True, help="Include the session's messages in the webhook.")
@_param_option
@_json_option
@_common
@_handle_errors
def send(
    url: str,
    session_id: str,
    message: str,
    role: str,
    wait: bool,
    timeout: float | None,
    webhook_url: str | None,
    webhook_token: str | None,
    webhook_include_messages: bool,
    params: tuple[str, ...],
    as_json: bool,
    api_key: str | None,
) -> None:
    """Send MESSAGE to a session (starts a turn).

    With --wait, exits with status 1 if the turn ended in error.
    """
    if (webhook_token or webhook_include_messages) and not webhook_url:
        raise click.UsageError("--webhook-token and --webhook-include-messages need --webhook-url")
    webhook = None
    if webhook_url:
        try:
            webhook = Webhook(url=webhook_url, token=webhook_token, include_messages=webhook_include_messages)
        except ValidationError as exc:
            reasons = "; ".join(str(error.get("msg", "invalid")) for error in exc.errors()[:3])
            raise click.BadParameter(visible(reasons), param_hint="--webhook-url/--webhook-token") from None
    user_params = parse_params(params)
    with Client(url, api_key=api_key) as client:
        accepted = client.send_message(session_id, message, role=role, user_params=user_params, webhook=webhook)
        if not wait:
            if as_json:
                _print_json(accepted.model_dump(mode="json"))
            else:
                click.echo(f"Message accepted; session {visible(accepted.session_id)} is {visible(accepted.status)}.")
            return
        session = _wait_until_settled(client, session_id, timeout)
    _print_session(session, as_json)
    if session.status == "error":
        sys.exit(1)


def _wait_until_settled(client: Client, session_id: str, timeout: float | None) -> SessionResponse:
    """Long poll until the session is not running, or ``timeout`` seconds pass."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        poll = DEFAULT_POLL_SECONDS if deadline is None else min(DEFAULT_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
        session = client.get_session(session_id, wait=True, timeout=poll)
        if session.status != "running" or (deadline is not None and time.monotonic() >= deadline):
            return session
