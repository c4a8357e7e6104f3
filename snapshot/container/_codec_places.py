"""Where the values that are not data sit in a value the encoder packed, and a copy of a value that
msgpack could not pack (a cycle, nesting past its bounds) with those containers marked as not data.

Both walk Python containers the way the encoder goes (dict items key then value, the items of lists,
tuples, sets in iteration order, deques, torch's ``DataChunk``); they run only when such a value was met.
"""

from __future__ import annotations

import sys
from collections import defaultdict, deque
from gc import is_tracked
from typing import Any

from snapshot.container import _codec_types as types

__all__ = ["NotData", "Rows", "TooDeep", "bounded", "cycles", "find", "where"]

_NESTS = (list, tuple, dict, set, frozenset, deque, defaultdict)


class TooDeep(Exception):
    """Nesting past ``MAX_DEPTH`` levels of containers that the encoder enters in Python."""


class Rows:
    """Wraps a list of tuples of one length, which the encoder writes as one value, by columns: a tuple
    alone costs a call of Python code each way."""

    __slots__ = ("value",)

    def __init__(self, value: list[tuple[Any, ...]]) -> None:
        self.value = value


class NotData:
    """Wraps a container that the encoder saves pickled although its type is data (it is part of a
    cycle, or nested too deep)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def find(value: Any, steps: list[tuple[str, Any]], base: int, wanted: list[Any], found: list[str],
         active: set[int] | None = None, depth: int = 0) -> None:
    """Depth first through ``value`` in the encoder's order, appending to ``found`` the place of each of
    ``wanted`` (by identity, in order) that it meets."""
    active = set() if active is None else active
    if len(found) == len(wanted):
        return
    if value is wanted[len(found)]:
        found.append(where(steps))
        return
    if type(value) is Rows:  # by columns, as the encoder writes them
        rows = value.value
        for column in range(len(rows[0]) if rows else 0):
            for index, row in enumerate(rows):
                find(row[column], [*steps, ("item", base + index), ("item", column)], 0, wanted, found, active,
                     depth + 2)
        return
    kind = type(value)
    if (kind not in _NESTS and kind is not _data_chunk()) or id(value) in active or depth > types.MAX_DEPTH:
        return
    active.add(id(value))
    if isinstance(value, dict):
        for index, (key, item) in enumerate(value.items()):
            find(key, [*steps, ("key", base + index)], 0, wanted, found, active, depth + 1)
            find(item, [*steps, ("value", key)], 0, wanted, found, active, depth + 1)
    else:
        step = "member" if kind in (set, frozenset) else "item"
        for index, item in enumerate(value):
            find(item, [*steps, (step, base + index)], 0, wanted, found, active, depth + 1)
    active.discard(id(value))


def where(steps: list[tuple[str, Any]]) -> str:
    """A place said as Python would reach it: ``.state[3]``, ``['0/datapipe']``, ``{2}`` (the third
    member of a set), ``.keys()[1]`` (the second key of a dict)."""
    parts = []
    for kind, step in steps:
        if kind == "value":
            parts.append(f".{step}" if type(step) is str and step.isidentifier() else f"[{_short_repr(step)}]")
        else:
            parts.append({"item": "[{}]", "member": "{{{}}}", "key": ".keys()[{}]"}[kind].format(step))
    return "".join(parts)


def cycles(value: Any) -> set[int]:
    """The ids of the containers in ``value`` that a depth-first walk finds inside themselves (each cycle
    has one: the first of its containers the walk enters). Containers the garbage collector does not
    track hold only atomic values, so they are on no cycle."""
    found: set[int] = set()
    entered: set[int] = set()
    done: set[int] = set()

    def walk(node: Any, depth: int) -> None:
        entered.add(id(node))
        for child in (node.values() if isinstance(node, dict) else node):
            if type(child) in _NESTS and is_tracked(child):
                if id(child) in entered:
                    found.add(id(child))
                elif id(child) not in done and depth < types.MAX_DEPTH:
                    walk(child, depth + 1)
        entered.discard(id(node))
        done.add(id(node))

    if type(value) in _NESTS and is_tracked(value):
        walk(value, 0)
    return found


def bounded(value: Any, cyclic: set[int], depth: int = 0) -> Any:
    """A copy of ``value`` in which the outermost container of each cycle, and each container nested
    ``MAX_DEPTH`` levels deep, is marked as not data (what msgpack could not pack)."""
    kind = type(value)
    if kind not in _NESTS:
        return value
    if id(value) in cyclic or depth >= types.MAX_DEPTH:
        return NotData(value)
    if isinstance(value, dict):
        pairs = {bounded(k, cyclic, depth + 1): bounded(v, cyclic, depth + 1) for k, v in value.items()}
        return defaultdict(value.default_factory, pairs) if isinstance(value, defaultdict) else pairs
    items = [bounded(item, cyclic, depth + 1) for item in value]
    return deque(items, value.maxlen) if isinstance(value, deque) else kind(items)


def _short_repr(key: Any) -> str:
    try:
        text = repr(key)
    except Exception:  # noqa: BLE001 - a key of a class whose __repr__ fails still needs a name
        return f"<{type(key).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _data_chunk() -> Any:
    """torch's ``DataChunk`` when torch is imported (``None`` otherwise: then no value is one)."""
    module = sys.modules.get("torch.utils.data.datapipes.datapipe")
    return None if module is None else module.DataChunk
