"""The decoding half of :mod:`snapshot.container._codec` (the format is described there).

msgpack's C unpacker reads the tree as it comes (from a file, a chunk at a time: the tree is never held
whole), with exact limits; a small tree in memory is first offered to msgspec's C decoder
(:mod:`~snapshot.container._codec_native`), taken only where its result is exactly msgpack's. The ``ext_hook``
builds only the types of the codec's ext table, from checked fields: it never imports a module, looks up an
attribute or calls anything that the bytes name. An array or a tensor is allocated when its descriptor is read
(never more bytes than the data holds) and filled from the bytes after the tree, read straight into its memory
(or copied from the data in memory where it is): decoding holds one copy of the state. Every malformed input
raises :class:`~snapshot.errors.CorruptSnapshotError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from snapshot.container import _codec_native
from snapshot.container import _codec_types as types
from snapshot.container._codec_exts import CallerError, Corrupt, ExtValues
from snapshot.errors import CorruptSnapshotError, SnapshotError

__all__ = ["Decoder", "MemoryReader", "Reader", "decode"]

#: Bytes msgpack reads at a time from a file.
_READ_SIZE = 256 * 1024
# What a broken payload can make Python or msgpack raise on its way through the decoder; each becomes a
# CorruptSnapshotError (msgpack's own errors are ValueErrors).
_BROKEN = (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, RuntimeError, MemoryError,
           RecursionError)
_HINT = "; the payload is damaged or was not written by this version of snapshot"
#: :func:`decode` takes a value of at most this many bytes in one call of msgpack (which copies the bytes after
#: the tree); a bigger one is read as a stream, its arrays filled from the data itself.
_AT_ONCE = 1 << 20
_AGAIN = object()  # what _at_once returns for a value to decode again as a stream


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


class Decoder(ExtValues):
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
        self._descriptors: dict[bytes, tuple[Any, tuple[int, ...], int, Any]] = {}

    def next(self) -> Any:
        """The next value (its arrays filled)."""
        self._pending, self._pending_bytes = [], 0
        counting = _Counting(self._ahead, self.reader)
        left = max(self.limit - self.position, 1)
        unpacker = msgpack.Unpacker(counting, read_size=min(_READ_SIZE, left), max_buffer_size=left,
                                    ext_hook=self._ext, **types.UNPACK_OPTIONS)
        try:
            try:
                value = unpacker.unpack()
            except msgpack.OutOfData:
                raise Corrupt("the data ends inside a value" if counting.count else
                               "the data ends where a value should start") from None
            tree = unpacker.tell()
            ahead = unpacker.read_bytes(counting.count - tree)  # what msgpack read past the tree
        except CallerError as caller:
            raise caller.error from None
        except SnapshotError:
            raise
        except Corrupt as error:
            raise self._corrupt(str(error), self.position + unpacker.tell()) from None
        except _BROKEN as error:
            raise self._corrupt(f"the value starting at byte {self.position} does not decode "
                                f"({type(error).__name__}: {error})", self.position + unpacker.tell()) from error
        self.position += tree
        self._fill(ahead)
        return value

    def _fill(self, ahead: bytes) -> None:
        """Read the bytes after the tree into the arrays and tensors it described, in order (``ahead``:
        those msgpack read already; then bytes in memory are copied from where they are)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        head, used = memoryview(ahead), 0
        memory = self.reader if isinstance(self.reader, MemoryReader) else None
        view, held = (memory.view, len(memory.view)) if memory is not None else (None, 0)
        for target, size in pending:
            got = 0
            if used < len(head):
                got = min(size, len(head) - used)
                target[:got] = head[used:used + got]
                used += got
            if got < size and memory is not None and memory.offset + size - got <= held:
                start = memory.offset
                memory.offset = end = start + size - got
                target[got:] = view[start:end]  # type: ignore[index]
                got = size
            while got < size:
                count = self.reader.readinto(target[got:])
                if not count:
                    raise self._corrupt(f"the data ends inside the bytes of an array of {size} bytes "
                                        f"({got} read)", self.position + got)
                got += count
            self.position += size
        self._ahead = bytes(head[used:])

    def _corrupt(self, message: str, offset: int) -> CorruptSnapshotError:
        return CorruptSnapshotError(message + _HINT, source=self._name, offset=offset)


def decode(data: bytes | bytearray | memoryview, *, pickled: Callable[[int], Any] | None = None,
           source: str = "<payload>") -> Any:
    """The one value that ``data`` holds (bytes after it are an error: a payload is exact).

    ``pickled(index)`` returns each value stored pickled (the encoder's ``pickled[index]``); without it
    a pickled value raises :class:`~snapshot.errors.UntrustedStateError`.
    """
    if len(data) <= _codec_native.MAX_BYTES:
        try:
            return _codec_native.tree(data, _Plain())
        except _codec_native.Refused:
            pass  # msgpack decodes it, or says what is wrong
    if len(data) <= _AT_ONCE:
        value = _at_once(data, pickled, source)
        if value is not _AGAIN:
            return value
    decoder = Decoder(data, pickled=pickled, name=source)
    try:
        value = decoder.next()
        left = decoder.limit - decoder.position
        if left:
            raise decoder._corrupt(f"{left} bytes follow the value, which ends here", decoder.position)
    finally:
        _release(decoder)
    return value


class _Plain(ExtValues):
    """The ext values of a tree that msgspec decodes: those that act beyond the value (arrays, tensors, values
    stored pickled) refuse it before they act (``_codec_native``), so only the nesting is counted (from the
    class's 0: no ``__init__`` to call)."""

    _depth = 0


class _Exts:
    """The ``ext_hook`` of a value decoded at once: the decoder (its checks, the arrays to fill) is made at the
    first ext value, which a state of msgpack's own types never meets."""

    __slots__ = ("data", "pickled", "source", "decoder")

    def __init__(self, data: Any, pickled: Callable[[int], Any] | None, source: str) -> None:
        self.data, self.pickled, self.source = data, pickled, source
        self.decoder: Decoder | None = None

    def __call__(self, code: int, body: bytes) -> Any:
        if self.decoder is None:
            self.decoder = Decoder(self.data, pickled=self.pickled, name=self.source)
        return self.decoder._ext(code, body)


def _at_once(data: Any, pickled: Callable[[int], Any] | None, source: str) -> Any:
    """``data``'s value in one call of msgpack, its arrays then filled; ``_AGAIN`` when it does not decode so
    (damaged, or bytes after it): :func:`decode` reads it again as a stream, whose error names what is wrong
    and where."""
    exts = _Exts(data, pickled, source)
    try:
        try:
            value, ahead = msgpack.unpackb(data, ext_hook=exts, **types.UNPACK_OPTIONS), b""
        except msgpack.ExtraData as extra:  # the bytes of the arrays after the tree
            value, ahead = extra.unpacked, extra.extra
        except (CallerError, SnapshotError, Corrupt, *_BROKEN):
            return _AGAIN
        decoder = exts.decoder
        if decoder is None:
            return _AGAIN if ahead else value
        decoder.position = decoder.limit - len(ahead)
        decoder.reader.offset = decoder.limit  # type: ignore[attr-defined]  # a MemoryReader: all read
        decoder._fill(ahead)
        return _AGAIN if decoder._ahead else value
    finally:
        _release(exts.decoder)


def _release(decoder: Decoder | None) -> None:
    reader = decoder.reader if decoder is not None else None
    if isinstance(reader, MemoryReader):
        reader.view.release()  # a memory map can close when decode returns, even after an error
