"""The encoding half of ``snapshot.container._codec`` (the format and what is data are described there).

The encoder writes as it walks: small values gather in a buffer handed to ``write`` every
64 KiB, and a big ``bytes``, array or tensor payload is handed to ``write`` from the object's
own memory, so encoding a large state to a file holds no second copy of it.
"""

from __future__ import annotations

import sys
from collections import defaultdict, deque
from collections.abc import Callable
from gc import is_tracked
from typing import Any

from snapshot.container._codec_types import (
    ARRAY,
    BYTEARRAY,
    BYTES,
    CHUNK,
    COMPLEX,
    DEFAULTDICT,
    DEQUE,
    DICT,
    DOUBLE,
    FACTORIES,
    FALSE,
    FLOAT,
    FROZENSET,
    INT,
    LIST,
    MAX_DEPTH,
    NONE,
    NUMPY_SCALAR,
    PICKLED,
    RANGE,
    SET,
    SHARED_STR,
    STR,
    STR_REF,
    TENSOR,
    TRUE,
    TUPLE,
    TWO_DOUBLES,
    array_descr,
    int_bytes,
    length,
    numpy_module,
    scalar_descr,
    shape_bytes,
    torch_dtype_names,
)

__all__ = ["Encoder"]

_FLUSH_AT = 64 * 1024  # the buffer of small values is handed to ``write`` when it holds this much
_OWN_WRITE = 16 * 1024  # a payload this big is handed to ``write`` from its own memory, uncopied
_ITEMS = {list: LIST, tuple: TUPLE, set: SET, frozenset: FROZENSET}
_NESTS = (list, tuple, dict, deque)  # the containers that can be part of a cycle
_LENGTHS = [length(n) for n in range(253)]
_INT64 = 2**63
_INT_HEADS = [INT + length(n) for n in range(10)]
_SMALL_INTS = {n: INT + length(len(int_bytes(n))) + int_bytes(n) for n in range(-128, 1024)}

Handler = Callable[[Any, int], None]


class Encoder:
    """Writes values through ``write`` as they are encoded; one :meth:`encode` call a value.

    ``pickled`` gathers ``(where, value)`` for each value that is not data, in order;
    ``written`` counts the bytes handed to ``write`` (each :meth:`encode` call hands over all
    it encoded before it returns, so the difference around a call is the size of its value).
    ``measure`` maps the ``id`` of values held in dicts to labels: the encoded size of each such
    value is put in ``sizes`` under each of its labels, as it is written (no second pass).

    A big payload reaches ``write`` as a view of the value's own memory: a ``write`` that keeps
    what it is given (a queue, a list) must be done with it before the value changes. After an
    exception (from ``write``, say) the stream is incomplete and the encoder is not to be reused.
    """

    def __init__(self, write: Callable[[bytes | memoryview], Any],
                 measure: dict[int, tuple[Any, ...]] | None = None) -> None:
        self.pickled: list[tuple[str, Any]] = []
        self.written = 0
        self.sizes: dict[Any, int] = {}
        self._measure = measure or {}
        self._write = write
        self._buffer = bytearray()
        self._root = ""
        self._path: list[list[Any]] = []  # [kind, index or key] for each container entered
        self._cyclic: set[int] = set()
        self._strings: dict[str, int] = {}  # long strs written so far, by their index (see STR_REF)
        self._handlers: dict[type, Handler] = {
            type(None): self._none, bool: self._bool, int: self._int, float: self._float, complex: self._complex,
            str: self._str, bytes: self._bytes, bytearray: self._bytes, list: self._items, tuple: self._items,
            set: self._items, frozenset: self._items, dict: self._dict, deque: self._deque, range: self._range,
        }

    def encode(self, value: Any, where: str = "state") -> None:
        """Append ``value`` to the stream; ``where`` names it in ``pickled`` (``state.nodes``)."""
        self._root = where
        self._cyclic = _cycles(value)
        try:
            self._handler(value)(value, 0)
        finally:
            self._path.clear()
            self._cyclic = set()
        self._flush()

    # plumbing --------------------------------------------------------------------------------------

    def _handler(self, value: Any) -> Handler:
        kind = type(value)
        handler = self._handlers.get(kind)
        if handler is None:
            handler = self._handlers[kind] = self._classify(kind)
        return handler

    def _classify(self, kind: type) -> Handler:
        numpy = numpy_module()
        if numpy is not None and kind is numpy.ndarray:
            return self._array
        if numpy is not None and issubclass(kind, numpy.generic):
            return self._numpy_scalar
        torch = sys.modules.get("torch")
        if torch is not None and kind is torch.Tensor:
            return self._tensor
        if torch is not None and kind is _data_chunk():
            return lambda value, depth: _chunk(self, value, depth)
        if kind is defaultdict:
            return lambda value, depth: _defaultdict(self, value, depth)
        return self._pickle

    def _small(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) >= _FLUSH_AT:
            self._flush()

    def _payload(self, header: bytes, data: bytes | memoryview) -> None:
        """``header`` then ``data``; a big ``data`` goes to ``write`` as it is, not copied."""
        self._buffer += header
        if len(data) < _OWN_WRITE:
            self._small(data)  # type: ignore[arg-type]
            return
        self._flush()
        self._write(data)
        self.written += len(data)

    def _flush(self) -> None:
        if self._buffer:
            buffer, self._buffer = self._buffer, bytearray()
            self._write(memoryview(buffer))  # not copied: this encoder never touches it again
            self.written += len(buffer)

    def _where(self) -> str:
        parts = [self._root]
        for kind, step in self._path:
            if kind == "value":
                parts.append(f".{step}" if type(step) is str and step.isidentifier() else f"[{_short_repr(step)}]")
            else:
                parts.append({"item": "[{}]", "member": "{{{}}}", "key": ".keys()[{}]"}[kind].format(step))
        return "".join(parts)

    # values ----------------------------------------------------------------------------------------

    def _pickle(self, value: Any, depth: int = 0) -> None:
        where = self._where()
        self._small(PICKLED + length(len(self.pickled)) + _str_bytes(where))
        self.pickled.append((where, value))

    def _none(self, value: None, depth: int) -> None:
        self._buffer += NONE

    def _bool(self, value: bool, depth: int) -> None:
        self._buffer += TRUE if value else FALSE

    def _int(self, value: int, depth: int) -> None:
        data = _SMALL_INTS.get(value)
        if data is not None:
            self._buffer += data
        elif -_INT64 <= value < _INT64:  # the common case inline: one length byte, at most 8 bytes
            size = value.bit_length() // 8 + 1
            self._buffer += _INT_HEADS[size]
            self._buffer += value.to_bytes(size, "little", signed=True)
        else:
            data = int_bytes(value)
            self._payload(INT + length(len(data)), data)

    def _float(self, value: float, depth: int) -> None:
        self._buffer += FLOAT
        self._buffer += DOUBLE.pack(value)

    def _complex(self, value: complex, depth: int) -> None:
        self._small(COMPLEX + TWO_DOUBLES.pack(value.real, value.imag))

    def _str(self, value: str, depth: int) -> None:
        if len(value) >= SHARED_STR:
            seen = self._strings.get(value)
            if seen is not None:
                self._small(STR_REF + length(seen))
                return
            self._strings[value] = len(self._strings)
        data = value.encode("utf-8", "surrogatepass")
        if len(data) < 253:
            self._buffer += STR
            self._buffer += _LENGTHS[len(data)]
            self._buffer += data
        else:
            self._payload(STR + length(len(data)), data)

    def _bytes(self, value: bytes | bytearray, depth: int) -> None:
        tag = BYTES if type(value) is bytes else BYTEARRAY
        self._payload(tag + length(len(value)), value if type(value) is bytes else memoryview(value))

    def _range(self, value: range, depth: int) -> None:
        self._small(RANGE)
        for end in (value.start, value.stop, value.step):
            self._int(end, depth)

    def _items(self, value: list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any], depth: int) -> None:
        if depth >= MAX_DEPTH or id(value) in self._cyclic:
            self._pickle(value)
            return
        self._small(_ITEMS[type(value)] + length(len(value)))
        self._each(value, depth, "member" if type(value) in (set, frozenset) else "item")

    def _deque(self, value: deque[Any], depth: int) -> None:
        if depth >= MAX_DEPTH or id(value) in self._cyclic:
            self._pickle(value)
            return
        self._small(DEQUE)
        if value.maxlen is None:
            self._none(None, depth)
        else:
            self._int(value.maxlen, depth)
        self._small(length(len(value)))
        self._each(value, depth, "item")

    def _each(self, items: Any, depth: int, kind: str) -> None:
        step = [kind, 0]
        self._path.append(step)
        handlers = self._handlers
        for index, item in enumerate(items):
            step[1] = index
            (handlers.get(type(item)) or self._handler(item))(item, depth + 1)
            if len(self._buffer) >= _FLUSH_AT:
                self._flush()
        self._path.pop()

    def _dict(self, value: dict[Any, Any], depth: int) -> None:
        if depth >= MAX_DEPTH or id(value) in self._cyclic:
            self._pickle(value)
            return
        self._small(DICT + length(len(value)))
        measure = self._measure
        step: list[Any] = ["key", 0]
        self._path.append(step)
        handlers = self._handlers
        for index, (key, item) in enumerate(value.items()):
            step[0], step[1] = "key", index
            (handlers.get(type(key)) or self._handler(key))(key, depth + 1)
            step[0], step[1] = "value", key
            labels = measure.get(id(item)) if measure else None
            start = self.written + len(self._buffer) if labels else 0
            (handlers.get(type(item)) or self._handler(item))(item, depth + 1)
            for label in labels or ():
                self.sizes[label] = self.written + len(self._buffer) - start
            if len(self._buffer) >= _FLUSH_AT:
                self._flush()
        self._path.pop()

    def _array(self, value: Any, depth: int) -> None:
        descr = array_descr(value.dtype)
        if descr is None or (value.dtype.itemsize == 0 and value.size):
            self._pickle(value)
            return
        self._array_body(ARRAY, descr, value)

    def _numpy_scalar(self, value: Any, depth: int) -> None:
        array = numpy_module().asarray(value)
        descr = scalar_descr(array.dtype) if type(value) is array.dtype.type else None
        if descr is None:
            self._pickle(value)
            return
        self._array_body(NUMPY_SCALAR, descr, array)

    def _array_body(self, tag: bytes, descr: str | list[Any], array: Any) -> None:
        numpy = numpy_module()
        flat = numpy.ascontiguousarray(array).reshape(-1)
        data = memoryview(flat.view(numpy.uint8)) if flat.nbytes else b""
        self._small(tag)
        self._handler(descr)(descr, 0)
        self._payload(shape_bytes(array.shape) + length(flat.nbytes), data)

    def _tensor(self, value: Any, depth: int) -> None:
        torch = sys.modules["torch"]
        name = torch_dtype_names().get(value.dtype)
        if (name is None or value.layout is not torch.strided or value.device.type != "cpu" or value.is_nested
                or any(getattr(value, "names", ())) or value.__dict__):
            self._pickle(value)
            return
        data: bytes | memoryview = b""
        try:
            if value.numel():
                flat = value.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
                data = memoryview(flat.numpy())
        except RuntimeError:  # a dtype that some operation here does not support yet: pickle can still save it
            self._pickle(value)
            return
        header = (TENSOR + length(len(name)) + name.encode("ascii") + shape_bytes(tuple(value.shape))
                  + (b"\x01" if value.requires_grad else b"\x00") + length(len(data)))
        self._payload(header, data)


def _cycles(value: Any) -> set[int]:
    """The ids of the containers in ``value`` that a depth-first walk finds inside themselves
    (each cycle has one: the first of its containers the walk enters).

    The walk enters only what the encoder enters, and skips what cannot be on a cycle: sets and
    dict keys (hashable values cannot reach back to a list or a dict), classes the encoder
    pickles whole, and containers the garbage collector does not track (CPython untracks a
    dict or a tuple that holds only atomic values, and an untracked object is on no cycle).
    """
    found: set[int] = set()
    entered: set[int] = set()
    done: set[int] = set()

    def walk(node: Any, depth: int) -> None:
        key = id(node)
        entered.add(key)
        for child in node.values() if type(node) is dict else node:
            if type(child) in _NESTS and is_tracked(child):
                if id(child) in entered:
                    found.add(id(child))
                elif id(child) not in done and depth < MAX_DEPTH:
                    walk(child, depth + 1)
        entered.discard(key)
        done.add(key)

    if type(value) in _NESTS and is_tracked(value):
        walk(value, 0)
    return found


def _short_repr(key: Any) -> str:
    try:
        text = repr(key)
    except Exception:  # noqa: BLE001 - a key of a class whose __repr__ fails still needs a name
        return f"<{type(key).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _str_bytes(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return STR + length(len(data)) + data


def _data_chunk() -> type:
    """torch's ``DataChunk`` (imported only once torch is: the codec does not import torch itself)."""
    from torch.utils.data.datapipes.datapipe import DataChunk

    chunk: type = DataChunk
    return chunk


def _same_items(items: Any, chunk: list[Any]) -> bool:
    """Whether ``items`` holds the chunk's own items (the same objects; equal numbers and strings after a
    pickle round trip between processes, which copies them)."""
    return type(items) is list and len(items) == len(chunk) and all(
        a is b or (type(a) is type(b) and type(a) in _ATOMS and a == b) for a, b in zip(items, chunk))


_ATOMS = (int, float, complex, str, bytes)


def _chunk(encoder: Encoder, value: list[Any], depth: int) -> None:
    # torch keeps the items twice (the list, and ``.items``): the copy is rebuilt, anything else is not data
    extra = vars(value)
    if depth >= MAX_DEPTH or set(extra) - {"items"} or not _same_items(extra.get("items", value), value):
        encoder._pickle(value)
        return
    encoder._small(CHUNK + length(len(value)))
    encoder._each(value, depth, "item")


def _defaultdict(encoder: Encoder, value: defaultdict[Any, Any], depth: int) -> None:
    factory = value.default_factory
    if depth >= MAX_DEPTH or not any(factory is known for known in FACTORIES):
        encoder._pickle(value)
        return
    encoder._small(DEFAULTDICT + length(next(i for i, known in enumerate(FACTORIES) if factory is known)))
    encoder._dict(dict(value), depth)
