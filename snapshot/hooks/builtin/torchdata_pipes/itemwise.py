"""Hooks for torchdata 0.9's pipes that turn each input sample into one output and keep nothing
between samples: ``drop``, ``flatten``, ``slice``, ``rows2columnar``, ``zip_with_map``,
``save_to_disk``, ``save_by_fsspec``, ``check_hash``, ``load_from_bz2`` and ``load_from_xz``.

Their generators (read for this: each pulls exactly one input per output, reads nothing
ahead and carries no value from one sample to the next) are run as they are, over the
input's iterator; a restore starts a fresh generator over the restored input. So their
state is empty, and a restore neither re-reads nor re-writes a file before the cut.
"""

from __future__ import annotations

from typing import Any

from snapshot.hooks.builtin._streams import KIND, address_of, mark
from snapshot.hooks.builtin.callable import ItemwiseIterator

__all__ = ["CompressedFileIterator", "HashCheckerIterator", "ItemwiseIterator"]


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
