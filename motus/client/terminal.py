r"""The chat's terminal: text made safe to print, line input with editing, the spinner.

Owns how anything reaches the terminal and how a line is read from it; what is shown and
asked is :mod:`motus.client.prompts`, the chat itself :mod:`motus.client.chat`.

Nothing the server or the agent sent reaches the terminal raw: every such string goes
through :func:`visible` (or :func:`visible_json`), which shows control characters (C0, DEL,
C1, so also ESC/CSI/OSC sequences and ``\r``), Unicode bidi controls and line separators
as escapes (``\x1b``, ``\r``, ``\u202e``), so a tool argument cannot overwrite, hide or
reorder what the approval prompt shows. Line breaks are kept only where text is
multi-line by nature (the agent's reply, an error, a markdown preview, a multi-line
argument, which is shown as a block with every line marked ``|``, a custom prompt); in
one-line fields (tool and argument names, questions, options, titles, ids) ``\n`` is
escaped too. The starting text of an edit is :func:`visible_json` as well.

Line editing and history (the standard library's :mod:`readline`) at every prompt when
the chat runs on a terminal and the module exists (:class:`Console`).

Threads: a :class:`Console` is used by the chat's thread only; a :class:`Spinner` draws
from its own thread between ``start`` and ``stop``, and nothing else writes to its stream
meanwhile (``stop`` joins that thread before returning).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from motus.models import ChatMessage

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
        with _ctrl_c_deferred():
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


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that comes inside the block until its end, then raise it.

    ``Thread.start`` waits on a ``Condition``; a KeyboardInterrupt raised inside that wait
    can leave the condition's lock released twice ("RuntimeError: release unlocked lock"),
    a traceback instead of "Interrupted.". The spinner's first frame is printed from the
    new thread while ``start`` still waits, so a person who presses Ctrl-C on seeing it
    lands exactly there. Only the main thread's default handler is replaced."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pressed = []
    signal.signal(signal.SIGINT, lambda _signum, _frame: pressed.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_message(message: ChatMessage) -> str:
    """``role: content``, tool calls as ``name(arguments)``, continuation lines indented.

    Control and bidi characters are escaped; only the content keeps its line feeds.
    """
    who = visible(message.role) + (f" ({visible(message.name)})" if message.name and message.role == "tool" else "")
    parts = []
    if message.content:
        parts.append(visible(message.content, multiline=True))
    for call in message.tool_calls or []:
        parts.append(f"-> {visible(call.function.name)}({visible(call.function.arguments)})")
    if message.base64_image:
        parts.append("[image]")
    if message.user_params:
        parts.append("user_params: " + visible_json(message.user_params))
    body = "\n".join(parts) if parts else "(empty)"
    first, *rest = body.split("\n")
    return "\n".join([f"{who}: {first}", *("  " + line for line in rest)])
