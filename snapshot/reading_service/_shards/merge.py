"""Merging the logical shards into the loader's stream in a fixed order (0, 1, ..., L-1, 0, ...,
skipping exhausted shards), so the stream depends on the seed and L only; and the checkpoint
that every sharded service returns."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshot.engine.randomness import EpochSeeds
from snapshot.hooks import _fresh
from snapshot.reading_service._shards.engine import EngineState
from snapshot.schema import SeedsState, ServiceState, ShardState
from snapshot.schema.state import NodeState, TailState
from snapshot.storage._staging import stage

__all__ = ["CONSUMED", "RoundRobin", "Taken", "merge_state_for", "owners"]

#: Keys of the merge's own record (:meth:`RoundRobin.state`, the service record's ``merge``):
#: the shards merged, whose turn it is, the shards the merge saw end, samples taken per shard.
SHARDS, TURN, ENDED, CONSUMED = "shards", "turn", "exhausted", "consumed"


class RoundRobin(Iterator[Any]):
    """Merges logical shards into one stream: each owned shard in turn, skipping exhausted ones.

    ``fetch(shard)`` produces a shard's next sample (raising ``StopIteration`` at its end);
    samples already produced but not yet yielded (``in_flight``) are served first.
    """

    def __init__(self, shards: Sequence[int], fetch: Callable[[int], Any]):
        self.shards = list(shards)
        self.fetch = fetch
        self.turn = 0
        self.exhausted: set[int] = set()
        self.consumed = {s: 0 for s in self.shards}
        self.in_flight: dict[int, deque[Any]] = {s: deque() for s in self.shards}

    def __iter__(self) -> RoundRobin:
        return self

    def __next__(self) -> Any:
        shards = self.shards
        while len(self.exhausted) < len(shards):
            shard = shards[self.turn]
            self.turn = (self.turn + 1) % len(shards)
            if shard in self.exhausted:
                continue
            waiting = self.in_flight[shard]
            if waiting:
                item = waiting.popleft()
            else:
                try:
                    item = self.fetch(shard)
                except StopIteration:
                    self.exhausted.add(shard)
                    continue
            self.consumed[shard] += 1
            return item
        raise StopIteration

    def state(self) -> dict[str, Any]:
        return {SHARDS: list(self.shards), TURN: self.turn, ENDED: sorted(self.exhausted),
                CONSUMED: dict(self.consumed)}

    def load(self, state: Mapping[str, Any], shards: Sequence[ShardState | None]) -> None:
        """Continue from ``state`` (see :func:`merge_state_for`); ``shards`` are the saved records."""
        self.turn = int(state[TURN])
        self.exhausted = {int(s) for s in state[ENDED]}
        self.consumed = {int(s): int(n) for s, n in state[CONSUMED].items()}
        for shard in self.shards:
            record = shards[shard]
            self.in_flight[shard] = deque(record.in_flight if record is not None else [])


def merge_state_for(state: ServiceState, shards: Sequence[int]) -> dict[str, Any]:
    """The merge position for ``shards``: the saved one if the same shards were merged
    together, else one derived from the shard records (for a restore onto another layout)."""
    for merge in [state.merge] + [rank.merge for rank in state.ranks]:
        if merge is not None and [int(s) for s in merge[SHARDS]] == list(shards):
            return dict(merge)
    records = state.shards
    return {SHARDS: list(shards), TURN: 0,
            ENDED: [s for s in shards if (record := records[s]) is not None and record.finished],
            CONSUMED: {s: record.yielded if (record := records[s]) is not None else 0 for s in shards}}


def owners(count: int, workers: int) -> list[int]:
    """Which worker owns each logical shard (shard s -> worker s % workers)."""
    return [shard % max(workers, 1) for shard in range(count)]


def _copy(record: ShardState) -> ShardState:
    """A shallow copy of ``record`` (what ``dataclasses.replace`` makes, without its walk of the fields: 0.03 ms
    of a save's blocking part): the fields completed here are the copy's."""
    copy = object.__new__(ShardState)
    copy.__dict__.update(record.__dict__)
    return copy


@dataclass
class Taken:
    """What a sharded service's checkpoint is made of, taken at the call (:meth:`take`): the engines' records
    (new: :meth:`.ShardEngine.capture` builds them, a worker's are unpickled from its message), the tail's, and
    copies of what the service keeps changing (the merge's position, the samples in flight); :meth:`record`
    makes the checkpoint of them, in a background save's thread (see :meth:`staged`)."""

    name: str
    layout: dict[str, Any]
    seeds: SeedsState
    merge: dict[str, Any]
    in_flight: dict[int, list[Any]]
    engines: Sequence[EngineState]
    count: int
    tail: TailState | None = None

    @classmethod
    def take(cls, name: str, layout: dict[str, Any], seeds: EpochSeeds, merge: RoundRobin,
             engines: Sequence[EngineState], count: int, tail: TailState | None) -> Taken:
        """``layout``: new (the service's ``_layout`` builds it)."""
        return cls(name, layout, seeds.record(), merge.state(), {s: list(merge.in_flight[s]) for s in merge.shards},
                   engines, count, tail)

    def record(self) -> ServiceState:
        """The checkpoint every sharded service returns (see ``ServiceCheckpoint``).

        ``shards`` has one record per logical shard (``None`` for shards this process does not
        own, which a distributed snapshot fills in from the other ranks).
        """
        shards: list[ShardState | None] = [None] * self.count
        upstream = []
        for engine in self.engines:
            if engine.upstream is not None:
                upstream.append(engine.upstream)
            for shard, record in engine.shards.items():
                shards[int(shard)] = None if record is None else _copy(record)
        merge = self.merge
        consumed, ended = merge[CONSUMED], set(merge[ENDED])
        for shard in merge[SHARDS]:
            record = shards[shard]
            assert record is not None
            record.shard = shard
            record.yielded = consumed[shard]
            record.in_flight = self.in_flight[shard]
            record.finished = shard in ended
        state = ServiceState(service=self.name, layout=self.layout, seeds=self.seeds, merge=merge, upstream=upstream,
                             shards=shards)
        state.tail = self.tail
        return state

    def checkpoint(self) -> dict[str, Any]:
        """:meth:`record` as the dict a service's ``checkpoint`` returns."""
        return self.record().to_dict()

    def later(self, service: Any, plain: bool) -> Any:
        """:meth:`checkpoint`; in a background save's capture that asks ``service`` itself for it (``plain``: its
        class keeps ``ShardedService.checkpoint``), a :class:`~snapshot.hooks._fresh.Later` that the save's thread
        makes, once what the running graph may change is staged (:meth:`staged`). A service that wraps this one,
        or a subclass that extends its ``checkpoint``, may change the dict it gets: it gets it at once."""
        fresh = _fresh.collected()
        if fresh is None or fresh.service is not service or not plain:
            return self.checkpoint()
        return _fresh.later(self.staged(fresh).checkpoint)

    def staged(self, fresh: Mapping[int, Any]) -> Taken:
        """These values for a background save, whose thread makes the :meth:`record` (``fresh``: what the capture
        said fresh, taken as it is): in place, each value here that the running graph, its hooks or the training
        step may change later is replaced by a staged copy (:func:`.stage`). These are the hooks' states (a user
        pipe's ``state_dict`` may return its live dict), the states kept across epochs, a node's pass, the samples
        in flight and queued at a router (the step may change a sample in place), the deal of a split router and
        the upstream's generator states.

        The rest is new and holds only values nobody changes, so it is not walked: the records (made by this
        capture: :meth:`.Run.capture`'s ``NodeState``, the engine's, the tail's), the plan's record (tuples and
        new dicts of text), the generator states of a shard and of the tail (``_rng.plain_rng``: new dicts, lists
        of ints, bytes), the layout, the seeds' record (new dicts and a list of ints) and the merge's
        (:meth:`RoundRobin.state`: new lists and dict of ints)."""
        def nodes(records: Mapping[str, NodeState]) -> None:
            for node in records.values():
                if node.state is not None:
                    node.state = stage(node.state, fresh)
                if node.passes is not None:
                    node.passes = stage(node.passes, fresh)

        for engine in self.engines:
            upstream = engine.upstream
            if upstream is not None:
                nodes(upstream.nodes)
                upstream.persistent = stage(upstream.persistent, fresh)
                upstream.rng = stage(upstream.rng, fresh)
                for router in upstream.routers.values():
                    router.queues = stage(router.queues, fresh)
                    router.deal = stage(router.deal, fresh)
            for record in engine.shards.values():
                if record is not None:
                    nodes(record.nodes)
                    record.persistent = stage(record.persistent, fresh)
        self.in_flight = stage(self.in_flight, fresh)
        if self.tail is not None:
            nodes(self.tail.nodes)
            self.tail.persistent = stage(self.tail.persistent, fresh)
        return self
