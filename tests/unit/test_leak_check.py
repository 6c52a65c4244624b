"""The leak check every test runs (``no_leaks`` in ``tests/conftest.py``) sees the children a
test starts, by either of its two ways of listing them, and only those."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import wait_until
from tests.support import processes


@pytest.mark.parametrize("exact", [False, True], ids=["children-files", "psutil"])
def test_a_child_the_test_started_is_seen_until_it_is_reaped_and_an_older_one_never(exact: bool) -> None:
    older = subprocess.Popen(["sleep", "60"])
    try:
        assert older.pid in processes.started_since(0, exact=exact)
        wait_until(lambda: processes.now_ticks() >= (processes.started_at(older.pid) or 0) + 3, timeout=5, what="two clock ticks to pass")
        since = processes.now_ticks()
        assert older.pid not in processes.started_since(since, exact=exact)  # there before: not the test's
        child = subprocess.Popen(["sleep", "60"])
        try:
            assert child.pid in processes.started_since(since, exact=exact)
            child.kill()
            wait_until(lambda: child.poll() is not None, timeout=10, what="the child to exit")
            assert child.pid not in processes.started_since(since, exact=exact)
        finally:
            child.kill()
            child.wait(10)
    finally:
        older.kill()
        older.wait(10)


def test_an_exited_child_not_yet_reaped_is_not_a_leak() -> None:
    since = processes.now_ticks()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: processes.alive(child.pid) is False, timeout=10, what="the child to become a zombie")
        assert child.pid not in processes.started_since(since)
        assert child.pid not in processes.started_since(since, exact=True)
    finally:
        child.wait(10)

