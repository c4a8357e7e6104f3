"""State as data: a small tagged binary codec for node states, buffered samples and checkpoints.

A snapshot's state must decode without running code from the file (docs/threat-model.md), and a
save must stream to disk without holding a second copy of the state. Why a codec of our own:

- torch's ``weights_only`` unpickler is private (``torch._weights_only_unpickler``); what it
  accepts changes between torch versions, and numpy values need their globals registered in it.
  Still a pickle, its safety is an allowlist kept by someone else.
- A pickle is one opaque stream: it cannot be written piece by piece with the size of each
  node's part known, nor be read without the classes it names.
- safetensors frames flat dicts of tensors only; a state is nested lists, dicts, tuples,
  strings, numbers, arrays and tensors.

So each value is a tag byte followed by lengths and bytes. The encoder writes through a
``write`` callable as it goes (small values gathered in a 64 KiB buffer, a big ``bytes``, array
or tensor payload written from the object's own memory), and the decoder only ever builds the
types listed below: it imports nothing the data names and calls nothing from it.

======  ==============================================================================
tag     value (``len`` is one byte below 253, or 0xFE + 4 bytes, or 0xFF + 8, little-endian)
======  ==============================================================================
``N``   None
``T``   True;  ``F`` False
``i``   int: ``len`` + that many bytes, signed little-endian (any size)
``d``   float: 8 bytes (IEEE double, little-endian);  ``j`` complex: two of them
``s``   str: ``len`` + UTF-8 (``surrogatepass``, so any Python str round-trips)
``b``   bytes;  ``B`` bytearray: ``len`` + the bytes
``l``   list;  ``t`` tuple;  ``S`` set;  ``Z`` frozenset: ``len`` + the items
``D``   dict: ``len`` + key, value, key, value, ...
``Q``   collections.deque: maxlen (a value: ``N`` or ``i``) + ``len`` + the items
``R``   range: start, stop, step (three ``i`` values)
``A``   numpy array: dtype description (a value: str, or the list of fields of
        ``numpy.lib.format.dtype_to_descr``), ndim (1 byte), each dim (``len``),
        ``len`` of the bytes + the bytes in C order
``G``   numpy scalar: as ``A`` with no dims (decodes to the same scalar type)
``X``   torch tensor: dtype name (``len`` + ASCII, from a fixed table), ndim and dims as
        ``A``, requires_grad (1 byte), ``len`` of the bytes + the bytes in C order
``P``   not data: ``len`` (its index in the encoder's ``pickled`` list) + where (as ``s``)
======  ==============================================================================

Data is matched by exact type (``type(v) is dict``), so subclasses (``OrderedDict``,
``defaultdict``, namedtuples, enums, str and int subclasses, ``torch.nn.Parameter``) are not
data. Neither are custom classes, functions, generators, tensors off the CPU or not strided
(sparse, quantized, nested, named), arrays of objects, a container deeper than
:data:`MAX_DEPTH` and a container that contains itself (the outermost container of the cycle).
Such a value is no error: the encoder writes a ``P`` tag and appends ``(where, value)`` to
``Encoder.pickled``, where ``where`` names its place (``state.nodes['/0/shuffle'].state[3]``
(a str key that is a Python name shows as ``.name``, another key as ``[repr]``, the n-th
member of a set as ``{n}``, the n-th key of a dict as ``.keys()[n]``); the caller pickles
those values in a section of their own, which needs trust to load.

What data does not keep: object identity (a list held twice decodes as two equal lists;
views of one tensor decode as separate tensors), array memory order (arrays decode
C-contiguous and writable), a tensor's autograd history (a tensor decodes as a leaf with its
``requires_grad``). Values must not change while they are encoded.

The encoder is in ``_codec_encode``, the decoder in ``_codec_decode``, and the tags and dtype
tables both use in ``_codec_types``; callers import from this module.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from snapshot.container._codec_decode import Decoder, decode
from snapshot.container._codec_encode import Encoder
from snapshot.container._codec_types import MAX_DEPTH

__all__ = ["MAX_DEPTH", "Decoder", "Encoder", "Pickled", "decode", "encode"]


@dataclass(frozen=True)
class Pickled:
    """Stands for a value that is not data: the ``index``-th entry of ``Encoder.pickled``
    (a ``pickled`` callback of :func:`decode` may return it to show a state without unpickling)."""

    index: int
    where: str = ""


def encode(value: Any, where: str = "state") -> tuple[bytes, list[tuple[str, Any]]]:
    """``value`` encoded in memory, and the ``(where, value)`` of each part that is not data.

    >>> data, pickled = encode({"seen": 3, "buffer": [1.5, b"ab", (None, True)]})
    >>> decode(data)
    {'seen': 3, 'buffer': [1.5, b'ab', (None, True)]}
    >>> pickled
    []
    """
    out = io.BytesIO()
    encoder = Encoder(out.write)
    encoder.encode(value, where)
    return out.getvalue(), encoder.pickled
