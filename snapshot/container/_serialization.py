"""Pickling, in one place: the only module that imports ``dill``.

Graphs are pickled with ``dill`` so that lambdas and local functions survive (as
torchdata's DataLoader2 did). States and payloads try the standard ``pickle`` first, which
is faster, and fall back to ``dill``. A failure is reported as a :class:`SerializationError`
that names the DataPipe (node path and type) and the attribute that cannot be pickled.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import re
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any

import dill

from snapshot import schema
from snapshot.container import _reducers
from snapshot.errors import SerializationError
from snapshot.schema.saved import map_node_states

__all__ = ["clone", "cooperative", "decode_nodes", "dumps", "dumps_graph", "explain_missing_code", "loads",
           "loads_graph", "portable_graph"]

_PICKLE = b"P"
_DILL = b"D"


_local = threading.local()


class _Frames(io.BytesIO):
    """A pickle's output, written frame by frame through Python code.

    The C pickler holds the GIL for a whole ``dumps``; writing through a Python method
    gives the interpreter a chance to switch threads between frames (64 KiB), so a
    background save does not stall the thread that keeps iterating.
    """

    def write(self, data: Any) -> int:
        return super().write(data)


@contextlib.contextmanager
def cooperative() -> Iterator[None]:
    """In this thread, pickle so that other threads keep running (see :class:`_Frames`)."""
    _local.cooperative = True
    try:
        yield
    finally:
        _local.cooperative = False


def _pickle(obj: Any, *, graph: bool = False) -> bytes:
    # the tag and the pickle go into one buffer: ``tag + pickle.dumps()`` would copy the
    # whole pickle once more (a large buffered state twice in memory)
    out = _Frames() if getattr(_local, "cooperative", False) else io.BytesIO()
    out.write(_PICKLE)
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    if graph:  # a graph's random generators in compact form (see _reducers)
        pickler.dispatch_table = _reducers.dispatch_table()
    pickler.dump(obj)
    return out.getvalue()


def _dill(obj: Any, **settings: Any) -> bytes:
    """A graph pickled with dill (``settings``: its ``recurse``, ...), its random generators in compact form."""
    out = io.BytesIO()
    out.write(_DILL)
    pickler = dill.Pickler(out, pickle.HIGHEST_PROTOCOL, **settings)
    pickler.dispatch_table = _reducers.dispatch_table()
    pickler.dump(obj)
    return out.getvalue()


def _the(what: str) -> str:
    """``what`` with its article: callers may name a thing with one (``the state of ...``) or without."""
    return what if what.startswith(("the ", "a ", "an ")) else f"the {what}"


def dumps(obj: Any, *, what: str = "object") -> bytes:
    """Pickle ``obj``; the first byte records which pickler was used."""
    try:
        return _pickle(obj)
    except Exception:  # noqa: BLE001 - any pickle failure falls back to dill
        pass
    try:
        return _DILL + dill.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise SerializationError(
            f"cannot pickle {_the(what)}: {type(exc).__name__}: {exc}. "
            "Every value a snapshot stores must be picklable by pickle or dill."
        ) from exc


def loads(data: bytes, *, what: str = "object") -> Any:
    """Inverse of :func:`dumps`. Only call it on verified bytes."""
    tag, body = data[:1], data[1:]
    try:
        if tag == _PICKLE:
            return pickle.loads(body)
        if tag == _DILL:
            return dill.loads(body)
    except (ModuleNotFoundError, AttributeError) as exc:
        raise SerializationError(
            f"cannot unpickle {_the(what)}: {exc}. It refers to code that is not importable "
            "here; install the module that defines it, or build the graph in code and pass "
            "it to DataLoader2 before restoring."
        ) from exc
    except Exception as exc:
        raise SerializationError(f"cannot unpickle {_the(what)}: {type(exc).__name__}: {exc}") from exc
    raise SerializationError(f"cannot unpickle {_the(what)}: unknown pickler tag {tag!r}")


def _graph(datapipe: Any) -> Any:
    from snapshot.engine.graph import Graph  # torch, only when a graph is pickled

    return Graph(datapipe)


def _function_of(value: Any) -> types.FunctionType | None:
    """The function behind a callable (a function, a partial, a bound method), if any."""
    for _ in range(8):
        if isinstance(value, types.FunctionType):
            return value
        value = getattr(value, "func", None) or getattr(value, "__func__", None)
        if value is None:
            return None
    return None


def _global_culprit(value: Any) -> str:
    """Which global of the function behind ``value`` cannot be pickled with it (or ``""``)."""
    fn = _function_of(value)
    if fn is None:
        return ""
    try:
        names = dill.detect.globalvars(fn, recurse=True)
    except Exception:  # noqa: BLE001 - no better diagnosis
        return ""
    for name, used in names.items():
        try:
            dill.dumps(used, recurse=True)
        except Exception as exc:  # noqa: BLE001 - diagnosing an arbitrary pickling failure
            return (f"; the function {fn.__qualname__} (in {fn.__module__}) uses the global {name!r} = "
                    f"{type(used).__name__}, which cannot be pickled ({type(exc).__name__}: {exc})")
    return ""


def _culprit(graph: Any, *, recurse: bool = False) -> str:
    """Name the innermost node (and attribute) that stops the graph from pickling."""
    for node in reversed(graph.nodes):  # inputs come after their consumers in graph order
        try:
            dill.dumps(node.datapipe, recurse=recurse)
            continue
        except Exception as exc:  # noqa: BLE001 - diagnosing an arbitrary pickling failure
            error = exc
        inputs = {id(graph.by_path[p].datapipe) for p in node.inputs}
        try:
            attributes = dict(vars(node.datapipe))
        except TypeError:
            attributes = {}
        for name, value in attributes.items():
            if id(value) in inputs:
                continue
            try:
                dill.dumps(value, recurse=recurse)
            except Exception as attr_error:  # noqa: BLE001 - same diagnosis, per attribute
                return (
                    f"the DataPipe at {node.path} ({node.signature}) holds attribute "
                    f"{name!r} = {type(value).__name__} that cannot be pickled "
                    f"({type(attr_error).__name__}: {attr_error}){_global_culprit(value) if recurse else ''}"
                )
        return f"the DataPipe at {node.path} ({node.signature}) cannot be pickled ({error})"
    return "the graph cannot be pickled"


class _ByValueClasses:
    """While pickling, make DataPipe classes that dill pickles by value rebuild correctly.

    dill pickles a class defined in ``__main__`` (a script, a notebook) by value, and the
    copy goes through torch's DataPipe metaclass again. Two things go wrong unless fixed for
    the duration of the dump:

    - dill rebuilds the class from ``__orig_bases__`` when it has one, and such a class
      inherits ``IterDataPipe.__orig_bases__`` (``IterableDataset[T]``): the copy would lose
      its ``IterDataPipe`` base. It gets ``__orig_bases__ = __bases__``.
    - its ``__iter__``, ``__next__`` and ``reset`` are already wrapped by torch; the
      metaclass would wrap them a second time (every ``iter()`` then invalidates itself).
      dill is shown the unwrapped functions.
    """

    _WRAPPED = ("__iter__", "__next__", "reset")

    def __init__(self, datapipe: Any):
        self.classes: list[type] = []
        for node in _graph(datapipe):
            cls = type(node.datapipe)
            if cls.__module__ == "__main__" and cls not in self.classes:
                self.classes.append(cls)
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> None:
        for cls in self.classes:
            if "__orig_bases__" not in vars(cls) and getattr(cls, "__orig_bases__", None) is not None:
                self._saved.append((cls, "__orig_bases__", _ABSENT))
                cls.__orig_bases__ = cls.__bases__  # type: ignore[attr-defined]
            for name in self._WRAPPED:
                method = vars(cls).get(name)
                original = getattr(method, "__wrapped__", None)
                if original is not None:
                    self._saved.append((cls, name, method))
                    setattr(cls, name, original)

    def __exit__(self, *exc: Any) -> None:
        for cls, name, value in reversed(self._saved):
            if value is _ABSENT:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        self._saved.clear()


_ABSENT = object()


def dumps_graph(datapipe: Any) -> bytes:
    """Pickle a DataPipe graph (with the standard pickler, in C, when it can: dill's is Python, and a
    shuffle's random generator alone is 625 ints; else with dill), naming the pipe that fails.

    Functions and classes of ``__main__`` (a script, a notebook) refer to this process's
    ``__main__`` and share its globals: the loader's own copy of the graph sees the script's
    globals as they change. A snapshot keeps :func:`portable_graph` instead.
    """
    try:
        return _pickle(datapipe, graph=True)
    except Exception:  # noqa: BLE001 - a lambda, a local function, ...: dill pickles them
        return _dill_graph(datapipe)


def _dill_graph(datapipe: Any) -> bytes:
    """The graph pickled with dill (a script's classes and functions by value), naming the pipe that fails."""
    try:
        with _ByValueClasses(datapipe):
            return _dill(datapipe)
    except Exception as exc:
        detail = _culprit(_graph(datapipe))
        raise SerializationError(
            f"cannot pickle the DataPipe graph: {detail}. Make that value picklable, or save "
            "with include_graph=False and rebuild the same graph in code before restoring."
        ) from exc


def portable_graph(datapipe: Any, data: bytes) -> tuple[bytes, str | None]:
    """The graph pickle a snapshot keeps, so that ``from_snapshot`` works in another script.

    ``data`` is :func:`dumps_graph` of ``datapipe``. When it refers to ``__main__``, the graph is
    pickled again with the functions and classes of ``__main__`` carrying the globals they use
    (dill's ``recurse``). When that is impossible, ``data`` comes back with the reason: which
    pipe, which function and which global.
    """
    if b"__main__" not in data:  # nothing from the script: loads wherever the modules import
        return data, None
    try:
        with _ByValueClasses(datapipe):
            return _dill(datapipe, recurse=True), None
    except Exception:  # noqa: BLE001 - reported at the save that needs it, with the culprit
        # the script's functions by value (not by name, as the C pickler has them), as far as they go
        kept = _dill_graph(datapipe) if data[:1] == _PICKLE else data
        return kept, _culprit(_graph(datapipe), recurse=True)


def loads_graph(data: bytes) -> Any:
    return loads(data, what="DataPipe graph")


def clone(datapipe: Any) -> tuple[Any, bytes]:
    """A deep copy of a graph through its pickle; also returns the pickle."""
    data = dumps_graph(datapipe)
    return loads_graph(data), data


# -- format 1: node states were pickled one per node, inside the payload's pickle -----------

def _map_nodes(service: Mapping[str, Any], convert: Any) -> dict[str, Any]:
    """A copy of ``service`` with ``convert(path, state)`` applied to every node state."""
    record = schema.ServiceState.from_dict(service)
    return {} if record is None else map_node_states(record, convert).to_dict()


def decode_nodes(service: Mapping[str, Any]) -> dict[str, Any]:
    """The node states of a format-1 payload, unpickled (call only on verified, trusted payloads)."""
    return _map_nodes(service, lambda path, state: loads(
        state, what=f"state of the DataPipe at {path}") if isinstance(state, bytes) else state)


def explain_missing_code(exc: BaseException) -> None:
    """Add the likely cause and the fix to a ``NameError``/``ImportError`` that a graph unpickled from a
    snapshot raised (a function pickled with the script that saved it, whose globals or imports are
    not here)."""
    if not isinstance(exc, (NameError, ImportError)) or not hasattr(exc, "add_note"):
        return
    if getattr(exc, "_snapshot_explained", False):
        return
    setattr(exc, "_snapshot_explained", True)  # noqa: B010 - a private mark on a foreign exception
    found = re.search(r"name '([\w.]+)' is not defined|No module named '([\w.]+)'", str(exc))
    missing = next((name for name in found.groups() if name), None) if found else None
    kind = "module" if isinstance(exc, ImportError) else "name"
    what = f"the {kind} {missing!r}" if missing else f"a {kind}"
    exc.add_note(
        f"This graph was unpickled from a snapshot, and one of its functions needs {what}, which this process "
        "does not have. Likely cause: the function was defined in the script that saved the snapshot and uses a "
        "global or an import of that script (snapshots from older versions of snapshot did not carry a "
        "script's globals), or it imports a module that is not installed here. Fix: put the function in a module that "
        "both scripts import, or build the graph in code and call restore_snapshot(); or save again from the "
        "first script with this version, which pickles a script's functions with the globals they use.")
