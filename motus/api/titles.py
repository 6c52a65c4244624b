"""A session's title: what people see in lists and the inbox instead of a bare id.

A client may set one (``POST /sessions`` with ``{"title": ...}``, ``PATCH /sessions/{id}``);
otherwise the server takes the first user message's text, shortened, when the session is
created with a history or its first turn starts. Pure functions, used by the server and the
request schemas alike, so the rules are stated once.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Any

#: The longest title a client may set (characters).
TITLE_MAX = 200
#: A title taken from a message is cut to this many characters (and marked with an ellipsis).
DERIVED_MAX = 60
#: How much of a message a derived title reads (its first characters).
_READ = 16 * DERIVED_MAX
#: Unicode categories a title never holds: controls and line or paragraph separators.
_BREAKING = ("Cc", "Zl", "Zp")


def title_problem(title: str) -> str | None:
    """Why ``title`` cannot be a session's title, or None. A title is one line of text that
    is shown everywhere a session is listed, so it must say something, hold no control
    characters or line breaks (a terminal would run them), and be text a store can keep (no
    lone surrogate). Invisible format characters (a zero-width joiner in an emoji, a bidi
    mark) are kept: every client of ours shows them marked."""
    if not title.strip():
        return "must not be empty or only spaces"
    if len(title) > TITLE_MAX:
        return f"must be at most {TITLE_MAX} characters, got {len(title)}"
    for char in title:
        category = unicodedata.category(char)
        if category in _BREAKING:
            return f"must not hold control characters or line breaks (found U+{ord(char):04X})"
        if category == "Cs":
            return f"must not hold a lone surrogate (found U+{ord(char):04X})"
    return None


def derived_title(message: dict[str, Any] | None) -> str | None:
    """The title a user message gives a session: its text on one line, cut to
    ``DERIVED_MAX`` characters; None when it has no text to show."""
    if not isinstance(message, dict) or message.get("role", "user") != "user":
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return None
    # One line a title may be (``title_problem``): every run of spaces, line breaks and
    # control characters is one space, and a lone surrogate is the replacement character.
    # Only the start is read: a message may be megabytes, and a title is its first words.
    words = "".join(_title_char(c) for c in content[:_READ]).split()
    text = " ".join(words)
    if not text:
        return None
    whole = len(content) <= _READ
    return text if whole and len(text) <= DERIVED_MAX else text[: DERIVED_MAX - 1].rstrip() + "…"


def _title_char(char: str) -> str:
    category = unicodedata.category(char)
    if category in _BREAKING:
        return " "
    return "\ufffd" if category == "Cs" else char


def first_title(messages: Iterable[dict[str, Any]]) -> str | None:
    """The title of a history: that of its first user message with text."""
    for message in messages:
        title = derived_title(message)
        if title is not None:
            return title
    return None
