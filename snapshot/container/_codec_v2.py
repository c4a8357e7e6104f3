"""Format 2's data encoding, read only (files written by snapshot 0.2; format 3 encodes with msgpack, see
:mod:`snapshot.container._codec`).

Each value is a tag byte followed by lengths and bytes (``len`` is one byte below 253, or 0xFE + 4 bytes,
or 0xFF + 8, little-endian): ``N`` None, ``T``/``F`` booleans, ``i`` int (``len`` + signed little-endian
bytes), ``d`` float (8 bytes), ``j`` complex (16), ``s`` str (``len`` + UTF-8, ``surrogatepass``), ``r`` a
reference to an earlier str of at least 4 characters (its index), ``b``/``B`` bytes and bytearray, ``l``
``t`` ``S`` ``Z`` list, tuple, set, frozenset (``len`` + items), ``D`` dict (``len`` + key, value, ...),
``Q`` deque (maxlen, ``len``, items), ``R`` range (three ``i``), ``C`` torch's ``DataChunk`` (as ``l``),
``E`` defaultdict (its factory's index in ``FACTORIES``, then a ``D``), ``A`` numpy array (dtype
description, ndim byte, dims, ``len`` + bytes), ``G`` numpy scalar (as ``A`` without dims), ``X`` tensor
(dtype name from a fixed table, ndim and dims, requires_grad byte, ``len`` + bytes), ``P`` a value saved
pickled (its index, and its place as ``s``).

The decoder builds only the types of this tag table: it never imports a module, looks up an
attribute or calls anything that the bytes name. A numpy dtype is rebuilt from a checked
description of strings and integers (no objects), a torch dtype is looked up by name in the
codec's own table, and a ``P`` tag is handed to the caller's ``pickled`` callback or refused.
Every malformed input raises :class:`~snapshot.errors.CorruptSnapshotError` with its offset.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from snapshot.container import _codec_types as types
from snapshot.errors import CorruptSnapshotError, SnapshotError, UntrustedStateError

__all__ = ["Decoder", "decode"]


# Format 2's tags (letters, so that a hex dump reads) and framing.
NONE, TRUE, FALSE = b"N", b"T", b"F"
INT, FLOAT, COMPLEX = b"i", b"d", b"j"
STR, BYTES, BYTEARRAY = b"s", b"b", b"B"
LIST, TUPLE, DICT, SET, FROZENSET, DEQUE, RANGE = b"l", b"t", b"D", b"S", b"Z", b"Q", b"R"
ARRAY, NUMPY_SCALAR, TENSOR = b"A", b"G", b"X"
PICKLED, CHUNK, DEFAULTDICT, STR_REF = b"P", b"C", b"E", b"r"
SHARED_STR = 4  # a str of at least this many characters is remembered, for STR_REF
DOUBLE, TWO_DOUBLES = struct.Struct("<d"), struct.Struct("<dd")
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


def read_length(data: memoryview, offset: int) -> tuple[int, int]:
    """The length framed at ``offset`` and the offset after it."""
    first = data[offset]
    if first < 253:
        return first, offset + 1
    if first == 254:
        return _U32.unpack_from(data, offset + 1)[0], offset + 5
    if first == 255:
        return _U64.unpack_from(data, offset + 1)[0], offset + 9
    raise ValueError("a length marker byte 253 (reserved)")

# What a broken payload can make Python raise on its way through the decoder; each becomes a
# CorruptSnapshotError (the specific checks below give the better messages first).
_BROKEN = (IndexError, KeyError, ValueError, TypeError, OverflowError, struct.error, RuntimeError,
           MemoryError, RecursionError, SyntaxError)
_HINT = "; the payload is damaged or was not written by this version of snapshot"


class _CallerError(Exception):
    """Carries an exception of the caller's ``pickled`` callback past the decoder's wrapping."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Decoder:
    """Decodes the values of ``data`` one after another (:meth:`next`); ``offset`` is where the
    next one starts. ``pickled(index, where)`` supplies each value stored pickled; without it,
    meeting one raises :class:`~snapshot.errors.UntrustedStateError`."""

    def __init__(self, data: bytes | bytearray | memoryview, *,
                 pickled: Callable[[int, str], Any] | None = None, source: str = "<payload>") -> None:
        view = memoryview(data)
        self._data = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self._end = len(self._data)
        self.offset = 0
        self._pickled = pickled
        self._source = source
        self._in_descr = False
        self._strings: list[str] = []  # long strs read so far (see STR_REF)

    def next(self) -> Any:
        """The value at ``offset``, which moves past it."""
        start = self.offset
        try:
            return self._handler()(self, 0)
        except _CallerError as caller:
            raise caller.error from None
        except SnapshotError:
            raise
        except _BROKEN as error:
            raise self._corrupt(f"the value starting at byte {start} does not decode "
                                f"({type(error).__name__}: {error})") from error

    # plumbing --------------------------------------------------------------------------------------

    def _corrupt(self, message: str) -> CorruptSnapshotError:
        return CorruptSnapshotError(message + _HINT, source=self._source, offset=self.offset)

    def _handler(self) -> Callable[[Decoder, int], Any]:
        """The reader of the value at ``offset``, past its tag."""
        try:
            handler = _HANDLERS[self._data[self.offset]]
        except IndexError:
            raise self._corrupt("the buffer ends where a value should start") from None
        except KeyError:
            raise self._corrupt(f"unknown tag byte 0x{self._data[self.offset]:02x}") from None
        self.offset += 1
        return handler

    def _length(self, what: str) -> int:
        if self.offset < self._end and self._data[self.offset] < 253:  # the common case: one byte
            self.offset += 1
            return self._data[self.offset - 1]
        try:
            value, self.offset = read_length(self._data, self.offset)
        except (IndexError, struct.error):
            raise self._corrupt(f"the buffer ends inside the length of {what}") from None
        except ValueError as error:
            raise self._corrupt(f"the length of {what} is malformed ({error})") from None
        return value

    def _take(self, size: int, what: str) -> memoryview:
        if size > self._end - self.offset:
            raise self._corrupt(f"{what} of {size} bytes runs past the end of the buffer "
                                f"({self._end - self.offset} bytes left)")
        data = self._data[self.offset:self.offset + size]
        self.offset += size
        return data

    def _sized(self, what: str) -> memoryview:
        """The bytes after a length (in one step when the length is one byte, the common case)."""
        offset = self.offset
        if offset < self._end and (size := self._data[offset]) < 253 and offset + 1 + size <= self._end:
            self.offset = offset + 1 + size
            return self._data[offset + 1:self.offset]
        return self._take(self._length(what), what)

    def _count(self, depth: int, what: str) -> int:
        """The number of items of a container; each takes a byte at least."""
        if depth >= types.V2_MAX_DEPTH:
            raise self._corrupt(f"a {what} nested deeper than {types.V2_MAX_DEPTH} levels")
        count = self._length(what)
        if count > self._end - self.offset:
            raise self._corrupt(f"a {what} of {count} items is longer than the rest of the buffer")
        return count

    # values ----------------------------------------------------------------------------------------

    def _int(self, depth: int) -> int:
        return int.from_bytes(self._sized("an int"), "little", signed=True)

    def _float(self, depth: int) -> float:
        value: float = DOUBLE.unpack(self._take(8, "a float"))[0]
        return value

    def _complex(self, depth: int) -> complex:
        real, imag = TWO_DOUBLES.unpack(self._take(16, "a complex"))
        return complex(real, imag)

    def _str(self, depth: int) -> str:
        data = self._sized("a str")
        try:
            return str(data, "utf-8", "surrogatepass")
        except UnicodeDecodeError as error:
            self.offset -= len(data)
            raise self._corrupt(f"a str that is not UTF-8 ({error.reason} at its byte {error.start})") from None

    def _bytes(self, depth: int) -> bytes:
        return bytes(self._sized("a bytes"))

    def _bytearray(self, depth: int) -> bytearray:
        return bytearray(self._sized("a bytearray"))

    def _items(self, depth: int, what: str) -> list[Any]:
        items = []
        for _ in range(self._count(depth, what)):
            items.append(self._handler()(self, depth + 1))
        return items

    def _list(self, depth: int) -> list[Any]:
        return self._items(depth, "list")

    def _tuple(self, depth: int) -> tuple[Any, ...]:
        return tuple(self._items(depth, "tuple"))

    def _set(self, depth: int) -> set[Any]:
        return self._members(depth, "set")

    def _frozenset(self, depth: int) -> frozenset[Any]:
        return frozenset(self._members(depth, "frozenset"))

    def _members(self, depth: int, what: str) -> set[Any]:
        members = set()
        for _ in range(self._count(depth, what)):
            at = self.offset
            members.add(self._hashable(self._handler()(self, depth + 1), f"a {what} member", at))
        return members

    def _dict(self, depth: int) -> dict[Any, Any]:
        items = {}
        for _ in range(self._count(depth, "dict")):
            at = self.offset
            key = self._hashable(self._handler()(self, depth + 1), "a dict key", at)
            items[key] = self._handler()(self, depth + 1)
        return items

    def _hashable(self, value: Any, what: str, at: int) -> Any:
        try:
            hash(value)
        except TypeError:
            self.offset = at
            raise self._corrupt(f"{what} of type {type(value).__name__}, which is not hashable") from None
        return value

    def _deque(self, depth: int) -> deque[Any]:
        at = self.offset
        maxlen = self._handler()(self, depth + 1)
        if not (maxlen is None or (type(maxlen) is int and maxlen >= 0)):
            self.offset = at
            raise self._corrupt(f"a deque whose maxlen is {maxlen!r:.40}, not None or a count")
        items = self._items(depth, "deque")
        if maxlen is not None and len(items) > maxlen:
            raise self._corrupt(f"a deque of {len(items)} items with maxlen {maxlen}")
        return deque(items, maxlen)

    def _range(self, depth: int) -> range:
        at = self.offset
        ends = [self._handler()(self, depth + 1) for _ in range(3)]
        if any(type(end) is not int for end in ends) or ends[2] == 0:
            self.offset = at
            raise self._corrupt(f"a range of {ends!r:.60}, not three ints with a nonzero step")
        return range(*ends)

    def _pickle(self, depth: int) -> Any:
        index = self._length("a pickled value's index")
        if self._data[self.offset:self.offset + 1] != STR:
            raise self._corrupt("a pickled value's place is not a str")
        self.offset += 1
        where = self._str(depth)
        if self._in_descr:
            raise self._corrupt(f"an array's dtype description holds a pickled value ({where})")
        if self._pickled is None:
            raise _untrusted(where, self._source)
        try:
            return self._pickled(index, where)
        except Exception as error:
            raise _CallerError(error) from error

    def _array(self, depth: int) -> Any:
        return self._array_body("an array", scalar=False)

    def _numpy_scalar(self, depth: int) -> Any:
        return self._array_body("a numpy scalar", scalar=True)[()]

    def _array_body(self, what: str, *, scalar: bool) -> Any:
        at = self.offset
        if self._in_descr:
            raise self._corrupt(f"an array's dtype description holds {what}")
        self._in_descr = True
        try:
            descr = self._handler()(self, types.V2_MAX_DEPTH - 32)
        finally:
            self._in_descr = False
        try:
            dtype = types.dtype_of(descr) if types.is_descr(descr) else None
        except (TypeError, ValueError, KeyError, IndexError) as error:
            self.offset = at
            raise self._corrupt(f"{what} whose dtype {descr!r:.80} is not one numpy rebuilds as data ({error})") \
                from None
        if dtype is None:
            self.offset = at
            raise self._corrupt(f"{what} whose dtype description {descr!r:.80} is not one of plain data (numbers, "
                                "bytes, text, times, or fields of them such as [('x', '<f8')]: never Python objects)")
        shape = self._shape(what)
        if scalar and shape:
            raise self._corrupt(f"{what} with dimensions {shape}")
        if dtype.itemsize == 0 and types.elements(shape):
            raise self._corrupt(f"{what} of shape {shape} whose dtype {dtype} has no bytes an element")
        data = self._payload(what, types.elements(shape) * dtype.itemsize, f"{shape} of dtype {dtype}")
        return types.array_from(dtype, shape, data)

    def _shape(self, what: str) -> tuple[int, ...]:
        ndim = self._take(1, f"the dimensions of {what}")[0]
        if ndim > types.MAX_DIMS:
            self.offset -= 1
            raise self._corrupt(f"{what} of {ndim} dimensions (at most {types.MAX_DIMS})")
        return tuple(self._length(f"a dimension of {what}") for _ in range(ndim))

    def _payload(self, what: str, expected: int, described: str) -> memoryview:
        at = self.offset
        size = self._length(f"the bytes of {what}")
        if size != expected:
            self.offset = at
            raise self._corrupt(f"{what} of shape {described} needs {expected} bytes, its payload has {size}")
        return self._take(size, f"the bytes of {what}")

    def _tensor(self, depth: int) -> Any:
        if self._in_descr:
            raise self._corrupt("an array's dtype description holds a tensor")
        at = self.offset
        name = str(self._sized("a tensor's dtype"), "ascii", "replace")
        dtype = types.torch_dtypes().get(name)
        if dtype is None:
            self.offset = at
            raise self._corrupt(f"a tensor of dtype {name!r:.40}, which is not in the codec's table "
                                f"({', '.join(types.torch_dtypes())})")
        shape = self._shape("a tensor")
        flag = self._take(1, "a tensor's requires_grad")[0]
        if flag > 1:
            self.offset -= 1
            raise self._corrupt(f"a tensor's requires_grad byte is {flag}, not 0 or 1")
        data = self._payload("a tensor", types.elements(shape) * dtype.itemsize, f"{list(shape)} of dtype {name}")
        return types.tensor_from(dtype, shape, data, requires_grad=flag == 1)


def _chunk(decoder: Decoder, depth: int) -> Any:
    from torch.utils.data.datapipes.datapipe import DataChunk  # a fixed class, never one the data names

    return DataChunk(decoder._items(depth, "DataChunk"))


def _defaultdict(decoder: Decoder, depth: int) -> defaultdict[Any, Any]:
    at = decoder.offset
    index = decoder._length("a defaultdict's factory")
    if index >= len(types.FACTORIES):
        decoder.offset = at
        raise decoder._corrupt(f"a defaultdict whose factory is number {index}, of {len(types.FACTORIES)} known")
    if decoder._data[decoder.offset:decoder.offset + 1] != DICT:
        raise decoder._corrupt("a defaultdict whose items are not a dict")
    decoder.offset += 1
    return defaultdict(types.FACTORIES[index], decoder._dict(depth))


def _untrusted(where: str, source: str) -> UntrustedStateError:
    shown = where if where.isprintable() else repr(where)
    return UntrustedStateError(f"{shown} is stored pickled (not data), and unpickling it can run code from the file: "
                               "trust it with a key or allow_pickle=True", source=source, where=where)


def _string(decoder: Decoder, depth: int) -> str:
    text = decoder._str(depth)
    if len(text) >= SHARED_STR:
        decoder._strings.append(text)
    return text


def _string_ref(decoder: Decoder, depth: int) -> str:
    at = decoder.offset
    index = decoder._length("a reference to an earlier str")
    if index >= len(decoder._strings):
        decoder.offset = at
        raise decoder._corrupt(f"a reference to str number {index}, of {len(decoder._strings)} read so far")
    return decoder._strings[index]


# The reader of each tag (functions, not bound methods: a decoder holds no cycle, so the buffer it
# reads is let go as soon as the decoder is).
_HANDLERS: dict[int, Callable[[Decoder, int], Any]] = {tag[0]: handler for tag, handler in (
    (NONE, lambda decoder, depth: None), (TRUE, lambda decoder, depth: True),
    (FALSE, lambda decoder, depth: False),
    (INT, Decoder._int), (FLOAT, Decoder._float), (COMPLEX, Decoder._complex),
    (STR, _string), (BYTES, Decoder._bytes), (BYTEARRAY, Decoder._bytearray),
    (LIST, Decoder._list), (TUPLE, Decoder._tuple), (SET, Decoder._set),
    (FROZENSET, Decoder._frozenset), (DICT, Decoder._dict), (DEQUE, Decoder._deque),
    (RANGE, Decoder._range), (ARRAY, Decoder._array), (NUMPY_SCALAR, Decoder._numpy_scalar),
    (TENSOR, Decoder._tensor), (PICKLED, Decoder._pickle), (CHUNK, _chunk),
    (DEFAULTDICT, _defaultdict), (STR_REF, _string_ref),
)}


def decode(data: bytes | bytearray | memoryview, *, pickled: Callable[[int, str], Any] | None = None,
           source: str = "<payload>") -> Any:
    """The one value that ``data`` holds (bytes after it are an error: a payload is exact).

    ``pickled(index, where)`` returns each value stored pickled (``Encoder.pickled[index]``);
    without it a pickled value raises :class:`~snapshot.errors.UntrustedStateError`.
    """
    decoder = Decoder(data, pickled=pickled, source=source)
    try:
        value = decoder.next()
        if decoder.offset != decoder._end:
            raise decoder._corrupt(f"{decoder._end - decoder.offset} bytes follow the value, which ends here")
    finally:
        decoder._data.release()  # a memory map can close when decode returns, even after an error
    return value
