"""The decoding half of :mod:`snapshot.container._codec` (the format is described there).

msgpack's C unpacker reads the tree as it comes (from a file, a chunk at a time: the tree is never held
whole), with exact limits; this module's ``ext_hook`` builds only the types of the codec's ext table,
from checked fields: it never imports a module, looks up an attribute or calls anything that the bytes
name. An array or a tensor is allocated when its descriptor is read (never more bytes than the data
holds) and filled from the bytes after the tree, read straight into its memory: decoding holds one copy
of the state. Every malformed input raises :class:`~snapshot.errors.CorruptSnapshotError`.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from snapshot.container import _codec_types as types
from snapshot.errors import CorruptSnapshotError, SnapshotError, UntrustedStateError

__all__ = ["Decoder", "MemoryReader", "Reader", "decode"]

#: Bytes msgpack reads at a time from a file.
_READ_SIZE = 256 * 1024
_COMPLEX = struct.Struct("<dd")
# What a broken payload can make Python or msgpack raise on its way through the decoder; each becomes a
# CorruptSnapshotError (msgpack's own errors are ValueErrors).
_BROKEN = (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, RuntimeError, MemoryError,
           RecursionError)
_HINT = "; the payload is damaged or was not written by this version of snapshot"


class Reader(Protocol):
    """Where a decoder reads: ``read(n)`` (at most ``n`` bytes, fewer only at the end) and ``readinto``."""

    def read(self, size: int) -> bytes: ...

    def readinto(self, buffer: Any) -> int: ...


class MemoryReader:
    """A :class:`Reader` over bytes in memory (read in pieces, not copied whole)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        self.view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.offset = 0

    def read(self, size: int) -> bytes:
        start = self.offset
        self.offset = min(start + max(size, 0), len(self.view))
        return bytes(self.view[start:self.offset])

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        size = min(len(target), len(self.view) - self.offset)
        target[:size] = self.view[self.offset:self.offset + size]
        self.offset += size
        return size


class _Counting:
    """What msgpack reads a tree through: the bytes read ahead before, then the reader; it counts the bytes
    handed over (msgpack reads ahead of the tree)."""

    def __init__(self, ahead: bytes, reader: Reader) -> None:
        self.ahead, self.reader, self.count = ahead, reader, 0

    def read(self, size: int) -> bytes:
        if self.ahead:
            data, self.ahead = self.ahead, b""
        else:
            data = self.reader.read(size)
        self.count += len(data)
        return data


class _Corrupt(Exception):
    """A field that the codec's checks refuse (turned into a CorruptSnapshotError with the place)."""


class _CallerError(Exception):
    """Carries an exception of the caller's ``pickled`` callback past the decoder's wrapping."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Decoder:
    """Decodes the values that ``source`` holds one after another (:meth:`next`): each value's tree,
    then the bytes of its arrays and tensors. ``limit`` bounds what the values may take (the bytes left
    in the data). ``pickled(index)`` supplies each value stored pickled; without it, meeting one raises
    :class:`~snapshot.errors.UntrustedStateError`."""

    def __init__(self, source: Reader | bytes | bytearray | memoryview, *, limit: int | None = None,
                 pickled: Callable[[int], Any] | None = None, name: str = "<payload>") -> None:
        self.reader: Reader = MemoryReader(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
        self.limit = len(self.reader.view) if isinstance(self.reader, MemoryReader) and limit is None \
            else (limit if limit is not None else 1 << 62)
        self.position = 0  # bytes of the data decoded so far
        self._ahead = b""  # bytes read past the last value (the start of the next)
        self._pickled = pickled
        self._name = name
        self._depth = 0
        self._pending: list[tuple[memoryview, int]] = []  # arrays and tensors to fill, in order
        self._pending_bytes = 0
        self._descriptors: dict[bytes, tuple[Any, tuple[int, ...], int]] = {}
        self._options = {**types.UNPACK_OPTIONS, "ext_hook": self._ext}
        self._hooks: dict[int, Callable[[bytes], Any]] = {
            types.TUPLE: self._tuple, types.SET: self._set, types.FROZENSET: self._frozenset,
            types.BIGINT: lambda data: int.from_bytes(data, "little", signed=True), types.COMPLEX: self._complex,
            types.BYTEARRAY: bytearray, types.DEQUE: self._deque, types.RANGE: self._range,
            types.DEFAULTDICT: self._defaultdict, types.CHUNK: self._chunk, types.ARRAY: self._array,
            types.NUMPY_SCALAR: self._numpy_scalar, types.TENSOR: self._tensor, types.PICKLED: self._pickle,
            types.ROWS: self._rows}

    def next(self) -> Any:
        """The next value (its arrays filled)."""
        reader = self.reader
        if isinstance(reader, MemoryReader) and not self._ahead:  # at once: msgpack's unpackb starts sooner
            start = reader.offset
            try:
                value, ahead = msgpack.unpackb(reader.view[start:], **self._options), b""
            except msgpack.ExtraData as extra:  # the bytes after the tree: buffers (or the next value)
                value, ahead = extra.unpacked, extra.extra
            except (_CallerError, SnapshotError, _Corrupt, *_BROKEN):
                return self._streamed()  # the same, read as a stream, names what is wrong and where
            reader.offset = len(reader.view)
            self.position += len(reader.view) - start - len(ahead)
            self._fill(ahead)
            return value
        return self._streamed()

    def _streamed(self) -> Any:
        self._pending, self._pending_bytes = [], 0
        counting = _Counting(self._ahead, self.reader)
        left = max(self.limit - self.position, 1)
        unpacker = msgpack.Unpacker(counting, read_size=min(_READ_SIZE, left), max_buffer_size=left,
                                    **self._options)
        try:
            try:
                value = unpacker.unpack()
            except msgpack.OutOfData:
                raise _Corrupt("the data ends inside a value" if counting.count else
                               "the data ends where a value should start") from None
            tree = unpacker.tell()
            ahead = unpacker.read_bytes(counting.count - tree)  # what msgpack read past the tree
        except _CallerError as caller:
            raise caller.error from None
        except SnapshotError:
            raise
        except _Corrupt as error:
            raise self._corrupt(str(error), self.position + unpacker.tell()) from None
        except _BROKEN as error:
            raise self._corrupt(f"the value starting at byte {self.position} does not decode "
                                f"({type(error).__name__}: {error})", self.position + unpacker.tell()) from error
        self.position += tree
        self._fill(ahead)
        return value

    def _fill(self, ahead: bytes) -> None:
        """Read the bytes after the tree into the arrays and tensors it described, in order (``ahead``:
        those msgpack read already)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        head = memoryview(ahead)
        for target, size in pending:
            taken = min(size, len(head))
            target[:taken] = head[:taken]
            head = head[taken:]
            got = taken
            while got < size:
                count = self.reader.readinto(target[got:])
                if not count:
                    raise self._corrupt(f"the data ends inside the bytes of an array of {size} bytes "
                                        f"({got} read)", self.position + got)
                got += count
            self.position += size
        self._ahead = bytes(head)

    def _corrupt(self, message: str, offset: int) -> CorruptSnapshotError:
        return CorruptSnapshotError(message + _HINT, source=self._name, offset=offset)

    # ext values ------------------------------------------------------------------------------------

    def _ext(self, code: int, data: bytes) -> Any:
        handler = self._hooks.get(code)
        if handler is None:
            raise _Corrupt(f"a value of unknown ext type {code}")
        return handler(data)

    def _items(self, data: bytes, what: str) -> list[Any]:
        """The list an ext value's bytes hold (decoded by msgpack, with this decoder's ext types)."""
        if self._depth >= types.MAX_DEPTH:
            raise _Corrupt(f"a {what} nested deeper than {types.MAX_DEPTH} levels")
        self._depth += 1
        try:
            items = msgpack.unpackb(data, **self._options)
        finally:
            self._depth -= 1
        if type(items) is not list:
            raise _Corrupt(f"a {what} whose body is a {type(items).__name__}, not a list")
        return items

    def _fields(self, data: bytes, what: str, *kinds: Any) -> list[Any]:
        """The fields of a record (``kinds``: the type, or types, of each), checked exactly."""
        fields = self._items(data, what)
        if len(fields) != len(kinds) or not all(type(f) is k or (type(k) is tuple and type(f) in k)
                                                 for f, k in zip(fields, kinds)):
            raise _Corrupt(f"a {what} whose fields are {_shown(fields)}")
        return fields

    def _rows(self, data: bytes) -> list[tuple[Any, ...]]:
        body = self._items(data, "list of tuples")
        count, columns = (body[0], body[1:]) if body else (None, [])
        if type(count) is not int or not columns or not all(type(c) is list and len(c) == count for c in columns):
            raise _Corrupt(f"a list of tuples whose columns are not {_shown(count)} long lists")
        return list(zip(*columns))

    def _tuple(self, data: bytes) -> tuple[Any, ...]:
        return tuple(self._items(data, "tuple"))

    def _set(self, data: bytes) -> set[Any]:
        return set(self._hashable(self._items(data, "set"), "set member"))

    def _frozenset(self, data: bytes) -> frozenset[Any]:
        return frozenset(self._hashable(self._items(data, "frozenset"), "frozenset member"))

    @staticmethod
    def _hashable(items: list[Any], what: str) -> list[Any]:
        for item in items:
            try:
                hash(item)
            except TypeError:
                raise _Corrupt(f"a {what} of type {type(item).__name__}, which is not hashable") from None
        return items

    def _complex(self, data: bytes) -> complex:
        if len(data) != _COMPLEX.size:
            raise _Corrupt(f"a complex of {len(data)} bytes, not {_COMPLEX.size}")
        return complex(*_COMPLEX.unpack(data))

    def _deque(self, data: bytes) -> deque[Any]:
        items = self._items(data, "deque")
        maxlen = items[0] if items else "nothing"
        if not (maxlen is None or (type(maxlen) is int and maxlen >= 0)) or \
                (maxlen is not None and len(items) - 1 > maxlen):
            raise _Corrupt(f"a deque of {len(items) - 1} items whose maxlen is {_shown(maxlen)}")
        return deque(items[1:], maxlen)

    def _range(self, data: bytes) -> range:
        ends = self._items(data, "range")
        if len(ends) != 3 or any(type(end) is not int for end in ends) or ends[2] == 0:
            raise _Corrupt(f"a range of {_shown(ends)}, not three ints with a nonzero step")
        return range(*ends)

    def _defaultdict(self, data: bytes) -> defaultdict[Any, Any]:
        index, items = self._fields(data, "defaultdict", int, dict)
        if not 0 <= index < len(types.FACTORIES):
            raise _Corrupt(f"a defaultdict whose factory is number {index}, of {len(types.FACTORIES)} known")
        return defaultdict(types.FACTORIES[index], items)

    def _chunk(self, data: bytes) -> Any:
        from torch.utils.data.datapipes.datapipe import DataChunk  # a fixed class, never one the data names

        return DataChunk(self._items(data, "DataChunk"))

    def _pickle(self, data: bytes) -> Any:
        if len(data) != 8:
            raise _Corrupt(f"a pickled value's index of {len(data)} bytes, not 8")
        index = int.from_bytes(data, "little")
        if self._pickled is None:
            raise UntrustedStateError(f"the value stored pickled (number {index}) needs unpickling, which can run "
                                      "code from the file: trust it with a key or allow_pickle=True",
                                      source=self._name)
        try:
            return self._pickled(index)
        except Exception as error:
            raise _CallerError(error) from error

    # arrays and tensors ------------------------------------------------------------------------------

    def _shape(self, shape: Any, what: str) -> tuple[int, ...]:
        if type(shape) is not list or len(shape) > types.MAX_DIMS or not all(type(n) is int and n >= 0 for n in shape):
            raise _Corrupt(f"{what} of shape {_shown(shape)} (at most {types.MAX_DIMS} dimensions, each a count)")
        return tuple(shape)

    def _reserve(self, size: Any, expected: int, what: Callable[[], str]) -> None:
        """Refuse buffers whose size is not the one their shape needs, or that the data cannot hold."""
        if size != expected or type(size) is not int:
            raise _Corrupt(f"{what()} needs {expected} bytes, its descriptor says {_shown(size)}")
        if self._pending_bytes + size > self.limit - self.position:
            raise _Corrupt(f"{what()} of {size} bytes, more than the data holds")
        self._pending_bytes += size

    def _array(self, data: bytes) -> Any:
        import numpy

        known = self._descriptors.get(data)  # a buffer of samples: many arrays of one dtype and shape
        if known is None:
            known = self._descriptor(data)
            if len(self._descriptors) < 256:
                self._descriptors[data] = known
        dtype, shape, size = known
        self._reserve(size, size, lambda: f"an array of shape {shape} and dtype {dtype}")
        array = numpy.empty(shape, dtype)
        if size:
            flat: Any = array.reshape(-1).view(numpy.uint8)
            self._pending.append((memoryview(flat), size))
        return array

    def _descriptor(self, data: bytes) -> tuple[Any, tuple[int, ...], int]:
        """An array's dtype, shape and size in bytes, checked."""
        fields = self._items(data, "array")
        if len(fields) != 3:
            raise _Corrupt(f"an array whose descriptor is {_shown(fields)}")
        descr, shape, size = fields
        dtype = _dtype(descr, "an array")
        shape = self._shape(shape, "an array")
        count = types.elements(shape)
        if dtype.itemsize == 0 and count:
            raise _Corrupt(f"an array of shape {shape} whose dtype {dtype} has no bytes an element")
        if size != count * dtype.itemsize or type(size) is not int:
            raise _Corrupt(f"an array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
                           f"its descriptor says {_shown(size)}")
        return dtype, shape, size

    def _numpy_scalar(self, data: bytes) -> Any:
        descr, raw = self._fields(data, "numpy scalar", (str, list), bytes)
        dtype = _dtype(descr, "a numpy scalar")
        if len(raw) != dtype.itemsize:
            raise _Corrupt(f"a numpy scalar of dtype {dtype} with {len(raw)} bytes, not {dtype.itemsize}")
        return types.array_from(dtype, (), memoryview(raw))[()]

    def _tensor(self, data: bytes) -> Any:
        import torch

        name, shape, requires_grad, size = self._fields(data, "tensor", str, list, bool, int)
        dtype = types.torch_dtypes().get(name)
        if dtype is None:
            raise _Corrupt(f"a tensor of dtype {name!r:.40}, which is not in the codec's table "
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


def _dtype(descr: Any, what: str) -> Any:
    """The dtype a checked description names (those met are kept: a buffer holds many arrays of one)."""
    dtype = _DTYPES.get(descr) if type(descr) is str else None
    if dtype is not None:
        return dtype
    try:
        dtype = types.dtype_of(descr) if types.is_descr(descr) else None
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise _Corrupt(f"{what} whose dtype {_shown(descr)} is not one numpy rebuilds as data ({error})") from None
    if dtype is None:
        raise _Corrupt(f"{what} whose dtype description {_shown(descr)} is not one of plain data (numbers, bytes, "
                       "text, times, or fields of them such as [('x', '<f8')]: never Python objects)")
    if type(descr) is str and len(_DTYPES) < 1024:
        _DTYPES[descr] = dtype
    return dtype


_DTYPES: dict[str, Any] = {}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode(data: bytes | bytearray | memoryview, *, pickled: Callable[[int], Any] | None = None,
           source: str = "<payload>") -> Any:
    """The one value that ``data`` holds (bytes after it are an error: a payload is exact).

    ``pickled(index)`` returns each value stored pickled (the encoder's ``pickled[index]``); without it
    a pickled value raises :class:`~snapshot.errors.UntrustedStateError`.
    """
    decoder = Decoder(data, pickled=pickled, name=source)
    try:
        value = decoder.next()
        left = decoder.limit - decoder.position
        if left:
            raise decoder._corrupt(f"{left} bytes follow the value, which ends here", decoder.position)
    finally:
        reader = decoder.reader
        if isinstance(reader, MemoryReader):
            reader.view.release()  # a memory map can close when decode returns, even after an error
    return value
