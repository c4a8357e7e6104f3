"""Run the graph in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from snapshot.container import _serialization
from snapshot.engine.graph import Graph
from snapshot.engine.randomness import SeedGenerator
from snapshot.engine.sharding import Topology, WorkerInfo
from snapshot.reading_service._rng import GlobalRNG
from snapshot.reading_service._shards.service import Executor, LocalExecutor, ShardedService, resolve_logical_shards

__all__ = ["InProcessReadingService", "resolve_logical_shards"]


class InProcessReadingService(ShardedService):
    """Iterate the graph synchronously in the main process.

    Same constructor as torchdata 0.9's, plus ``logical_shards`` (how many logical shards to
    cut the graph into at its sharding point, default 1: an explicit value lets a run
    in-process produce exactly the stream of a run with that many workers) and
    ``global_rng`` (see :class:`~snapshot.GlobalRNG`; in-process the default leaves your
    training loop's generators alone). ``init_fn(datapipe, worker_info)`` runs once on the
    graph before the first epoch and may return a new graph. ``prefetch_cnt`` is accepted for
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
        super().__init__(logical_shards=logical_shards, global_rng=global_rng)
        self.prefetch_cnt = prefetch_cnt
        self.init_fn = init_fn
        self.reset_fn = reset_fn

    def _default_shards(self) -> int:
        return 1

    def prepare(self, datapipe: Any) -> Any:
        if self.init_fn is not None:
            datapipe = self.init_fn(datapipe, WorkerInfo(1, 0))
        return datapipe

    def _make_executor(self, datapipe: Any, graph: Graph, topology: Topology, count: int,
                       shards: list[int]) -> Executor:
        template = _serialization.dumps_graph(datapipe) if len(shards) > 1 else b""
        return LocalExecutor(graph, template, topology, count, shards, self.global_rng, self.buffer_state)

    def _layout(self) -> dict[str, Any]:
        return {"logical_shards": self._count, "workers": 0, "ranks": 1,
                "owners": {str(s): 0 for s in self._owned}}

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        if self.reset_fn is not None and self._graph is not None:
            self.reset_fn(self._graph.sink, WorkerInfo(1, 0), seed_generator)
        return super().initialize_iteration(seed_generator, iter_reset_fn)
