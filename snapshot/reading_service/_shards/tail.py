"""The non-replicable tail: the part of the graph below a pipe whose ``is_replicable()`` is
``False``, run once, in the loader's process, over the merged stream of the logical shards (as
torchdata 0.9 ran it in the main process; see :mod:`snapshot.sharding`).

Each logical shard runs the graph up to the *merge point*; the loader's round robin merges
their samples, and a :class:`~snapshot.execution.Run` of the tail reads that merged stream
through a port at the merge point. The tail runs on a copy of the graph made once per
configuration, so its pipes never share an object with a shard's copy.

A snapshot holds the tail's node records (counts, states) beside the shards'. A restore puts
the tail's nodes back from their states; when a node of the tail has no state hook, its replay
would need the merged stream from the start of the epoch, so the epoch is started again from
its saved seeds and the tail replays its saved count through the shards (exact onto any number
of workers, O(samples of the epoch)); the shards' merge counts are then checked against the
snapshot's. With ``GlobalRNG.ISOLATE`` the tail draws from ``random``/``numpy``/``torch``
generator states of its own, saved too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from snapshot.container import _serialization
from snapshot.engine.execution import Run, capture_persistent, restore_persistent
from snapshot.engine.graph import ROOT, Graph
from snapshot.engine.plan import RestoreStrategy, make_plan
from snapshot.engine.randomness import EpochSeeds
from snapshot.engine.sharding import Topology
from snapshot.errors import RestoreError, ShardingError
from snapshot.reading_service._rng import GlobalRNG, plain_rng, raw_from_plain, raw_rng, seeded_rng, set_raw_rng
from snapshot.reading_service._shards.engine import counts
from snapshot.reading_service._shards.merge import CONSUMED, RoundRobin
from snapshot.schema.state import NodeState, TailState

__all__ = ["Tail", "check_restarted"]

_RNG_SALT = 0x7A11_5EED_0F_7A11  # the tail's generators are seeded apart from the shards'

_log = logging.getLogger(__name__)


class MergePort(Iterator[Any]):
    """The tail's view of the merged stream: the cell of the merge point in the tail's run."""

    __slots__ = ("merge", "yielded", "exhausted", "path")

    def __init__(self, merge: RoundRobin, yielded: int = 0):
        self.merge = merge
        self.yielded = yielded
        self.exhausted = False
        self.path: str | None = None

    def __iter__(self) -> MergePort:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self.merge)
        except StopIteration:
            self.exhausted = True
            raise
        self.yielded += 1
        return item


class Tail(Iterator[Any]):
    """Runs ``topology``'s non-replicable tail over the merged stream, one epoch at a time."""

    def __init__(self, graph: Graph, topology: Topology, count: int, owned: list[int], *,
                 global_rng: GlobalRNG = GlobalRNG.ISOLATE, buffer_state: str = "values"):
        if len(owned) != count:
            raise ShardingError(
                f"{', '.join(sorted(topology.tail))}: the part below a non-replicable pipe runs once over the merged "
                f"stream of all {count} logical shards, but this process merges only shards {owned} (ranks): "
                "put the non-replicable pipe above a sharding_round_robin_dispatch, or leave it out of "
                "distributed runs")
        assert topology.merge_point is not None
        self.graph = Graph(_serialization.loads_graph(_serialization.dumps_graph(graph.sink)))
        self.topology = topology
        self.merge_point = topology.merge_point
        self.isolate = GlobalRNG(global_rng) is GlobalRNG.ISOLATE
        self.buffer_state = buffer_state
        self._run: Run | None = None
        self._rng: Any = None
        self._planned: tuple[TailState, RestoreStrategy, Any] | None = None

    def restarts_epoch(self, saved: TailState | None, strategy: RestoreStrategy) -> bool:
        """Whether restoring ``saved`` needs the merged stream from the start of the epoch."""
        if saved is None:
            raise RestoreError("the snapshot holds no state for the part of the graph below a non-replicable "
                               f"pipe ({', '.join(sorted(self.topology.tail))}); it was taken with another "
                               "graph or another version: restore onto the layout it was taken with")
        return self._plan(saved, strategy).reaches_ports

    def _plan(self, saved: TailState, strategy: RestoreStrategy) -> Any:
        """The restore plan of ``saved`` (made once: :meth:`restarts_epoch` and :meth:`start` both need it)."""
        if self._planned is None or self._planned[0] is not saved or self._planned[1] is not strategy:
            plan = make_plan(self.graph, counts(saved.nodes), strategy, sinks=[ROOT],
                             ports=frozenset({self.merge_point}))
            self._planned = (saved, strategy, plan)
        return self._planned[2]

    def start(self, seeds: EpochSeeds, merge: RoundRobin, saved: TailState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO, *, restarted: bool = False) -> None:
        """Start the epoch over ``merge``, or put the tail back where ``saved`` was (``restarted``:
        the shards started the epoch again, and the tail replays through them)."""
        self.close()
        own = {p: s for p, s in (seeds.shards[0] if seeds.shards else {}).items() if p in self.topology.tail}
        records = plan = None
        port = MergePort(merge)
        if saved is not None:
            restore_persistent(self.graph, saved.persistent)
            records, plan = saved.nodes, self._plan(saved, strategy)
            if not restarted:
                port.yielded = _yielded(records, self.merge_point)
            else:
                _log.info("restore: the part below the non-replicable pipe has a pipe without a state hook, so "
                          "the epoch restarts and %d samples of it are replayed", _yielded(records, ROOT))
        caller = raw_rng() if self.isolate else None
        if self.isolate:  # a replay starts from the epoch's generator states, then the saved ones apply
            set_raw_rng(seeded_rng(_rng_seed(seeds)))
        try:
            self._run = Run(self.graph, own, ports={self.merge_point: port}, records=records, plan=plan,
                            buffer_state=self.buffer_state)
        finally:
            if caller is not None:
                plain = saved.rng if saved is not None else None
                self._rng = raw_from_plain(plain) if plain else raw_rng()
                set_raw_rng(caller)

    def __iter__(self) -> Tail:
        return self

    def __next__(self) -> Any:
        assert self._run is not None
        if not self.isolate:
            return next(self._run)
        caller = raw_rng()
        set_raw_rng(self._rng)
        try:
            return next(self._run)
        finally:
            self._rng = raw_rng()
            set_raw_rng(caller)

    def progress(self) -> tuple[int, bool]:
        """Samples the tail yielded in the epoch, and whether it ended."""
        if self._run is None:
            return 0, False
        return self._run.yielded, self._run.exhausted

    def capture(self) -> TailState:
        assert self._run is not None
        persistent = {p: s for p, s in capture_persistent(self.graph).items() if p in self.topology.tail}
        return TailState(nodes=self._run.capture(), persistent=persistent,
                         rng=plain_rng(self._rng) if self.isolate else None)

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
        self._run = None


def _yielded(records: Mapping[str, NodeState], path: str) -> int:
    record = records.get(path)
    return int(record.yielded or 0) if record is not None else 0


def _rng_seed(seeds: EpochSeeds) -> int:
    return (seeds.rng[0] if seeds.rng else 0) ^ _RNG_SALT


def check_restarted(merge: RoundRobin, saved_merge: Mapping[str, Any] | None) -> None:
    """After a restarted epoch's replay, the shards must have given the merge what they had
    given it when the snapshot was taken."""
    if saved_merge is None:
        return
    want = {int(s): int(n) for s, n in saved_merge[CONSUMED].items()}
    have = {s: n for s, n in merge.consumed.items() if s in want}
    if have != want:
        raise RestoreError(
            "replaying the part below the non-replicable pipe did not reproduce the saved position: the logical "
            f"shards gave the merge {have} samples, the snapshot says {want}. A pipe is not deterministic for a "
            "given seed (it draws from an unseeded random source, or reads data that changed).")
