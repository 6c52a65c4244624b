"""pytest fixtures for the fake providers; import them into a test module to use them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fakes.providers import FakeProvider


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    """A started :class:`FakeProvider`, stopped (thread joined) after the test."""
    with FakeProvider() as fake:
        yield fake
