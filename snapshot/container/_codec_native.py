"""msgspec's C decoder for the trees of the data section, taken only where its result is exactly msgpack's.

``msgspec.msgpack`` decodes a small state's tree in about 40 % of the time of msgpack's unpacker. It differs from
the unpacker the codec is defined by (:data:`~snapshot.container._codec_types.UNPACK_OPTIONS`) in a few ways;
each is a reason to refuse the bytes (:class:`Refused`), and the caller decodes them with msgpack as before,
which returns its value or names what is wrong exactly as it always did:

- an ext -1 (msgpack's timestamp) is a ``datetime`` to msgspec, a ``msgpack.Timestamp`` to msgpack: bytes
  holding a byte 0xff anywhere (a timestamp's type byte, and much else: a scan for a timestamp's headers cost
  more than msgspec saves) are refused;
- an array as a map key is a tuple to msgspec, an unhashable list (an error) to msgpack: a decoded value with
  a key of another type than str, int, float or bytes is refused (msgspec's JSON encoder checks that, in C;
  a tuple key that the codec wrote, an ext 1, is refused too, and decoded by msgpack);
- nesting: msgpack refuses more than 1,024 levels, msgspec's bound is Python's recursion limit (to 3.11) or the
  C stack's: a tree of more than 1,024 bytes (room for 1,025 levels) is refused unless msgspec's bound is the
  lower one;
- lone surrogates (the encoder writes them with ``surrogatepass``), invalid UTF-8, a truncated tree, bytes after
  it: msgspec raises, and so the bytes are refused;
- ext bodies reach the hook as memoryviews of the data (the hooks copy what they keep).

Forged lengths cost nothing: msgspec checks each length against the bytes left before it allocates (a list of
at most 16 items first). A value whose hook acts beyond the value (an array or a tensor, filled from the bytes
after the tree; a pickled value, which calls the caller's ``pickled``) is refused at that ext, before the hook
acts, so a refused decode leaves nothing behind. Trees of more than :data:`MAX_BYTES` are not tried (the checks
cost time in proportion), nor trees that are not a map: msgspec wins on maps (their keys are strs, which it
makes faster than msgpack), while on a list of ints its checks cost more than it saves (a set of 10,000 ints:
0.77 ms against msgpack's 0.32).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import Any

import msgpack

from snapshot.container import _codec_types as types

try:
    import msgspec
except ImportError:  # pragma: no cover - an optional speed-up, as in snapshot.schema._native
    msgspec = None  # type: ignore[assignment]

__all__ = ["MAX_BYTES", "Refused", "body", "tree"]

#: Trees of at most this many bytes are tried with msgspec.
MAX_BYTES = 64 * 1024
# the first byte of a map (fixmap, map 16, map 32): only maps are tried
_MAPS = frozenset((*range(0x80, 0x90), 0xde, 0xdf))
# msgpack's unpacker refuses deeper nesting than this; a tree of at most this many bytes cannot hold more
_MSGPACK_LEVELS = 1024
# to 3.11 msgspec's bound on nesting is Python's recursion limit (from 3.12, the C stack's)
_PYTHON_BOUND = sys.version_info < (3, 12)
# ext types whose hook acts beyond the value: an array or a tensor (to fill), a pickled value (a call)
_ACTS = frozenset({types.ARRAY, types.TENSOR, types.PICKLED})


class Refused(Exception):
    """msgspec cannot give msgpack's exact result for these bytes: the caller decodes them with msgpack."""


_local = threading.local()  # .exts: the ext values of the msgspec decode running on this thread, if any


def _hook(code: int, data: memoryview) -> Any:
    if code in _ACTS:
        raise Refused
    return _local.exts._ext(code, data)


def _contents(value: Any) -> Any:
    """What msgspec's JSON encoder checks of a value it has no type for (and of a key it refuses: an error)."""
    kind = type(value)
    if kind is deque:
        return list(value)
    numpy = types.numpy_module()
    if kind is complex or kind is range or (numpy is not None and isinstance(value, numpy.generic)):
        return None  # made from checked fields: holds no map
    raise TypeError(f"not checked: {kind.__name__}")


_DECODER = msgspec.msgpack.Decoder(ext_hook=_hook) if msgspec is not None else None
_KEYS: Any = msgspec.json.Encoder(enc_hook=_contents) if msgspec is not None else None


def tree(data: Any, exts: Any) -> Any:
    """The value ``data`` holds, decoded by msgspec with the ext types of ``exts`` (an ``ExtValues``), exactly
    as msgpack decodes it; :class:`Refused` where msgspec cannot."""
    size = len(data)
    if _DECODER is None or size > MAX_BYTES or not size or data[0] not in _MAPS or (
            size > _MSGPACK_LEVELS and not _bounded()):
        raise Refused
    if 255 in (data if type(data) is bytes else bytes(data)):  # an ext -1's type byte may be one of them
        raise Refused
    local = _local
    local.exts = exts
    try:
        value = _DECODER.decode(data)
        # refuses a key msgspec made of an array (and any key but a str, int, float or bytes)
        _KEYS.encode_into(value, getattr(local, "buffer", None) or _buffer())
    except Exception:  # noqa: BLE001 - whatever msgspec or a hook raises, msgpack judges these bytes again
        raise Refused from None
    finally:
        local.exts = None
    return value


def body(data: Any, exts: Any) -> Any:
    """An ext value's body (a msgpack value of its own, a list): inside a msgspec decode, by msgspec (the outermost
    decode has checked these bytes, and checks the value; a refusal refuses it whole); else by msgpack (a list is
    not tried, see :func:`tree`)."""
    if getattr(_local, "exts", None) is not None:
        assert _DECODER is not None
        return _DECODER.decode(data)
    return msgpack.unpackb(data, ext_hook=exts._ext, **types.UNPACK_OPTIONS)


def _bounded() -> bool:
    """Whether msgspec refuses a tree nested deeper than msgpack's unpacker allows, whatever its size."""
    return _PYTHON_BOUND and sys.getrecursionlimit() <= _MSGPACK_LEVELS


def _buffer() -> bytearray:
    """The thread's buffer for the check of keys (what it writes is not used)."""
    _local.buffer = buffer = bytearray(4096)  # encode_into grows it as it needs
    return buffer
