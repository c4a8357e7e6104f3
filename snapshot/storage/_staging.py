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
  shuffle buffer's samples, is copied as one block in one call (its items become views of the block),
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
import dataclasses
import enum
import mmap
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from snapshot.container import _serialization

try:
    import numpy
except ImportError:  # pragma: no cover - numpy is optional
    numpy = None  # type: ignore[assignment]

__all__ = ["stage"]

_IMMUTABLE = (bytes, str, int, float, complex, bool, type(None), range, enum.Enum)
#: Leaves that are immutable by their exact type (a container of only these needs no walk).
_ATOMS = frozenset({bytes, str, int, float, complex, bool, type(None)})
_NONE: Mapping[int, Any] = MappingProxyType({})


def _block(items: list[Any]) -> list[Any] | None:
    """``items``, arrays (or CPU tensors that need no grad) of one dtype and shape, copied as one block:
    the block's rows; ``None`` for any other list."""
    kinds = set(map(type, items))
    if numpy is not None and kinds == {numpy.ndarray}:
        layouts = {(a.dtype, a.shape) for a in items}
        if len(layouts) != 1:
            return None
        dtype, shape = layouts.pop()
        if not shape or dtype.hasobject:
            return None
        block = _unadvised(len(items) * dtype.itemsize * int(numpy.prod(shape))).view(dtype)
        numpy.concatenate(items, axis=0, out=block.reshape(len(items) * shape[0], *shape[1:]))
        return list(block.reshape(len(items), *shape))
    if kinds == {torch.Tensor}:
        tensors = {(t.dtype, t.shape, t.device.type, t.layout, t.requires_grad) for t in items}
        if len(tensors) != 1 or tensors.pop()[2:] != ("cpu", torch.strided, False):
            return None
        return list(torch.stack(items).unbind(0))
    return None


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
    what :func:`snapshot.hooks._fresh.collecting` collected while ``value`` was captured)."""
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
        block = _block(value) if len(value) > 1 else None
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
