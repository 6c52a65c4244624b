"""The one-worker lock file: a server's sweep of stale lock files never makes another
server's worker, booting at the same moment, refuse to start.

Seen in CI: three servers started together, one worker failed with "Refusing to start a second
gunicorn worker": another server's sweep had locked its new, not yet locked, file.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from motus.serve.gunicorn import arbiter


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtime"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def test_a_live_arbiters_file_that_nobody_locks_yet_is_left_alone(runtime: Path) -> None:
    """A worker between creating its file and locking it: the sweep neither locks nor removes
    the file (either one made that worker refuse to boot, or lock a file no longer named)."""
    booting = Path(arbiter.claim_path(os.getpid()))  # this process stands for a live arbiter
    booting.write_text("")
    gone = Path(arbiter.claim_path(999_999_999))  # a killed server's
    gone.write_text("")
    arbiter._sweep_stale_claims(keep=str(runtime / "gunicorn-1.lock"))
    assert booting.exists()
    assert not gone.exists()
    with booting.open("a") as handle:  # and nothing holds it: its worker can still lock it
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_file_an_orphaned_worker_still_holds_stays(runtime: Path) -> None:
    """The arbiter is gone but its worker lives on holding the lock: the file stays."""
    held = runtime / "gunicorn-999999998.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        arbiter._sweep_stale_claims(keep=str(runtime / "gunicorn-1.lock"))
        assert held.exists()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()
    arbiter._sweep_stale_claims(keep=str(runtime / "gunicorn-1.lock"))
    assert not held.exists()


def test_names_that_are_not_an_arbiters_pid_are_not_touched(runtime: Path) -> None:
    odd = runtime / "gunicorn-notapid.lock"
    odd.write_text("keep")
    arbiter._sweep_stale_claims(keep=str(runtime / "gunicorn-1.lock"))
    assert odd.read_text() == "keep"
