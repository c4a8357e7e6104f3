"""Read across ranks of ``torch.distributed``; save and restore snapshots collectively.

The L logical shards are dealt to ranks (shard s to rank s % R); each rank runs its share
through its executor (in-process, or worker processes with
``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``),
so each rank's stream is its deterministic share of the one stream the seed defines. Rank 0's
seeds are shared at every epoch.

Snapshots are collective: ``save_snapshot(directory)`` has every rank write its part and rank 0
the manifest, and the directory appears atomically; ``state_dict()`` gathers every rank's part
(so ``torch.distributed.checkpoint`` keeps one copy). A snapshot from R ranks x W workers restores
onto R' x W' whenever the saved logical shards allow it, each logical shard continuing exactly
where it stopped, so nothing is lost or repeated over the rest of the epoch.

Ranks end every epoch together by default (``even_batches="drop"``, torchdata 0.9's behaviour):
a rank's share can be one sample longer than another's (or more, after a ``filter``), and a
collective after the loop (a DDP step, a barrier) would otherwise wait for a rank that is still
reading. The policies are in :data:`EVEN_BATCHES`; the one in force is recorded in the
snapshot's layout, and what ``"pad"`` repeats is saved with each rank's part.

Every collective runs on a gloo group created with ``timeout``; a rank that dies or hangs turns
into a :class:`~snapshot.RankError` on the others within that time.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from snapshot.engine.graph import Graph
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import SeedGenerator
from snapshot.engine.sharding import analyze
from snapshot.errors import RankError, ShardingError
from snapshot.reading_service._even import FIRST, EvenBatches, First, deal, saved_first, saved_last
from snapshot.reading_service._sharded import ShardedService, resolve_logical_shards
from snapshot.reading_service._split import epoch_units, restore_units
from snapshot.reading_service._uneven import check_even_rest, sharding_lengths
from snapshot.reading_service._worker_reset import same_layout_problems
from snapshot.reading_service.base import ReadingServiceInterface, ServiceCheckpoint, as_record
from snapshot.reading_service.in_process import InProcessReadingService
from snapshot.schema import ServiceState

__all__ = ["Collective", "DistributedReadingService"]

#: ``even_batches`` values: every rank stops when the first runs out (the default), ranks that
#: run out repeat their last sample until all are done, or each rank yields its own share.
EVEN_BATCHES = ("drop", "pad", None)

_log = logging.getLogger(__name__)


class Collective:
    """The loader's collective operations on its own gloo group, with a timeout."""

    def __init__(self, group: Any, rank: int, world: int, timeout: float):
        self.group = group
        self.rank = rank
        self.world = world
        self.timeout = timeout

    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (RuntimeError, dist.DistBackendError) as exc:
            raise RankError(
                f"rank {self.rank} of {self.world}: {what} failed: another rank died, hung for more than "
                f"{self.timeout:g} s, or left the group ({type(exc).__name__}: {str(exc).splitlines()[0]}). "
                "Stop every rank and restore from the last complete snapshot."
            ) from exc

    def all_gather(self, value: Any, what: str) -> list[Any]:
        out: list[Any] = [None] * self.world
        self._run(what, lambda: dist.all_gather_object(out, value, group=self.group))
        return out

    def gather(self, value: Any, what: str) -> list[Any] | None:
        """Every rank's ``value`` on rank 0, in rank order; ``None`` on the other ranks."""
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        self._run(what, lambda: dist.gather_object(value, out, dst=0, group=self.group))
        return out

    def broadcast(self, value: Any, what: str) -> Any:
        box = [value if self.rank == 0 else None]
        self._run(what, lambda: dist.broadcast_object_list(box, src=0, group=self.group))
        return box[0]

    def all_reduce_min(self, value: int, what: str) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        self._run(what, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group))
        return int(tensor.item())

    def all_reduce_max(self, value: int, what: str) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        self._run(what, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group))
        return int(tensor.item())

    def barrier(self, what: str) -> None:
        self.all_gather(None, what)


class DistributedReadingService(ReadingServiceInterface):
    """Share the logical shards among the ranks of the default process group.

    Args:
        timeout: seconds any collective of the loader may take (gloo group timeout).
        logical_shards: L (default: ranks x workers per rank). Fixed by the first run.
        even_batches: ``"drop"`` (default, as torchdata 0.9: every rank stops as soon as one
            runs out, dropping the others' remainders), ``"pad"`` (ranks that run out repeat
            their last sample until all are done) or ``None`` (each rank yields its whole
            share, and ranks may end the epoch after different numbers of samples). With
            ``"drop"`` and ``"pad"`` every rank yields the same number of samples, so a
            collective in the training step or after the loop does not hang; each costs one
            tiny all-reduce per sample.
        executor: runs this rank's shards (default :class:`InProcessReadingService`);
            ``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``
            sets it.
    """

    reads_records = True

    def __init__(self, timeout: float = 1800.0, *, logical_shards: int | None = None,
                 even_batches: str | None = "drop", executor: ShardedService | None = None):
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this build of torch")
        if even_batches not in EVEN_BATCHES:
            raise ValueError(f"even_batches must be one of {EVEN_BATCHES} (\"drop\": every rank stops when the "
                             f"first runs out), got {even_batches!r}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds: every collective has a limit")
        self.timeout = float(timeout)
        self.logical_shards = logical_shards
        self.even_batches = even_batches
        self.executor: ShardedService = executor if executor is not None else InProcessReadingService()
        self._collective: Collective | None = None
        self._even: EvenBatches | None = None  # the current epoch's (with a policy)
        self._resume_last: list[Any] | None = None  # what "pad" repeats, from a restored snapshot
        self._first: list[Any] = []  # what this rank hands out before the restored stream
        self._stream: Iterator[Any] | None = None  # this epoch's local stream
        self._pending_first: list[list[Any]] = []  # given by hand_out_first() for the next restore

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_collective=None, _even=None, _resume_last=None, _first=[], _pending_first=[],
                     _stream=None)
        return state

    @property
    def collective(self) -> Collective:
        """The loader's collective operations (joins the process group on first use)."""
        return self._connect()

    def _connect(self) -> Collective:
        if self._collective is None:
            if not dist.is_initialized():
                raise RankError(
                    "torch.distributed is not initialized: call torch.distributed.init_process_group() first "
                    "(torchrun and most launchers set the environment it reads)")
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
            self._collective = Collective(group, dist.get_rank(), dist.get_world_size(), self.timeout)
        return self._collective

    def hand_out_first(self, per_rank: list[list[Any]]) -> None:
        """Before a restore: samples the saved ranks are to yield before their restored streams
        (batches that a trainer's fetcher had taken ahead of the saved step, say), one list per
        saved rank, the same on every rank. Each rank yields its share of them first, under the
        ``even_batches`` policy like every other sample: its own list on the same number of ranks,
        else the lists dealt as evenly as they can be, and the restore evens out the rest of the
        epoch around them. A snapshot taken before they are all yielded keeps the rest."""
        self._pending_first = [list(items) for items in per_rank]

    def owned(self, count: int) -> list[int]:
        collective = self._connect()
        return [shard for shard in range(count) if shard % collective.world == collective.rank]

    # -- lifecycle --------------------------------------------------------------------------

    def initialize(self, datapipe: Any) -> Iterator[Any] | _Output:
        collective = self._connect()
        datapipe = self.executor._prepare(datapipe)
        graph = Graph(datapipe)
        topology = analyze(graph)
        mine = {"fingerprint": graph.fingerprint, "workers": self.executor.workers,
                "logical_shards": self.logical_shards or self.executor.logical_shards}
        infos = collective.all_gather(mine, "checking that every rank has the same graph")
        different = [r for r, info in enumerate(infos) if info["fingerprint"] != infos[0]["fingerprint"]]
        if different:
            raise RankError(f"ranks {different} built a different graph than rank 0 (graph fingerprints "
                            "differ): every rank must build the same graph")
        requested = infos[0]["logical_shards"]
        default = collective.world * max(int(infos[0]["workers"]), 1)
        if not topology.sharded and collective.world > 1:
            raise ShardingError(
                f"the graph has no sharding point, so its {collective.world} ranks would each read the whole "
                "dataset: add .sharding_filter() where samples may be split")
        count = resolve_logical_shards(requested, topology, default)
        units = epoch_units(count, collective.world)
        self.executor.configure(datapipe, count, self.owned(units), units, graph=graph, analysis=topology)
        return _Output(self)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        collective = self._connect()
        states = collective.all_gather(seed_generator.state(), "checking the epoch's seeds")
        if any(state != states[0] for state in states):
            seed_generator.set_state(states[0])  # rank 0's seeds drive every rank
        self._even, self._resume_last, self._first, self._stream = None, None, [], None
        executor = self.executor
        units = epoch_units(executor._count, collective.world)
        if executor._graph is not None and executor._units != units:  # the epoch after a split restore
            executor.configure(executor._graph.sink, executor._count, self.owned(units), units)
        return executor.initialize_iteration(seed_generator, iter_reset_fn)

    def finalize_iteration(self) -> None:
        self.executor.finalize_iteration()

    def finalize(self) -> None:
        self.executor.finalize()
        if self._collective is not None:
            collective, self._collective = self._collective, None
            try:
                dist.destroy_process_group(collective.group)
            except (RuntimeError, ValueError, AssertionError):
                pass  # the default group is already gone (interpreter exit, a failed run)

    # -- checkpoint / restore -----------------------------------------------------------------

    def checkpoint(self) -> ServiceCheckpoint:
        state = self.executor.record()
        if state is None:
            return {}
        collective = self._connect()
        state.service = type(self).__name__
        state.layout = {**state.layout, "ranks": collective.world, "rank": collective.rank,
                        "even_batches": self.even_batches}
        record = self._even.state() if self._even is not None else EvenBatches.initial()
        record[FIRST] = list(self._stream.items) if isinstance(self._stream, First) else list(self._first)
        state.even_batches = record
        return state.to_dict()

    def validate(self, state: ServiceCheckpoint | ServiceState) -> list[str]:
        state = as_record(state)
        problems = self.executor.validate(state)
        world = self._connect().world
        problems += [p for p in same_layout_problems(state, self.executor._reset_layout(), ranks=world)
                     if p not in problems]  # a worker_reset_fn's snapshot restores on its own ranks only
        saved = state.units
        mine = restore_units(saved, world) // world
        workers = self.executor.workers
        if workers > mine:
            problems.append(f"on {world} ranks each rank runs {mine} logical shard(s) (or sub-shards) of this "
                            f"snapshot, which cannot keep {workers} workers per rank busy; use at most {mine}")
        return problems

    def restore(self, datapipe: Any, state: ServiceCheckpoint | ServiceState | None, *,
                strategy: Any = RestoreStrategy.AUTO) -> _Output:
        state = as_record(state) if state else None
        if state is None:
            if self.executor._executor is None:
                self.initialize(datapipe)
            return _Output(self)
        collective = self._connect()
        saved = state.units
        units = restore_units(saved, collective.world)
        saved_ranks = state.world
        if saved_ranks != collective.world:
            _log.info("re-sharding: %d unit(s) saved on %d rank(s) now run as %d on %d; rank %d owns %s",
                      saved, saved_ranks, units, collective.world, collective.rank, self.owned(units))
        if self.executor._executor is None:
            datapipe = self.executor._prepare(datapipe)
        first = saved_first(state, collective.rank, collective.world)
        if self._pending_first:
            first += deal(self._pending_first, collective.rank, collective.world)
        ahead = collective.all_gather(len(first), "agreeing on the samples handed out before the stream") \
            if saved_ranks != collective.world else [len(first)] * collective.world
        if self.even_batches is not None and saved_ranks != collective.world:
            graph = self.executor._graph or Graph(datapipe)
            check_even_rest(state, units, collective.world, ahead, self.even_batches,
                            sharding_lengths(graph, analyze(graph)))  # refused: nothing changed
        self._pending_first = []
        self.executor.restore(datapipe, state, strategy=strategy, shards=self.owned(units), units=units,
                              ranks=collective.world, ahead=ahead)
        self._even, self._resume_last, self._first = None, saved_last(state, collective.rank), first
        return _Output(self)

    def progress(self) -> tuple[int, bool]:
        return self.executor.progress()

    def stream(self) -> Iterator[Any]:
        local = self.executor.stream()
        if self._first:
            local, self._first = First(self._first, local), []
        self._stream = local
        if self.even_batches is None:
            return local
        self._even = EvenBatches(local, self._connect(), self.even_batches, self._resume_last)
        self._resume_last = None
        return self._even


class _Output:
    def __init__(self, service: DistributedReadingService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        return self._service.stream()
