"""The interactive chat of ``motus serve chat``: a REPL that answers every interrupt.

Talks to the server only through :mod:`motus.client.library` (its endpoint methods); owns the
session side of the chat: the ``>`` loop and its commands, waiting for a turn, Ctrl-C, and
what happens to the session when the chat ends. How an interrupt is shown and answered is
:mod:`motus.client.prompts`; line input, the spinner and terminal-safe text are
:mod:`motus.client.terminal`. Their public names are importable from here as well.

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

Every string from the server or the agent is printed through
:func:`~motus.client.terminal.visible`: no raw control or bidi character reaches the terminal.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from motus.client.library import (
    SKIP,
    Client,
    ClientError,
    ConnectionFailed,
    Forbidden,
    InterruptInfo,
    NotFound,
    SessionResponse,
    Unavailable,
    WhoAmI,
)
from motus.api.approvers import progress, quorum_refusal, refusal
from motus.client.prompts import (
    OTHER_LABEL,
    answer_custom,
    answer_interrupt,
    answer_own_approval,
    answer_tool_approval,
    answer_user_input,
    boxed,
    describe_error,
    error_summary,
    format_arguments,
    format_custom,
    format_question,
    parse_choices,
    quorum_of,
)
from motus.client.terminal import Console, Spinner, format_message, visible, visible_json

__all__ = [
    "EXIT_INTERRUPTED",
    "HELP",
    "OTHER_LABEL",
    "Chat",
    "Console",
    "Spinner",
    "answer_custom",
    "answer_interrupt",
    "answer_tool_approval",
    "answer_user_input",
    "boxed",
    "describe_error",
    "error_summary",
    "format_arguments",
    "format_custom",
    "format_question",
    "parse_choices",
    "visible",
    "visible_json",
]

log = logging.getLogger(__name__)

#: Exit status after Ctrl-C ends a one-shot chat, as shells report a process ended by SIGINT.
EXIT_INTERRUPTED = 130

#: Statuses in which a turn is still in progress (a new message would get 409).
_BUSY = ("running", "interrupted")

HELP = """\
Commands:
  /quit, /exit, Ctrl-D   leave; the session is kept (rejoin it with --session ID)
  /history               the session's messages so far, and the turn in progress
  /delete                delete the session and leave
  /help                  show this
Ctrl-C cancels the question or the wait in progress without answering anything; at the
> prompt, a second Ctrl-C leaves. While a turn is unfinished, Enter goes back to it."""


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
    #: The server refused the chat's key (401, 403): the session is left as it is, unmentioned.
    refused: bool = field(default=False, init=False)
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
    #: Who this chat's key is (``GET /whoami``): None until asked, False where the server
    #: cannot say (then every answer is offered, and the server decides).
    _me: WhoAmI | bool | None = field(default=None, init=False)

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
            if exc.status in (401, 403):
                self.refused = True  # the key may not use it: nothing to say of keeping or rejoining it
            elif isinstance(exc, NotFound) and self._gone():
                self.deleted = True  # nothing is kept, so the chat offers no rejoin
                self.console.note(
                    f"[info] session {visible(self.session_id)} no longer exists (deleted from elsewhere, or expired)"
                )
            status = 1
        finally:
            status = self._leave(status, one_shot=message is not None)
        return status

    def _gone(self) -> bool:
        """After a 404: whether the session itself is what is missing."""
        if self.session_id is None:
            return False
        try:
            self.client.get_session(self.session_id)
        except NotFound:
            return True
        except ClientError as exc:
            log.info("could not tell whether session %s still exists: %s", self.session_id, exc)
        return False

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
            self._show_turn(joined)  # someone else's message, maybe: say what is being decided
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
            if line == "/history":
                self._guarded(self._history)
                armed = self._cancelled
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
                finished = self._drive()
                self._spinner.stop()  # erase the "working" line before the outcome is printed
                outcome = self._show(finished, one_shot)
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
                why = self._cannot_answer(item, session)
                if why is not None:
                    # Not offered: the server would refuse it. It waits for someone who may,
                    # and the turn shows as paused (Enter looks again once they have answered).
                    self._spinner.stop()
                    self.console.note(f"[info] {why}; it waits for someone who may answer it")
                    self._spinner.start()
                    session = self.client.get_session(self._sid)
                    continue
                value = self._answer(item, (asked, asked - 1 + len(fresh)), self._approved_already(item))
                if value is not SKIP:
                    try:
                        with _ctrl_c_held_back():
                            accepted = self.client.resume(self._sid, item.interrupt_id, value)
                        if accepted.approvals_needed:
                            # One approval of a quorum: it waits for other keys, and the
                            # turn shows as paused (Enter looks again once they have answered).
                            self._spinner.stop()
                            self.console.note(f"[info] your approval counted: {visible(accepted.detail or '')}")
                            self._spinner.start()
                    except NotFound as exc:
                        # Answered elsewhere (the server says by whom and when), or the turn
                        # ended meanwhile: the person is told their answer did not count; the
                        # next read shows what did.
                        self._spinner.stop()
                        self.console.note(f"[info] your answer did not count: {visible(exc.detail)}")
                        self._spinner.start()
                    except Forbidden as exc:
                        # This key may not answer it (the tool names other approvers, or
                        # forbids the sender): it stays pending for someone who may, and the
                        # turn shows as paused (Enter looks again once they have answered).
                        self._spinner.stop()
                        self.console.note(f"[info] your answer was refused; someone who may must answer it: {visible(exc.detail)}")
                        self._spinner.start()
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

    def _whoami(self) -> WhoAmI | None:
        """This chat's key as the server names it, asked once; None where it cannot say."""
        if self._me is None:
            try:
                self._me = self.client.whoami()
            except (NotFound, Forbidden):
                self._me = False  # an older server, or the reference product: nothing is held back
        return self._me if isinstance(self._me, WhoAmI) else None

    def _cannot_answer(self, item: InterruptInfo, session: SessionResponse) -> str | None:
        """Why this chat's key may not answer ``item`` (its policy, as the server checks it),
        or None: it may, or who the key is is not known."""
        me = self._whoami()
        if me is None:
            return None
        if me.read_only:
            return f"your key ({visible(me.name)}) is read-only, so it cannot answer {visible(item.type)}"
        sender = (session.turn or {}).get("sent_by")
        # An unknown sender is left for the server to judge (the check fails closed on None).
        why = refusal(item.payload, me.name, me.roles, sender if isinstance(sender, str) else "\x00unknown")
        if why is not None:
            return f"your key cannot answer this: {visible(why)}"
        return None

    def _approved_already(self, item: InterruptInfo) -> str | None:
        """Where the quorum stands (``1 of 2 approvals: bob``) when this chat's key approved
        ``item`` already and may not again (it may still reject it); else None."""
        me = self._whoami()
        if me is None or not item.approvals:
            return None
        quorum = quorum_of(item.payload)
        given = [approval.by for approval in item.approvals]
        if quorum_refusal(item.payload, {"approved": True}, me.name, given, quorum) is None:
            return None
        return progress(quorum, given)

    def _answer(self, info: InterruptInfo, position: tuple[int, int], approved: str | None = None) -> Any:
        """Ask the person; ``approved``: they approved it already (a quorum), so only a rejection is asked."""
        self._spinner.stop()
        self._asking = True
        value = answer_own_approval(info.payload, approved, self.console) if approved else answer_interrupt(info, self.console, position)
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

    def _history(self) -> None:
        """``/history``: the stored messages, oldest first, then the turn in progress."""
        messages = self.client.get_messages(self._sid)
        for message in messages:
            self.console.say(format_message(message))
        session = self.client.get_session(self._sid)
        if session.status in _BUSY:
            self._show_turn(session)
        elif not messages:
            self.console.note("[info] no messages yet")

    def _show_turn(self, session: SessionResponse) -> None:
        """What the turn in progress is about: the message that started it (who sent it,
        when) and what the agent said in it so far, from the session's live ``turn``."""
        turn = session.turn if isinstance(session.turn, dict) else {}
        message = turn.get("message") if isinstance(turn.get("message"), dict) else {}
        content = message.get("content")
        if isinstance(content, str):
            sender = turn.get("sent_by")
            who = visible(sender) if isinstance(sender, str) and sender != "anonymous" else "the user"
            when = f" at {visible(turn['started_at'])}" if isinstance(turn.get("started_at"), str) else ""
            self.console.say(f"[turn in progress] {who} asked{when}:\n  " + visible(content, multiline=True).replace("\n", "\n  "))
        said = [step["text"] for step in turn.get("steps") or []
                if isinstance(step, dict) and step.get("kind") == "model" and isinstance(step.get("text"), str) and step["text"].strip()]
        if said:
            self.console.say("[the agent said] " + visible("\n\n".join(said), multiline=True).replace("\n", "\n  "))

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
            if sid is None or self.deleted or self.refused:
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
