"""``worker_reset_fn``: torchdata 0.9's per-epoch hook, run in each worker so snapshots stay exact.

At the start of every epoch, and again when a snapshot is restored, a worker

1. seeds the random pipes of its graphs with the epoch's seeds (what the engine would do),
2. calls ``worker_reset_fn(datapipe, worker_info, seed_generator)`` on each owned logical
   shard's copy of the graph, in shard order, with one :class:`~snapshot.SeedGenerator` per
   worker and epoch (see :func:`reset_generator`),
3. starts its engine without seeding again, so what the function set (seeds, attributes)
   stays.

The generator is derived from the epoch's seeds, which every snapshot holds: a restore calls
the function again with a generator in the same state as at the start of the epoch, before
the saved states are installed. Pipes restored from their state then continue from it, and
pipes that replay do so with the seeds and settings the function gave them.

Since the function sees a *worker* (``WorkerInfo(num_workers, worker_id)``), the stream may
depend on the number of workers: such snapshots restore only onto the same layout (see
``MultiProcessingReadingService.validate``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from snapshot.engine.graph import ROOT, Graph
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import EpochSeeds, SeedGenerator
from snapshot.engine.sharding import WorkerInfo
from snapshot.errors import ExecutionError
from snapshot.reading_service._shards.engine import EngineState, ShardEngine

__all__ = ["ResetEngine", "callable_name", "reset_generator"]

_RESET_SALT = b"worker_reset_fn"  # the function's generator is drawn apart from every other seed

ResetFn = Callable[[Any, WorkerInfo, SeedGenerator], Any]


def callable_name(fn: Any) -> str:
    """``module.qualname`` of a function (of the function inside a ``functools.partial``)."""
    inner = getattr(fn, "func", fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def reset_generator(seeds: EpochSeeds, worker: WorkerInfo) -> SeedGenerator:
    """The seed generator a worker's ``worker_reset_fn`` gets this epoch: spawned for the worker
    (as torchdata 0.9's ``seed_generator.spawn(worker_id)``) from a digest of all the epoch's
    seeds, so it depends on the loader seed, the epoch and the layout only."""
    text = json.dumps(seeds.state(), sort_keys=True).encode()
    base = int.from_bytes(hashlib.sha256(_RESET_SALT + text).digest()[:8], "little")
    return SeedGenerator(base).spawn(worker.worker_id)


def _translate(path: str, prefix: str) -> str:
    """A path of the loader's graph in a copy whose sink ``worker_init_fn`` wrapped (``prefix``:
    where the original sink sits in the copy)."""
    return prefix + path[len(ROOT):]


class ResetEngine(ShardEngine):
    """A :class:`ShardEngine` that calls ``reset_fn`` on each owned shard's graph per epoch."""

    def __init__(self, *args: Any, reset_fn: ResetFn, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reset_fn = reset_fn
        first = self._shard_graphs[self.shards[0]] if self.shards else self.graph
        # worker_init_fn may wrap the sink (torchdata 0.9's tests add a sharding_filter there)
        self._sink_at = first.path_of(self.graph.sink) if first.contains(self.graph.sink) else ROOT

    def start(self, seeds: EpochSeeds, restore: EngineState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        self.close()
        for path, seed in seeds.shared.items():  # the part above the sharding point runs on self.graph
            self.graph[path].datapipe.set_seed(seed)
        generator = reset_generator(seeds, self.worker)
        for shard in self.shards:
            graph = self._shard_graphs[shard]
            self._seed(graph, seeds.for_shard(shard))
            result = self.reset_fn(graph.sink, self.worker, generator)
            if result is not None and result is not graph.sink:
                raise ExecutionError(
                    f"worker_reset_fn returned another DataPipe ({type(result).__name__}) than the one it was "
                    f"given (logical shard {shard}, worker {self.worker.worker_id}): the engine runs the graph "
                    "it was built with, so change that graph in place (reseed it, set attributes) and return it "
                    "(or None). To change the graph's shape, build it so before giving it to the loader.")
        super().start(dataclasses.replace(seeds, shared={}, shards=[{} for _ in seeds.shards]), restore, strategy)

    def _seed(self, graph: Graph, seeds: Mapping[str, int]) -> None:
        for path, seed in seeds.items():
            graph[_translate(path, self._sink_at)].datapipe.set_seed(seed)
