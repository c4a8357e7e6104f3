"""Values a capture made for itself: a background save takes them as they are.

A background save stages what it captured (:mod:`snapshot.storage._staging`): it copies every
container and walks every list for samples to copy, so that the running graph cannot change what is
written. A hook's ``get_state`` may build a container that needs neither: new (made by this call,
held by nothing else) and holding only values that nobody changes (the keys of a buffer saved by
position, each made once by :meth:`~snapshot.hooks._positions.Reproducer.key` and only replaced,
never changed, and the ``None`` that stand for their samples). :func:`fresh` says so. While a
background save captures (:func:`collecting`, in the thread that captures), the values said fresh are
kept, by identity, and the staging takes them as they are: 10,000 positions cost the save's blocking
part nothing instead of a walk over them. Anywhere else, :func:`fresh` does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["collecting", "fresh"]

_T = TypeVar("_T")
_local = threading.local()


def fresh(value: _T) -> _T:
    """``value``, which its caller just made and which holds nothing that anyone changes (see the module)."""
    found = getattr(_local, "found", None)
    if found is not None:
        found[id(value)] = value  # the value is held: its id cannot be reused while the save stages
    return value


@contextlib.contextmanager
def collecting() -> Iterator[dict[int, Any]]:
    """The values said :func:`fresh` in this thread while the block runs, by ``id``."""
    found: dict[int, Any] = {}
    outer = getattr(_local, "found", None)
    _local.found = found
    try:
        yield found
    finally:
        _local.found = outer
