"""Buffers saved by position: re-producing a buffered sample from where it came from.

With ``DataLoader2(..., buffer_state="positions")`` a buffering pipe (``shuffle``) saves,
for each buffered sample, its position in the pipe's input stream instead of the sample
itself, when the pipes above can re-produce the sample from that position: a source that
can be indexed (a list, tuple, range or other ``Sequence`` wrapped by ``IterableWrapper``,
a map-style pipe read through ``to_iter_datapipe``) followed only by element-wise pipes
(``map``, ``collate``). A restore re-produces each sample by indexing the source and applying
the element-wise pipes again; like a fast-forward, this assumes their functions are
deterministic. Where the input cannot re-produce samples, the buffer is saved by value and
the snapshot's manifest says why (``buffer_state`` of the node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapshot._choice import Choice

__all__ = ["BufferState", "Reproducer", "reproducer_for"]


class BufferState(Choice):
    """How buffering pipes save the samples they hold."""

    VALUES = "values"
    POSITIONS = "positions"

    @classmethod
    def label(cls) -> str:
        return "buffer_state"


class Reproducer:
    """Makes the sample at position ``k`` of a pipe's input: ``lookup(k)``, then each step."""

    def __init__(self, lookup: Callable[[int], Any], steps: list[tuple[type, Any]]):
        self._lookup = lookup
        self._steps = steps

    def __call__(self, position: int) -> Any:
        item = self._lookup(position)
        for kind, datapipe in self._steps:
            item = next(kind(datapipe, [iter((item,))]))
        return item


def reproducer_for(cell: Any) -> Reproducer | str:
    """A :class:`Reproducer` for the samples ``cell`` (an input's running iterator) yields,
    or the reason there is none."""
    steps: list[tuple[type, Any]] = []
    while getattr(cell, "elementwise", False) and len(getattr(cell, "inputs", ())) == 1:
        steps.append((type(cell), cell.datapipe))
        cell = cell.inputs[0]
    lookup = getattr(cell, "lookup", None)
    found = lookup() if lookup is not None else None
    if found is None:
        name = type(getattr(cell, "datapipe", cell)).__name__
        return (f"its input cannot re-produce a sample from its position: {name} is neither an indexable "
                "source (IterableWrapper over a list, range or Sequence; to_iter_datapipe) nor an "
                "element-wise pipe (map) over one")
    steps.reverse()
    return Reproducer(found, steps)
