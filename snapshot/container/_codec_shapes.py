"""The shapes the encoder packs in one call of msgpack: the small values of the payload's frame, and lists
of tuples of one length (written by rows, ext ``ROWS``). Each check is exact (no subclass passes for its
base) and made in as few passes of Python as it can (``list.count`` and ``map`` run in C)."""

from __future__ import annotations

from typing import Any

__all__ = ["ROWS", "SMALL", "fits", "rows"]

ROWS = 16  # a list of more tuples than this is written by columns
#: Small values (:func:`fits`): scalars, strs and bytes of at most ``PLAIN_TEXT`` bytes, and dicts and lists
#: of them, at most ``SMALL`` items in all. The frame packs each run of them in one call.
SCALARS = frozenset({type(None), bool, int, float})
TEXTS = frozenset({str, bytes})
PLAIN_TEXT = 4096
SMALL = 32
KEYS = frozenset({str, *SCALARS})  # the keys of a small dict


def fits(value: Any, measure: dict[int, Any], left: int) -> int:
    """``left`` less the items of ``value``, or -1 unless ``value`` is small: a scalar, a str or bytes of at
    most ``PLAIN_TEXT`` bytes, or a list (of at most ``ROWS`` items) or dict (str or scalar keys) of small
    values, ``left`` items in all, none of them measured. A small value packed whole is packed as the frame
    would have written it, with nothing to stream, measure or name (and it holds no cycle: each level
    costs items)."""
    if id(value) in measure:
        return -1
    kind = type(value)
    if kind in SCALARS or (kind in TEXTS and len(value) <= PLAIN_TEXT):
        return left
    if kind is list:
        if len(value) > ROWS:
            return -1
        items = value
    elif kind is dict and KEYS.issuperset(map(type, value)):
        items = value.values()
    else:
        return -1
    left -= len(value)
    for item in items:
        if left < 0:
            return -1
        kind = type(item)
        if kind in SCALARS or (kind in TEXTS and len(item) <= PLAIN_TEXT):
            if id(item) in measure:
                return -1
        else:
            left = fits(item, measure, left)
    return left


def rows(value: list[Any]) -> bool:
    """Whether ``value`` holds more than ``ROWS`` items, only tuples (exactly: no subclass) of one length, not
    0. Each check is one pass in C (``list.count`` compares by identity first): a third of the time of sets
    of the types and lengths."""
    if len(value) <= ROWS:
        return False
    first = value[0]
    if type(first) is not tuple or not first:
        return False
    count = len(value)
    return list(map(type, value)).count(tuple) == count and list(map(len, value)).count(len(first)) == count
