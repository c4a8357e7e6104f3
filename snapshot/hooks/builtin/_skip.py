"""Moving a fresh iterator forward quickly (used to restore sources by position)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from snapshot.errors import PositionError

#: Iterator types of builtin sequences: their ``__setstate__`` jumps to an index in O(1).
_SEEKABLE: tuple[type, ...] = (type(iter([])), type(iter(())), type(iter(range(0))), type(iter(range(2**64))),
             type(iter("")), type(iter(b"")))


def advance(it: Iterator[Any], n: int, *, source: Any = None, what: str = "source") -> Iterator[Any]:
    """Skip ``n`` items of ``it``; raise :class:`PositionError` if there are fewer."""
    if n <= 0:
        return it
    if isinstance(it, _SEEKABLE) and source is not None and hasattr(source, "__len__"):
        if n > len(source):
            raise PositionError(
                f"the snapshot is at item {n} of the {what}, which now has {len(source)} items: "
                "the data changed since the snapshot. Restore with the original data."
            )
        it.__setstate__(n)  # type: ignore[attr-defined]
        return it
    skipped = 0
    for _ in islice(it, n):
        skipped += 1
    if skipped < n:
        raise PositionError(
            f"the snapshot is at item {n} of the {what}, which now ends after {skipped} items: "
            "the data changed since the snapshot. Restore with the original data."
        )
    return it
