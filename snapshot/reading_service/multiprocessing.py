"""Run the graph in worker processes, one stream for any number of workers.

The graph is cut into L logical shards at its sharding point (see :mod:`snapshot.sharding`);
worker w owns shards w, w + W, w + 2W, ... and runs one copy of the part above the sharding
point plus one copy of the part below it per owned shard. The main process takes samples from
the shards in a fixed round-robin order, so for a fixed seed and L the stream is the same
in-process and with any number of workers up to L (more workers split the shards into
sub-shards). The part above a ``sharding_round_robin_dispatch`` is not copied: it runs once, in the main process, which
deals its samples to the workers' shards (see :mod:`snapshot.reading_service._shards.dispatch`).

A snapshot is exact while workers run ahead: each worker reports its state between two
samples (it is paused only for that), and the samples it had produced that the loader has
not yielded yet are stored by value in the snapshot and yielded first after a restore. A
snapshot taken with W workers restores onto any number of workers, or in-process (unless a
``worker_reset_fn`` ties it to its layout): onto more workers than it has units, the units are
split into sub-shards so that each worker has one (see :mod:`snapshot.reading_service.reshard`).
A non-replicable tail (see :mod:`snapshot.sharding`) runs in the main process over the merged
stream.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import warnings
from collections.abc import Callable
from typing import Any

from snapshot._warnings import user_stacklevel
from snapshot.container import _serialization
from snapshot.engine.graph import Graph
from snapshot.engine.sharding import Topology, WorkerInfo, analyze
from snapshot.reading_service._rng import GlobalRNG
from snapshot.reading_service._shards.dispatch import Dispatcher
from snapshot.reading_service._shards.service import Executor, LocalExecutor, ShardedService
from snapshot.reading_service._workers.pool import WorkerPool
from snapshot.reading_service._workers.reset import callable_name
from snapshot.reading_service.reshard import RESET_FN

__all__ = ["MultiProcessingReadingService"]

class MultiProcessingReadingService(ShardedService):
    """Load with ``num_workers`` processes; exact snapshots; restore onto any number of workers.

    Compared with torchdata 0.9's service of the same name: the arguments after
    ``num_workers`` are keyword-only; a ``worker_reset_fn`` ties snapshots to the layout (see
    below); and since samples are dealt to logical shards, not to workers, the stream of a
    graph with random pipes below the sharding point differs from torchdata's (it is instead
    the same for any number of workers).

    Args:
        num_workers: worker processes (0 runs in the main process, like
            :class:`InProcessReadingService`).
        logical_shards: L, how many logical shards the graph is cut into (default
            ``num_workers``; a graph without a sharding point has 1). Fixed by the first run
            and saved; a restore takes the saved value. Below ``num_workers``, each logical shard
            is split into sub-shards so that every worker has one (the stream is then theirs); a
            multiple of every number of workers you will use keeps one stream.
        prefetch_factor: samples requested ahead per logical shard.
        multiprocessing_context: ``"fork"`` (the default on Linux: workers start in milliseconds),
            ``"spawn"`` or ``"forkserver"`` (the default elsewhere is Python's).
        worker_init_fn: ``fn(datapipe, worker_info)`` called in each worker on each of its
            shards' copies of the graph; it may return a replacement but must keep the graph's
            structure.
        timeout: seconds to wait for a worker before raising :class:`~snapshot.WorkerError`.
        global_rng: see :class:`~snapshot.GlobalRNG` (default: each logical shard has its own
            ``random``/``numpy``/``torch`` generator states, saved in snapshots).
        worker_prefetch_cnt: torchdata 0.9's name for ``prefetch_factor`` (also an attribute).
        main_prefetch_cnt: torchdata 0.9's main-process prefetch; not needed (samples queue in
            the pipes), kept as an attribute and ignored, with a warning when above 0.
        worker_reset_fn: torchdata 0.9's per-epoch hook ``fn(datapipe, worker_info,
            seed_generator)``, called in each worker at the start of each epoch on each of its
            shards' copies of the graph, after the engine seeded it, with a
            :class:`~snapshot.SeedGenerator` spawned for the worker from the epoch's seeds. It
            changes the graph in place (reseeds pipes, sets attributes) and returns it or
            ``None``. Since it sees workers, the stream may then depend on the number of
            workers: a snapshot records the layout and restores only onto the same one (the same
            ``num_workers`` and logical shards, and, with ranks, the same number of ranks;
            another worker count or service is refused with a :class:`~snapshot.LayoutError`).
            A restore calls it again with the generator of the saved epoch before the saved
            states are installed. With ``num_workers=0`` it is not called, as in torchdata 0.9
            (a warning says so).
    """

    def __init__(
        self,
        num_workers: int = 0,
        *,
        logical_shards: int | None = None,
        prefetch_factor: int = 2,
        multiprocessing_context: str | None = None,
        worker_init_fn: Callable[[Any, WorkerInfo], Any] | None = None,
        timeout: float = 300.0,
        global_rng: GlobalRNG | str = GlobalRNG.ISOLATE,
        worker_prefetch_cnt: int | None = None,
        main_prefetch_cnt: int | None = None,
        worker_reset_fn: Callable[[Any, WorkerInfo, Any], Any] | None = None,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if multiprocessing_context is not None and multiprocessing_context not in mp.get_all_start_methods():
            raise ValueError(f"multiprocessing_context must be one of {mp.get_all_start_methods()}, "
                             f"got {multiprocessing_context!r}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds: every wait for a worker has a limit")
        if main_prefetch_cnt:
            warnings.warn("main_prefetch_cnt is ignored: samples already queue between the workers and "
                          "the main process", stacklevel=2)
        super().__init__(logical_shards=logical_shards, global_rng=global_rng)
        self.num_workers = num_workers
        self.prefetch_factor = worker_prefetch_cnt if worker_prefetch_cnt is not None else prefetch_factor
        self.main_prefetch_cnt = main_prefetch_cnt or 0
        self.multiprocessing_context = multiprocessing_context
        self.worker_init_fn = worker_init_fn
        self.worker_reset_fn = worker_reset_fn
        if worker_reset_fn is not None and num_workers == 0:
            warnings.warn("worker_reset_fn is not called with num_workers=0 (as in torchdata 0.9): there are no "
                          "workers", stacklevel=2)
        self.timeout = timeout
        self._running = 0

    @property
    def worker_prefetch_cnt(self) -> int:
        """torchdata 0.9's name for :attr:`prefetch_factor`."""
        return self.prefetch_factor

    @property
    def workers(self) -> int:
        return self.num_workers

    def _default_shards(self) -> int:
        return max(self.num_workers, 1)

    def _context(self) -> Any:
        method = self.multiprocessing_context or ("fork" if sys.platform.startswith("linux") else None)
        return mp.get_context(method)

    def _make_executor(self, datapipe: Any, graph: Graph, topology: Topology, count: int,
                       shards: list[int]) -> Executor:
        template = _serialization.dumps_graph(datapipe)
        if self.num_workers == 0:
            self._running = 0
            return LocalExecutor(graph, template if len(shards) > 1 else b"", topology, count, shards,
                                 self.global_rng, self.buffer_state)
        workers = self.num_workers
        if not topology.sharded and workers > 1:
            warnings.warn(
                f"the graph has no sharding point, so it runs as one logical shard in one worker (not "
                f"{workers}): each worker would otherwise read the whole dataset. Add .sharding_filter() "
                "where samples may be split (after shuffling file names, say) to use every worker.",
                stacklevel=user_stacklevel(),
            )
            workers = 1
        workers = min(workers, len(shards))  # (the units are laid out so that each worker has one: reshard)
        self._running = workers
        dispatcher = Dispatcher(graph, topology, count, shards, global_rng=self.global_rng) \
            if topology.dispatchers else None
        return WorkerPool(context=self._context(), template=template, topology=topology, count=count,
                          shards=shards, num_workers=workers, init_fn=self.worker_init_fn,
                          global_rng=self.global_rng, timeout=self.timeout, prefetch=self.prefetch_factor,
                          dispatcher=dispatcher, dispatched=analyze(graph).dispatched, buffer_state=self.buffer_state,
                          reset_fn=self.worker_reset_fn)

    def _layout(self) -> dict[str, Any]:
        assignment = {str(s): i % max(self._running, 1) for i, s in enumerate(self._owned)}
        layout = {"logical_shards": self._count, "workers": self._running, "ranks": 1, "owners": assignment}
        if self.worker_reset_fn is not None and self._running:
            layout[RESET_FN] = self.reset_layout()
        return layout

    def reset_layout(self) -> dict[str, Any] | None:
        """The ``worker_reset_fn`` a restore would call, and in how many workers."""
        if self.worker_reset_fn is None or self.num_workers == 0:
            return None
        return {"function": callable_name(self.worker_reset_fn), "num_workers": self.num_workers}
