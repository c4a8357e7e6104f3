"""State as data: format 3's encoding of node states, buffered samples and checkpoints, in msgpack.

A snapshot's state must decode without running code from the file (docs/threat-model.md), a save must
stream to disk without a second copy of the state, and a restore must hold one copy of it. msgpack's C
packer and unpacker do the work (``strict_types``: a subclass is not taken for its base; exact limits on
every length when decoding); this codec adds ext types for what msgpack has no type for, and writes the
bytes of arrays and tensors out of band, after the tree, as safetensors does (descriptors, then raw
buffers): a save writes them from the arrays' own memory, a restore reads them into the arrays it made
from their descriptors.

A value is its *tree* (one msgpack value) followed by its *buffers* (the bytes of each array and tensor
of the tree, in the order of their descriptors, back to back). In the tree:

======================  ========================================================================
msgpack                 None, bool, int (64 bits), float (a double), str (UTF-8, lone surrogates
                        too), bytes, list, dict (any keys, in order)
ext 1, 2, 3, 10         tuple, set, frozenset, torch's ``DataChunk``: a msgpack list of the items
ext 4                   int beyond 64 bits: signed little-endian bytes
ext 5                   complex: two little-endian doubles
ext 6                   bytearray: its bytes
ext 7                   collections.deque: ``[maxlen or None, *items]``
ext 8                   range: ``[start, stop, step]``
ext 9                   collections.defaultdict: ``[factory, {items}]``, the factory by its index
                        in ``_codec_types.FACTORIES`` (never by a name in the data)
ext 11                  numpy array: ``[descr, shape, nbytes]``, ``descr`` the ``.npy`` header's
                        description (no Python objects); its bytes, C order, are a buffer
ext 12                  numpy scalar: ``[descr, bytes]``
ext 13                  torch tensor (CPU, strided): ``[dtype name from a fixed table, shape,
                        requires_grad, nbytes]``; its bytes, C order, are a buffer
ext 14                  not data: its index in the pickled section (8 bytes, little-endian)
ext 15                  a list of more than 16 tuples of one length (in the payload's frame or a
                        node state's dict): ``[count, *columns]``, each column a msgpack list
======================  ========================================================================

An ext value's body is a msgpack value of its own; they nest up to :data:`MAX_DEPTH` levels (32: each is a call
of msgpack's unpacker, whose context takes about 50 KiB of the C stack).

Data is matched by exact type, so subclasses (``OrderedDict``, namedtuples, enums, str and int
subclasses, ``torch.nn.Parameter``) are not data. Neither are custom classes, functions, generators,
tensors off the CPU or not strided (sparse, quantized, nested, named), arrays of objects, a container
nested deeper than the encoder goes (:data:`MAX_DEPTH` levels of tuples, sets and the like, or
msgpack's 1,024 levels of lists and dicts) and a container that contains itself (the outermost container
of the cycle). Such a value is no error: the encoder writes ext 14 and appends ``(where, value)`` to
``Encoder.pickled``, where ``where`` names its place (``state.nodes['/0/shuffle'].state[3]``: a str key
that is a Python name shows as ``.name``, another key as ``[repr]``, the n-th member of a set as
``{n}``, the n-th key of a dict as ``.keys()[n]``); the caller pickles those values in a section of
their own, which needs trust to load.

What data does not keep: object identity (a list held twice decodes as two equal lists; views of one
tensor decode as separate tensors), array memory order (arrays decode C-contiguous and writable), a
tensor's autograd history (a tensor decodes as a leaf with its ``requires_grad``), the type of a
``bytearray`` or a ``memoryview`` (msgpack's packer takes both for bytes before any hook sees them: they decode
as ``bytes``; ext 6 is read, never written). Values must not change while they are encoded.

The encoder is in ``_codec_encode`` (with ``_codec_default``, msgpack's ``default`` for the values it has no
type for, and ``_codec_shapes``, what it packs in one call), the decoder in ``_codec_decode`` (with
``_codec_exts``, what each ext value decodes to, and ``_codec_native``, msgspec), what both share in
``_codec_types``; callers import from this module. Format 2's encoding is read by ``_codec_v2``. :func:`encode`
packs a value of msgpack's own types in one call (the encoder's bytes, without its walk). :func:`decode` decodes
a tree of at most 64 KiB without arrays, tensors or pickled values in one call of msgspec's C decoder (about
twice as fast as msgpack's on a small state) wherever msgspec's result is exactly msgpack's, and so do ext bodies;
anything else msgspec refuses (``_codec_native`` lists where the two differ) is decoded by msgpack as the
definition above says, with its value or its error unchanged: a value of at most 1 MiB in one call, making the
decoder at its first ext value, a bigger one as a stream.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import msgpack

from snapshot.container._codec_decode import Decoder, MemoryReader, Reader, decode
from snapshot.container._codec_encode import Encoder
from snapshot.container._codec_shapes import rows
from snapshot.container._codec_types import MAX_DEPTH, PACK_OPTIONS

__all__ = ["MAX_DEPTH", "Decoder", "Encoder", "MemoryReader", "Pickled", "Reader", "decode", "encode"]


@dataclass(frozen=True)
class Pickled:
    """Stands for a value that is not data: the ``index``-th entry of ``Encoder.pickled`` (a ``pickled``
    callback of :func:`decode` may return it to show a state without unpickling)."""

    index: int


def encode(value: Any, where: str = "state") -> tuple[bytes, list[tuple[str, Any]]]:
    """``value`` encoded in memory, and the ``(where, value)`` of each part that is not data.

    >>> data, pickled = encode({"seen": 3, "buffer": [1.5, b"ab", (None, True)]})
    >>> decode(data)
    {'seen': 3, 'buffer': [1.5, b'ab', (None, True)]}
    >>> pickled
    []
    """
    data = _native(value)
    if data is not None:
        return data, []
    pieces: list[Any] = []
    # the pieces joined once (arrays copied once); a dict is walked only for the lists of tuples it holds
    encoder = Encoder(pieces.append, frame=0 if _holds_rows(value) else -1, buffered=False)
    try:
        encoder.encode(value, where)
    finally:
        encoder.close()
    return b"".join(pieces), encoder.pickled


def _holds_rows(value: Any) -> bool:
    """Whether ``value`` is a dict holding a list of tuples that the encoder's walk writes by rows (the walk of
    a dict writes the bytes of a pack of it, but for those)."""
    return type(value) is dict and list in set(map(type, value.values())) and any(
        type(item) is list and rows(item) for item in value.values())


class _NotNative(Exception):
    """A value msgpack has no type for (a tuple, an array, ...): the encoder's walk encodes it."""


def _refuse(value: Any) -> Any:
    raise _NotNative


_packers = threading.local()  # a packer per thread (a background save encodes in a thread of its own)


def _native(value: Any) -> bytes | None:
    """``value`` packed in one call of msgpack when it is made of msgpack's own types only, else ``None``.

    Those are the bytes the encoder writes for such a value (its walk packs the same items in pieces), without
    its setup and walk: most of the time of a small state. A packer is kept per thread, taken out while it
    packs (msgpack resets it after a failed ``pack``), and kept only after a small value (its buffer grows to
    the biggest value it packed). A value it refuses (a tuple, a big int, a str with lone surrogates, a cycle,
    nesting past msgpack's bounds) is the encoder's, which redoes what was packed before it (in C: a fraction
    of what the walk costs)."""
    packer = getattr(_packers, "packer", None)
    _packers.packer = None
    if packer is None:
        packer = msgpack.Packer(default=_refuse, buf_size=_KEPT, **PACK_OPTIONS)
    try:
        data: bytes = packer.pack(value)
    except (_NotNative, ValueError, TypeError, OverflowError, UnicodeEncodeError, RecursionError):
        return None
    if len(data) <= _KEPT:
        _packers.packer = packer
    return data


_KEPT = 64 * 1024  # the thread's packer starts with this buffer, and is kept only after a value this small
