"""The durable API's old import paths keep working: ``motus.serve.journal``, ``protocol``,
``interrupt`` and ``jsonshape`` re-export ``motus.durable``, and ``motus.anthropic`` re-exports
``motus.frameworks.anthropic``.

The state a worker installs (the running journal, the channel) lives in the durable modules
alone; read through an old path it is always the current value. A record an older motus
pickled under the old module names (kept in a store across an upgrade) still loads.
"""

from __future__ import annotations

import asyncio
import importlib
import pickle

import pytest

from motus.durable import interrupt as interrupt_module
from motus.durable import journal as journal_module
from motus.durable.journal import Journal, OutcomeUnknown, pack, unpack

MOVED = {
    "motus.serve.journal": "motus.durable.journal",
    "motus.serve.protocol": "motus.durable.records",
    "motus.serve.interrupt": "motus.durable.interrupt",
    "motus.serve.jsonshape": "motus.durable.jsonshape",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_public_name_of_an_old_path_is_the_durable_object(old: str) -> None:
    shim, moved = importlib.import_module(old), importlib.import_module(MOVED[old])
    public = [name for name in vars(moved) if not name.startswith("_") and getattr(vars(moved)[name], "__module__", None) == moved.__name__]
    assert public
    for name in public:
        assert getattr(shim, name) is getattr(moved, name), f"{old}.{name}"
    from motus.durable import records  # the old interrupt module re-exported the wire records too

    for name in shim.__all__:
        assert getattr(shim, name) is getattr(moved, name, getattr(records, name, None)), f"{old}.{name}"


def test_the_guides_interrupt_and_the_old_wire_records_are_the_durable_ones() -> None:
    from motus.durable import records
    from motus.serve.interrupt import Ack, Failure, Interrupt, Job, Record, Result, Resume, interrupt

    assert interrupt is interrupt_module.interrupt
    assert (Ack, Failure, Interrupt, Job, Record, Result, Resume) == (
        records.Ack, records.Failure, records.Interrupt, records.Job, records.Record, records.Result, records.Resume,
    )
    with pytest.raises(RuntimeError, match="outside motus serve worker"):
        asyncio.run(interrupt({"type": "confirm"}))


def test_worker_state_read_through_an_old_path_is_current() -> None:
    from motus.serve import interrupt as old_interrupt
    from motus.serve import journal as old_journal

    journal = Journal((), None)
    journal_module._install(journal)
    try:
        assert old_journal.current() is journal and old_journal._journal is journal
    finally:
        journal_module._install(None)
    assert old_journal._journal is None and old_interrupt._channel is None
    sentinel = object()
    interrupt_module._install(sentinel)  # type: ignore[arg-type]
    try:
        assert old_interrupt._channel is sentinel
    finally:
        interrupt_module._install(None)


def test_a_record_pickled_under_the_old_module_names_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an older motus kept in a store: an exception a journaled call raised, pickled as
    ``motus.serve.journal._Raised`` holding ``motus.serve.journal.OutcomeUnknown``."""
    monkeypatch.setattr(journal_module._Raised, "__module__", "motus.serve.journal")
    monkeypatch.setattr(OutcomeUnknown, "__module__", "motus.serve.journal")
    old = pack(("raise", OutcomeUnknown("Outcome unknown: the server stopped while delete was running")))
    monkeypatch.undo()
    assert b"motus.serve.journal" in old and b"motus.durable" not in old
    with pytest.raises(OutcomeUnknown, match="^Outcome unknown: the server stopped while delete was running$"):
        unpack(old)
    assert pickle.loads(old)[1].cls is OutcomeUnknown


def test_the_anthropic_runner_keeps_its_old_path() -> None:
    pytest.importorskip("anthropic", reason="needs the anthropic package: pip install 'motus[anthropic]'")
    import motus.anthropic as old
    import motus.frameworks.anthropic as moved

    for name in old.__all__:
        assert getattr(old, name) is getattr(moved, name)
    assert old._MARK == moved._MARK
