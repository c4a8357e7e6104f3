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
tensor's autograd history (a tensor decodes as a leaf with its ``requires_grad``). Values must not
change while they are encoded.

The encoder is in ``_codec_encode`` (with ``_codec_default``, msgpack's ``default`` for the values it has no
type for, and ``_codec_shapes``, what it packs in one call), the decoder in ``_codec_decode``, what both share in
``_codec_types``; callers import from this module. Format 2's encoding is read by ``_codec_v2``.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from snapshot.container._codec_decode import Decoder, MemoryReader, Reader, decode
from snapshot.container._codec_encode import Encoder
from snapshot.container._codec_types import MAX_DEPTH

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
    out = io.BytesIO()
    encoder = Encoder(out.write, frame=0)
    encoder.encode(value, where)
    return out.getvalue(), encoder.pickled
