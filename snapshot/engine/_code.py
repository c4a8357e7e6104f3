"""Code fingerprints: what a function argument of a DataPipe (``map``'s ``fn``) runs.

A function is identified by its code, not its name: its bytecode, constants and names,
recursively through the code objects nested in it (inner functions, lambdas, comprehensions),
its closure, its default arguments, and the functions of its own module that it calls. So
editing a map function's body changes its fingerprint while its qualified name stays the same.

Bytecode differs between Python versions: a fingerprint is ``"<major>.<minor>:<digest>"``, and
two fingerprints made by different versions cannot be compared. Values of globals are not
covered (a global constant changed between runs is not seen).
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from typing import Any

from snapshot.engine._tokens import _token

__all__ = ["code_fingerprint", "python_of"]

_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def python_of(fingerprint: str) -> str:
    """The Python version that made ``fingerprint``."""
    return fingerprint.split(":", 1)[0]


def function_behind(value: Any) -> types.FunctionType | None:
    """The Python function a callable runs: itself, a partial's or a method's function, or a
    callable object's ``__call__`` (``None`` for a builtin or a non-callable)."""
    for _ in range(8):
        if isinstance(value, types.FunctionType):
            return value
        if isinstance(value, functools.partial):
            value = value.func
        elif isinstance(value, types.MethodType):
            value = value.__func__
        elif callable(value) and not isinstance(value, (type, types.BuiltinFunctionType)):
            value = type(value).__call__
        else:
            return None
    return None


def _hash_code(code: types.CodeType, fn: types.FunctionType | None, digest: Any, seen: set[int]) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(const, None, digest, seen)
        else:
            digest.update(_token(const).encode())
    if fn is None:
        return
    digest.update(_token(fn.__defaults__).encode() + _token(fn.__kwdefaults__).encode())
    cells = [cell.cell_contents for cell in fn.__closure__ or () if cell.cell_contents is not fn]
    called = [fn.__globals__.get(name) for name in code.co_names]
    same_module = [f for f in called if isinstance(f, types.FunctionType) and f.__module__ == fn.__module__]
    for value in cells + same_module:
        inner = function_behind(value)
        if inner is None:
            digest.update(_token(value).encode())
        elif id(inner) not in seen:
            seen.add(id(inner))
            _hash_code(inner.__code__, inner, digest, seen)


def code_fingerprint(value: Any) -> str | None:
    """``"<python>:<digest>"`` of the code ``value`` runs, or ``None`` when it runs no Python function."""
    fn = function_behind(value)
    if fn is None:
        return None
    digest = hashlib.sha256()
    _hash_code(fn.__code__, fn, digest, {id(fn)})
    return f"{_PYTHON}:{digest.hexdigest()[:16]}"
