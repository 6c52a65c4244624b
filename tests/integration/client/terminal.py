"""Drive ``python -m motus ...`` through a real pseudo-terminal, with deadlines.

The child gets the pty as stdin, stdout, stderr and controlling terminal, so it behaves
exactly as in a person's terminal: ``isatty()`` is true (the spinner runs), input is
echoed, and writing ``\\x03`` makes the terminal send SIGINT, like pressing Ctrl-C.

``expect(pattern)`` reads until the pattern appears in the output after the previous
match, failing with everything read so far once its deadline passes. Nothing here sleeps.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

from tests.conftest import ROOT, server_env

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SPINNER_FRAME = re.compile(r"\r[|/\\-] working")

# Runs in the child before exec: make the pty (already on fd 0) the controlling terminal
# of the new session, so Ctrl-C on it signals the chat's process group.
_BOOT = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.executable, sys.argv[1:])"


class Terminal:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, sys.executable, "-m", "motus", *args],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=ROOT,
                env=server_env(env),
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self._master = master
        self.raw = b""
        self._pos = 0
        self._eof = False

    def text(self) -> str:
        """Everything read so far, without escape sequences, spinner frames and ``\\r``."""
        text = self.raw.decode("utf-8", errors="replace")
        return _SPINNER_FRAME.sub("", _ANSI.sub("", text)).replace("\r", "")

    def expect(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """Wait for ``pattern`` (a regex) in the output after the previous match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.text(), self._pos)
            if match:
                self._pos = match.end()
                return match
            remaining = deadline - time.monotonic()
            if self._eof or remaining <= 0:
                state = "the terminal closed" if self._eof else f"{timeout}s passed"
                raise AssertionError(f"{state} before {pattern!r} appeared; output after the last match:\n{self.text()[self._pos:]}")
            self._read(remaining)

    def expect_literal(self, text: str, timeout: float = 20.0) -> re.Match[str]:
        return self.expect(re.escape(text), timeout)

    def read_raw_until(self, data: bytes, timeout: float = 20.0, after: int = 0) -> None:
        """Wait until ``data`` appears in the raw bytes (escape sequences included), past
        the first ``after`` of them."""
        deadline = time.monotonic() + timeout
        while self.raw.find(data, after) < 0:
            remaining = deadline - time.monotonic()
            if self._eof or remaining <= 0:
                raise AssertionError(f"{data!r} never appeared; output:\n{self.text()}")
            self._read(remaining)

    def send(self, line: str) -> None:
        """Type ``line`` and press Enter."""
        os.write(self._master, line.encode() + b"\r")

    def ctrl_c(self) -> None:
        os.write(self._master, b"\x03")

    def ctrl_c_at_prompt(self, timeout: float = 20.0) -> None:
        """Press Ctrl-C once the chat is blocked reading the terminal.

        The prompt is on the screen a moment before the read starts, and CPython's readline
        looks at signals only when its ``select()`` is interrupted: a Ctrl-C that lands in
        that moment waits for the next key. A person is never that fast; a test is.
        """
        self.wait_reading(timeout)
        self.ctrl_c()

    def wait_reading(self, timeout: float = 20.0) -> None:
        """Wait until the chat's main thread is blocked reading its terminal (fd 0): in
        ``select()`` on it (readline), or in ``read()`` of it (no readline). Linux only."""
        deadline = time.monotonic() + timeout
        path = f"/proc/{self.process.pid}/syscall"
        while True:
            with open(path) as file:
                fields = file.read().split()
            # select/pselect6 with nfds 1 (fd 0 alone), or read of fd 0
            if fields[:2] in (["23", "0x1"], ["270", "0x1"], ["0", "0x0"]):
                return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"the chat never waited for input; output:\n{self.text()}")
            select.select([], [], [], 0.005)  # a short pause between two looks at /proc

    def send_eof(self) -> None:
        """Press Ctrl-D at the start of a line: end of input."""
        os.write(self._master, b"\x04")

    def wait_exit(self, timeout: float = 20.0) -> int:
        """Read the rest of the output and return the exit status."""
        deadline = time.monotonic() + timeout
        while not self._eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the chat did not exit within {timeout}s; output:\n{self.text()}")
            self._read(remaining)
        return self.process.wait(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self._master)

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self._master, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            data = b""
        if data:
            self.raw += data
        else:
            self._eof = True
