"""A directory's index lists a record of every logical shard and upstream copy of the job, which a
restoring rank reads few of: :class:`Records` keeps them as parsed JSON, checked for shape when the
index is read (:func:`index_shards`, :func:`index_upstream`), and each record checked in full the
first time it is used, so that reading the index costs a rank little more than parsing its JSON."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, overload

from snapshot.errors import ManifestError
from snapshot.schema._fields import T, _int, _list, _object

_UNREAD: Any = object()


class Records(Sequence[T], Generic[T]):
    """A list of records read from JSON when first used (``read(item, where)``); a record that is wrong is
    a :class:`ManifestError` naming its field and ``source``, then. :meth:`check` reads them all."""

    __slots__ = ("_raw", "_read", "_where", "_source", "_done")

    def __init__(self, raw: list[Any], where: str, read: Callable[[Any, str], T], source: str) -> None:
        self._raw, self._read, self._where, self._source = raw, read, where, source
        self._done: list[Any] = [_UNREAD] * len(raw)

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[T, ...]: ...

    def __getitem__(self, i: int | slice) -> T | tuple[T, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        value = self._done[i]
        if value is _UNREAD:
            index = i % len(self._raw)
            try:
                value = self._read(self._raw[index], f"{self._where}[{index}]")
            except ManifestError as exc:
                raise exc.at(self._source) from None
            self._done[index] = value
        return value

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, list, Records)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Records({len(self)} {self._where}, {sum(v is not _UNREAD for v in self._done)} read)"

    def check(self) -> None:
        """Read every record (a :class:`ManifestError` names the first that is wrong)."""
        for i in range(len(self)):
            self[i]

    @property
    def raw(self) -> list[Any]:
        """The records as parsed JSON (each an object, or ``None`` where :func:`index_shards` allows it)."""
        return self._raw


class Mapped(Sequence[Any]):
    """``read(records[i])`` for ``i`` below ``length`` (``None`` where a record is ``None`` or absent), each read
    when asked: a count of every unit of an index, of which a rank's plan reads its own units' only."""

    __slots__ = ("_records", "_read", "_length")

    def __init__(self, records: Sequence[Any], read: Callable[[Any], Any], length: int) -> None:
        self._records, self._read, self._length = records, read, length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if not -self._length <= i < self._length:
            raise IndexError(i)
        i %= self._length
        record = self._records[i] if i < len(self._records) else None
        return None if record is None else self._read(record)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, list, Mapped)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Mapped({self._length} records)"


def index_shards(value: Any, where: str, read: Callable[[Any, str], T], source: str) -> Records[T]:
    """An index's ``shards``: a list of objects or nulls, each read in full when used."""
    for i, item in enumerate(_list(value, where)):
        if item is not None and type(item) is not dict:
            _object(item, f"{where}[{i}]")
    return Records(value, where, read, source)


def index_upstream(value: Any, where: str, read: Callable[[Any, str], T], source: str) -> Records[T]:
    """An index's ``upstream``: a list of objects whose ``shards`` are lists of ints, each read in full when used."""
    for i, item in enumerate(_list(value, where)):
        shards = _object(item, f"{where}[{i}]").get("shards")
        if shards is not None and (type(shards) is not list or not all(type(s) is int and s >= 0 for s in shards)):
            for j, shard in enumerate(_list(shards, f"{where}[{i}].shards")):
                _int(shard, f"{where}[{i}].shards[{j}]")
    return Records(value, where, read, source)


def unknown_node(records: Sequence[Any], where: str, paths: set[str]) -> tuple[str, str] | None:
    """The first record's place and node path that is not one of ``paths`` (``None``: there is none), read or not."""
    raw = records.raw if isinstance(records, Records) else None
    for i in range(len(records)):
        if raw is None:
            record = records[i]
            nodes = None if record is None else record.nodes
        else:
            nodes = None if raw[i] is None else raw[i].get("nodes")
            if nodes is not None and type(nodes) is not dict:
                _object(nodes, f"{where}[{i}].nodes")
        if nodes and not paths.issuperset(nodes):
            return f"{where}[{i}]", next(path for path in nodes if path not in paths)
    return None


def upstream_shards(records: Sequence[Any]) -> Iterator[tuple[int, Sequence[int]]]:
    """Each upstream copy's index and the logical shards it feeds, read or not."""
    if isinstance(records, Records):
        yield from ((i, item.get("shards") or ()) for i, item in enumerate(records.raw))
    else:
        yield from enumerate(copy.shards for copy in records)


def missing(records: Sequence[Any]) -> int | None:
    """The first ``None`` record's index (``None``: there is none), read or not."""
    for i, item in enumerate(records.raw if isinstance(records, Records) else records):
        if item is None:
            return i
    return None


__all__ = ["Mapped", "Records", "index_shards", "index_upstream", "missing", "unknown_node", "upstream_shards"]
