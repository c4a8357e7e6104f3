"""Stable, address-free tokens for values: how a DataPipe's arguments enter its structural
fingerprint and the manifest (numbers and strings by value, functions by qualified name,
large collections by length and a sample, other objects by type)."""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe

__all__ = ["attribute", "describe_value", "type_name"]

#: Collections longer than this are fingerprinted by length and a sample of items.
_MAX_TOKEN_ITEMS = 64
_DISPLAY_WIDTH = 80


#: Per type, whether its instances are DataPipes: walking a graph asks of every attribute of every pipe,
#: and ``isinstance`` against torch's DataPipe classes (ABCs) costs a Python-level check each time. The first
#: check of a type walks every subclass of both (0.14-1.1 ms a type, 2 ms of a process's first restore): the
#: builtin types of plain arguments are known not to be DataPipes (only ``register`` could make one so, and a
#: builtin registered as a DataPipe would break torch's own checks).
_DATAPIPE_TYPES: dict[type, bool] = dict.fromkeys(
    (bool, int, float, complex, str, bytes, bytearray, type(None), range, slice, list, tuple, dict, set, frozenset,
     types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial), False)


def _is_datapipe(value: Any) -> bool:
    cls = type(value)
    known = _DATAPIPE_TYPES.get(cls)
    if known is None:
        known = _DATAPIPE_TYPES[cls] = issubclass(cls, (IterDataPipe, MapDataPipe))
    return known


#: torch's ``__getattr__`` of the DataPipe classes, with the functional names it answers (``.map``, ...).
_TORCH_GETATTR: dict[Any, dict[str, Any]] = {IterDataPipe.__getattr__: IterDataPipe.functions,
                                             MapDataPipe.__getattr__: MapDataPipe.functions}
_ABSENT = object()


def attribute(obj: Any, name: str, default: Any = None) -> Any:
    """``getattr(obj, name, default)``, without torch's ``__getattr__`` for a name it would refuse: it
    raises an ``AttributeError`` with a formatted message, and the graph walk, its checks and the sharding
    analysis probe every pipe for names most pipes lack."""
    if name in getattr(obj, "__dict__", ()):
        return getattr(obj, name, default)
    cls = type(obj)
    functions = _TORCH_GETATTR.get(getattr(cls, "__getattr__", None))
    if functions is not None and name not in functions and getattr(cls, name, _ABSENT) is _ABSENT:
        return default
    return getattr(obj, name, default)


def type_name(obj_or_type: Any) -> str:
    """``module.QualName`` of a type (or of an object's type)."""
    cls = obj_or_type if isinstance(obj_or_type, type) else type(obj_or_type)
    return f"{cls.__module__}.{cls.__qualname__}"


def _callable_token(value: Any) -> str:
    if isinstance(value, functools.partial):
        args = ", ".join(_token(a) for a in value.args)
        kwargs = ", ".join(f"{k}={_token(v)}" for k, v in sorted(value.keywords.items()))
        inner = ", ".join(x for x in (_callable_token(value.func), args, kwargs) if x)
        return f"partial({inner})"
    if isinstance(value, types.MethodType):
        return f"{type_name(value.__self__)}.{value.__func__.__name__}"
    module = getattr(value, "__module__", None) or "?"
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name is None:  # a callable object
        return f"<{type_name(value)}>"
    return f"{module}.{name}"


def _token(value: Any, depth: int = 0) -> str:
    """A stable, address-free token for ``value`` (used for fingerprints)."""
    if value is None or isinstance(value, (bool, int, float, str, range, slice)):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes[{len(value)}]:{hashlib.sha256(value).hexdigest()[:16]}"
    if isinstance(value, type):
        return type_name(value)
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                          functools.partial)):
        return _callable_token(value)
    if _is_datapipe(value):
        return f"<{type_name(value)}>"
    if isinstance(value, (list, tuple, set, frozenset, dict)) and depth < 3:
        return _collection_token(value, depth)
    return f"<{type_name(value)}>"


def _collection_token(value: Any, depth: int) -> str:
    name = type(value).__name__
    if isinstance(value, dict):
        items = [f"{_token(k, depth + 1)}: {_token(v, depth + 1)}" for k, v in value.items()]
    elif isinstance(value, (set, frozenset)):
        items = sorted(_token(v, depth + 1) for v in value)
    else:
        items = [_token(v, depth + 1) for v in value] if len(value) <= _MAX_TOKEN_ITEMS else []
    if len(value) <= _MAX_TOKEN_ITEMS:
        return f"{name}[{', '.join(items)}]"
    # Large collections: length plus a sample from both ends, so that fingerprinting
    # IterableWrapper(list_of_a_million_items) stays cheap and still sees edits at the ends.
    seq = list(value.items()) if isinstance(value, dict) else value
    if isinstance(seq, (set, frozenset)):
        return f"{name}[{len(value)}]"
    head = [_token(v, depth + 1) for v in list(seq[:8])]
    tail = [_token(v, depth + 1) for v in list(seq[-8:])]
    sample = hashlib.sha256("|".join(head + tail).encode()).hexdigest()[:16]
    return f"{name}[{len(value)}]:{sample}"


def describe_value(value: Any) -> str:
    """A short human-readable rendering of an argument (for manifests and messages)."""
    text = _token(value)
    if len(text) > _DISPLAY_WIDTH:
        text = text[: _DISPLAY_WIDTH - 3] + "..."
    return text
