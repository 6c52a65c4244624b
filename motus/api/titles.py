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


def title_problem(title: str) -> str | None:
    """Why ``title`` cannot be a session's title, or None. A title is one line of text that
    is shown everywhere a session is listed, so it must say something and hold no control
    characters (a terminal would run them)."""
    if not title.strip():
        return "must not be empty or only spaces"
    if len(title) > TITLE_MAX:
        return f"must be at most {TITLE_MAX} characters, got {len(title)}"
    for char in title:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            return f"must not hold control characters (found U+{ord(char):04X})"
    return None


def derived_title(message: dict[str, Any] | None) -> str | None:
    """The title a user message gives a session: its text on one line, cut to
    ``DERIVED_MAX`` characters; None when it has no text to show."""
    if not isinstance(message, dict) or message.get("role", "user") != "user":
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return None
    # One line of printable text: every run of spaces, newlines and control characters is one space.
    words = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in content).split()
    text = " ".join(words)
    if not text:
        return None
    return text if len(text) <= DERIVED_MAX else text[: DERIVED_MAX - 1].rstrip() + "…"


def first_title(messages: Iterable[dict[str, Any]]) -> str | None:
    """The title of a history: that of its first user message with text."""
    for message in messages:
        title = derived_title(message)
        if title is not None:
            return title
    return None
