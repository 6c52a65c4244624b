"""A session's title: what a client may set, and what a message gives (pure functions)."""

from __future__ import annotations

import pytest

from motus.api.titles import DERIVED_MAX, TITLE_MAX, derived_title, first_title, title_problem


@pytest.mark.parametrize("title", ["Invoices", "x" * TITLE_MAX, "👨\u200d👩\u200d👧 family", "right-to-left \u202e mark", " padded "])
def test_a_line_of_text_is_a_title(title: str) -> None:
    assert title_problem(title) is None


@pytest.mark.parametrize("title, problem", [
    ("", "must not be empty"),
    (" \t ", "must not be empty"),
    ("x" * (TITLE_MAX + 1), f"at most {TITLE_MAX} characters, got {TITLE_MAX + 1}"),
    ("two\nlines", "U+000A"),
    ("nul\x00", "U+0000"),
    ("sep\u2028", "U+2028"),
    ("half \ud800 a pair", "lone surrogate (found U+D800)"),
])
def test_a_title_that_is_no_line_of_text_is_refused_naming_why(title: str, problem: str) -> None:
    assert problem in (title_problem(title) or "")


def test_a_message_gives_its_text_on_one_line_cut_and_storable() -> None:
    assert derived_title({"role": "user", "content": "  please\n\tdelete\x1b[31m  the logs "}) == "please delete [31m the logs"
    long = derived_title({"content": "word " * 40})
    assert long is not None and len(long) == DERIVED_MAX and long.endswith("…")
    huge = derived_title({"content": "start " + "x" * 50_000_000})  # read from its start only (a 50 MB message)
    assert huge == "start " + "x" * (DERIVED_MAX - 7) + "…"
    assert derived_title({"content": "a\ud800b"}) == "a\ufffdb"  # a store keeps it; title_problem accepts it
    assert title_problem(derived_title({"content": "a\ud800b\u2029c"}) or "") is None


@pytest.mark.parametrize("message", [{"role": "assistant", "content": "hi"}, {"content": None}, {"content": " \n "}, {"content": 5}, None])
def test_a_message_without_user_text_gives_no_title(message: object) -> None:
    assert derived_title(message) is None  # type: ignore[arg-type]


def test_a_history_is_titled_by_its_first_user_message_with_text() -> None:
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}, {"role": "user", "content": "hello"}]
    assert first_title(history) == "hello" and first_title([]) is None
