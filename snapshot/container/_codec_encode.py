"""The encoding half of :mod:`snapshot.container._codec` (the format and what is data are described there).

msgpack's C packer encodes the state; Python runs only for what msgpack has no type for (tuples, sets,
arrays, ...: its ``default``), and for the frame of the payload down to the node states, which this
encoder walks itself so that it can write as it goes (a big list is packed in chunks of about a MiB,
whatever holds it) and measure each node state where it is written. Array and tensor bytes are not
copied into the tree: they are written after it, from the value's own memory.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import msgpack

from snapshot.container import _codec_types as types
from snapshot.container._codec_places import NotData, Rows, TooDeep, bounded, cycles, find, where

__all__ = ["Encoder"]

_FLUSH_AT = 64 * 1024  # the tree's small pieces are handed to ``write`` when they add up to this much
#: The payload's frame: dicts, and lists of dicts, this many levels deep are walked in Python (the node
#: states are the values at the last level, and their dicts' items are written one by one too); below,
#: msgpack packs whole values (a big list in chunks, a list of tuples as rows).
SPINE = 7
_CHUNK_BYTES = 1 << 20  # a big list or dict is packed in chunks of about this many bytes
_ROWS = 16  # a list of more tuples than this is written by columns
_CHUNKED = 8  # a longer list or dict is packed in chunks
_MAX_CHUNK = 4096  # items; a chunk starts at one item and doubles while it stays small
_HEADER = {0xdc: 3, 0xdd: 5, 0xde: 3, 0xdf: 5}  # msgpack's array and map headers of 16 and 32 bits
_COMPLEX = struct.Struct("<dd")
_EXT16, _EXT32 = struct.Struct(">BHb"), struct.Struct(">BIb")  # msgpack's ext 16 and ext 32 headers
#: Small values (``_fits``): scalars, strs and bytes of at most ``_PLAIN_TEXT`` bytes, and dicts and lists
#: of them, at most ``_SMALL`` items in all. The frame packs each run of them in one call.
_SCALARS = frozenset({type(None), bool, int, float})
_TEXTS = frozenset({str, bytes})
_PLAIN_TEXT = 4096
_SMALL = 32
_KEYS = frozenset({str, *_SCALARS})  # the keys of a small dict
_ext = msgpack.ExtType
_new = tuple.__new__  # an ExtType without its checks in Python (the code and bytes are ours)


class _Extensions:
    """The values msgpack has no type for: the ``default`` of the encoder's packers, which turns each
    into an ext value (its items packed by a packer of the next level), names it as not data (pickled
    apart), or sets its bytes aside to follow the tree (arrays and tensors)."""

    _handlers: dict[type, Callable[[Any], Any]]
    _packers: list[msgpack.Packer]
    _surrogates: bool
    _depth: int
    _objects: list[Any]
    _buffers: list[Any]
    _buffered: int

    def _default(self, value: Any) -> Any:
        handler = self._handlers.get(type(value))
        if handler is None:
            handler = self._handlers[type(value)] = self._classify(type(value))
        return handler(value)

    def _classify(self, kind: type) -> Callable[[Any], Any]:
        numpy = types.numpy_module()
        if numpy is not None and kind is numpy.ndarray:
            return self._array
        if numpy is not None and issubclass(kind, numpy.generic):
            return self._numpy_scalar
        torch = sys.modules.get("torch")
        if torch is not None and kind is torch.Tensor:
            return self._tensor
        if torch is not None and kind is _data_chunk():
            return self._chunk
        return self._pickle

    def _packer(self) -> msgpack.Packer:
        # msgpack packs a str by its fast UTF-8 path unless told how to treat lone surrogates; then it
        # encodes each str through Python's codec (1.6x the time of a list of paths): a packer says so
        # only once a str that needs it was met (the bytes of any other str are the same either way)
        options = types.SURROGATES if self._surrogates else types.PACK_OPTIONS
        return msgpack.Packer(default=self._default, **options)

    def _nested(self, items: Any) -> bytes:
        """``items`` packed as the body of an ext value (by a packer of the next level: msgpack's own
        packer is in the middle of a value)."""
        depth = self._depth + 1
        if depth > types.MAX_DEPTH:
            raise TooDeep
        if depth == len(self._packers):
            self._packers.append(self._packer())
        self._depth = depth
        try:
            data: bytes = self._packers[depth].pack(items)
        finally:
            self._depth = depth - 1
        return data

    def _pickle(self, value: Any) -> Any:
        self._objects.append(value)
        return _new(_ext, (types.PICKLED, (len(self._objects) - 1).to_bytes(8, "little")))

    def _rows(self, rows: Rows) -> Any:  # by columns: each taken (and, decoding, the tuples made) in C
        columns = [list(map(itemgetter(index), rows.value)) for index in range(len(rows.value[0]))]
        return _new(_ext, (types.ROWS, self._nested([len(rows.value), *columns])))

    def _tuple(self, value: tuple[Any, ...]) -> Any:
        return _new(_ext, (types.TUPLE, self._nested(list(value))))

    def _set(self, value: set[Any]) -> Any:
        return _new(_ext, (types.SET, self._nested(list(value))))

    def _frozenset(self, value: frozenset[Any]) -> Any:
        return _new(_ext, (types.FROZENSET, self._nested(list(value))))

    def _bigint(self, value: int) -> Any:  # msgpack's own ints are 64 bits
        return _new(_ext, (types.BIGINT, value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)))

    def _complex(self, value: complex) -> Any:
        return _new(_ext, (types.COMPLEX, _COMPLEX.pack(value.real, value.imag)))

    def _bytearray(self, value: bytearray) -> Any:
        return _new(_ext, (types.BYTEARRAY, bytes(value)))

    def _deque(self, value: deque[Any]) -> Any:
        return _new(_ext, (types.DEQUE, self._nested([value.maxlen, *value])))

    def _range(self, value: range) -> Any:
        return _new(_ext, (types.RANGE, self._nested([value.start, value.stop, value.step])))

    def _defaultdict(self, value: defaultdict[Any, Any]) -> Any:
        index = next((i for i, known in enumerate(types.FACTORIES) if value.default_factory is known), None)
        if index is None:
            return self._pickle(value)
        return _new(_ext, (types.DEFAULTDICT, self._nested([index, dict(value)])))

    def _chunk(self, value: list[Any]) -> Any:
        # torch keeps the items twice (the list, and ``.items``): the copy is rebuilt, anything else is not data
        extra = vars(value)
        if set(extra) - {"items"} or not _same_items(extra.get("items", value), value):
            return self._pickle(value)
        return _new(_ext, (types.CHUNK, self._nested(list(value))))

    def _array(self, value: Any) -> Any:
        descr = types.array_descr(value.dtype)
        if descr is None or (value.dtype.itemsize == 0 and value.size):
            return self._pickle(value)
        body = self._nested([descr, list(value.shape), value.nbytes])
        self._buffers.append(value)
        self._buffered += value.nbytes
        return _new(_ext, (types.ARRAY, body))

    def _numpy_scalar(self, value: Any) -> Any:
        array = types.numpy_module().asarray(value)
        descr = types.scalar_descr(array.dtype) if type(value) is array.dtype.type else None
        if descr is None:
            return self._pickle(value)
        return _new(_ext, (types.NUMPY_SCALAR, self._nested([descr, array.tobytes()])))

    def _tensor(self, value: Any) -> Any:
        torch = sys.modules["torch"]
        name = types.torch_dtype_names().get(value.dtype)
        if (name is None or value.layout is not torch.strided or value.device.type != "cpu" or value.is_nested
                or any(getattr(value, "names", ())) or value.__dict__):
            return self._pickle(value)
        try:  # the bytes, flat, from the tensor's own memory where it is contiguous
            flat = value.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8) \
                if value.numel() else torch.empty(0, dtype=torch.uint8)
        except RuntimeError:  # a dtype that some operation here does not support yet: pickle can still save it
            return self._pickle(value)
        body = self._nested([name, list(value.shape), bool(value.requires_grad), flat.numel()])
        self._buffers.append(flat)
        self._buffered += flat.numel()
        return _new(_ext, (types.TENSOR, body))


class Encoder(_Extensions):
    """Writes values through ``write`` as they are encoded; one :meth:`encode` call a value.

    ``pickled`` gathers ``(where, value)`` for each value that is not data, in order; ``written``
    counts the bytes handed to ``write`` (each :meth:`encode` call hands over all it encoded before
    it returns). ``measure`` maps the ``id`` of values held in dicts of the payload's frame to labels:
    the encoded size of each such value (its tree and its arrays' bytes) is put in ``sizes`` under
    each of its labels, as it is written.

    Array and tensor bytes reach ``write`` as views of the value's own memory after the tree: a
    ``write`` that keeps what it is given must be done with it before the value changes. After an
    exception (from ``write``, say) the stream is incomplete and the encoder is not to be reused.
    """

    def __init__(self, write: Callable[[bytes | memoryview], Any],
                 measure: dict[int, tuple[Any, ...]] | None = None, *, frame: int = SPINE) -> None:
        self.pickled: list[tuple[str, Any]] = []
        self.written = 0
        self.sizes: dict[Any, int] = {}
        self._measure = measure or {}
        self._spine = frame  # the levels of the frame (0: a value that is not a payload is packed at once)
        self._write = write
        self._buffer = bytearray()
        self._buffers: list[Any] = []  # arrays and flat tensors whose bytes follow the tree, in order
        self._buffered = 0  # their bytes, not yet written
        self._objects: list[Any] = []  # the values not data, by index (``pickled`` names them)
        self._surrogates = False  # whether a str with lone surrogates was met (see _packer)
        self._packers = [self._packer()]
        self._depth = 0
        self._root = ""
        self._path: list[list[Any]] = []
        self._active: set[int] = set()  # the frame's containers being written (a cycle is not data)
        self._handlers: dict[type, Callable[[Any], Any]] = {
            tuple: self._tuple, set: self._set, frozenset: self._frozenset, int: self._bigint,
            complex: self._complex, bytearray: self._bytearray, deque: self._deque, range: self._range,
            defaultdict: self._defaultdict, NotData: lambda wrapped: self._pickle(wrapped.value), Rows: self._rows}

    def encode(self, value: Any, where: str = "state") -> None:
        """Append ``value`` to the stream (its tree, then its arrays' bytes); ``where`` names it in
        ``pickled``."""
        self._root = where
        try:
            self._value(value, 0)
        finally:
            self._path.clear()
        self._flush()
        buffers, self._buffers = self._buffers, []
        for item in buffers:
            self._write_buffer(item)
        self._flush()

    # the tree --------------------------------------------------------------------------------------

    def _value(self, value: Any, depth: int, small: bool | None = None) -> None:
        kind = type(value)
        if small is None:
            small = (kind is dict or kind is list) and _fits(value, self._measure, _SMALL) >= 0
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
        elif kind is list and len(value) > _ROWS and _rows(value):
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
        measure = self._measure
        step: list[Any] = ["key", 0]
        level = len(self._path)  # the dict's own place, for the runs of plain items
        self._path.append(step)
        plain: dict[str, Any] = {}  # a run of items of small values, packed in one call (the same bytes)
        for index, (key, item) in enumerate(value.items()):
            small = _fits(item, measure, _SMALL) >= 0
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
        except (UnicodeEncodeError, ValueError, RecursionError, TooDeep):
            self._undo(marks)
            self._emit(self._pack(Rows(value)))  # the slow paths, as for any value
            return
        if len(body) < 1 << 8:  # msgpack's fixext and ext 8 headers: packed as any value
            self._emit(self._packers[0].pack(_new(_ext, (types.ROWS, body))))
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
        items: Iterator[Any] = iter(value.items()) if isinstance(value, dict) else iter(value)
        done, size = 0, 1
        while done < len(value):
            part: Any = list(itertools.islice(items, size))
            if is_dict:
                part = dict(part)
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
            data: bytes = self._packers[0].pack(value)
        except UnicodeEncodeError:
            raise
        except (ValueError, RecursionError, TooDeep):
            self._undo(marks)
            data = self._packers[0].pack(bounded(value, cycles(value)))
        return data

    def _undo(self, marks: tuple[int, int, int]) -> None:
        """Forget what a failed pack set aside (values not data, buffers) after ``marks``."""
        objects, buffers, self._buffered = marks
        del self._objects[objects:], self._buffers[buffers:]
        self._depth = 0

    def _emit(self, data: bytes | memoryview) -> None:
        if len(data) >= _FLUSH_AT:
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


def _fits(value: Any, measure: dict[int, Any], left: int) -> int:
    """``left`` less the items of ``value``, or -1 unless ``value`` is small: a scalar, a str or bytes of at
    most ``_PLAIN_TEXT`` bytes, or a list (of at most ``_ROWS`` items) or dict (str or scalar keys) of small
    values, ``left`` items in all, none of them measured. A small value packed whole is packed as the frame
    would have written it, with nothing to stream, measure or name (and it holds no cycle: each level
    costs items)."""
    if id(value) in measure:
        return -1
    kind = type(value)
    if kind in _SCALARS or (kind in _TEXTS and len(value) <= _PLAIN_TEXT):
        return left
    if kind is list:
        if len(value) > _ROWS:
            return -1
        items = value
    elif kind is dict and _KEYS.issuperset(map(type, value)):
        items = value.values()
    else:
        return -1
    left -= len(value)
    for item in items:
        if left < 0:
            return -1
        kind = type(item)
        if kind in _SCALARS or (kind in _TEXTS and len(item) <= _PLAIN_TEXT):
            if id(item) in measure:
                return -1
        else:
            left = _fits(item, measure, left)
    return left


def _rows(value: list[Any]) -> bool:
    """Whether ``value`` (not empty) holds only tuples (exactly: no subclass) of one length, not 0. Each
    check is one pass in C (``list.count`` compares by identity first): a third of the time of sets of
    the types and lengths."""
    first = value[0]
    if type(first) is not tuple or not first:
        return False
    count = len(value)
    return list(map(type, value)).count(tuple) == count and list(map(len, value)).count(len(first)) == count


def _data_chunk() -> type:
    """torch's ``DataChunk`` (imported only once torch is: the codec does not import torch itself)."""
    from torch.utils.data.datapipes.datapipe import DataChunk

    chunk: type = DataChunk
    return chunk


_ATOMS = (int, float, complex, str, bytes)


def _same_items(items: Any, chunk: list[Any]) -> bool:
    """Whether ``items`` holds the chunk's own items (the same objects; equal numbers and strings after a
    pickle round trip between processes, which copies them)."""
    return type(items) is list and len(items) == len(chunk) and all(
        a is b or (type(a) is type(b) and type(a) in _ATOMS and a == b) for a, b in zip(items, chunk))
