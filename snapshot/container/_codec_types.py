"""What the data encodings share (format 3's, :mod:`snapshot.container._codec`, and format 2's, still read by
:mod:`snapshot.container._codec_v2`): the tables that turn numpy dtypes and torch dtypes into data and back,
the factories of a data ``defaultdict``, and the bounds on nesting and dimensions.

Nothing here imports numpy or torch at import time: the helpers that need them import them when
an array or a tensor is met, so the CLI reads a payload's structure without torch.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy
    import torch

#: The factories a ``collections.defaultdict`` may have to be data, named by their position in this tuple
#: (the decoder rebuilds one from this fixed table, never from a name in the data).
FACTORIES: tuple[Any, ...] = (None, list, dict, set, int, float, str, tuple, bytes)

#: Format 3: deeper nesting of ext values (tuples in tuples, sets of tuples, ...) is saved pickled, and
#: refused when decoding: each level is a call of msgpack's unpacker, whose context takes about 50 KiB of
#: the C stack (a thread's stack is 8 MiB, or less on some systems).
MAX_DEPTH = 32
#: Format 2: its decoder recurses two Python frames a level; this leaves the caller room under Python's
#: default recursion limit (1000).
V2_MAX_DEPTH = 256
# numpy's own bound on the number of dimensions (torch's is the same).
MAX_DIMS = 64


def elements(shape: tuple[int, ...]) -> int:
    """How many elements an array of ``shape`` has."""
    count = 1
    for dim in shape:
        count *= dim
    return count


# numpy dtypes ------------------------------------------------------------------------------------

def array_descr(dtype: numpy.dtype[Any]) -> str | list[Any] | None:
    """The description of ``dtype`` that ``numpy.lib.format.descr_to_dtype`` rebuilds exactly
    (the ``.npy`` header's), or ``None`` when ``dtype`` is not data: it holds Python objects,
    carries metadata, or is a dtype the description cannot rebuild (``StringDType``, user dtypes)."""
    return None if dtype.metadata is not None else _descr(dtype)  # dtypes equal but for metadata hash alike


@lru_cache(maxsize=1024)
def _descr(dtype: numpy.dtype[Any]) -> str | list[Any] | None:
    from numpy.lib.format import descr_to_dtype

    if dtype.hasobject:
        return None
    descr: str | list[Any] = dtype.descr if dtype.names is not None else dtype.str
    try:
        rebuilt = descr_to_dtype(descr)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if rebuilt != dtype or rebuilt.metadata != dtype.metadata:
        return None
    return descr


def scalar_descr(dtype: numpy.dtype[Any]) -> str | list[Any] | None:
    """As :func:`array_descr`, and ``None`` also when the rebuilt dtype's scalar type differs
    (``numpy.longlong`` is ``<i8`` like ``numpy.int64``, but a scalar keeps its exact type)."""
    descr = array_descr(dtype)
    if descr is None or dtype_of(descr).type is not dtype.type:
        return None
    return descr


def is_descr(value: object, depth: int = 0) -> bool:
    """Whether a decoded ``value`` has the exact shape of a description that ``dtype_to_descr``
    writes: a type string such as ``<f8``, ``|S5`` or ``<M8[ns]`` (no objects, no commas or
    parentheses for numpy's string parser to read), or a list of fields ``(name, description)``
    and ``(name, description, shape)``. Nothing else reaches ``numpy.dtype``."""
    if type(value) is str:
        return _TYPE_STRING.match(value) is not None
    return type(value) is list and depth < 8 and all(_is_field(field, depth) for field in value)


def _is_field(field: object, depth: int) -> bool:
    if type(field) is not tuple or len(field) not in (2, 3):
        return False
    name, shape = field[0], field[2] if len(field) == 3 else ()
    named = type(name) is str or (type(name) is tuple and len(name) == 2 and all(type(n) is str for n in name))
    shaped = (type(shape) is int and shape >= 0) or (
        type(shape) is tuple and len(shape) <= MAX_DIMS and all(type(n) is int and n >= 0 for n in shape))
    return named and shaped and is_descr(field[1], depth + 1)


_TYPE_STRING = re.compile(r"[<>|=][biufcmMSUV][0-9]{1,9}(\[[0-9]{0,9}[a-zA-Z]{1,7}\])?\Z")


def dtype_of(descr: Any) -> numpy.dtype[Any]:
    """The dtype a checked description names (``ValueError`` when it holds Python objects)."""
    dtype = _dtype_of_str(descr) if type(descr) is str else _rebuild(descr)
    if dtype.hasobject:
        raise ValueError(f"the dtype {dtype} holds Python objects, which are not data")
    return dtype


@lru_cache(maxsize=1024)
def _dtype_of_str(descr: str) -> numpy.dtype[Any]:
    return _rebuild(descr)


def _rebuild(descr: Any) -> numpy.dtype[Any]:
    from numpy.lib.format import descr_to_dtype

    dtype: numpy.dtype[Any] = descr_to_dtype(descr)
    return dtype


def array_from(dtype: numpy.dtype[Any], shape: tuple[int, ...], data: memoryview) -> Any:
    """A new, writable array of ``shape`` holding a copy of ``data`` (checked to fit)."""
    import numpy

    array = numpy.zeros(shape, dtype)
    if data:  # byte by byte: a copy by fields would drop the padding bytes of a structured dtype
        array.reshape(-1).view(numpy.uint8)[:] = numpy.frombuffer(data, numpy.uint8)
    return array


def numpy_module() -> Any:
    """numpy when something has imported it, else ``None`` (no value can then be numpy's)."""
    return sys.modules.get("numpy")


# torch dtypes ------------------------------------------------------------------------------------

# The dtypes a tensor may have to be data, by the name after ``torch.``. A fixed list in this
# module: the decoder looks a saved name up here, it never asks torch for an attribute the file names.
TORCH_DTYPE_NAMES = (
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)


@lru_cache(maxsize=1)
def torch_dtypes() -> dict[str, torch.dtype]:
    """The dtypes of :data:`TORCH_DTYPE_NAMES` that this torch has, by name."""
    import torch

    found = {name: getattr(torch, name, None) for name in TORCH_DTYPE_NAMES}
    return {name: dtype for name, dtype in found.items() if isinstance(dtype, torch.dtype)}


def tensor_from(dtype: torch.dtype, shape: tuple[int, ...], data: memoryview, *, requires_grad: bool) -> Any:
    """A new tensor of ``shape`` holding a copy of ``data`` (checked to fit), not a view of it."""
    import torch

    if data:
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        tensor = torch.empty(shape, dtype=dtype)
    return tensor.requires_grad_() if requires_grad else tensor


@lru_cache(maxsize=1)
def torch_dtype_names() -> dict[torch.dtype, str]:
    return {dtype: name for name, dtype in torch_dtypes().items()}


# format 3: the msgpack ext types of the data encoding (see snapshot.container._codec) -------------

TUPLE, SET, FROZENSET, BIGINT, COMPLEX, BYTEARRAY, DEQUE, RANGE = 1, 2, 3, 4, 5, 6, 7, 8
DEFAULTDICT, CHUNK, ARRAY, NUMPY_SCALAR, TENSOR, PICKLED, ROWS = 9, 10, 11, 12, 13, 14, 15
#: The options both halves give msgpack: exact types (a subclass, a tuple, is not taken for a list or a
#: str), binary for bytes, any Python str (lone surrogates too: the encoder packs with ``SURROGATES``
#: once it meets one, the decoder always reads them). Strs as str and arrays as lists (``raw=False``,
#: ``use_list=True``) are msgpack's defaults since 1.0: not passed again (each keyword costs every call).
PACK_OPTIONS: dict[str, Any] = {"strict_types": True, "use_bin_type": True}
SURROGATES: dict[str, Any] = {**PACK_OPTIONS, "unicode_errors": "surrogatepass"}
UNPACK_OPTIONS: dict[str, Any] = {"strict_map_key": False, "unicode_errors": "surrogatepass"}
