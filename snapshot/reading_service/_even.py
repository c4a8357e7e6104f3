"""Ranks that end an epoch together (``even_batches``), and the samples a rank hands out
before its restored stream (batches a trainer's fetcher had taken ahead of a checkpoint)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from snapshot.errors import RankError
from snapshot.schema import ServiceState

__all__ = ["FIRST", "EvenBatches", "First", "deal", "saved_ended", "saved_first", "saved_last"]

#: Keys of a rank's even-batches record (the service record's ``even_batches``): the sample "pad"
#: repeats, samples padded, whether the policy ended the epoch, and the samples handed out first.
LAST, PADDED, ENDED, FIRST = "last", "padded", "ended", "first"


class Reducer(Protocol):
    rank: int

    def all_reduce_min(self, value: int, what: str) -> int: ...

    def all_reduce_max(self, value: int, what: str) -> int: ...


class First(Iterator[Any]):
    """``items`` first, then ``rest``; the items not yielded yet are part of a snapshot."""

    def __init__(self, items: Iterable[Any], rest: Iterator[Any]):
        self.items = deque(items)
        self.rest = rest

    def __iter__(self) -> First:
        return self

    def __next__(self) -> Any:
        if self.items:
            return self.items.popleft()
        return next(self.rest)


def deal(per_rank: list[list[Any]], rank: int, world: int) -> list[Any]:
    """``rank``'s share of the items of every saved rank: its own on the same number of ranks;
    else all of them, in saved rank order, dealt in runs as equal as they can be."""
    if len(per_rank) == world:
        return list(per_rank[rank])
    items = [item for saved in per_rank for item in saved]
    share, extra = divmod(len(items), world)
    start = rank * share + min(rank, extra)
    return items[start:start + share + (1 if rank < extra else 0)]


def saved_ended(state: ServiceState) -> bool:
    """Whether the policy had ended the saved epoch on some rank."""
    return any(record and record.get(ENDED) for record in state.even_batches_records)


def saved_first(state: ServiceState, rank: int, world: int) -> list[Any]:
    """The items the saved ranks still had to hand out first, this rank's share of them."""
    return deal([list((record or {}).get(FIRST) or []) for record in state.even_batches_records], rank, world)


def saved_last(state: ServiceState, rank: int) -> list[Any]:
    """The sample ``"pad"`` repeats on ``rank`` after a restore: the one this rank saved; after a
    restore onto another number of ranks, one that a saved rank had (its own number first)."""
    saved = state.even_batches_records
    order = ([rank] if rank < len(saved) else []) + [r for r in range(len(saved)) if r != rank]
    for index in order:
        record = saved[index]
        if record and record.get(LAST):
            return list(record[LAST])
    return []


class EvenBatches(Iterator[Any]):
    """Every rank yields the same number of samples (see ``even_batches``).

    ``last`` is the last sample this rank's share yielded (``[]`` or ``[sample]``): ``"pad"``
    repeats it once the share runs out, so it is part of the snapshot.
    """

    def __init__(self, local: Iterator[Any], collective: Reducer, policy: str, last: list[Any] | None = None):
        self.local = local
        self.collective = collective
        self.policy = policy
        self.last: list[Any] = list(last or [])
        self.padded = 0
        self.done = False

    @staticmethod
    def initial() -> dict[str, Any]:
        return {LAST: [], PADDED: 0}

    def state(self) -> dict[str, Any]:
        return {LAST: list(self.last) if self.policy == "pad" else [], PADDED: self.padded, ENDED: self.done}

    def __iter__(self) -> EvenBatches:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        try:
            item, has = next(self.local), 1
        except StopIteration:
            item, has = None, 0
        if self.policy == "drop":
            everyone = self.collective.all_reduce_min(has, "agreeing on the end of the epoch")
            if not everyone:
                self.done = True
                raise StopIteration
            return item
        anyone = self.collective.all_reduce_max(has, "agreeing on the end of the epoch")
        if not anyone:
            self.done = True
            raise StopIteration
        if has:
            self.last = [item]
            return item
        if not self.last:
            raise RankError(
                f"rank {self.collective.rank} has no sample at all to pad its share with (even_batches=\"pad\" "
                "repeats a rank's last sample): give the graph at least one sample per rank, or use "
                "even_batches=\"drop\"")
        self.padded += 1
        return self.last[0]
