"""Attacks on the gunicorn worker's heartbeat: ``MotusWorker.notify`` touches gunicorn's
heartbeat file at most once a second, and never lets it grow older than the arbiter allows.
"""

from __future__ import annotations

import random

import pytest

from motus.serve.gunicorn import MotusWorker


# == the heartbeat ===========================================================================


class _Tmp:
    def __init__(self) -> None:
        self.touched: list[float] = []

    def notify(self) -> None:
        self.touched.append(_clock[0])


_clock = [0.0]


def test_the_heartbeat_is_never_older_than_a_second_plus_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """gunicorn's loop calls ``notify`` once a pass (a pass waits at most 1 s for events);
    whatever the passes' spacing, including a pass that blocked for 50 s, the file is
    touched at the first pass a second or more after the last touch, and never more than
    once a second. The arbiter's 60 s limit is then never approached by a live loop."""
    worker_ = MotusWorker.__new__(MotusWorker)
    worker_._notified_at = float("-inf")
    worker_.tmp = _Tmp()
    monkeypatch.setattr("motus.serve.gunicorn.worker.time.monotonic", lambda: _clock[0])
    rng = random.Random(7)
    _clock[0] = 1000.0
    gaps = [rng.uniform(0, 1.0) for _ in range(2000)] + [50.0] + [rng.uniform(0, 0.01) for _ in range(500)] + [1.0] * 20
    for gap in gaps:
        _clock[0] += gap
        before = worker_.tmp.touched[-1] if worker_.tmp.touched else None
        worker_.notify()
        last = worker_.tmp.touched[-1]
        assert _clock[0] - last < MotusWorker.NOTIFY_EVERY_SECONDS  # touched now, or less than a second ago
        if before is not None and last != before:
            assert last - before >= MotusWorker.NOTIFY_EVERY_SECONDS
    touches = worker_.tmp.touched
    assert len(touches) <= (touches[-1] - touches[0]) / MotusWorker.NOTIFY_EVERY_SECONDS + 1
