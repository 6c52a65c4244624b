r"""The interactive chat of ``motus serve chat``: a REPL that answers every interrupt.

Built only on :mod:`motus.client.library` (its endpoint methods); this module adds the
terminal: how interrupts are shown and answered, line editing, the spinner, Ctrl-C, and
what happens to the session when the chat ends.

How each interrupt is answered (the resume ``value``). When several are pending at once,
each says so first: ``Approval 1 of 2``.

- ``tool_approval``: the tool and its arguments are shown; ``Approve? [y/N]``.
  ``y`` -> ``{"approved": true}``; ``e`` edits the arguments first: the current arguments
  are the starting text of the line (where readline can do that; else they are printed
  above it), the keys typed replace the agent's (the server merges them the same way),
  and the merged arguments are shown before asking again; approving then sends
  ``{"approved": true, "tool_args": <the merged arguments>}``. Anything else rejects, with
  an optional reason -> ``{"approved": false[, "reason": "..."]}``.
- ``user_input``: every question with its header and numbered options (a ``markdown``
  preview in a box), plus a last "(Other: type your own answer)" choice. ``Choice:`` takes
  one number, or several (``1,3``) for ``multiSelect`` questions, whose answer is the chosen
  labels joined by ", ". -> ``{"answers": {question: answer}}``.
- any other type (a custom interrupt): its own ``title`` and ``prompt`` if the payload has
  them, the payload as JSON, and an answer line: a JSON value, or plain text, which is sent
  as a string (and the chat says so). An empty line leaves it unanswered
  (:data:`motus.client.SKIP`).

While a turn runs, the chat waits on the session's event stream (``GET
/sessions/{id}/events``) where the server has one, and long-polls a server without (404, the
reference), or while every stream slot is taken (503).

Ctrl-C never throws the conversation away and never answers anything:

- at a question, it cancels the question: the interrupt stays pending, and the chat goes
  back to the ``>`` prompt, where Enter (or the next message) asks again;
- while the agent works, it stops waiting: the turn goes on in the session;
- at the ``>`` prompt, a second Ctrl-C in a row leaves, as ``/quit`` and Ctrl-D do.

Leaving keeps the session and prints how to rejoin it (``--session ID``); ``/delete``
deletes it (after a confirmation while a turn is in progress). Two exceptions, where
nothing can be lost: a session this chat created and never sent a message to is deleted,
and a one-shot chat (``motus serve chat URL MESSAGE``) whose turn ended deletes the
session it created unless ``--keep``. A session joined with ``--session`` is deleted only
by ``/delete``. Errors are one line on stderr, never a traceback.

Line editing and history (the standard library's :mod:`readline`) at every prompt when
the chat runs on a terminal and the module exists.

Nothing the server or the agent sent reaches the terminal raw: every such string goes
through :func:`visible` (or :func:`visible_json`), which shows control characters (C0, DEL,
C1, so also ESC/CSI/OSC sequences and ``\r``), Unicode bidi controls and line separators
as escapes (``\x1b``, ``\r``, ``\u202e``), so a tool argument cannot overwrite, hide or
reorder what the approval prompt shows. Line breaks are kept only where text is
multi-line by nature (the agent's reply, an error, a markdown preview, a multi-line
argument, which is shown as a block with every line marked ``|``, a custom prompt); in
one-line fields (tool and argument names, questions, options, titles, ids) ``\n`` is
escaped too. The starting text of an edit is :func:`visible_json` as well.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from types import ModuleType
from typing import Any, TextIO

from motus.client.library import (
    SKIP,
    Client,
    ClientError,
    ConnectionFailed,
    InterruptInfo,
    NotFound,
    SessionResponse,
    Unavailable,
)

log = logging.getLogger(__name__)

#: Exit status after Ctrl-C ends a one-shot chat, as shells report a process ended by SIGINT.
EXIT_INTERRUPTED = 130

OTHER_LABEL = "(Other: type your own answer)"

#: Statuses in which a turn is still in progress (a new message would get 409).
_BUSY = ("running", "interrupted")

#: What a numbered interrupt is called: "Approval 1 of 2".
_KIND_NAMES = {"tool_approval": "Approval", "user_input": "Question"}

HELP = """\
Commands:
  /quit, /exit, Ctrl-D   leave; the session is kept (rejoin it with --session ID)
  /delete                delete the session and leave
  /help                  show this
Ctrl-C cancels the question or the wait in progress without answering anything; at the
> prompt, a second Ctrl-C leaves. While a turn is unfinished, Enter goes back to it."""


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
    """Line-based terminal I/O: conversation and prompts on stdout, notices on stderr.

    On a terminal (``line_editing`` left to ``None``: stdin and stdout are this process'
    terminal), prompts are read with :func:`input` and :mod:`readline`: line editing and one
    history shared by every prompt. Elsewhere (pipes, tests) a prompt is written and a line
    read from ``stdin``.
    """

    def __init__(
        self,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        line_editing: bool | None = None,
    ) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        if line_editing is None:
            line_editing = self.stdin is sys.stdin and self.stdout is sys.stdout and _isatty(self.stdin) and _isatty(self.stdout)
        self._readline = _load_readline() if line_editing else None

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    @property
    def can_prefill(self) -> bool:
        """Whether :meth:`ask` can put starting text on the line (readline's pre-input hook)."""
        return self._readline is not None and hasattr(self._readline, "set_pre_input_hook")

    def ask(self, prompt: str, initial: str | None = None) -> str:
        """Show ``prompt`` and read one line (without its newline). EOFError at end of input.

        ``initial`` is the line's starting text, to edit, where :attr:`can_prefill`; callers
        show it some other way where not. Ctrl-C raises KeyboardInterrupt, as always.
        """
        if self._readline is not None:
            return self._ask_with_readline(prompt, initial)
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    def _ask_with_readline(self, prompt: str, initial: str | None) -> str:
        readline = self._readline
        assert readline is not None
        prefill = bool(initial) and self.can_prefill
        if prefill:

            def insert_initial() -> None:
                readline.insert_text(initial)
                readline.redisplay()

            readline.set_pre_input_hook(insert_initial)
        try:
            self.stdout.flush()
            self.stderr.flush()
            return input(prompt)
        finally:
            if prefill:
                readline.set_pre_input_hook()

    @property
    def unicode(self) -> bool:
        return "utf" in (getattr(self.stdout, "encoding", None) or "").lower()


def _load_readline() -> ModuleType | None:
    """The standard library's ``readline`` (importing it is what makes :func:`input` edit
    lines and keep history), or None where this Python has none (Windows, some builds)."""
    try:
        import readline
    except ImportError:
        return None
    return readline


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


def answer_tool_approval(payload: dict[str, Any], console: Console) -> dict[str, Any]:
    tool_name = payload.get("tool_name") or "(unnamed tool)"
    proposed = payload.get("tool_args")
    args = proposed
    console.say(f"\nThe agent wants to run: {visible(tool_name)}")
    while True:
        console.say(format_arguments(args))
        console.say("(y = approve, e = edit the arguments first, n or Enter = reject)")
        reply = console.ask("Approve? [y/N] ").strip().lower()
        if reply in ("y", "yes"):
            return {"approved": True, "tool_args": args} if args != proposed else {"approved": True}
        if reply in ("e", "edit"):
            args = _edit_arguments(console, args)
            console.say("With your edits it runs with:" if args != proposed else "Unchanged: it runs with the agent's arguments:")
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


# --------------------------------------------------------------------------- the chat


class _Stop(Exception):
    """Ctrl-C inside a turn, with what it cancelled (for the note the REPL prints)."""

    def __init__(self, asking: bool, sent: bool) -> None:
        super().__init__("cancelled")
        self.asking = asking  # a question was on screen: it stays unanswered
        self.sent = sent  # the message of this turn had been sent


@dataclass
class Chat:
    """One chat with one session: ``run(message)`` for one-shot, ``run(None)`` for the REPL."""

    client: Client
    console: Console
    session_id: str | None = None
    keep: bool = False
    user_params: dict[str, Any] | None = None
    created: bool = field(default=False, init=False)
    #: A message was sent from this chat: the session holds a conversation worth keeping.
    sent: bool = field(default=False, init=False)
    deleted: bool = field(default=False, init=False)
    #: The last turn seen is still in progress (paused on a person, or no longer waited for).
    unfinished: bool = field(default=False, init=False)
    _spinner: Spinner = field(init=False)
    #: A question is on screen (so Ctrl-C now leaves an interrupt unanswered).
    _asking: bool = field(default=False, init=False)
    #: The last guarded action was cancelled by Ctrl-C (so one more at the prompt leaves).
    _cancelled: bool = field(default=False, init=False)
    #: Whether the server has event streams: None until known, False after a 404 (the
    #: reference server), when every wait is a long poll.
    _events: bool | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._spinner = Spinner(self.console.stderr)

    def run(self, message: str | None) -> int:
        """Run the chat and return the exit status; then keep or delete the session (module doc)."""
        status = 1
        try:
            status = self._run(message)
        except KeyboardInterrupt:
            self._spinner.stop()
            self.console.note("\nInterrupted.")
            self.unfinished = True  # whatever the turn was doing, it may still be doing it
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
            status = self._leave(status, one_shot=message is not None)
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
            f"Chatting with {visible(self.client.base_url)} (session {visible(self._sid)}). "
            "Type /quit or press Ctrl-D to leave; the session is kept. /help lists commands."
        )
        if joined is not None and joined.status in _BUSY:
            self.console.note("[info] finishing the turn in progress first")
            self.unfinished = True
            self._guarded(lambda: self._turn(None, one_shot=False))
        return self._repl(armed=self._cancelled)

    def _repl(self, armed: bool = False) -> int:
        """The ``>`` loop; returns the exit status when the person leaves. ``armed``: the
        last thing was a Ctrl-C, so one more at the prompt leaves."""
        while True:
            try:
                line = self.console.ask("> ").strip()
            except KeyboardInterrupt:
                self.console.say("")
                if armed:
                    return 0
                armed = True
                self.console.note("[info] press Ctrl-C again or Ctrl-D to leave (the session is kept), or type a message")
                continue
            except EOFError:
                self.console.say("")
                return 0
            armed = False
            if line in ("/quit", "/exit"):
                return 0
            if line == "/help":
                self.console.say(HELP)
                continue
            if line == "/delete":
                if self._guarded(self._delete):
                    return 0
                armed = self._cancelled
                continue
            if re.fullmatch(r"/[A-Za-z]+", line):
                self.console.note(f"[info] unknown command {visible(line)}; /help lists commands")
                continue
            if line or self.unfinished:
                try:
                    self._guarded(lambda: self._turn(line or None, one_shot=False))
                except EOFError:
                    self.console.say("")
                    self.console.note("[info] input ended; the question stays unanswered")
                    return 0
                armed = self._cancelled

    def _guarded(self, action: Callable[[], Any]) -> Any:
        """Run ``action``; Ctrl-C inside it cancels it (module doc) and returns None."""
        self._cancelled = False
        try:
            return action()
        except (KeyboardInterrupt, _Stop) as exc:
            self._spinner.stop()
            self._cancelled = True
            self.console.say("")
            if isinstance(exc, _Stop) and exc.asking:
                self.console.note(
                    "[info] not answered: the agent is still waiting for it. Press Enter to answer now; "
                    "Ctrl-C again or Ctrl-D leaves (the session is kept)."
                )
            elif isinstance(exc, _Stop) and not exc.sent:
                self.console.note("[info] cancelled; the message was not sent. Ctrl-C again or Ctrl-D leaves.")
            elif isinstance(exc, _Stop):
                self.console.note(
                    "[info] stopped waiting; the turn goes on in the session. Press Enter to wait for it again; "
                    "Ctrl-C again or Ctrl-D leaves (the session is kept)."
                )
            else:
                self.console.note("[info] cancelled. Ctrl-C again or Ctrl-D leaves (the session is kept).")
            return None

    def _turn(self, content: str | None, one_shot: bool) -> bool | None:
        """Finish an unfinished turn, then send ``content`` (None: only finish) and show the
        outcome. True if the turn ended idle, False in error, None if it is still paused."""
        sent = False
        try:
            if content is None or self.client.get_session(self._sid).status in _BUSY:
                if content is not None:
                    self.console.note("[info] the previous turn is still waiting; finishing it first")
                outcome = self._show(self._drive(), one_shot)
                if outcome is None and content is not None:
                    self.console.note("[info] message not sent")
                if outcome is None or content is None:
                    return outcome
            with _ctrl_c_held_back():
                self.client.send_message(self._sid, content, user_params=self.user_params)
                sent = self.sent = self.unfinished = True
            session = self._drive()  # starts the "working" line: only a sent message is worked on
        except KeyboardInterrupt:
            if one_shot:
                raise
            raise _Stop(asking=self._asking, sent=sent or content is None) from None
        finally:
            self._asking = False
            self._spinner.stop()
        return self._show(session, one_shot)

    def _drive(self) -> SessionResponse:
        """Wait for the turn in progress, asking about each pending interrupt once.

        Returns the session once it is not running and nothing more can be asked: idle,
        error, or interrupted on interrupts the person left unanswered. The interrupts of
        one pause are numbered together (``1 of 2``); one that arrives while the person
        answers another joins the count.
        """
        handled: set[str] = set()
        self._spinner.start()
        while True:
            session = self._wait()
            if session.status != "interrupted":
                return session
            asked = 0
            while session.status == "interrupted":
                fresh = [item for item in session.interrupts or [] if item.interrupt_id not in handled]
                if not fresh:
                    break
                item = fresh[0]
                handled.add(item.interrupt_id)
                asked += 1
                value = self._answer(item, (asked, asked - 1 + len(fresh)))
                if value is not SKIP:
                    try:
                        with _ctrl_c_held_back():
                            self.client.resume(self._sid, item.interrupt_id, value)
                    except NotFound as exc:
                        # Answered elsewhere, or the turn ended meanwhile: the next read shows it.
                        log.info("resume of %s refused: %s", item.interrupt_id, exc.detail)
                session = self.client.get_session(self._sid)
            if asked == 0:
                return session  # only interrupts left unanswered remain

    def _wait(self) -> SessionResponse:
        """The session once it is not running. Woken by the session's event stream where the
        server has one (the stream opens first, then the session is read, so no change is
        missed); by long polls against a server without streams (404), while every stream
        slot is taken (503), or after the stream drops."""
        if self._events is False:
            return self.client.wait(self._sid)
        stream = self.client.events(self._sid, reconnect=False)
        try:
            try:
                next(stream)  # "ready": the stream is open
            except NotFound:
                self.client.get_session(self._sid)  # raises NotFound if the session is what is missing
                self._events = False
                log.info("the server has no event streams: long-polling instead")
                return self.client.wait(self._sid)
            except (Unavailable, ConnectionFailed, StopIteration):
                return self.client.wait(self._sid)
            self._events = True
            session = self.client.get_session(self._sid)
            while session.status == "running":
                try:
                    event = next(stream)
                except StopIteration:  # the session was deleted: the read says so
                    return self.client.get_session(self._sid)
                except ConnectionFailed:
                    return self.client.wait(self._sid)
                if event.kind in ("status", "interrupt", "message", "error", "reset"):
                    session = self.client.get_session(self._sid)
            return session
        finally:
            stream.close()

    def _answer(self, info: InterruptInfo, position: tuple[int, int]) -> Any:
        self._spinner.stop()
        self._asking = True
        value = answer_interrupt(info, self.console, position)
        self._asking = False
        self._spinner.start()
        return value

    def _show(self, session: SessionResponse, one_shot: bool) -> bool | None:
        """Print how a turn ended: True for idle, False for error, None if still paused."""
        self.unfinished = session.status in _BUSY
        if session.status == "idle":
            content = session.response.content if session.response else None
            self.console.say(visible(content, multiline=True) if content else "(empty response)")
            return True
        if session.status == "error":
            self.console.note(f"Error: {visible(error_summary(session.error), multiline=True)}")
            return False
        pending = len(session.interrupts or [])
        hint = "" if one_shot else "; press Enter to answer now, or your next message asks again"
        self.console.note(f"[info] the turn is paused on {pending} unanswered interrupt(s){hint}")
        return None

    def _delete(self) -> bool:
        """``/delete``: delete the session (asking first while a turn is in progress)."""
        session = self.client.get_session(self._sid)
        if session.status in _BUSY:
            what = "waiting for an answer" if session.status == "interrupted" else "still running"
            reply = self.console.ask(f"A turn is {what}; deleting the session cancels it. Delete it? [y/N] ").strip().lower()
            if reply not in ("y", "yes"):
                self.console.note("[info] the session is kept")
                return False
        try:
            with _ctrl_c_held_back():
                self.client.delete_session(self._sid)
        except NotFound:
            self.console.note(f"Session {visible(self._sid)} was already gone.")
        else:
            self.console.note(f"Deleted session {visible(self._sid)}.")
        self.deleted = True
        return True

    def _leave(self, status: int, one_shot: bool) -> int:
        """Keep or delete the session as the chat ends (module doc), and say which."""
        try:
            sid = self.session_id
            if sid is None or self.deleted:
                return status
            ended = not self.unfinished
            if self.created and (not self.sent or (one_shot and ended and not self.keep)):
                self._delete_unneeded(sid, empty=not self.sent)
            elif not one_shot or self.unfinished or self.keep:
                waiting = " A turn is still in progress in it." if self.unfinished else ""
                self.console.note(
                    f"Session kept: {visible(sid)}.{waiting} Rejoin it with: "
                    f"motus serve chat {visible(self.client.base_url)} --session {visible(sid)}"
                )
        except KeyboardInterrupt:
            self.console.note(f"\nInterrupted; session {visible(self.session_id)} is kept.")
            return EXIT_INTERRUPTED
        finally:
            self.client.close()
        return status

    def _delete_unneeded(self, sid: str, empty: bool) -> None:
        """Delete a session nothing would be lost with: ``empty`` (nothing was ever sent, and
        the chat says so), or holding a one-shot turn that has ended (silently, as scripts
        expect)."""
        try:
            self.client.delete_session(sid)
        except NotFound:
            log.info("session %s was already gone", sid)
        except ClientError as exc:
            self.console.note(f"[warn] could not delete session {visible(sid)}: {describe_error(exc)}")
        else:
            if empty:
                self.console.note(f"[info] nothing was sent, so the empty session {visible(sid)} was deleted")


@contextmanager
def _ctrl_c_held_back() -> Iterator[None]:
    """Hold Ctrl-C back while a request whose outcome the chat must know is in flight
    (a message sent, an answer posted, a deletion): it takes effect when the request ends,
    so the chat never has to guess whether the server got it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


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
