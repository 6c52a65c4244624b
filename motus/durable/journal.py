"""The turn journal, worker side: record what a turn learns, and replay it.

Everything a turn learns from the outside world goes through :meth:`Journal.call` (model
calls, tool bodies through :func:`tool_call`, ``motus.step`` blocks) or through
``interrupt()``. On a first run
each call runs and its result is sent to the server as a ``Record``; on a replay (a fresh
process after parking or a restart) a call that matches a recorded one returns the recorded
result, or raises the recorded exception, without running.

Matching is by kind, key and occurrence, never by timing, so concurrent calls (several
gated tools in one model step, ``asyncio.gather`` over interrupts) replay correctly:

- a call whose key matches an unconsumed record consumes the first such record;
- a call that matches nothing is new, and runs, *unless* an unconsumed record of the same
  kind and label is still waiting (the same step, tool, interrupt type or model endpoint
  reached with other inputs) after every other branch of the turn had its chance to
  consume it (see ``CONFLICT_WAIT_SECONDS``): that is a divergence;
- a turn that ends with records it never reached has diverged too.

A divergence fails the turn with ``Replay diverged: ...`` naming the first record that
differs, even if the agent catches the exception: :attr:`Journal.diverged` is checked when
the turn ends. Nothing recorded ever runs twice silently.

Every call writes a *started* mark before it runs, so a call that is re-run after its
process ended keeps its ``seq`` and the records made inside it keep their parent. A gated
tool (``requires_approval``) also waits for the server to acknowledge that mark before its
body runs. A replay that finds the mark without a result knows the
body may have run when the server stopped: it never runs it again, and the tool fails with
``Outcome unknown: the server stopped while <tool> was running`` (recorded, so later replays
agree). Other calls in flight when a process died simply run again (at least once).

Thread safety: model calls run in threads (``asyncio.to_thread``), so the journal's state is
guarded by one lock; sends go through the channel, which serialises them.

The running turn's journal (:func:`current`) is state of this module alone, installed by the
worker runtime (``_install``); ``motus.serve.journal`` only re-exports it.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import json
import re
import logging
import pickle
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from motus.durable.records import STEP, TOOL, JournalEntry, Record

log = logging.getLogger(__name__)


#: A same-label conflict is looked at again, first after every other ready branch had a
#: turn (``READY_TRIES`` passes of the event loop), then while branches working in threads
#: catch up, for at most ``CONFLICT_WAIT_SECONDS``; only then is it a divergence. The wait
#: only delays the report of a real divergence, it never changes a replayed result.
READY_TRIES = 50
CONFLICT_WAIT_SECONDS = 2.0


#: The ``seq`` of the journaled call whose body is running here (copied into tasks and
#: ``asyncio.to_thread`` threads with the context), so records made inside know their parent.
_parent: contextvars.ContextVar[int | None] = contextvars.ContextVar("motus_journal_parent", default=None)


def current_parent() -> int | None:
    return _parent.get()


class ReplayDiverged(Exception):
    """The agent's code no longer does what its journal recorded."""


class OutcomeUnknown(Exception):
    """A gated tool was inside its body when the server stopped; it is not run again."""


class _Sender(Protocol):
    def send(self, message: object) -> None: ...

    async def send_and_wait_ack(self, record: Record) -> None: ...


#: ``json.dumps(value, sort_keys=True, ensure_ascii=False)``, built once (see
#: ``interrupt._STRICT_JSON``).
_SORTED_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def digest(value: Any) -> str:
    """A key for inputs that is the same in every process: JSON with sorted keys (pydantic
    models and dataclasses by their fields); an object with no data form counts by its
    type only, never by ``repr`` (which may hold a memory address)."""
    from pydantic_core import to_jsonable_python

    data = to_jsonable_python(value, fallback=lambda obj: f"<{type(obj).__module__}.{type(obj).__qualname__}>")
    text = _SORTED_JSON.encode(data)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def canonical_payload(payload: dict[str, Any]) -> str:
    """The payload as the key of its interrupt: sorted JSON, readable text kept as it is. A
    lone surrogate (half an emoji, which a client can send as ``\\ud800``) is written as its
    JSON escape, so the key is valid UTF-8 that every store can hold; any other text gives
    the same key as before, so journals written earlier still match on replay."""
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", _SORTED_JSON.encode(payload))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Raised:
    """A recorded exception, rebuilt as its own class without calling its ``__init__``
    (many exception classes take required arguments that ``args`` does not hold, so plain
    pickling writes them but cannot read them back)."""

    def __init__(self, exc: BaseException) -> None:
        self.cls = type(exc)
        self.args = exc.args
        self.state = dict(getattr(exc, "__dict__", {}))

    def rebuild(self) -> BaseException:
        exc = self.cls.__new__(self.cls)
        exc.args = self.args
        exc.__dict__.update(self.state)
        return exc


class Unrecordable(Exception):
    """A journaled call returned a value that cannot be written to the journal."""


def pack(outcome: tuple[str, Any]) -> bytes:
    """Record ``("ok", result)`` or ``("raise", exception)`` as bytes a later process can
    read back (checked here, once, rather than discovered by a replay).

    An exception that cannot be recorded as itself is recorded as a ``RuntimeError`` with
    its text. A result that cannot be recorded raises ``Unrecordable``: the caller decides
    what the journal keeps instead."""
    kind, value = outcome
    if kind == "raise":
        for candidate in (_Raised(value), _Raised(RuntimeError(f"{type(value).__name__}: {value}"))):
            try:
                data = pickle.dumps(("raise", candidate), protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(data)[1].rebuild()
                return data
            except Exception:  # try the plainer form
                continue
        raise AssertionError("a RuntimeError with a text always pickles")  # pragma: no cover
    try:
        data = pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
    except Exception as exc:
        raise Unrecordable(f"{type(value).__name__} could not be recorded ({type(exc).__name__}: {exc})") from None
    return data


def unpack(value: bytes | None) -> Any:
    kind, result = pickle.loads(value) if value is not None else ("ok", None)
    if kind == "raise":
        raise result.rebuild() if isinstance(result, _Raised) else result
    return result


def _record(label: str, outcome: tuple[str, Any]) -> bytes:
    """What the journal keeps for an outcome; a result that cannot be recorded is kept as an
    error a replay raises, saying why (the first run still returns the result)."""
    try:
        return pack(outcome)
    except Unrecordable as exc:
        log.warning("%s: its result %s; a replay of this turn will fail there", label, exc)
        return pack(("raise", Unrecordable(f"{label} cannot be replayed: its result {exc}. Return plain data (str, dict, list, numbers, pydantic models) from journaled calls.")))


class Journal:
    """One turn's journal inside its worker process."""

    def __init__(self, entries: Iterable[JournalEntry], channel: _Sender | None) -> None:
        self._lock = threading.Lock()
        self._unconsumed: list[JournalEntry] = sorted(entries, key=lambda e: e.seq)
        self._next_seq = max((e.seq for e in self._unconsumed), default=0) + 1
        self._channel = channel
        self.diverged: ReplayDiverged | None = None

    @property
    def replaying(self) -> bool:
        with self._lock:
            return bool(self._unconsumed)

    def has_unconsumed(self, kind: str, key: str) -> bool:
        """Whether a record of this kind and key waits to be replayed (nothing is claimed)."""
        with self._lock:
            return any(entry.kind == kind and entry.key == key for entry in self._unconsumed)

    def _try_claim(self, kind: str, key: str, label: str) -> tuple[JournalEntry | None, JournalEntry | None]:
        """``(record to replay, None)``, ``(None, None)`` for a new call, or ``(None,
        conflicting record)`` while an unconsumed record of the same kind and label waits."""
        with self._lock:
            if self.diverged is not None:
                raise self.diverged
            for index, entry in enumerate(self._unconsumed):
                if entry.kind == kind and entry.key == key:
                    del self._unconsumed[index]
                    return entry, None
            for entry in self._unconsumed:
                if entry.kind == kind and entry.label == label:
                    return None, entry
            return None, None

    def _diverge(self, kind: str, label: str, entry: JournalEntry) -> ReplayDiverged:
        with self._lock:
            if self.diverged is None:
                self.diverged = ReplayDiverged(
                    f"Replay diverged: the agent reached {kind} {label} with other inputs than "
                    f"{entry.describe()} in the journal"
                )
            return self.diverged

    def claim(self, kind: str, key: str, label: str) -> JournalEntry | None:
        """The recorded entry this call replays, or None for a new call (blocking callers:
        model requests run in threads). A same-label conflict is given a moment to resolve,
        since a concurrent call may be about to consume that record (see ``claim_async``)."""
        deadline = time.monotonic() + CONFLICT_WAIT_SECONDS
        while True:
            entry, conflict = self._try_claim(kind, key, label)
            if conflict is None:
                return entry
            if time.monotonic() > deadline:
                raise self._diverge(kind, label, conflict)
            time.sleep(0.002)

    async def claim_async(self, kind: str, key: str, label: str) -> JournalEntry | None:
        """The recorded entry this call replays, or None for a new call.

        When an unconsumed record of the same kind and label has other inputs, a concurrent
        branch of the same code may simply not have reached it yet (replayed results return
        at once, so the order of concurrent calls can differ from the first run). So the
        call yields to the event loop and looks again; only a conflict that survives every
        other ready branch is a divergence."""
        deadline = time.monotonic() + CONFLICT_WAIT_SECONDS
        tries = 0
        while True:
            entry, conflict = self._try_claim(kind, key, label)
            if conflict is None:
                return entry
            if time.monotonic() > deadline:
                raise self._diverge(kind, label, conflict)
            tries += 1
            await asyncio.sleep(0 if tries <= READY_TRIES else 0.002)

    def _consume_children(self, seq: int) -> None:
        """A call was answered from its record (or will never run again): the records its
        body made are consumed with it, children of children too."""
        with self._lock:
            parents = {seq}
            changed = True
            while changed:
                changed = False
                for entry in list(self._unconsumed):
                    if entry.parent in parents:
                        self._unconsumed.remove(entry)
                        parents.add(entry.seq)
                        changed = True

    def new_seq(self) -> int:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def finish(self) -> None:
        """The turn ended: a record it never reached means the code diverged."""
        with self._lock:
            if self.diverged is None and self._unconsumed:
                first = self._unconsumed[0]
                self.diverged = ReplayDiverged(
                    f"Replay diverged: the turn ended without reaching {first.describe()} from the journal"
                )

    def _send(self, entry: JournalEntry) -> None:
        if self._channel is not None:
            self._channel.send(Record(entry))

    # -- recording calls ------------------------------------------------------------------

    def call_sync(self, kind: str, key: str, label: str, fn: Callable[[], Any]) -> Any:
        """Run or replay a blocking call (model requests, from a worker thread)."""
        entry = self.claim(kind, key, label)
        if entry is not None and entry.done:
            self._consume_children(entry.seq)
            return unpack(entry.value)
        parent = _parent.get()
        if entry is not None:
            seq = entry.seq  # started before the process ended: run again (at least once)
        else:
            seq = self.new_seq()
            self._send(JournalEntry(seq=seq, kind=kind, key=key, label=label, parent=parent))
        token = _parent.set(seq)
        try:
            outcome = _run_sync(fn)
        finally:
            _parent.reset(token)
        self._send(JournalEntry(seq=seq, kind=kind, key=key, label=label, done=True, value=_record(label, outcome), parent=parent))
        return _unwrap(outcome)

    async def call(self, kind: str, key: str, label: str, fn: Callable[[], Awaitable[Any]], *, gated: bool = False) -> Any:
        """Run or replay an async call. ``gated``: write a *started* mark, acknowledged by
        the server, before ``fn`` runs, and never run it again after a stop (see module doc)."""
        entry = await self.claim_async(kind, key, label)
        if entry is not None and entry.done:
            self._consume_children(entry.seq)
            return unpack(entry.value)
        if entry is not None and gated:
            self._consume_children(entry.seq)
            unknown = OutcomeUnknown(f"Outcome unknown: the server stopped while {label} was running")
            self._send(entry.finished(pack(("raise", unknown))))
            raise unknown
        parent = _parent.get()
        if entry is not None:
            seq = entry.seq  # started before the process ended: run again (at least once)
        else:
            seq = self.new_seq()
            started = JournalEntry(seq=seq, kind=kind, key=key, label=label, parent=parent)
            if gated and self._channel is not None:
                await self._channel.send_and_wait_ack(Record(started, ack=True))
            else:
                self._send(started)
        token = _parent.set(seq)
        try:
            outcome: tuple[str, Any] = ("ok", await fn())
        except Exception as exc:
            outcome = ("raise", exc)
        finally:
            _parent.reset(token)
        self._send(JournalEntry(seq=seq, kind=kind, key=key, label=label, done=True, value=_record(label, outcome), parent=parent))
        return _unwrap(outcome)


def _run_sync(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("raise", exc)


def _unwrap(outcome: tuple[str, Any]) -> Any:
    if outcome[0] == "raise":
        raise outcome[1]
    return outcome[1]


_journal: Journal | None = None


def _install(journal: Journal | None) -> None:
    """Called by the worker runtime only."""
    global _journal
    _journal = journal


def current() -> Journal | None:
    """The running turn's journal, or None outside a ``motus serve`` worker."""
    return _journal


# -- motus.step ---------------------------------------------------------------------------


def step(name: str, fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any) -> Any:
    """Run a block of the agent's own code once per turn, and journal its result.

    ``await motus.step("charge card", charge, card_id)`` calls ``charge(card_id)`` (a plain
    or an async function) and returns its result. When the turn is replayed (after it was
    parked, or the server restarted) the recorded result is returned, or the recorded
    exception raised, and ``charge`` is not called again. A step matches its record by
    ``name`` and arguments, and by occurrence: give different steps different names.

    ``@motus.step("name")`` decorates a function instead; the decorated function is async.
    Outside a served turn a step simply runs.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("motus.step() needs a name: step('charge card', fn, *args)")
    if fn is None:
        if args or kwargs:
            raise TypeError("motus.step(name) used as a decorator takes no arguments")

        def decorate(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
            async def stepped(*a: Any, **kw: Any) -> Any:
                return await _run_step(name, function, a, kw)

            stepped.__name__ = getattr(function, "__name__", name)
            stepped.__qualname__ = getattr(function, "__qualname__", name)
            stepped.__doc__ = function.__doc__
            stepped.__wrapped__ = function  # type: ignore[attr-defined]
            return stepped

        return decorate
    if not callable(fn):
        raise TypeError(f"motus.step({name!r}, fn, ...): fn must be callable, got {type(fn).__name__}")
    return _run_step(name, fn, args, kwargs)


async def _run_step(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    async def run() -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        result = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    journal = current()
    if journal is None:
        return await run()
    return await journal.call(STEP, f"{name}:{digest([args, kwargs])}", name, run)


# -- tool calls ---------------------------------------------------------------------------


async def tool_call(
    name: str,
    arguments: Any,
    body: Callable[[], Awaitable[Any]],
    *,
    gated: bool,
    unrecordable: Callable[[Any], Any] | None = None,
) -> Any:
    """Run one call of tool ``name`` with ``arguments`` through the turn's journal, and return
    what ``body()`` returns (or raise what it raises).

    Every tool runner records its calls this way (``@tool``, the Anthropic runner), so a call
    has the same record whatever runs it: kind ``TOOL``, keyed by the tool's name and the
    digest of its arguments, labelled by its name. A replay returns the recorded result
    without calling ``body``. ``gated`` (a tool a person approved): its *started* mark is
    acknowledged by the server before ``body`` runs, and a replay that finds that mark
    without a result raises ``OutcomeUnknown`` instead of running it again.

    ``unrecordable``: given a result the journal cannot record, what to return and record
    instead, so a replay returns the same; without it the result is returned and a replay
    fails there (see ``_record``). Outside a served turn ``body`` simply runs, and its
    result is returned as it is."""
    journal = current()
    if journal is None:
        return await body()
    key = f"{name}:{digest(arguments)}"
    if unrecordable is None:
        return await journal.call(TOOL, key, name, body, gated=gated)
    replace = unrecordable

    async def recordable() -> Any:
        result = await body()
        try:
            pack(("ok", result))
        except Unrecordable:
            return replace(result)
        return result

    return await journal.call(TOOL, key, name, recordable, gated=gated)
