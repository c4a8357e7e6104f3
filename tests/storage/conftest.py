"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults import Held


@pytest.fixture
def held() -> Iterator[type[Held]]:
    """:class:`tests.faults.Held`, reset before and after the test (and never left holding a save)."""
    Held.reset()
    yield Held
    Held.go.set()
    Held.reset()
