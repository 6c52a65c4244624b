r"""The interactive chat of ``motus serve chat``: a REPL that answers every interrupt.

Built only on :mod:`motus.client` (``Client.finish_turn`` drives each turn); this module adds
the terminal: how interrupts are shown and answered, the spinner, and session cleanup.

How each interrupt is answered (the resume ``value``):

- ``tool_approval``: the tool and its arguments are shown; ``Approve? [y/N]``.
  ``y`` -> ``{"approved": true}``; ``e`` edits the arguments as JSON first ->
  ``{"approved": true, "tool_args": {...}}``; anything else rejects, with an optional
  reason -> ``{"approved": false[, "reason": "..."]}``.
- ``user_input``: every question with its header and numbered options (a ``markdown``
  preview in a box), plus a last "(Other: type your own answer)" choice. ``Choice:`` takes
  one number, or several (``1,3``) for ``multiSelect`` questions, whose answer is the chosen
  labels joined by ", ". -> ``{"answers": {question: answer}}``.
- any other type: ``[warn] unknown interrupt type: <type>``, then the payload as JSON, and
  the person types a JSON value to resume with, or an empty line to leave it pending
  (:data:`motus.client.SKIP`), which the next message of the REPL asks about again.

Guarantees: each pending interrupt is asked once per poll cycle; a session this chat
created is deleted when it exits (also on Ctrl-C), unless ``--keep``; a session joined
with ``--session`` is never deleted; errors are one line on stderr, never a traceback.

Nothing the server or the agent sent reaches the terminal raw: every such string goes
through :func:`visible` (or :func:`visible_json`), which shows control characters (C0, DEL,
C1, so also ESC/CSI/OSC sequences and ``\r``), Unicode bidi controls and line separators
as escapes (``\x1b``, ``\r``, ``\u202e``), so a tool argument cannot overwrite, hide or
reorder what the approval prompt shows. Line breaks are kept only where text is
multi-line by nature (the agent's reply, an error, a markdown preview, a multi-line
argument, which is shown as a block with every line marked ``|``); in one-line fields
(tool and argument names, questions, options, ids) ``\n`` is escaped too.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from http import HTTPStatus
from dataclasses import dataclass, field
from typing import Any, TextIO

from motus.client import SKIP, Client, ClientError, InterruptInfo, NotFound, SessionResponse

log = logging.getLogger(__name__)

#: Exit status after Ctrl-C, as shells report a process ended by SIGINT.
EXIT_INTERRUPTED = 130

OTHER_LABEL = "(Other: type your own answer)"

#: Statuses in which a turn is still in progress (a new message would get 409).
_BUSY = ("running", "interrupted")


# --------------------------------------------------------------------------- terminal-safe text

#: What must never reach a terminal raw: C0 controls (the tab and the line feed are allowed
#: back in by ``visible(..., multiline=True)``), DEL and C1 controls, the Unicode bidi
#: controls (embeddings, overrides, isolates, marks), the line and paragraph separators,
#: and lone surrogates (which would not even encode).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b\u200c\u200e\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: object, multiline: bool = False) -> str:
    r"""``text`` safe to print on a terminal: each control or bidi character as a visible escape.

    ``"a.db\r  path: b"`` shows as ``a.db\r  path: b`` (a backslash and an ``r``), an escape
    sequence ``"\x1b]0;x\x07"`` as ``\x1b]0;x\x07``, a right-to-left override as ``\u202e``.
    With ``multiline`` the line feed and the tab stay as they are; ``\r`` never does.
    Backslashes are not doubled: ``\r`` on screen is an escaped carriage return or those
    two characters, and neither moves the cursor.
    """
    text = str(text)
    if multiline:
        return _UNSAFE.sub(lambda match: match.group() if match.group() in "\n\t" else _escape(match.group()), text)
    return _UNSAFE.sub(lambda match: _escape(match.group()), text)


def visible_json(value: Any, indent: int | None = None) -> str:
    r"""``value`` as JSON that is safe to print, and still valid JSON equal to ``value``.

    ``json.dumps`` escapes C0 controls; DEL, C1, bidi controls, separators and lone
    surrogates are escaped here as ``\uXXXX``, which decodes to the same string. Other
    non-ASCII text (accents, CJK, emoji) stays readable.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False)  # its only raw line feeds are the indentation's
    return _UNSAFE.sub(lambda match: match.group() if match.group() == "\n" else f"\\u{ord(match.group()):04x}", text)


class Console:
    """Line-based terminal I/O: conversation and prompts on stdout, notices on stderr."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def ask(self, prompt: str) -> str:
        """Show ``prompt`` and read one line (without its newline). EOFError at end of input."""
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    @property
    def unicode(self) -> bool:
        return "utf" in (getattr(self.stdout, "encoding", None) or "").lower()


class Spinner:
    """An animated "working" line on a terminal stream while the agent runs.

    Does nothing when the stream is not a terminal, so piped output stays clean.
    ``start``/``stop`` are idempotent; ``stop`` erases the line before returning, so
    whatever is printed next starts on a clean line.
    """

    FRAMES = "|/-\\"
    LABEL = "working"

    def __init__(self, stream: TextIO, interval: float = 0.1) -> None:
        self._stream = stream
        self._interval = interval
        self._enabled = _isatty(stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self._enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._spin, name="motus-chat-spinner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._stream.write("\r\x1b[K")
        self._stream.flush()

    def _spin(self) -> None:
        index = 0
        while True:
            self._stream.write(f"\r{self.FRAMES[index % len(self.FRAMES)]} {self.LABEL}")
            self._stream.flush()
            index += 1
            if self._stop.wait(self._interval):
                return


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------- answering


def answer_interrupt(info: InterruptInfo, console: Console) -> Any:
    """Show one interrupt, ask the person, return the resume value (or ``SKIP``)."""
    if info.type == "tool_approval":
        return answer_tool_approval(info.payload, console)
    if info.type == "user_input":
        questions = _valid_questions(info.payload)
        if questions is not None:
            return answer_user_input(questions, console)
        console.note("[warn] malformed user_input payload (questions need question, header and options with labels)")
    else:
        console.note(f"[warn] unknown interrupt type: {visible(info.type)}")
    return answer_custom(info.payload, console)


def answer_tool_approval(payload: dict[str, Any], console: Console) -> dict[str, Any]:
    tool_name = payload.get("tool_name") or "(unnamed tool)"
    args = payload.get("tool_args")
    edited = False
    console.say(f"\nThe agent wants to run: {visible(tool_name)}")
    while True:
        console.say(format_arguments(args))
        console.say("(y = approve, e = edit the arguments first, n or Enter = reject)")
        reply = console.ask("Approve? [y/N] ").strip().lower()
        if reply in ("y", "yes"):
            return {"approved": True, "tool_args": args} if edited else {"approved": True}
        if reply in ("e", "edit"):
            args = _ask_json_object(console, args)
            edited = True
            console.say("Edited arguments:")
            continue
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
                console.say(str(exc))
        chosen = []
        for number in picks:
            if number <= len(options):
                chosen.append(str(options[number - 1]["label"]))
            else:
                chosen.append(_ask_nonempty(console, "Your answer: "))
        answers[str(question["question"])] = ", ".join(chosen)
    return {"answers": answers}


def answer_custom(payload: dict[str, Any], console: Console) -> Any:
    console.say(visible_json(payload, indent=2))
    while True:
        text = console.ask("Answer with a JSON value (Enter to skip): ").strip()
        if not text:
            console.note("[info] interrupt left pending")
            return SKIP
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            console.say(f"Not valid JSON ({exc.msg}); strings need double quotes, e.g. \"yes\".")


def _ask_json_object(console: Console, current: Any) -> Any:
    console.say("Current arguments: " + visible_json(current))
    while True:
        text = console.ask("New arguments as a JSON object (Enter to keep): ").strip()
        if not text:
            return current
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            console.say(f"Not valid JSON: {exc.msg}.")
            continue
        if isinstance(value, dict):
            return value
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


# --------------------------------------------------------------------------- the chat


@dataclass
class Chat:
    """One chat with one session: ``run(message)`` for one-shot, ``run(None)`` for the REPL."""

    client: Client
    console: Console
    session_id: str | None = None
    keep: bool = False
    user_params: dict[str, Any] | None = None
    created: bool = field(default=False, init=False)
    _spinner: Spinner = field(init=False)

    def __post_init__(self) -> None:
        self._spinner = Spinner(self.console.stderr)

    def run(self, message: str | None) -> int:
        """Run the chat and return the exit status; deletes a created session at the end."""
        status = 1
        try:
            status = self._run(message)
        except KeyboardInterrupt:
            self._spinner.stop()
            self.console.note("\nInterrupted.")
            status = EXIT_INTERRUPTED
        except EOFError:
            self._spinner.stop()
            self.console.note("\nError: input ended while an answer was expected.")
            status = 1
        except ClientError as exc:
            self._spinner.stop()
            self.console.note(f"Error: {describe_error(exc)}")
            status = 1
        finally:
            status = self._cleanup(status)
        return status

    @property
    def _sid(self) -> str:
        assert self.session_id is not None, "the session is opened first"
        return self.session_id

    def _run(self, message: str | None) -> int:
        joined = None
        if self.session_id is None:
            self.session_id = self.client.create_session().session_id
            self.created = True
        else:
            joined = self.client.get_session(self.session_id)  # 404 here if it does not exist
        if message is not None:
            return 0 if self._turn(message, one_shot=True) else 1
        self.console.note(
            f"Chatting with {visible(self.client.base_url)} (session {visible(self._sid)}). Type /quit or press Ctrl-D to leave."
        )
        if joined is not None and joined.status in _BUSY:
            self.console.note("[info] finishing the turn in progress first")
            self._show(self._finish(), one_shot=False)
        while True:
            try:
                line = self.console.ask("> ").strip()
            except EOFError:
                self.console.say("")
                return 0
            if line in ("/quit", "/exit"):
                return 0
            if line:
                self._turn(line, one_shot=False)

    def _turn(self, content: str, one_shot: bool) -> bool:
        """Finish any unfinished turn, send ``content``, show the outcome; True if it ended idle."""
        if self.client.get_session(self._sid).status in _BUSY:
            self.console.note("[info] the previous turn is still waiting; finishing it first")
            if self._show(self._finish(), one_shot) is None:
                self.console.note("[info] message not sent")
                return False
        self._spinner.start()
        try:
            self.client.send_message(self._sid, content, user_params=self.user_params)
            session = self.client.finish_turn(self._sid, self._answer)
        finally:
            self._spinner.stop()
        return bool(self._show(session, one_shot))

    def _finish(self) -> SessionResponse:
        self._spinner.start()
        try:
            return self.client.finish_turn(self._sid, self._answer)
        finally:
            self._spinner.stop()

    def _answer(self, info: InterruptInfo) -> Any:
        self._spinner.stop()
        try:
            return answer_interrupt(info, self.console)
        finally:
            self._spinner.start()

    def _show(self, session: SessionResponse, one_shot: bool) -> bool | None:
        """Print how a turn ended: True for idle, False for error, None if still paused."""
        if session.status == "idle":
            content = session.response.content if session.response else None
            self.console.say(visible(content, multiline=True) if content else "(empty response)")
            return True
        if session.status == "error":
            self.console.note(f"Error: {visible(error_summary(session.error), multiline=True)}")
            return False
        pending = len(session.interrupts or [])
        if not one_shot:
            hint = "; your next message asks again"
        elif self.created and not self.keep:
            hint = "; the session is deleted on exit (use --keep, then --session ID, to answer later)"
        else:
            hint = "; answer it later with --session ID"
        self.console.note(f"[info] the turn is paused on {pending} unanswered interrupt(s){hint}")
        return None

    def _cleanup(self, status: int) -> int:
        try:
            if self.created and self.session_id and not self.keep:
                try:
                    self.client.delete_session(self.session_id)
                except NotFound:
                    log.info("session %s was already gone", self.session_id)
                except ClientError as exc:
                    self.console.note(f"[warn] could not delete session {visible(self.session_id)}: {describe_error(exc)}")
                else:
                    if status == EXIT_INTERRUPTED:
                        self.console.note(f"Deleted session {visible(self.session_id)}.")
            elif self.created and self.session_id:
                self.console.note(f"Session kept: {visible(self.session_id)}")
        except KeyboardInterrupt:
            self.console.note(f"\nInterrupted; session {visible(self.session_id)} may still exist.")
            return EXIT_INTERRUPTED
        finally:
            self.client.close()
        return status


def describe_error(exc: ClientError) -> str:
    """One line for a person: what failed and, for 401, what to do about it (controls escaped)."""
    if exc.status is None:
        return visible(exc.detail)
    try:
        phrase = HTTPStatus(exc.status).phrase
    except ValueError:
        phrase = "HTTP error"
    text = f"{exc.status} {phrase}: {visible(exc.detail)}"
    if exc.status == 401:
        text += " (set --api-key or MOTUS_API_KEY)"
    return text
