"""Named and read-only API keys: how ``--api-key`` values are read, and who a header is."""

from __future__ import annotations

import pytest

from motus.serve.auth import ANONYMOUS, READ, WRITE, ApiKeys, Caller, parse_key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3cret", ("default", "s3cret", WRITE)),
        ("abc==", ("default", "abc==", WRITE)),  # base64 padding stays a bare secret
        ("ops=s3cret", ("ops", "s3cret", WRITE)),
        ("viewer=s3cret:read", ("viewer", "s3cret", READ)),
        ("s3cret:read", ("default", "s3cret", READ)),
        ("a=b=c", ("a", "b=c", WRITE)),
        ("=x", ("default", "=x", WRITE)),
        ("bad name=x", ("default", "bad name=x", WRITE)),
        (":read", ("default", ":read", WRITE)),  # nothing before the scope: the secret itself
        ("  ops=k  ", ("ops", "k", WRITE)),
    ],
)
def test_key_spellings(text: str, expected: tuple[str, str, str]) -> None:
    assert parse_key(text) == expected


def test_a_header_names_its_caller() -> None:
    keys = ApiKeys(["ops=one-secret", "viewer=two-secret:read", "three-secret"])
    assert keys.identify("Bearer one-secret") == Caller("ops", WRITE)
    assert keys.identify("bearer two-secret") == Caller("viewer", READ)
    assert keys.identify("Bearer three-secret") == Caller("default", WRITE)
    assert not keys.identify("Bearer two-secret").can_write
    for wrong in (None, "", "Bearer", "Bearer nope", "Basic one-secret", "Bearer one-secret:read"):
        assert keys.identify(wrong) is None
    assert keys.names == ["ops", "viewer", "default"] and "secret" not in repr(keys)


def test_without_keys_everyone_is_anonymous_and_may_write() -> None:
    caller = ApiKeys().identify(None)
    assert caller is not None and caller.name == ANONYMOUS and caller.can_write


def test_one_secret_under_two_names_is_refused() -> None:
    with pytest.raises(ValueError, match="same secret"):
        ApiKeys(["a=same", "b=same:read"])
