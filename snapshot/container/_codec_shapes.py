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
BIG = SMALL + 1  # the weight of a value that is not small (see fits)
KEYS = frozenset({str, *SCALARS})  # the keys of a small dict


def fits(value: Any, measure: dict[int, Any], left: int, weights: dict[int, int] | None = None, *,
         measured: bool = False) -> int:
    """``left`` less the items of ``value``, or -1 unless ``value`` is small: a scalar, a str or bytes of at
    most ``PLAIN_TEXT`` bytes, or a list (of at most ``ROWS`` items) or dict (str or scalar keys) of small
    values, ``left`` items in all, none of them measured. A small value packed whole is packed as the frame
    would have written it, with nothing to stream, measure or name (and it holds no cycle: each level
    costs items).

    ``weights`` keeps the items counted in each dict and list met, by ``id`` (while its values live and do
    not change), so that the frame's walk, which asks about a dict and then about each of its items, counts
    each one once. ``measured``: ``value`` itself may be measured (packed whole, its size is its bytes)."""
    if not measured and id(value) in measure:
        return -1
    kind = type(value)
    if kind in SCALARS or (kind in TEXTS and len(value) <= PLAIN_TEXT):
        return left
    if kind is not list and kind is not dict:
        return -1
    weight = _weight(value, measure, {} if weights is None else weights, left)
    return left - weight if weight <= left else -1


def _weight(value: Any, measure: dict[int, Any], weights: dict[int, int], room: int) -> int:
    """The items of ``value`` (a dict or a list) and of the dicts and lists in it if they are small and at most
    ``room``, else ``BIG``. Each level costs items, so the walk goes at most ``room`` levels deep (a value inside
    itself too)."""
    known = weights.get(id(value))
    if known is not None:
        return known if known <= room else BIG
    total = len(value)
    if type(value) is list:
        if total > ROWS:
            weights[id(value)] = BIG
            return BIG
        items: Any = value
    elif total > SMALL or not KEYS.issuperset(map(type, value)):  # the length first: a big dict's keys
        weights[id(value)] = BIG
        return BIG
    else:
        items = value.values()
    for item in items:
        if total > room:
            break
        kind = type(item)
        if kind in SCALARS or (kind in TEXTS and len(item) <= PLAIN_TEXT):
            if id(item) in measure:
                weights[id(value)] = BIG
                return BIG
        elif (kind is list or kind is dict) and id(item) not in measure:
            total += _weight(item, measure, weights, room - total)
        else:
            weights[id(value)] = BIG
            return BIG
    if total > room:
        if room >= SMALL:  # more than any room: not small, whoever asks
            weights[id(value)] = BIG
        return BIG
    weights[id(value)] = total
    return total


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
