"""What each ext value of the codec's tree decodes to (the ``ext_hook`` of
:class:`snapshot.container._codec_decode.Decoder`).

Every field is checked before anything is made of it, and only the types of the codec's ext table
are built: nothing here imports a module, looks up an attribute or calls anything that the bytes
name. Arrays and tensors are allocated empty here (never more bytes than the data holds) and filled
by the decoder from the bytes after the tree.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from snapshot.container import _codec_native
from snapshot.container import _codec_types as types
from snapshot.errors import UntrustedStateError

__all__ = ["HOOKS", "CallerError", "Corrupt", "ExtValues", "shown"]

_COMPLEX = struct.Struct("<dd")


class Corrupt(Exception):
    """A field that the codec's checks refuse (turned into a CorruptSnapshotError with the place)."""


class CallerError(Exception):
    """Carries an exception of the caller's ``pickled`` callback past the decoder's wrapping."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ExtValues:
    """What each ext value of the tree decodes to (the decoder's ``ext_hook``), every field checked
    before anything is made of it: the types msgpack lacks, the values stored pickled, and arrays
    and tensors, made empty here and filled from the bytes after the tree."""

    limit: int
    position: int
    _depth: int
    _pickled: Callable[[int], Any] | None
    _name: str
    _pending: list[tuple[memoryview, int]]
    _pending_bytes: int
    _descriptors: dict[bytes, tuple[Any, tuple[int, ...], int, Any]]

    def _ext(self, code: int, data: bytes) -> Any:
        if code == types.TUPLE:  # the most common, without a call more
            return tuple(self._items(data, "tuple"))
        handler = HOOKS.get(code)
        if handler is None:
            raise Corrupt(f"a value of unknown ext type {code}")
        return handler(self, data)

    def _items(self, data: bytes, what: str) -> list[Any]:
        """The list an ext value's bytes hold (decoded by msgspec or msgpack, with this decoder's ext types)."""
        if self._depth >= types.MAX_DEPTH:
            raise Corrupt(f"a {what} nested deeper than {types.MAX_DEPTH} levels")
        self._depth += 1
        try:
            items = _codec_native.body(data, self)
        finally:
            self._depth -= 1
        if type(items) is not list:
            raise Corrupt(f"a {what} whose body is a {type(items).__name__}, not a list")
        return items

    def _fields(self, data: bytes, what: str, *kinds: Any) -> list[Any]:
        """The fields of a record (``kinds``: the type, or types, of each), checked exactly."""
        fields = self._items(data, what)
        if len(fields) != len(kinds) or not all(type(f) is k or (type(k) is tuple and type(f) in k)
                                                 for f, k in zip(fields, kinds)):
            raise Corrupt(f"a {what} whose fields are {shown(fields)}")
        return fields

    def _rows(self, data: bytes) -> list[tuple[Any, ...]]:
        body = self._items(data, "list of tuples")
        count, columns = (body[0], body[1:]) if body else (None, [])
        if type(count) is not int or not columns or not all(type(c) is list and len(c) == count for c in columns):
            raise Corrupt(f"a list of tuples whose columns are not {shown(count)} long lists")
        return list(zip(*columns))

    def _tuple(self, data: bytes) -> tuple[Any, ...]:
        return tuple(self._items(data, "tuple"))

    def _set(self, data: bytes) -> set[Any]:
        return _members(set, self._items(data, "set"), "set member")

    def _frozenset(self, data: bytes) -> frozenset[Any]:
        return _members(frozenset, self._items(data, "frozenset"), "frozenset member")

    def _complex(self, data: bytes) -> complex:
        if len(data) != _COMPLEX.size:
            raise Corrupt(f"a complex of {len(data)} bytes, not {_COMPLEX.size}")
        return complex(*_COMPLEX.unpack(data))

    def _deque(self, data: bytes) -> deque[Any]:
        items = self._items(data, "deque")
        maxlen = items[0] if items else "nothing"
        if not (maxlen is None or (type(maxlen) is int and maxlen >= 0)) or \
                (maxlen is not None and len(items) - 1 > maxlen):
            raise Corrupt(f"a deque of {len(items) - 1} items whose maxlen is {shown(maxlen)}")
        return deque(items[1:], maxlen)

    def _range(self, data: bytes) -> range:
        ends = self._items(data, "range")
        if len(ends) != 3 or any(type(end) is not int for end in ends) or ends[2] == 0:
            raise Corrupt(f"a range of {shown(ends)}, not three ints with a nonzero step")
        return range(*ends)

    def _defaultdict(self, data: bytes) -> defaultdict[Any, Any]:
        index, items = self._fields(data, "defaultdict", int, dict)
        if not 0 <= index < len(types.FACTORIES):
            raise Corrupt(f"a defaultdict whose factory is number {index}, of {len(types.FACTORIES)} known")
        return defaultdict(types.FACTORIES[index], items)

    def _chunk(self, data: bytes) -> Any:
        from torch.utils.data.datapipes.datapipe import DataChunk  # a fixed class, never one the data names

        return DataChunk(self._items(data, "DataChunk"))

    def _pickle(self, data: bytes) -> Any:
        if len(data) != 8:
            raise Corrupt(f"a pickled value's index of {len(data)} bytes, not 8")
        index = int.from_bytes(data, "little")
        if self._pickled is None:
            raise UntrustedStateError(f"the value stored pickled (number {index}) needs unpickling, which can run "
                                      "code from the file: trust it with a key or allow_pickle=True",
                                      source=self._name)
        try:
            return self._pickled(index)
        except Exception as error:
            raise CallerError(error) from error

    # arrays and tensors ------------------------------------------------------------------------------

    def _shape(self, shape: Any, what: str) -> tuple[int, ...]:
        if type(shape) is not list or len(shape) > types.MAX_DIMS or not all(type(n) is int and n >= 0 for n in shape):
            raise Corrupt(f"{what} of shape {shown(shape)} (at most {types.MAX_DIMS} dimensions, each a count)")
        return tuple(shape)

    def _reserve(self, size: Any, expected: int, what: Callable[[], str]) -> None:
        """Refuse buffers whose size is not the one their shape needs, or that the data cannot hold."""
        if size != expected or type(size) is not int:
            raise Corrupt(f"{what()} needs {expected} bytes, its descriptor says {shown(size)}")
        if self._pending_bytes + size > self.limit - self.position:
            raise Corrupt(f"{what()} of {size} bytes, more than the data holds")
        self._pending_bytes += size

    def _array(self, data: bytes) -> Any:
        known = self._descriptors.get(data)  # a buffer of samples: many arrays of one dtype and shape
        if known is None:
            known = self._descriptor(data)
            if len(self._descriptors) < 256:
                self._descriptors[data] = known
        dtype, shape, size, empty = known  # size: checked against dtype and shape by _descriptor
        if self._pending_bytes + size > self.limit - self.position:
            raise Corrupt(f"an array of shape {shape} and dtype {dtype} of {size} bytes, more than the data holds")
        array = empty(shape, dtype)
        if size:
            self._pending_bytes += size
            self._pending.append((_bytes_of(array), size))
        return array

    def _descriptor(self, data: bytes) -> tuple[Any, tuple[int, ...], int, Any]:
        """An array's dtype, shape and size in bytes, checked, and ``numpy.empty`` (no import an array)."""
        import numpy

        fields = self._items(data, "array")
        if len(fields) != 3:
            raise Corrupt(f"an array whose descriptor is {shown(fields)}")
        descr, shape, size = fields
        dtype = _dtype(descr, "an array")
        shape = self._shape(shape, "an array")
        count = types.elements(shape)
        if dtype.itemsize == 0 and count:
            raise Corrupt(f"an array of shape {shape} whose dtype {dtype} has no bytes an element")
        if size != count * dtype.itemsize or type(size) is not int:
            raise Corrupt(f"an array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
                           f"its descriptor says {shown(size)}")
        return dtype, shape, size, numpy.empty

    def _numpy_scalar(self, data: bytes) -> Any:
        descr, raw = self._fields(data, "numpy scalar", (str, list), bytes)
        dtype = _dtype(descr, "a numpy scalar")
        if len(raw) != dtype.itemsize:
            raise Corrupt(f"a numpy scalar of dtype {dtype} with {len(raw)} bytes, not {dtype.itemsize}")
        return types.array_from(dtype, (), memoryview(raw))[()]

    def _tensor(self, data: bytes) -> Any:
        import torch

        name, shape, requires_grad, size = self._fields(data, "tensor", str, list, bool, int)
        dtype = types.torch_dtypes().get(name)
        if dtype is None:
            raise Corrupt(f"a tensor of dtype {name!r:.40}, which is not in the codec's table "
                           f"({', '.join(types.torch_dtypes())})")
        shape = self._shape(shape, "a tensor")
        self._reserve(size, types.elements(shape) * dtype.itemsize,
                      lambda: f"a tensor of shape {list(shape)} and dtype {name}")
        if size:
            raw = torch.empty(size, dtype=torch.uint8)
            tensor = raw.view(dtype).reshape(shape)
            flat: Any = raw.numpy()
            self._pending.append((memoryview(flat), size))
        else:
            tensor = torch.empty(shape, dtype=dtype)
        return tensor.requires_grad_() if requires_grad else tensor


#: What each ext type of the tree decodes to: functions of (decoder, body), none bound (no cycle to collect).
HOOKS: dict[int, Callable[[Any, bytes], Any]] = {
    types.TUPLE: ExtValues._tuple, types.SET: ExtValues._set, types.FROZENSET: ExtValues._frozenset,
    types.BIGINT: lambda _, data: int.from_bytes(data, "little", signed=True), types.COMPLEX: ExtValues._complex,
    types.BYTEARRAY: lambda _, data: bytearray(data), types.DEQUE: ExtValues._deque, types.RANGE: ExtValues._range,
    types.DEFAULTDICT: ExtValues._defaultdict, types.CHUNK: ExtValues._chunk, types.ARRAY: ExtValues._array,
    types.NUMPY_SCALAR: ExtValues._numpy_scalar, types.TENSOR: ExtValues._tensor, types.PICKLED: ExtValues._pickle,
    types.ROWS: ExtValues._rows}


def _bytes_of(array: Any) -> memoryview:
    """The memory of a new (C-contiguous) array, as bytes to fill."""
    try:
        return memoryview(array).cast("B")  # a third of the time of a view as uint8
    except (ValueError, TypeError, NotImplementedError, BufferError):  # a dtype numpy exports no buffer of (times)
        import numpy

        flat: Any = array.reshape(-1).view(numpy.uint8)
        return memoryview(flat)


def _dtype(descr: Any, what: str) -> Any:
    """The dtype a checked description names (those met are kept: a buffer holds many arrays of one)."""
    dtype = _DTYPES.get(descr) if type(descr) is str else None
    if dtype is not None:
        return dtype
    try:
        dtype = types.dtype_of(descr) if types.is_descr(descr) else None
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise Corrupt(f"{what} whose dtype {shown(descr)} is not one numpy rebuilds as data ({error})") from None
    if dtype is None:
        raise Corrupt(f"{what} whose dtype description {shown(descr)} is not one of plain data (numbers, bytes, "
                       "text, times, or fields of them such as [('x', '<f8')]: never Python objects)")
    if type(descr) is str and len(_DTYPES) < 1024:
        _DTYPES[descr] = dtype
    return dtype


_DTYPES: dict[str, Any] = {}


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _members(kind: Any, items: list[Any], what: str) -> Any:
    """``kind(items)`` (a set or frozenset: each member hashed in C), or ``Corrupt`` naming an unhashable one."""
    try:
        return kind(items)
    except TypeError:
        pass
    for item in items:
        try:
            hash(item)
        except TypeError:
            raise Corrupt(f"a {what} of type {type(item).__name__}, which is not hashable") from None
    raise Corrupt(f"a {what} that is not hashable")  # pragma: no cover - set() and hash() agree
