"""Hooks for torchdata 0.9's pipes that turn each input sample into one output and keep nothing
between samples: ``drop``, ``flatten``, ``slice``, ``rows2columnar``, ``zip_with_map``,
``save_to_disk``, ``save_by_fsspec``, ``check_hash``, ``load_from_bz2`` and ``load_from_xz``.

Their generators (read for this: each pulls exactly one input per output, reads nothing
ahead and carries no value from one sample to the next) are run as they are, over the
input's iterator; a restore starts a fresh generator over the restored input. So their
state is empty, and a restore neither re-reads nor re-writes a file before the cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe

from snapshot.hooks._base import Stateless
from snapshot.hooks.builtin._streams import KIND, address_of, mark

__all__ = ["CompressedFileIterator", "HashCheckerIterator", "ItemwiseIterator"]


def _unwrapped_iter(cls: type) -> Any:
    method = cls.__iter__  # type: ignore[attr-defined]
    return getattr(method, "__wrapped__", method)


class ItemwiseIterator(Stateless):
    """Runs the pipe's own generator over its input's iterator: one output per input, no state."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._gen: Iterator[Any] | None = None

    def _generator(self) -> Iterator[Any]:
        # a copy of the pipe whose input attribute is this iterator's input (the pipe is not changed)
        (source,) = [cell for cell in self.inputs if not isinstance(cell, MapDataPipe)]
        view = object.__new__(type(self.datapipe))
        view.__dict__.update(self.datapipe.__dict__)
        for name, value in self.datapipe.__dict__.items():
            if isinstance(value, IterDataPipe):
                view.__dict__[name] = source
        return iter(_unwrapped_iter(type(self.datapipe))(view))

    def next(self) -> Any:
        if self._gen is None:
            self._gen = self._generator()
        return next(self._gen)

    def close(self) -> None:
        self._gen = None


class HashCheckerIterator(ItemwiseIterator):
    """``check_hash``: each ``(path, stream)`` checked against its hash and passed on."""

    streams = "passes"

    def next(self) -> Any:
        path, data = super().next()
        inner = address_of(getattr(data, "file_obj", None))  # it wraps the stream it checked
        if inner is not None:
            mark(data, inner)
        return path, data


class CompressedFileIterator(ItemwiseIterator):
    """``load_from_bz2`` / ``load_from_xz``: the decompressed stream of each input, marked with its
    address (the compressed stream's, and the format)."""

    streams = "unpacks"
    inflates = True
    #: The ``decompress`` format name of each loader (by class name).
    FORMATS = {"Bz2FileLoaderIterDataPipe": "bz2", "XzFileLoaderIterDataPipe": "lzma"}

    def next(self) -> Any:
        path, stream = super().next()
        inner = address_of(getattr(stream, "parent_stream", None))
        if inner is not None:
            fmt = self.FORMATS[type(self.datapipe).__name__]
            mark(stream, {KIND: "decompress", "type": fmt, "inner": inner, "name": stream.name})
        return path, stream
