"""Values a capture made for itself: a background save takes them as they are, or makes them in its thread.

A background save stages what it captured (:mod:`snapshot.storage._staging`): it copies every
container and walks every list for samples to copy, so that the running graph cannot change what is
written. A hook's ``get_state`` may build a container that needs neither: new (made by this call,
held by nothing else) and holding only values that nobody changes (the keys of a buffer saved by
position, each made once by :meth:`~snapshot.hooks._positions.Reproducer.key` and only replaced,
never changed, and the ``None`` that stand for their samples). :func:`fresh` says so. While a
background save captures (:func:`collecting`, in the thread that captures), the values said fresh are
kept, by identity, and the staging takes them as they are: 10,000 positions cost the save's blocking
part nothing instead of a walk over them.

A hook may also leave a value to be made later (:func:`later`), when ``make`` reads nothing the running
graph changes (the ``None`` that stand for 10,000 samples saved by position: a list of 10,000 made in the
save's thread). While a background save captures, the capture holds a :class:`Later` in its place, and the
save's thread puts ``make()`` there before it writes (:meth:`Collected.make_later`). Anywhere else,
:func:`fresh` does nothing and :func:`later` returns ``make()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Collected", "Later", "collected", "collecting", "fresh", "later"]

_T = TypeVar("_T")
_local = threading.local()


class Later:
    """Stands in a capture for ``make()``, made by the background save's thread."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


class Collected(dict[int, Any]):
    """The values a capture said :func:`fresh` or left for :func:`later`, by ``id``."""

    def __init__(self) -> None:
        super().__init__()
        self.later = 0
        #: The reading service the loader asks directly for its checkpoint: only its own ``checkpoint`` may leave
        #: the record for later (a service that wraps another, or overrides it, may change the dict it returns).
        self.service: Any = None

    def defer(self, make: Callable[[], _T]) -> _T | Later:
        """A :class:`Later` of ``make`` that the save's thread makes (:func:`later`, for a caller that holds this
        capture's values rather than running in its thread: the staging of a block of samples, whose rows are
        made in the save's thread)."""
        value = Later(make)
        self[id(value)] = value  # taken by the staging as it is
        self.later += 1
        return value

    def make_later(self, value: Any) -> None:
        """Put in ``value`` (what the capture became once staged: its dicts, lists and dataclasses are the
        save's own) each :class:`Later`'s value; in the save's thread."""
        if self.later and _make_later(value, self.later):
            raise RuntimeError(f"a capture left {self.later} value(s) to make later, and not all of them were "
                               "found in a dict, list or dataclass of what was staged")


def _make_later(value: Any, left: int) -> int:
    """:meth:`Collected.make_later` in ``value``: how many are left to make once it is walked."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(item) is Later:
                value[key] = item = item.make()  # (a key's value replaced: the dict does not resize)
                left -= 1
            if left and (type(item) in _WALKED or dataclasses.is_dataclass(item)):
                left = _make_later(item, left)  # (a made value may hold a Later of its own: a service's record)
            if not left:
                break
    elif kind is list:
        for index, item in enumerate(value):
            if type(item) is Later:
                value[index] = item = item.make()
                left -= 1
            if left and (type(item) in _WALKED or dataclasses.is_dataclass(item)):
                left = _make_later(item, left)
            if not left:
                break
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        left = _make_later(vars(value), left)
    return left


_WALKED = frozenset({dict, list})


def fresh(value: _T) -> _T:
    """``value``, which its caller just made and which holds nothing that anyone changes (see the module)."""
    found = getattr(_local, "found", None)
    if found is not None:
        found[id(value)] = value  # the value is held: its id cannot be reused while the save stages
    return value


def later(make: Callable[[], _T]) -> _T | Later:
    """``make()``; while a background save captures, a :class:`Later` that its thread makes. ``make`` reads
    only what its caller copied for it (nothing the running graph changes) and returns a new value that
    holds nothing anyone changes."""
    found = getattr(_local, "found", None)
    return make() if found is None else found.defer(make)


def collected() -> Collected | None:
    """What this thread's background capture collects so far (``None``: no background save captures here)."""
    return getattr(_local, "found", None)


@contextlib.contextmanager
def collecting() -> Iterator[Collected]:
    """The values said :func:`fresh` (or left for :func:`later`) in this thread while the block runs, by ``id``."""
    found = Collected()
    outer = getattr(_local, "found", None)
    _local.found = found
    try:
        yield found
    finally:
        _local.found = outer
