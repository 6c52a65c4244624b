"""The wire messages between the server and a worker process, and the turn journal's record.

One duplex ``multiprocessing`` Pipe per turn::

    server                                        worker (one process, one turn)
      Job(message, state, journal, ...)      ->   run the agent; replay ``journal`` first
                                             <-   Record(entry, ack)     (model call, tool, step)
      Ack(seq)                               ->   (only when ``ack`` was asked: a gated tool's
                                                   *started* mark is committed before its body runs)
                                             <-   Interrupt(id, payload, seq)   (any number)
      Resume(interrupt_id, value)            ->   the awaiting future gets ``value``
                                             <-   Result(response, state, kept) | Failure(error)

All messages are plain picklable dataclasses that reference no server object, so a turn can
be re-driven from its journal by a fresh process (replay) after parking or a restart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from motus.durable.jsonshape import MAX_JSON_DEPTH, json_depth_exceeds, key_with_lone_surrogate

#: The kinds of journal records, in the words replay errors use.
INTERRUPT, MODEL, TOOL, STEP = "interrupt", "model", "tool", "step"


@dataclass(frozen=True)
class JournalEntry:
    """One thing a turn learned from the outside world, in the order it happened.

    ``seq`` numbers the turn's records from 1. Replay matches a record by ``kind`` and
    ``key`` (an interrupt's canonical payload, a model request's digest, a tool's name and
    arguments, a step's name) and by occurrence, never by timing. ``done`` is False for an
    interrupt not yet answered and for a gated tool that has only its *started* mark.
    ``value`` is the pickled result or answer. ``ref`` is an interrupt's id; ``payload``
    its payload as the API shows it. ``parent`` is the ``seq`` of the journaled call this one
    ran inside (a tool whose body asks a question): replaying the parent's result consumes
    its children, since the body that made them does not run again.
    """

    seq: int
    kind: str
    key: str
    label: str
    done: bool = False
    value: bytes | None = None
    ref: str | None = None
    payload: dict[str, Any] | None = None
    answered_at: float | None = None
    answered_by: str | None = None
    parent: int | None = None  # the journaled call (a tool, a step) this one ran inside
    created_at: float | None = None  # an interrupt's: when the server first saw it (wall clock)
    expires_at: float | None = None  # an interrupt's deadline, if it has a timeout (wall clock)
    default: bytes | None = None  # the packed value an expired interrupt resolves to

    def finished(self, value: bytes, **changes: Any) -> JournalEntry:
        return replace(self, done=True, value=value, **changes)

    def describe(self) -> str:
        """How a replay error names this record."""
        return f"record #{self.seq} ({self.kind} {self.label})"


@dataclass(frozen=True)
class Job:
    """The one turn a worker process runs. ``message``/``state`` are JSON-ready dicts.

    ``journal`` is empty for a fresh turn; for a replay it holds every record so far.
    """

    session_id: str
    turn_id: int
    message: dict[str, Any]
    state: list[dict[str, Any]]
    max_interrupts: int = 0  # pending at once; 0 = no limit
    journal: tuple[JournalEntry, ...] = field(default_factory=tuple)
    grants: tuple[str, ...] = ()  # tools the session approved "for the session" before this turn


@dataclass(frozen=True)
class Interrupt:
    """Worker -> server: the agent paused; ``payload`` is the agent's dict, normalised.

    A replayed interrupt that is still unanswered is sent again with its original id and
    ``seq``; the server treats that as "waiting again", not as a new interrupt.
    """

    interrupt_id: str
    payload: dict[str, Any]
    seq: int = 0
    parent: int | None = None
    timeout: float | None = None  # seconds until the server resolves it with ``default``
    default: Any = None  # JSON-ready


@dataclass(frozen=True)
class Interrupts:
    """Worker -> server: the interrupts raised in one pass of the agent's event loop (the
    branches of one ``asyncio.gather``), in one message, so the server takes them whole and
    shows them together (a message of several frames could be read in parts)."""

    interrupts: tuple[Interrupt, ...]


@dataclass(frozen=True)
class Record:
    """Worker -> server: store this journal record (insert, or complete the same ``seq``).
    With ``ack`` the worker waits for ``Ack(seq)``, sent once the record is committed."""

    entry: JournalEntry
    ack: bool = False


@dataclass(frozen=True)
class Ack:
    """Server -> worker: the record with this ``seq`` is committed."""

    seq: int


@dataclass(frozen=True)
class Resume:
    """Server -> worker: the client's reply to one interrupt."""

    interrupt_id: str
    value: Any


@dataclass(frozen=True)
class Result:
    """Worker -> server: the turn completed. ``response`` and the messages are JSON-ready dicts.

    The agent's new state is ``job.state[:kept] + state``: the worker sends back only what
    follows the longest run of leading messages the agent left unchanged (``unchanged_prefix``),
    so a turn that appends to a long history does not pickle the history back, and the server
    does not unpickle or store it again. ``kept`` 0 with the whole list is always correct.
    """

    response: dict[str, Any]
    state: list[dict[str, Any]]
    kept: int = 0


def unchanged_prefix(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> int:
    """How many leading messages ``new`` has that are ``old``'s exactly, as JSON: by value
    and type (``1``, ``1.0`` and ``True`` are equal in Python, not in JSON), keys in the same
    order, never by identity (an agent may edit a message of its state in place; ``old``
    must be a copy it never reached)."""
    kept = 0
    for before, after in zip(old, new):
        # ``==`` rejects fast, and is already exact for a string or None (most of a message);
        # what else it calls equal is looked at as JSON (half the time of ``same_json`` on
        # whole messages: 0.15 against 0.31 ms for 200 short ones, in a warm process).
        if before != after or list(before) != list(after):
            break
        for key, value in before.items():
            if value is not None and type(value) is not str and not same_json(value, after[key]):
                return kept
        kept += 1
    return kept


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON-ready values would be written as the same JSON text."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        return list(a) == list(b) and all(same_json(value, b[key]) for key, value in a.items())
    if kind is list:
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if kind is float:  # -0.0 == 0.0, and NaN is never equal: such a message is written again
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def result_problem(result: Result) -> str | None:
    """Why a ``Result`` is not one a worker of ours sends (a process the agent wrote to
    itself), or None: the response must be a dict, the messages a list of dicts, all of it
    JSON-ready (what the store and the API write). Only the messages sent are checked: the
    ones kept are the server's own."""
    if type(result.response) is not dict:
        return f"its response is not a dict ({type(result.response).__name__})"
    if type(result.state) is not list:
        return f"its state is not a list ({type(result.state).__name__})"
    for item in result.state:
        if type(item) is not dict:
            return f"its state holds something other than a dict ({type(item).__name__})"
    try:
        json.dumps([result.response, result.state])
    except (TypeError, ValueError, RecursionError) as exc:
        return f"it is not JSON: {type(exc).__name__}: {exc}"
    from pydantic import ValidationError

    from motus.models import ChatMessage

    for what, item in (("response", result.response), *(("a message", message) for message in result.state)):
        try:
            ChatMessage.model_validate(item)  # what the API shows it as, and the next turn reads
        except (ValidationError, RecursionError) as exc:
            return f"{'its' if what == 'response' else 'its state holds'} {what} that is not a chat message ({_first_error(exc)})"
    return None


def _first_error(exc: Exception) -> str:
    if hasattr(exc, "errors"):
        errors = exc.errors()
        if errors:
            where = ".".join(str(part) for part in errors[0].get("loc", ()))
            return f"{where}: {errors[0].get('msg')}" if where else str(errors[0].get("msg"))
    return type(exc).__name__


def interrupts_problem(message: Interrupts) -> str | None:
    """Why an ``Interrupts`` is not one a worker sends (its interrupts are checked one by one
    where they are applied), or None."""
    items = message.interrupts
    if type(items) is not tuple or not items:
        return f"interrupts: not a non-empty tuple ({type(items).__name__})"
    stray = next((item for item in items if not isinstance(item, Interrupt)), None)
    if stray is not None:
        return f"interrupts: one is not an Interrupt ({type(stray).__name__})"
    return None


def message_problem(message: object) -> str | None:
    """Why a message read from a worker's pipe is not one a worker of ours sends (a process
    the agent wrote to itself), or None. Named by what it claims to be: "a malformed
    interrupt: ...". The server ends such a turn in error rather than apply half of it.

    Only shapes are checked (types, JSON-ready payloads, a record's kind): what a real worker
    makes is always right, so this never refuses one."""
    if isinstance(message, Result):
        problem = result_problem(message)
        return None if problem is None else f"result: {problem}"
    if isinstance(message, Failure):
        return None if type(message.error) is str else f"failure: its error is not a str ({type(message.error).__name__})"
    if isinstance(message, Interrupt):
        problem = _interrupt_problem(message)
        return None if problem is None else f"interrupt: {problem}"
    if isinstance(message, Interrupts):
        return interrupts_problem(message)
    if isinstance(message, Record):
        problem = _record_problem(message)
        return None if problem is None else f"record: {problem}"
    return None  # anything else is ignored (and logged) by the server


def _interrupt_problem(message: Interrupt) -> str | None:
    if not _is_text(message.interrupt_id) or not message.interrupt_id:
        return "its id is not a non-empty str"
    if type(message.payload) is not dict:
        return f"its payload is not a dict ({type(message.payload).__name__})"
    if not _is_seq(message.seq, 0):
        return "its seq is not an int >= 0"
    if message.parent is not None and not _is_seq(message.parent, 1):
        return "its parent is not an int"
    timeout = message.timeout
    if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout < math.inf):
        return "its timeout is not a finite number of seconds > 0"
    problem = _not_json(message.payload)
    if problem is None and key_with_lone_surrogate(message.payload) is not None:
        problem = "its payload has an object key holding a lone surrogate (no view of it could show it)"
    if problem is None and timeout is not None:
        # The default matters (and a worker checks it) only with a timeout: without one, an
        # agent may pass anything, and it is never used. A worker bounds the payload's
        # depth, not the default's, and the default is kept pickled, never shown as JSON.
        problem = _not_json(message.default, depth=False)
    return problem


def _record_problem(message: Record) -> str | None:
    entry = message.entry
    if type(entry) is not JournalEntry:
        return f"its entry is not a JournalEntry ({type(entry).__name__})"
    if type(message.ack) is not bool:
        return "its ack is not a bool"
    if entry.kind not in (MODEL, TOOL, STEP):  # interrupts are journaled by the server itself
        return f"its kind is not one a worker records ({entry.kind!r})"
    if not _is_seq(entry.seq, 1):
        return "its seq is not an int >= 1"
    if not _is_text(entry.key) or not _is_text(entry.label) or type(entry.done) is not bool:
        return "its key, label or done has the wrong type"
    if entry.value is not None and type(entry.value) is not bytes:
        return "its value is not bytes"
    if entry.parent is not None and not _is_seq(entry.parent, 1):
        return "its parent is not an int"
    extra = (entry.ref, entry.payload, entry.answered_at, entry.answered_by, entry.created_at, entry.expires_at, entry.default)
    if any(field is not None for field in extra):
        return "it sets fields only the server sets (an interrupt's)"
    return None


#: A journal seq is a 64-bit integer in the stores.
_MAX_SEQ = 2**63 - 1


def _is_seq(value: object, least: int) -> bool:
    return type(value) is int and least <= value <= _MAX_SEQ


def _is_text(value: object) -> bool:
    """A str the stores can write: UTF-8, so no lone surrogate."""
    if type(value) is not str:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_json(value: Any, depth: bool = True) -> str | None:
    """Why ``value`` is not JSON as a worker of ours sends it (a JSON round trip, within
    ``MAX_JSON_DEPTH`` if ``depth``), or None."""
    if depth and json_depth_exceeds(value):
        return f"it nests deeper than {MAX_JSON_DEPTH} levels"
    stack = [value]
    while stack:  # JSON writes an int key as a str: the payload would change on its way
        item = stack.pop()
        if type(item) is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return f"it has a key that is not a str ({type(key).__name__})"
                stack.append(child)
        elif type(item) is list:
            stack.extend(item)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"it is not JSON: {type(exc).__name__}: {exc}"
    return None


def resulting_state(job_state: list[dict[str, Any]], result: Result) -> tuple[list[dict[str, Any]], int]:
    """The agent's whole new state from a ``Result`` of a job given ``job_state``, and how many
    of its leading messages are ``job_state``'s own. A ``kept`` that no worker of ours sends
    (negative, past the job's state, not an int: a process the agent wrote to itself) keeps
    nothing, so the state is exactly the list sent."""
    kept = result.kept
    if type(kept) is not int or not 0 <= kept <= len(job_state):
        kept = 0
    return job_state[:kept] + list(result.state), kept


@dataclass(frozen=True)
class Failure:
    """Worker -> server: the turn failed; ``error`` is what the session shows."""

    error: str
