"""Buffers saved by position: re-producing a buffered sample from where it came from.

With ``DataLoader2(..., buffer_state="positions")`` a buffering pipe (``shuffle``) saves,
for each buffered sample, where it came from instead of the sample itself, when the pipes
above can re-produce the sample from that: a source that can be indexed (a list, tuple,
range or other ``Sequence`` wrapped by ``IterableWrapper``, a map-style pipe read through
``to_iter_datapipe``: the sample's position in its stream) or a file reader whose samples
have addresses (``webdataset``, ``load_from_tar``, ``load_from_zip``, ``readlines``,
``parse_csv``, ``parse_json_files``, ``load_from_tfrecord``: the file, member or byte offset
the sample was read from), followed only by element-wise pipes (``map``, ``collate``). A
restore re-produces the samples from there, all together (:meth:`Reproducer.many`: a file
reader reopens each file once and reads its buffered samples in offset order, a gzip file
inflated once), and applies the element-wise pipes again; like a fast-forward, this assumes
their functions are deterministic. Where the input cannot
re-produce samples, the buffer is saved by value and the snapshot's manifest says why
(``buffer_state`` of the node). A file that changed since is refused when it is reopened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
    """Makes a sample of a pipe's input again from its key: ``lookup(key)``, then each step.

    The key of a sample is taken when the buffering pipe receives it (:meth:`key`): its
    position in the input's stream for an indexable source, its address (file, member or
    offset) for a file reader; ``None`` when the sample has none (it is then kept by value).
    """

    def __init__(self, lookup: Callable[[Any], Any], steps: list[tuple[type, Any]],
                 key: Callable[[], Any] | None = None, cell: Any = None,
                 many: Callable[[Sequence[Any]], Iterable[tuple[int, Any]]] | None = None):
        self._lookup = lookup
        self._steps = steps
        self._key = key
        self._cell = cell
        self._many = many

    @property
    def always_keyed(self) -> bool:
        """Whether every sample has a key (its position in an indexable input; a reader's sample may have
        no address)."""
        return self._key is None

    def key(self) -> Any:
        """The key of the sample the input just yielded."""
        if self._key is not None:
            return self._key()
        return self._cell.yielded - 1

    def __call__(self, key: Any) -> Any:
        return self._apply(self._lookup(key))

    def _apply(self, item: Any) -> Any:
        for kind, datapipe in self._steps:
            item = next(kind(datapipe, [iter((item,))]))
        return item

    def many(self, keys: Sequence[Any]) -> list[Any]:
        """The samples at ``keys``, in the order of ``keys``: equal to ``[self(k) for k in keys]``, but
        a file reader reads each file once, in offset order (``fetch_many``); each sample goes through
        the steps as soon as it is read, before the next is read."""
        made: dict[int, Any] = {}
        pairs = self._many(keys) if self._many is not None else enumerate(map(self._lookup, keys))
        for index, item in pairs:
            made[index] = self._apply(item)
        if sorted(made) != list(range(len(keys))):  # a reader's fetch_many broke its contract
            raise RuntimeError(f"{self._many!r} gave the samples {sorted(made)} for {len(keys)} keys")
        return [made[i] for i in range(len(keys))]


def reproducer_for(cell: Any) -> Reproducer | str:
    """A :class:`Reproducer` for the samples ``cell`` (an input's running iterator) yields,
    or the reason there is none."""
    steps: list[tuple[type, Any]] = []
    top = cell
    while getattr(cell, "elementwise", False) and len(getattr(cell, "inputs", ())) == 1:
        steps.append((type(cell), cell.datapipe))
        cell = cell.inputs[0]
    steps.reverse()
    lookup = getattr(cell, "lookup", None)
    found = lookup() if lookup is not None else None
    if found is not None:
        return Reproducer(found, steps, cell=top)
    addressing = getattr(cell, "addressing", None)
    fetch = addressing() if addressing is not None else None
    if fetch is not None:
        return Reproducer(fetch, steps, key=cell.last_address, many=getattr(cell, "fetch_many", None))
    name = type(getattr(cell, "datapipe", cell)).__name__
    return (f"its input cannot re-produce a sample from its position: {name} is neither an indexable "
            "source (IterableWrapper over a list, range or Sequence; to_iter_datapipe), nor a file reader "
            "whose samples have addresses (load_from_tar, load_from_zip, webdataset, readlines, parse_csv, "
            "parse_json_files, load_from_tfrecord), nor an element-wise pipe (map) over one")
