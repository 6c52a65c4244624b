"""``motus.client.terminal``: the spinner's start holds a Ctrl-C until its thread is running."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from motus.client.terminal import _ctrl_c_deferred


def test_a_ctrl_c_inside_the_block_is_raised_at_its_end_not_inside() -> None:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.fail("this test needs Python's default Ctrl-C handler in the main thread")
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            thread = threading.Thread(target=lambda: None)
            thread.start()  # the wait a KeyboardInterrupt must not break into
            thread.join()
            reached_the_end = True
    assert reached_the_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_is_raised_and_the_handler_is_back() -> None:
    with _ctrl_c_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
