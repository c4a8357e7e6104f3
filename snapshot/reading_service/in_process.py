"""Run the graph in the calling process."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

from snapshot.execution import Run, capture_persistent, restore_persistent
from snapshot.graph import Graph
from snapshot.randomness import EpochSeeds, SeedGenerator, epoch_seeds
from snapshot.reading_service.base import ReadingServiceInterface, ServiceState
from snapshot.restore import RestoreStrategy, make_plan
from snapshot.sharding import WorkerInfo

__all__ = ["InProcessReadingService"]


class InProcessReadingService(ReadingServiceInterface):
    """Iterate the graph synchronously in the main process.

    Same constructor as torchdata 0.9's. ``init_fn(datapipe, worker_info)`` runs once on the
    graph before the first epoch and may return a new graph. ``prefetch_cnt`` is accepted for
    compatibility and ignored with a warning: reading synchronously is what keeps an
    in-process snapshot exact without bookkeeping; use ``MultiProcessingReadingService`` to
    load in the background.
    """

    def __init__(
        self,
        prefetch_cnt: int = 0,
        init_fn: Callable[[Any, WorkerInfo], Any] | None = None,
        reset_fn: Callable[[Any, WorkerInfo, SeedGenerator], Any] | None = None,
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
        self._graph: Graph | None = None
        self._seeds: EpochSeeds | None = None
        self._run: Run | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_graph=None, _seeds=None, _run=None)
        return state

    # -- lifecycle ------------------------------------------------------------------------

    def initialize(self, datapipe: Any) -> _CurrentRun:
        if self.init_fn is not None:
            datapipe = self.init_fn(datapipe, WorkerInfo(1, 0))
        self._graph = Graph(datapipe)
        return _CurrentRun(self)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        graph = self._require_graph()
        self._close_run()
        if self.reset_fn is not None:
            self.reset_fn(graph.sink, WorkerInfo(1, 0), seed_generator)
        self._seeds = epoch_seeds(seed_generator, graph)
        self._run = Run(graph, self._seeds.for_shard(0))
        return None

    def finalize_iteration(self) -> None:
        pass

    def finalize(self) -> None:
        self._close_run()

    # -- checkpoint / restore -------------------------------------------------------------

    def checkpoint(self) -> ServiceState:
        if self._run is None or self._seeds is None:
            return {}
        run = self._run
        records = run.capture()
        counts = {path: r["yielded"] for path, r in records.items()}
        plan = make_plan(run.graph, counts, RestoreStrategy.AUTO)
        return {
            "service": type(self).__name__,
            "layout": {"logical_shards": 1, "workers": 0, "ranks": 1},
            "seeds": self._seeds.state(),
            "persistent": capture_persistent(run.graph),
            "shards": [{
                "yielded": run.yielded,
                "exhausted": run.exhausted,
                "nodes": records,
                "plan": plan.describe(),
            }],
        }

    def restore(
        self, datapipe: Any, state: ServiceState, *, strategy: Any = RestoreStrategy.AUTO
    ) -> _CurrentRun:
        end = _CurrentRun(self) if self._graph is not None else self.initialize(datapipe)
        graph = self._require_graph()
        self._close_run()
        if not state:
            return end
        self._seeds = EpochSeeds.from_state(state["seeds"])
        restore_persistent(graph, state.get("persistent", {}))
        shard = state["shards"][0]
        if shard["exhausted"]:
            return end  # the next epoch starts from initialize_iteration
        records = shard["nodes"]
        counts = {path: record["yielded"] for path, record in records.items()}
        plan = make_plan(graph, counts, RestoreStrategy.parse(strategy))
        self._run = Run(graph, self._seeds.for_shard(0), records=records, plan=plan)
        return end

    # -- internals ------------------------------------------------------------------------

    def _require_graph(self) -> Graph:
        if self._graph is None:
            raise RuntimeError("initialize() must be called before iterating")
        return self._graph

    def _close_run(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None


class _CurrentRun:
    """What the loader iterates: the service's run for the current epoch."""

    def __init__(self, service: InProcessReadingService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        run = self._service._run
        return run if run is not None else iter(())  # a restored, already exhausted epoch
