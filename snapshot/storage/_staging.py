"""Staging a capture for a background save: a copy that the live graph cannot change.

A background save pickles and writes the captured state while the loader keeps iterating,
so the capture must share nothing mutable with the running graph. :func:`stage` copies
every container (dict, list, tuple, deque, set) and decides per leaf:

- dataclasses (the captured loader state) are copied field by field;
- immutable values (``bytes``, ``str``, numbers, ``None``, enums, ranges, frozensets of
  them) are shared: that is what makes the blocking part cheap for buffers of encoded
  samples, whatever their size;
- tensors are cloned and numpy arrays copied (a pipe or the training step may change them
  in place after they leave a buffer); a list of arrays (or of tensors) of one dtype and shape, a
  shuffle buffer's samples, is copied into one block (its items become views of the block; a large
  block of arrays is copied by as many threads as torch's own copies use),
  and an array that cannot change (read-only, owning its memory) is shared;
- any other object is deep-copied (``copy.deepcopy``), falling back to a pickle round trip;
- but a value that the capture said fresh (:func:`snapshot.hooks._fresh.fresh`: made by the capture,
  holding nothing anyone changes, as a shuffle buffer's positions) is taken as it is, unwalked.

So a background save blocks for about the time of a memory copy of the mutable samples it
holds (one copy of the bytes, as ``torch.distributed.checkpoint``'s staging of one tensor), for
a walk of its other lists, and for almost nothing when samples are ``bytes`` or strings or saved by
position.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import enum
import functools
import mmap
import operator
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from snapshot.container import _serialization
from snapshot.errors import SnapshotError

try:
    import numpy
except ImportError:  # pragma: no cover - numpy is optional
    numpy = None  # type: ignore[assignment]

__all__ = ["stage"]

_IMMUTABLE = (bytes, str, int, float, complex, bool, type(None), range, enum.Enum)
#: Leaves that are immutable by their exact type (a container of only these needs no walk).
_ATOMS = frozenset({bytes, str, int, float, complex, bool, type(None)})
_NONE: Mapping[int, Any] = MappingProxyType({})


_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")


def _block(items: list[Any], defer: Callable[[Callable[[], Any]], Any] | None = None) -> Any:
    """``items``, arrays (or CPU tensors that need no grad) of one dtype and shape, copied as one block:
    the block's rows (``defer(make)`` of them, where the caller can make them later: 10,000 row views are
    2-3 ms that the save's thread can spend instead); ``None`` for any other list."""
    kinds = set(map(type, items))
    if numpy is not None and kinds == {numpy.ndarray}:
        dtypes, shapes = set(map(_DTYPE, items)), set(map(_SHAPE, items))
        if len(dtypes) != 1 or len(shapes) != 1:
            return None
        dtype, shape = dtypes.pop(), shapes.pop()
        if not shape or dtype.hasobject:
            return None
        block = _unadvised(len(items) * dtype.itemsize * int(numpy.prod(shape))).view(dtype)
        _gather(items, block.reshape(len(items) * shape[0], *shape[1:]))
        rows: Any = block.reshape(len(items), *shape)
    elif kinds == {torch.Tensor}:
        tensors = {(t.dtype, t.shape, t.device.type, t.layout, t.requires_grad) for t in items}
        if len(tensors) != 1 or tensors.pop()[2:] != ("cpu", torch.strided, False):
            return None
        rows = torch.stack(items).unbind(0)
    else:
        return None
    # the block is the capture's own: its rows can be made at any time
    make: Callable[[], list[Any]] = functools.partial(list, rows)
    return make() if defer is None else defer(make)


#: A block smaller than this is gathered by the calling thread alone (a thread costs ~0.1 ms to start).
_PER_THREAD = 16 << 20
#: The longest a part of a block's copy may take (a memory copy: only a machine out of memory gets near it).
_COPY_LIMIT = 300.0


def _gather(items: list[Any], rows: Any) -> None:
    """Copy ``items`` (numpy arrays of one dtype and shape) one after another into ``rows``, split across as
    many threads as torch's own copies use (``torch.get_num_threads()``, as DCP's staging copy of one tensor
    does): numpy lets the GIL go while it copies, and the first touch of a new block's pages, which costs
    this machine as much as the copy itself, is then shared too (164 MB: 122 ms alone, 64 ms on two cores;
    each part's pages asked for at once before its copy, 44-48 ms)."""
    parts = max(1, min(torch.get_num_threads(), len(items), rows.nbytes // _PER_THREAD))
    if parts == 1:
        _prefault(rows)
        numpy.concatenate(items, axis=0, out=rows)
        return
    step = rows.shape[0] // len(items)
    bounds = [len(items) * k // parts for k in range(parts + 1)]
    failed: list[BaseException] = []

    def copy(k: int) -> None:
        try:
            part = rows[bounds[k] * step:bounds[k + 1] * step]
            _prefault(part)
            numpy.concatenate(items[bounds[k]:bounds[k + 1]], axis=0, out=part)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            failed.append(exc)

    helpers = [threading.Thread(target=copy, args=(k,), name="snapshot-stage", daemon=True) for k in range(1, parts)]
    for helper in helpers:
        helper.start()
    copy(0)
    for helper in helpers:
        helper.join(_COPY_LIMIT)
        if helper.is_alive():
            raise SnapshotError(
                f"staging {rows.nbytes} bytes of arrays for a background save took over {_COPY_LIMIT:g} s (is the "
                "machine out of memory, or swapping?); nothing was written. Save with blocking=True, or free memory.")
    if failed:
        raise failed[0]


#: ``madvise``'s advice to fault a range's pages in, writable, as a write to each would (Linux >= 5.14).
_MADV_POPULATE_WRITE = 23


@functools.cache
def _madvise() -> Any:
    """libc's ``madvise`` through ctypes (which lets the GIL go during the call, so that the parts run at once),
    or ``None`` off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def _prefault(part: Any) -> None:
    """Fault in the pages of ``part`` (a contiguous numpy array about to be written) in one call, cheaper than
    the copy's first touch of each page; a kernel without the advice refuses it (``EINVAL``), and the copy then
    faults them in as before. It changes no byte: a page already there is left as it is."""
    madvise = _madvise()
    if madvise is None or not part.nbytes:
        return
    start = part.ctypes.data
    aligned = start - start % mmap.PAGESIZE
    madvise(aligned, start + part.nbytes - aligned, _MADV_POPULATE_WRITE)  # its result: a hint, taken or not


def _unadvised(size: int) -> Any:
    """``size`` bytes (a writable numpy uint8 array) of a private anonymous map, which no one asks huge pages for.

    numpy asks the kernel for huge pages for an array of 4 MiB or more (``madvise(MADV_HUGEPAGE)``); where the
    kernel's THP defrag is ``madvise`` (a common default), the first touch of those pages waits for memory to
    be compacted: staging 164 MB so blocked the loader 279-293 ms, 99-105 ms in a private map (fresh processes,
    alternating; DCP's staging of one tensor, 58-63 ms). A shared map (``mmap``'s default) is shmem: 130-147 ms.
    (Not torch's memory, as DCP's is: a tensor that the writer thread frees as the interpreter exits aborts it.)"""
    flags = getattr(mmap, "MAP_PRIVATE", None)  # (none on Windows: numpy's memory there)
    if not size or flags is None:
        return numpy.empty(size, numpy.uint8)
    return numpy.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=numpy.uint8)


_PLAIN: dict[type, bool] = {}


def _plain(kind: type) -> bool:
    """Whether ``copy.copy`` of a ``kind`` is a new object with the same ``__dict__`` (no hook of its own)."""
    plain = _PLAIN.get(kind)
    if plain is None:
        default = object.__dict__.get("__getstate__")
        plain = _PLAIN[kind] = (
            not hasattr(kind, "__slots__") and getattr(kind, "__copy__", None) is None
            and kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
            and getattr(kind, "__getstate__", None) is default and getattr(kind, "__setstate__", None) is None)
    return plain


def stage(value: Any, fresh: Mapping[int, Any] = _NONE) -> Any:
    """A copy of ``value`` that shares only immutable leaves with it, and the values in ``fresh`` (by ``id``:
    what :func:`snapshot.hooks._fresh.collecting` collected while ``value`` was captured). Where ``fresh`` can
    ``defer(make)`` (a background save's :class:`~snapshot.hooks._fresh.Collected`), the rows of a block of
    samples are left for the save's thread to make."""
    kind = type(value)
    if kind in _ATOMS or id(value) in fresh:
        return value
    if kind is dict:  # the atoms inline: most leaves of a capture are (a call each was half its staging)
        return {k: v if type(v) in _ATOMS else stage(v, fresh) for k, v in value.items()}
    if kind is list:
        if not value:
            return []
        if all(type(x) in _ATOMS for x in value):  # positions, counts, seeds: a shallow copy is a deep one
            return value.copy()
        block = _block(value, getattr(fresh, "defer", None)) if len(value) > 1 else None
        return block if block is not None else [stage(x, fresh) for x in value]
    if isinstance(value, _IMMUTABLE):
        return value
    if kind is tuple:
        if all(type(x) in _ATOMS for x in value):  # immutable all the way down: shared
            return value
        return tuple(stage(x, fresh) for x in value)
    if isinstance(value, deque):
        return deque((stage(x, fresh) for x in value), maxlen=value.maxlen)
    if isinstance(value, frozenset) and all(isinstance(x, _IMMUTABLE) for x in value):
        return value
    if isinstance(value, (set, frozenset)):
        return kind(stage(x, fresh) for x in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if _plain(kind):  # what copy.copy does for it, without its dispatch (the captured loader state)
            staged = object.__new__(kind)
            staged.__dict__.update({k: v if type(v) in _ATOMS else stage(v, fresh) for k, v in vars(value).items()})
            return staged
        staged = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(staged, f.name, stage(getattr(value, f.name), fresh))
        return staged
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if numpy is not None and isinstance(value, numpy.ndarray):
        return value if not value.flags.writeable and value.base is None else value.copy()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - objects deepcopy cannot copy: a pickle round trip
        return _serialization.loads(_serialization.dumps(value, what="state to save in the background"))
