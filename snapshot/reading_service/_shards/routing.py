"""Dealing the samples that reach a ``sharding_filter`` or a dispatcher to logical shards:
:class:`Router` (sample i to shard i % L, in this process) and :class:`RemoteRouter` (fetched
from the dispatching process)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from snapshot.schema.state import RouterState

__all__ = ["Deal", "RemoteFetch", "RemoteRouter", "Router", "RouterPort"]


class Deal:
    """Which unit (logical shard or sub-shard) sample ``i`` of a sharding point goes to.

    An epoch starts with one level: sample ``i`` goes to unit ``i % M``. A restore onto a
    number of ranks that cannot share the units equally adds a level ``(M', split, moved)``
    from where each unit had stopped: sample ``i`` of unit ``u`` goes to unit ``i % M'`` once
    ``i >= split[u]`` (``M'`` is a multiple of ``M``, so unit ``u`` keeps the samples
    ``i = u mod M'`` and its sub-units ``u + k M`` take the others), except the few samples in
    ``moved`` (sample index to unit) that even out the ranks' shares. Plain data: ``levels`` is
    ``[[M], [M', {u: split}, {i: unit}], ...]``.
    """

    __slots__ = ("levels", "modulus")

    def __init__(self, modulus: int, levels: Sequence[Sequence[Any]] | None = None):
        self.levels: list[tuple[int, dict[int, int], dict[int, int]]] = [(int(modulus), {}, {})]
        if levels:
            self.levels = [(int(level[0]), _ints(level[1] if len(level) > 1 else {}),
                            _ints(level[2] if len(level) > 2 else {})) for level in levels]
        self.modulus = self.levels[-1][0]

    def unit(self, index: int) -> int:
        levels = self.levels
        unit = index % levels[0][0]
        if len(levels) == 1:  # every epoch but one split by a restore: no copy of the levels per sample
            return unit
        for modulus, split, moved in levels[1:]:
            start = split.get(unit)
            if start is None or index < start:
                break
            unit = moved.get(index, index % modulus)
        return unit

    def after(self, unit: int, index: int) -> int:
        """The smallest sample index above ``index`` that ``unit`` may still be dealt."""
        if len(self.levels) == 1:
            return index + self.modulus
        return next((i for i in range(index + 1, index + self.modulus + 1) if self.unit(i) == unit),
                    index + self.modulus)

    def split(self, modulus: int, starts: Mapping[int, int], moved: Mapping[int, int] | None = None) -> Deal:
        """This deal with the units split into ``modulus`` from each unit's ``starts`` on."""
        if modulus % self.modulus:
            raise ValueError(f"a split needs a multiple of {self.modulus} units, not {modulus}")
        return Deal(modulus, [*self.state(), [modulus, dict(starts), dict(moved or {})]])

    def state(self) -> list[list[Any]]:
        return [[m, dict(split), dict(moved)] if i else [m] for i, (m, split, moved) in enumerate(self.levels)]


def _ints(mapping: Mapping[Any, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in mapping.items()}


class Router:
    """Deals the samples reaching a ``sharding_filter`` to logical shards: sample i to i % L.

    Only owned shards' samples are kept (queued by value until their shard reads them). A
    filter that was already configured by hand (``apply_sharding(n, k)`` before the loader
    saw it) keeps only its share first; the logical shards split that share.
    """

    def __init__(self, source: Iterator[Any], count: int, shards: Sequence[int],
                 state: RouterState | None = None, *, outer: tuple[int, int] = (1, 0)):
        self.source = source
        self.count = count
        self.deal = Deal(count, state.deal if state is not None else None)
        self.outer = outer
        self.position = 0  # samples read from the source
        self.kept = 0  # samples of this filter's share so far (the index shards are dealt by)
        self.ended = False
        self.next_index = {s: s for s in shards}
        self.queues: dict[int, deque[tuple[int, Any]]] = {s: deque() for s in shards}
        if state is not None:
            self.position, self.kept, self.ended = state.position, state.kept, state.ended
            self.next_index = {int(s): int(i) for s, i in state.next.items()}
            self.queues = {int(s): deque((int(i), x) for i, x in q) for s, q in state.queues.items()}

    def next_for(self, shard: int) -> Any:
        queue = self.queues[shard]
        outer_count, outer_id = self.outer
        while not queue:
            if self.ended:
                raise StopIteration
            try:
                item = next(self.source)
            except StopIteration:
                self.ended = True
                raise
            position = self.position
            self.position = position + 1
            if outer_count > 1 and position % outer_count != outer_id:
                continue
            index = self.kept
            self.kept = index + 1
            target = self.deal.unit(index)
            wanted = self.queues.get(target)
            if wanted is not None and index >= self.next_index[target]:
                wanted.append((index, item))
        index, item = queue.popleft()
        self.next_index[shard] = self.deal.after(shard, index)
        return item

    def state(self) -> RouterState:
        return RouterState(position=self.position, kept=self.kept, ended=self.ended,
                           next={s: i for s, i in self.next_index.items()},
                           queues={s: [[i, x] for i, x in q] for s, q in self.queues.items()},
                           deal=self.deal.state() if len(self.deal.levels) > 1 else None)


def _outer(datapipe: Any) -> tuple[int, int]:
    """The share a ``sharding_filter`` was configured to keep by hand (a dispatcher keeps all)."""
    return int(getattr(datapipe, "num_of_instances", 1)), int(getattr(datapipe, "instance_id", 0))


class RouterPort(Iterator[Any]):
    """A shard's view of a router: the cell of the ``sharding_filter`` in the shard's copy."""

    __slots__ = ("router", "shard", "yielded", "exhausted", "path", "datapipe")

    def __init__(self, router: Router | RemoteRouter, shard: int, datapipe: Any):
        self.router = router
        self.shard = shard
        self.datapipe = datapipe
        self.yielded = 0
        self.exhausted = False
        self.path: str | None = None

    def __iter__(self) -> RouterPort:
        return self

    def __next__(self) -> Any:
        try:
            item = self.router.next_for(self.shard)
        except StopIteration:
            self.exhausted = True
            raise
        self.yielded += 1
        return item


#: How a worker gets a dispatcher's samples: ``fetch(dispatcher path, shard, samples received
#: so far)`` returns the next samples of that shard and whether the shard has ended there.
RemoteFetch = Callable[[str, int, int], tuple[list[Any], bool]]


class RemoteRouter:
    """A dispatcher whose upstream part runs in another process: a worker's side of it.

    Asks for a shard's samples only when it has none left, so a request also tells the
    dispatching process exactly how many the shard has read.
    """

    def __init__(self, path: str, fetch: RemoteFetch, shards: Sequence[int], received: Mapping[int, int]):
        self.path = path
        self.fetch = fetch
        self.received = {s: int(received.get(s, 0)) for s in shards}
        self.ended = {s: False for s in shards}
        self.queues: dict[int, deque[Any]] = {s: deque() for s in shards}

    def next_for(self, shard: int) -> Any:
        queue = self.queues[shard]
        if not queue:
            if self.ended[shard]:
                raise StopIteration
            items, ended = self.fetch(self.path, shard, self.received[shard])
            self.received[shard] += len(items)
            self.ended[shard] = ended
            queue.extend(items)
            if not queue:
                raise StopIteration
        return queue.popleft()


# Generator states are swapped as the generators' own objects (cheap: no copies into lists);
# they become plain data only when a snapshot is taken.
