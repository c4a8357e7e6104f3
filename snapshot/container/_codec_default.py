"""The values msgpack has no type for, as the codec encodes them: the ``default`` of the encoder's packers
(:class:`Extensions`, which :class:`snapshot.container._codec_encode.Encoder` extends). Each becomes an ext
value whose body a packer of the next level packs, a value not data (pickled apart), or an array or tensor
whose bytes are set aside to follow the tree.
"""

from __future__ import annotations

import struct
import sys
from collections import defaultdict, deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import msgpack

from snapshot.container import _codec_types as types
from snapshot.container._codec_places import NotData, Rows, TooDeep

__all__ = ["HANDLERS", "Extensions"]

_COMPLEX = struct.Struct("<dd")
#: A packer's first buffer (msgpack's default, 256 KiB, is a fresh mapping of memory for each packer made; it
#: grows as it needs)
_BUFFER = 16 * 1024
_ext = msgpack.ExtType
_new = tuple.__new__  # an ExtType without its checks in Python (the code and bytes are ours)


class Extensions:
    """The values msgpack has no type for: the ``default`` of the encoder's packers, which turns each
    into an ext value (its items packed by a packer of the next level), names it as not data (pickled
    apart), or sets its bytes aside to follow the tree (arrays and tensors)."""

    _handlers: dict[type, Callable[[Any, Any], Any]]  # functions of (encoder, value): no bound method (no cycle)
    _packers: list[msgpack.Packer]
    _surrogates: bool
    _depth: int
    _objects: list[Any]
    _buffers: list[Any]
    _buffered: int
    _arrays: dict[tuple[Any, tuple[int, ...]], Any]  # the ext value of an array, by its dtype and shape

    def _default(self, value: Any) -> Any:
        if type(value) is tuple:  # the most common, without a call more
            return _new(_ext, (types.TUPLE, self._nested(list(value))))
        handler = self._handlers.get(type(value))
        if handler is None:
            handler = self._handlers[type(value)] = _classify(type(value))
        return handler(self, value)

    def _packer(self) -> msgpack.Packer:
        # msgpack packs a str by its fast UTF-8 path unless told how to treat lone surrogates; then it
        # encodes each str through Python's codec (1.6x the time of a list of paths): a packer says so
        # only once a str that needs it was met (the bytes of any other str are the same either way)
        options = types.SURROGATES if self._surrogates else types.PACK_OPTIONS
        return msgpack.Packer(default=self._default, buf_size=_BUFFER, **options)

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
        dtype = value.dtype
        key = (dtype, value.shape)  # a buffer of samples: many arrays of one dtype and shape, one descriptor
        ext = self._arrays.get(key) if dtype.metadata is None else None
        if ext is None:
            descr = types.array_descr(dtype)
            if descr is None or (dtype.itemsize == 0 and value.size):
                return self._pickle(value)
            ext = _new(_ext, (types.ARRAY, self._nested([descr, list(value.shape), value.nbytes])))
            if len(self._arrays) < 256:
                self._arrays[key] = ext
        self._buffers.append(value)
        self._buffered += value.nbytes
        return ext

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


def _classify(kind: type) -> Callable[[Any, Any], Any]:
    numpy = types.numpy_module()
    if numpy is not None and kind is numpy.ndarray:
        return Extensions._array
    if numpy is not None and issubclass(kind, numpy.generic):
        return Extensions._numpy_scalar
    torch = sys.modules.get("torch")
    if torch is not None and kind is torch.Tensor:
        return Extensions._tensor
    if torch is not None and kind is _data_chunk():
        return Extensions._chunk
    return Extensions._pickle


#: What the encoder's ``default`` does with each type msgpack has no type for (more are added as they are met).
HANDLERS: dict[type, Callable[[Any, Any], Any]] = {
    tuple: Extensions._tuple, set: Extensions._set, frozenset: Extensions._frozenset, int: Extensions._bigint,
    complex: Extensions._complex, bytearray: Extensions._bytearray, deque: Extensions._deque,
    range: Extensions._range, defaultdict: Extensions._defaultdict, Rows: Extensions._rows,
    NotData: lambda encoder, wrapped: encoder._pickle(wrapped.value)}


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
