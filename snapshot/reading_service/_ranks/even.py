"""Ranks that end an epoch together (``even_batches``), and the samples a rank hands out before its
restored stream (batches a trainer's fetcher had taken ahead of a checkpoint).

Each rank yields its own share of the epoch while every rank has a sample left (one all-reduce per
sample tells). When one runs out, the ranks *share* what is left: every step, each rank that still
has samples yields its own next one, and the ranks without one receive one from the ranks that have
more (sent over the loader's group, in a fixed order), until fewer samples are left than there are
ranks. Those last few are dropped (``"drop"``) or the ranks without one repeat their last sample
(``"pad"``). So every rank yields as many samples, and fewer than R are dropped or repeated in an
epoch, whatever the shares were: files of different lengths, a filter, a restore onto another number
of ranks. Where the shares are equal, nothing is sent and the stream is torchdata 0.9's.

Counting is exact because it happens as the samples are read; nothing is estimated beforehand. A
snapshot taken while the ranks share keeps each rank's samples read for sharing (``spare``) by value.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from snapshot.errors import RankError
from snapshot.schema import Handout, ServiceState

if TYPE_CHECKING:
    from snapshot.reading_service.reshard import Slice

__all__ = ["FIRST", "EvenBatches", "First", "deal", "handout", "saved_first", "saved_last",
           "saved_sharing"]

#: Keys of a rank's even-batches record (the service record's ``even_batches``): the sample "pad"
#: repeats, samples padded, whether the policy ended the epoch, the samples handed out first, whether
#: the ranks were sharing the rest of the epoch, and this rank's samples read for sharing.
LAST, PADDED, ENDED, FIRST, SHARING, SPARE = "last", "padded", "ended", "first", "sharing", "spare"


class Exchange(Protocol):
    """The collective operations sharing needs (the distributed service's ``Collective``)."""

    rank: int
    world: int

    def all_reduce_min(self, value: int, what: str) -> int: ...

    def all_gather_ints(self, values: list[int], what: str) -> list[list[int]]: ...

    def send(self, value: Any, rank: int, what: str) -> None: ...

    def receive(self, rank: int, what: str) -> Any: ...


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


def saved_sharing(state: ServiceState, rank: int, world: int) -> tuple[bool, list[Any]]:
    """Whether the saved ranks were sharing the rest of the epoch, and ``rank``'s samples read for it:
    on the same number of ranks its own; on another, none (they are handed out first, see
    :func:`saved_first`)."""
    records = state.even_batches_records
    sharing = any(record and record.get(SHARING) for record in records)
    if len(records) != world or not sharing:
        return False, []
    return True, list((records[rank] or {}).get(SPARE) or [])


def saved_first(state: ServiceState, slices: Sequence[Slice], *, same_ranks: bool) -> list[Any]:
    """The saved samples this rank hands out first, as the re-shard plan deals them (``slices``). On the
    same number of ranks, a rank's own list; on another, each saved rank's samples read for sharing
    come before its samples to hand out first (they had been read before them)."""
    records = state.even_batches_records
    out: list[Any] = []
    for piece in slices:
        record = records[piece.rank] or {}
        items = list(record.get(FIRST) or []) if same_ranks else \
            list(record.get(SPARE) or []) + list(record.get(FIRST) or [])
        out += items[piece.start:piece.stop]
    return out


def handout(record: dict[str, Any]) -> Handout:
    """The counts of a rank's even-batches record, for the index (see :class:`snapshot.schema.Handout`)."""
    return Handout(first=len(record.get(FIRST) or []), spare=len(record.get(SPARE) or []),
                   sharing=bool(record.get(SHARING)), ended=bool(record.get(ENDED)))


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
    """Every rank yields the same number of samples (see the module docstring and ``even_batches``).

    ``last`` is the last sample this rank yielded (``[]`` or ``[sample]``): ``"pad"`` repeats it, so
    it is part of the snapshot, as are ``sharing`` and ``spare`` (see :meth:`state`).
    """

    def __init__(self, local: Iterator[Any], collective: Exchange, policy: str, last: list[Any] | None = None,
                 *, sharing: bool = False, spare: Iterable[Any] = ()):
        self.local = local
        self.collective = collective
        self.policy = policy
        self.last: list[Any] = list(last or [])
        self.padded = 0
        self.done = False
        self.sharing = sharing
        self.spare: deque[Any] = deque(spare)
        self._local_ended = False

    @staticmethod
    def initial() -> dict[str, Any]:
        return {LAST: [], PADDED: 0}

    def state(self) -> dict[str, Any]:
        record: dict[str, Any] = {LAST: list(self.last) if self.policy == "pad" else [], PADDED: self.padded,
                                  ENDED: self.done}
        if self.sharing:
            record.update({SHARING: True, SPARE: list(self.spare)})
        return record

    def __iter__(self) -> EvenBatches:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        if not self.sharing:
            has = self._read()
            if self.collective.all_reduce_min(has, "agreeing on the end of the epoch"):
                return self._yield(self.spare.popleft())
            self.sharing = True  # a rank ran out: from here on the ranks share what is left
        return self._yield(self._share())

    def _yield(self, item: Any) -> Any:
        if self.policy == "pad":
            self.last = [item]
        return item

    def _read(self, count: int = 1) -> int:
        """Read up to ``count`` more samples of this rank's own stream into ``spare``; how many came."""
        got = 0
        while got < count and not self._local_ended:
            try:
                self.spare.append(next(self.local))
            except StopIteration:
                self._local_ended = True
                break
            got += 1
        return got

    def _share(self) -> Any:
        """One step of sharing: this rank's sample (its own, one received, or, for ``"pad"`` at the very
        end, its last again); ``StopIteration`` when fewer samples than ranks are left."""
        collective = self.collective
        world = collective.world
        while True:  # read more where the ranks hold fewer samples than one step takes
            counts = collective.all_gather_ints([len(self.spare), int(self._local_ended)],
                                                "sharing the rest of the epoch")
            held = [n for n, _ in counts]
            reading = [r for r, (_, ended) in enumerate(counts) if not ended]
            if sum(held) >= world or not reading:
                break
            self._read(math.ceil((world - sum(held)) / len(reading)))
        if sum(held) == 0 or (sum(held) < world and self.policy == "drop"):
            self.done = True  # drop: fewer than R samples are left, and none is yielded
            self.spare.clear()
            raise StopIteration
        return self._exchange(held)

    def _exchange(self, held: list[int]) -> Any:
        """Each rank holding samples keeps its first; the ranks holding none receive, in rank order, the
        holders' others in rank order (pad: a rank left without one repeats its last)."""
        collective = self.collective
        rank = collective.rank
        takers = [r for r, n in enumerate(held) if n == 0]
        givers = [(r, k) for r, n in enumerate(held) for k in range(1, n)]
        given = list(zip(takers, givers))
        if held[rank]:
            mine = self.spare.popleft()
            sent = [taker for taker, (giver, _) in given if giver == rank]
            for taker in sent:
                collective.send(self.spare.popleft(), taker, "handing a sample to a rank that ran out")
            return mine
        index = takers.index(rank)
        if index < len(given):
            return collective.receive(given[index][1][0], "receiving a sample from a rank that has more")
        if not self.last:
            raise RankError(
                f"rank {rank} has no sample at all to pad its share with (even_batches=\"pad\" repeats a rank's "
                "last sample): give the graph at least one sample per rank, or use even_batches=\"drop\"")
        self.padded += 1
        return self.last[0]
