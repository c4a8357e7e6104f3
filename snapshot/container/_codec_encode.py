"""The encoding half of :mod:`snapshot.container._codec` (the format and what is data are described there).

msgpack's C packer encodes the state; Python runs only for what msgpack has no type for (tuples, sets,
arrays, ...: its ``default``), and for the frame of the payload down to the node states, which this
encoder walks itself so that it can write as it goes (a big list is packed in chunks of about a MiB,
whatever holds it) and measure each node state where it is written; its small dicts and lists, and each
run of small values of a dict, are packed in one call, with the bytes the walk would write. Array and
tensor bytes are not copied into the tree: they are written after it, from the value's own memory.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from snapshot.container import _codec_types as types
from snapshot.container._codec_default import HANDLERS, Extensions
from snapshot.container._codec_places import NotData, Rows, TooDeep, bounded, cycles, find, where
from snapshot.container._codec_shapes import SMALL, fits, rows

__all__ = ["Encoder"]

_FLUSH_AT = 64 * 1024  # the tree's small pieces are handed to ``write`` when they add up to this much
#: The payload's frame: dicts, and lists of dicts, this many levels deep are walked in Python (the node
#: states are the values at the last level, and their dicts' items are written one by one too); below,
#: msgpack packs whole values (a big list in chunks, a list of tuples as rows).
SPINE = 7
_CHUNK_BYTES = 1 << 20  # a big list or dict is packed in chunks of about this many bytes
_CHUNKED = 8  # a longer list or dict is packed in chunks
_MAX_CHUNK = 4096  # items; a chunk starts at one item and doubles while it stays small
_HEADER = {0xdc: 3, 0xdd: 5, 0xde: 3, 0xdf: 5}  # msgpack's array and map headers of 16 and 32 bits
_EXT16, _EXT32 = struct.Struct(">BHb"), struct.Struct(">BIb")  # msgpack's ext 16 and ext 32 headers


class Encoder(Extensions):
    """Writes values through ``write`` as they are encoded; one :meth:`encode` call a value.

    ``pickled`` gathers ``(where, value)`` for each value that is not data, in order; ``written``
    counts the bytes handed to ``write`` (each :meth:`encode` call hands over all it encoded before
    it returns). ``measure`` maps the ``id`` of values held in dicts of the payload's frame to labels:
    the encoded size of each such value (its tree and its arrays' bytes) is put in ``sizes`` under
    each of its labels, as it is written.

    Array and tensor bytes reach ``write`` as views of the value's own memory after the tree: a
    ``write`` that keeps what it is given must be done with it before the value changes. Small pieces
    are gathered into buffers of 64 KiB first, unless ``buffered`` is false: then each piece goes to
    ``write`` as it is made (for a ``write`` that keeps the pieces and joins them once). After an
    exception (from ``write``, say) the stream is incomplete and the encoder is not to be reused.
    """

    def __init__(self, write: Callable[[bytes | memoryview], Any],
                 measure: dict[int, tuple[Any, ...]] | None = None, *, frame: int = SPINE,
                 buffered: bool = True) -> None:
        self.pickled: list[tuple[str, Any]] = []
        self.written = 0
        self.sizes: dict[Any, int] = {}
        self._measure = measure or {}
        # the levels of the frame (0: the value's own dict only, its lists of tuples by rows; -1: no walk, the
        # value packed in one call)
        self._spine = frame
        self._write = write
        self._flush_at = _FLUSH_AT if buffered else 0
        self._buffer = bytearray()
        self._buffers: list[Any] = []  # arrays and flat tensors whose bytes follow the tree, in order
        self._buffered = 0  # their bytes, not yet written
        self._arrays = {}
        self._objects: list[Any] = []  # the values not data, by index (``pickled`` names them)
        self._surrogates = False  # whether a str with lone surrogates was met (see _packer)
        self._packers = [self._packer()]
        self._depth = 0
        self._root = ""
        self._path: list[list[Any]] = []
        self._active: set[int] = set()  # the frame's containers being written (a cycle is not data)
        self._weights: dict[int, int] = {}  # the items of the frame's dicts and lists, counted once (see fits)
        self._handlers = dict(HANDLERS)

    def encode(self, value: Any, where: str = "state") -> None:
        """Append ``value`` to the stream (its tree, then its arrays' bytes); ``where`` names it in
        ``pickled``."""
        self._root = where
        try:
            self._value(value, 0)
        finally:
            self._path.clear()
            self._weights.clear()  # by id: valid while the value is encoded
        self._flush()
        buffers, self._buffers = self._buffers, []
        for item in buffers:
            self._write_buffer(item)
        self._flush()

    def close(self) -> None:
        """Done with this encoder: its packers (their ``default`` holds it) let go, so it is freed at once."""
        self._packers.clear()

    # the tree --------------------------------------------------------------------------------------

    def _value(self, value: Any, depth: int, small: bool | None = None) -> None:
        kind = type(value)
        if small is None and self._spine < 0:  # no walk: packed in one call, but a list of tuples by rows
            if kind is list and rows(value):
                self._emit_rows(value)
                return
            small = True
        elif small is None:
            small = (kind is dict or kind is list) and fits(value, self._measure, SMALL, self._weights) >= 0
        if small:
            self._emit(self._pack(value))  # the same bytes as walked, in one call
            return
        frame = (kind is dict and depth <= self._spine) or (
            kind is list and depth < self._spine and all(type(x) is dict or x is None for x in value))
        if frame and id(value) in self._active:  # the frame holds itself: not data
            self._emit(self._pack(NotData(value)))
        elif frame:
            self._active.add(id(value))
            self._frame(value, depth) if kind is dict else self._items(value, depth)
            self._active.discard(id(value))
        elif kind is list and rows(value):
            self._emit_rows(value)
        elif (kind is dict or kind is list) and len(value) > _CHUNKED:
            self._chunked(value)
        else:
            self._emit(self._pack(value))

    def _items(self, value: list[Any], depth: int) -> None:
        """A list of dicts of the payload's frame (logical shards, ...), item by item."""
        self._emit(self._packers[0].pack_array_header(len(value)))
        step = ["item", 0]
        self._path.append(step)
        for index, item in enumerate(value):
            step[1] = index
            self._value(item, depth + 1)
        self._path.pop()

    def _frame(self, value: dict[Any, Any], depth: int) -> None:
        """A dict of the payload's frame, item by item; measured values are measured as they are written."""
        self._emit(self._packers[0].pack_map_header(len(value)))
        measure, weights = self._measure, self._weights
        step: list[Any] = ["key", 0]
        level = len(self._path)  # the dict's own place, for the runs of plain items
        self._path.append(step)
        plain: dict[str, Any] = {}  # a run of items of small values, packed in one call (the same bytes)
        for index, (key, item) in enumerate(value.items()):
            small = fits(item, measure, SMALL, weights) >= 0
            if small and type(key) is str:
                plain[key] = item
                continue
            if plain:
                self._emit_items(plain, level, index - len(plain))
                plain = {}
            step[0], step[1] = "key", index
            self._emit(self._pack(key))
            step[0], step[1] = "value", key
            labels = measure.get(id(item)) if measure else None
            if labels and not small:  # a node state small but for being measured: packed whole all the same
                small = fits(item, measure, SMALL, weights, measured=True) >= 0
            start = self._position()
            self._value(item, depth + 1, small)
            for label in labels or ():
                self.sizes[label] = self._position() - start
        if plain:
            self._emit_items(plain, level, len(value) - len(plain))
        self._path.pop()

    def _emit_items(self, items: dict[str, Any], level: int, base: int) -> None:
        """Items of a dict of the frame, packed at once without their map's header (the dict's own was
        written)."""
        data = self._pack(items, base=base, level=level)
        self._emit(memoryview(data)[_HEADER.get(data[0], 1):])

    def _emit_rows(self, value: list[tuple[Any, ...]]) -> None:
        """A list of tuples of one length, by rows (ext ``ROWS``): its body written as the packer made it,
        after the ext's header (as ``_pack(Rows(value))`` writes it, without copying the body twice)."""
        marks = len(self._objects), len(self._buffers), self._buffered
        try:
            body = self._rows(Rows(value)).data
        except UnicodeEncodeError:
            self._undo(marks)
            self._emit(self._pack(Rows(value)))  # msgpack's slow path for strs, from here on
            return
        except (ValueError, RecursionError, TooDeep):  # a cycle, or nesting past the bounds, in a row
            self._undo(marks)
            self._emit(self._pack(value))  # tuple by tuple: what msgpack cannot pack is named and pickled
            return
        if len(body) < 1 << 8:  # msgpack's fixext and ext 8 headers: packed as any value
            self._emit(self._packers[0].pack(tuple.__new__(msgpack.ExtType, (types.ROWS, body))))
        else:
            self._emit(_EXT32.pack(0xc9, len(body), types.ROWS) if len(body) >= 1 << 16
                       else _EXT16.pack(0xc8, len(body), types.ROWS))
            self._emit(body)
        if len(self._objects) > marks[0]:
            self._name(Rows(value), marks[0], self._root_steps(), 0)

    def _chunked(self, value: list[Any] | dict[Any, Any]) -> None:
        """A big list or dict, packed a slice at a time (each slice's header dropped), so that the tree
        is written as it is made."""
        is_dict = type(value) is dict
        packer = self._packers[0]
        self._emit(packer.pack_map_header(len(value)) if is_dict else packer.pack_array_header(len(value)))
        items: Iterator[Any] = iter(value.items()) if isinstance(value, dict) else iter(())
        done, size = 0, 1
        while done < len(value):
            # a list's slice is copied in C; a dict's items go straight into the part (the items' pairs reused)
            part: Any = dict(itertools.islice(items, size)) if is_dict else value[done:done + size]
            data = self._pack(part, base=done)
            self._emit(memoryview(data)[_HEADER.get(data[0], 1):])
            done += len(part)
            size = min(size * 2, _MAX_CHUNK) if len(data) < _CHUNK_BYTES // 2 else max(size // 2, 1)

    def _pack(self, value: Any, base: int = 0, level: int | None = None) -> bytes:
        """``value``, at the place the frame's walk is at (its first ``level`` steps, when given), packed by
        msgpack; a value it cannot pack (a cycle, nesting past the bounds) is packed again with those
        containers marked as not data."""
        marks = len(self._objects), len(self._buffers), self._buffered
        try:
            data = self._packed(value, marks)
        except UnicodeEncodeError:  # a str with lone surrogates, which msgpack's fast path refuses
            if self._surrogates:  # pragma: no cover - "surrogatepass" encodes every str
                raise
            self._undo(marks)
            self._surrogates = True  # from here on, every str goes through Python's codec (slower)
            self._packers = [self._packer()]
            data = self._packed(value, marks)
        if len(self._objects) > marks[0]:
            self._name(value, marks[0], self._root_steps()[:level], base)
        return data

    def _packed(self, value: Any, marks: tuple[int, int, int]) -> bytes:
        try:
            return self._packers[0].pack(value)
        except UnicodeEncodeError:
            raise
        except (ValueError, RecursionError, TooDeep):
            self._undo(marks)
            return self._packers[0].pack(bounded(value, cycles(value)))

    def _undo(self, marks: tuple[int, int, int]) -> None:
        """Forget what a failed pack set aside (values not data, buffers) after ``marks``."""
        objects, buffers, self._buffered = marks
        del self._objects[objects:], self._buffers[buffers:]
        self._depth = 0

    def _emit(self, data: bytes | memoryview) -> None:
        if len(data) >= self._flush_at:
            self._flush()
            self._write(data)
            self.written += len(data)
            return
        self._buffer += data
        if len(self._buffer) >= _FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            buffer, self._buffer = self._buffer, bytearray()
            self._write(memoryview(buffer))  # not copied: this encoder never touches it again
            self.written += len(buffer)

    def _position(self) -> int:
        return self.written + len(self._buffer) + self._buffered

    def _write_buffer(self, item: Any) -> None:
        numpy = types.numpy_module()
        if numpy is not None and type(item) is numpy.ndarray:
            flat = numpy.ascontiguousarray(item).reshape(-1).view(numpy.uint8)  # copies only a strided array
        else:
            flat = item.numpy()  # a flat uint8 tensor, made when it was met
        self._buffered -= flat.nbytes
        if flat.nbytes:
            self._emit(memoryview(flat))

    # where the values that are not data sit ---------------------------------------------------------

    def _root_steps(self) -> list[tuple[str, Any]]:
        return [(kind, step) for kind, step in self._path]

    def _name(self, value: Any, first: int, steps: list[tuple[str, Any]], base: int) -> None:
        """Name the place of each value not data that packing ``value`` met (``_objects[first:]``); the
        items of a chunk (``base``: the index of its first item) are named by their index in the whole."""
        wanted = self._objects[first:]
        found: list[str] = []
        find(value, steps, base, wanted, found)
        found += [where(steps) + " (somewhere inside)"] * (len(wanted) - len(found))
        self.pickled.extend((self._root + place, obj) for place, obj in zip(found, wanted))
