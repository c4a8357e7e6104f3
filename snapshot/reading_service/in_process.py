"""Run the graph in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

from snapshot import _serialization
from snapshot.errors import ShardingError
from snapshot.graph import Graph
from snapshot.randomness import EpochSeeds, SeedGenerator, epoch_seeds
from snapshot.reading_service._engine import GlobalRNG, RoundRobin, ShardEngine, recombine, service_state
from snapshot.reading_service.base import ReadingServiceInterface, ServiceState
from snapshot.restore import RestoreStrategy
from snapshot.sharding import Topology, WorkerInfo, analyze

__all__ = ["InProcessReadingService"]


def resolve_logical_shards(requested: int | None, topology: Topology, default: int) -> int:
    """The number of logical shards for a first run (an explicit request wins)."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"logical_shards must be >= 1, got {requested}")
        if requested > 1 and not topology.sharded:
            raise ShardingError(
                f"logical_shards={requested} needs a sharding point, and this graph has none: add "
                ".sharding_filter() where the samples may be split (after shuffling file names, "
                "say), or use logical_shards=1."
            )
        return requested
    return default if topology.sharded else 1


class InProcessReadingService(ReadingServiceInterface):
    """Iterate the graph synchronously in the main process.

    Same constructor as torchdata 0.9's, plus ``logical_shards`` (how many logical shards to
    cut the graph into at its sharding point, default 1: an explicit value lets a run
    in-process produce exactly the stream of a run with that many workers) and
    ``global_rng`` (see :class:`GlobalRNG`; in-process the default leaves your training
    loop's generators alone). ``init_fn(datapipe, worker_info)`` runs once on the graph
    before the first epoch and may return a new graph. ``prefetch_cnt`` is accepted for
    compatibility and ignored with a warning: reading synchronously is what keeps an
    in-process snapshot exact without bookkeeping.
    """

    def __init__(
        self,
        prefetch_cnt: int = 0,
        init_fn: Callable[[Any, WorkerInfo], Any] | None = None,
        reset_fn: Callable[[Any, WorkerInfo, SeedGenerator], Any] | None = None,
        *,
        logical_shards: int | None = None,
        global_rng: GlobalRNG | str = GlobalRNG.SHARED,
    ) -> None:
        if prefetch_cnt:
            warnings.warn(
                "InProcessReadingService(prefetch_cnt=...) is ignored: in-process reading is "
                "synchronous so that snapshots stay exact. Use MultiProcessingReadingService "
                "for background loading.",
                stacklevel=2,
            )
        self.prefetch_cnt = prefetch_cnt
        self.init_fn = init_fn
        self.reset_fn = reset_fn
        self.logical_shards = logical_shards
        self.global_rng = GlobalRNG(global_rng)
        self._reset_state()

    def _reset_state(self) -> None:
        self._graph: Graph | None = None
        self._topology: Topology | None = None
        self._engine: ShardEngine | None = None
        self._merge: RoundRobin | None = None
        self._seeds: EpochSeeds | None = None
        self._count = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_graph=None, _topology=None, _engine=None, _merge=None, _seeds=None, _count=0)
        return state

    # -- lifecycle ------------------------------------------------------------------------

    def initialize(self, datapipe: Any) -> _Output:
        if self.init_fn is not None:
            datapipe = self.init_fn(datapipe, WorkerInfo(1, 0))
        topology = analyze(Graph(datapipe))
        self._setup(datapipe, resolve_logical_shards(self.logical_shards, topology, 1))
        return _Output(self)

    def _setup(self, datapipe: Any, count: int) -> None:
        self.finalize()
        graph = Graph(datapipe)
        self._graph, self._topology, self._count = graph, analyze(graph), count
        template = _serialization.dumps_graph(datapipe) if count > 1 else b""
        self._engine = ShardEngine(graph, lambda: _serialization.loads_graph(template), self._topology, count,
                                   range(count), worker=WorkerInfo(1, 0), global_rng=self.global_rng,
                                   protect_caller_rng=True)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        engine, graph = self._require()
        if self.reset_fn is not None:
            self.reset_fn(graph.sink, WorkerInfo(1, 0), seed_generator)
        self._seeds = epoch_seeds(seed_generator, graph, self._count)
        engine.start(self._seeds)
        self._merge = RoundRobin(self._count, engine.next)
        return None

    def finalize(self) -> None:
        if self._engine is not None:
            self._engine.close()

    # -- checkpoint / restore -------------------------------------------------------------

    def checkpoint(self) -> ServiceState:
        if self._engine is None or self._merge is None or self._seeds is None:
            return {}
        layout = {"logical_shards": self._count, "workers": 0, "ranks": 1, "owners": [0] * self._count}
        return service_state(type(self).__name__, layout, self._seeds, self._merge, [self._engine.capture()])

    def validate(self, state: ServiceState) -> list[str]:
        saved = int(state["layout"]["logical_shards"])
        if self.logical_shards is not None and self.logical_shards != saved:
            return [f"the snapshot has {saved} logical shards but this service asks for "
                    f"logical_shards={self.logical_shards}; the number of logical shards is fixed by "
                    "the first run (leave logical_shards unset to take the saved value)"]
        return []

    def restore(
        self, datapipe: Any, state: ServiceState, *, strategy: Any = RestoreStrategy.AUTO
    ) -> _Output:
        if self._engine is None and self.init_fn is not None:
            datapipe = self.init_fn(datapipe, WorkerInfo(1, 0))
        if not state:
            if self._engine is None:
                self._setup(datapipe, resolve_logical_shards(self.logical_shards, analyze(Graph(datapipe)), 1))
            return _Output(self)
        count = int(state["layout"]["logical_shards"])
        if self._engine is None or count != self._count:
            self._setup(self._graph.sink if self._graph is not None else datapipe, count)
        engine, _ = self._require()
        assert self._topology is not None
        self._seeds = EpochSeeds.from_state(state["seeds"])
        restore = recombine(state["upstream"], state["shards"], range(count), self._topology.routers)
        engine.start(self._seeds, restore, RestoreStrategy.parse(strategy))
        self._merge = RoundRobin(count, engine.next)
        self._merge.load(state["merge"], [shard["in_flight"] for shard in state["shards"]])
        return _Output(self)

    def _require(self) -> tuple[ShardEngine, Graph]:
        if self._engine is None or self._graph is None:
            raise RuntimeError("initialize() must be called before iterating")
        return self._engine, self._graph


class _Output:
    """What the loader iterates: the current epoch's merged stream."""

    def __init__(self, service: InProcessReadingService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        merge = self._service._merge
        return merge if merge is not None else iter(())
