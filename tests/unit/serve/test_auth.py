"""Named and read-only API keys: how ``--api-key`` values are read, and who a header is."""

from __future__ import annotations

import pytest

from motus.serve.auth import ANONYMOUS, READ, WRITE, ApiKeys, Caller, parse_key


NONE: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3cret", ("default", "s3cret", WRITE, NONE)),
        ("abc==", ("default", "abc==", WRITE, NONE)),  # base64 padding stays a bare secret
        ("ops=s3cret", ("ops", "s3cret", WRITE, NONE)),
        ("viewer=s3cret:read", ("viewer", "s3cret", READ, NONE)),
        ("s3cret:read", ("default", "s3cret", READ, NONE)),
        ("a=b=c", ("a", "b=c", WRITE, NONE)),
        ("=x", ("default", "=x", WRITE, NONE)),
        ("bad name=x", ("default", "bad name=x", WRITE, NONE)),
        (":read", ("default", ":read", WRITE, NONE)),  # nothing before the scope: the secret itself
        ("  ops=k  ", ("ops", "k", WRITE, NONE)),
        # Roles: a named key's secret, then ":" and a comma-separated list of names.
        ("alice=k:ops", ("alice", "k", WRITE, frozenset({"ops"}))),
        ("alice=k:ops,finance", ("alice", "k", WRITE, frozenset({"ops", "finance"}))),
        ("auditor=k:read,ops", ("auditor", "k", READ, frozenset({"ops"}))),
        ("alice=k:x:ops", ("alice", "k:x", WRITE, frozenset({"ops"}))),  # the last ":" ends the secret
        ("alice=k:ops,", ("alice", "k:ops,", WRITE, NONE)),  # not a list of names: all secret
        ("alice=k:o p", ("alice", "k:o p", WRITE, NONE)),
        ("alice=:ops", ("alice", ":ops", WRITE, NONE)),  # nothing before the roles: the secret itself
        ("s3cret:ops", ("default", "s3cret:ops", WRITE, NONE)),  # a bare secret only ends in :read
    ],
)
def test_key_spellings(text: str, expected: tuple[str, str, str, frozenset[str]]) -> None:
    assert parse_key(text) == expected


def test_a_key_with_roles_names_them_and_the_server_knows_every_role_a_writer_has() -> None:
    keys = ApiKeys(["alice=a-secret", "bob=b-secret:ops,finance", "carol=c-secret:read,audit"])
    assert keys.identify("Bearer b-secret") == Caller("bob", WRITE, frozenset({"ops", "finance"}))
    assert keys.identify("Bearer a-secret") == Caller("alice", WRITE)
    assert keys.identify("Bearer b-secret:ops") is None  # the roles are no part of the secret
    assert keys.roles == {"ops", "finance"}  # a read-only key answers nothing: its roles do not count
    assert "b-secret" not in repr(keys)


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


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("one,two", ["one", "two"]),
        ("alice=a:ops,finance,bob=b", ["alice=a:ops,finance", "bob=b"]),  # a role list is one key
        ("alice=a:ops,finance,bare", ["alice=a:ops,finance,bare"]),  # a bare name after roles is a role
        ("alice=a:ops , bob=b:read\ncarol=c", ["alice=a:ops", "bob=b:read", "carol=c"]),
        ("s:read,other", ["s:read", "other"]),  # a bare key's ":read" is no role list
        (" , ,", []),
    ],
)
def test_the_environment_variable_separates_keys_by_commas_and_keeps_role_lists_whole(raw: str, expected: list[str]) -> None:
    from motus.serve.auth import split_keys

    assert split_keys(raw) == expected
    assert ApiKeys.from_sources((), {"MOTUS_API_KEY": raw}).names == [parse_key(key)[0] for key in expected]


def test_the_start_up_log_names_each_key_with_its_roles_and_no_secret() -> None:
    keys = ApiKeys(["alice=a-secret", "bob=b-secret:ops,finance", "viewer=v-secret:read", "c-secret"])
    assert keys.describe() == "alice, bob (finance, ops), viewer (read-only), default"


def test_the_name_anonymous_is_reserved() -> None:
    with pytest.raises(ValueError, match="'anonymous' is reserved"):
        ApiKeys(["anonymous=x:finance"])
