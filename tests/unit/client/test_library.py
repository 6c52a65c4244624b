"""Pure parts of ``motus.client``: URL handling and the error family."""

from __future__ import annotations

import pytest

from motus.client import (
    SKIP,
    APIError,
    Client,
    ClientError,
    Conflict,
    ConnectionFailed,
    NotFound,
    TurnFailed,
    Unauthorized,
    Unavailable,
    normalize_url,
)
from motus.api.schemas import SessionResponse


@pytest.mark.parametrize(
    ("given", "expected"),
    [("localhost:8000", "http://localhost:8000"), ("http://h:1/", "http://h:1"), (" https://h/api// ", "https://h/api")],
)
def test_normalize_url(given: str, expected: str) -> None:
    assert normalize_url(given) == expected


def test_error_family_carries_status_and_detail() -> None:
    for cls, status in ((Unauthorized, 401), (NotFound, 404), (Conflict, 409), (Unavailable, 503)):
        error = cls("the detail", status)
        assert isinstance(error, APIError) and isinstance(error, ClientError)
        assert (error.status, error.detail, str(error)) == (status, "the detail", f"{status}: the detail")
    refused = ConnectionFailed("http://h:1")
    assert (refused.status, str(refused)) == (None, "Could not connect to http://h:1")
    failed = TurnFailed(SessionResponse(session_id="s", status="error", error="Agent timed out"))
    assert (failed.detail, failed.session.session_id) == ("Agent timed out", "s")


def test_repr_hides_the_api_key() -> None:
    with Client("h:1", api_key="sekrit") as client:
        assert repr(client) == "Client('http://h:1')"
    assert repr(SKIP) == "SKIP"
