"""Pure helpers of ``motus serve start`` (``motus/serve/cli.py``)."""

from __future__ import annotations

import pytest

from motus.serve.cli import web_chat_address


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000/ui/"),
        ("localhost", "http://localhost:8000/ui/"),
        ("0.0.0.0", "http://127.0.0.1:8000/ui/"),  # a wildcard is not an address to browse to
        ("::", "http://[::1]:8000/ui/"),
        ("::1", "http://[::1]:8000/ui/"),
        ("192.168.1.5", "http://192.168.1.5:8000/ui/"),
    ],
)
def test_the_web_chat_address_logged_at_start_up(host: str, expected: str) -> None:
    assert web_chat_address(host, 8000) == expected
