"""Read across ranks of ``torch.distributed``; save and restore snapshots collectively.

The L logical shards are dealt to ranks (shard s to rank s % R); each rank runs its share
through its executor (in-process, or worker processes with
``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``),
so each rank's stream is its deterministic share of the one stream the seed defines. Rank 0's
seeds are shared at every epoch.

Snapshots are collective: ``save_snapshot(directory)`` has every rank write its part and rank 0
the index, and the directory appears atomically. A snapshot from R ranks x W workers restores onto
R' x W' as the re-shard plan says (:mod:`snapshot.reading_service.reshard`: the same on every rank,
from the index alone): each rank runs its units, continuing the saved ones exactly where they
stopped, and reads only the parts that hold them, so nothing is lost or repeated over the rest of
the epoch and the cost of a rank's restore does not grow with the number of ranks.

Ranks end every epoch together by default (``even_batches="drop"``): shares can differ (by a
sample, by whole files when the sharding point deals files, after a ``filter`` or a restore onto
another number of ranks), and a collective after the loop (a DDP step, a barrier) would otherwise
wait for a rank that is still reading. When a rank runs out, the ranks share what is left (see
:mod:`snapshot.reading_service._ranks.even`), so fewer than R samples are dropped (or, with
``"pad"``, repeated) in an epoch.
The policy in force is recorded in the snapshot's layout.

Every collective runs on a gloo group created with ``timeout``; a rank that dies or hangs turns
into a :class:`~snapshot.RankError` on the others within that time.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from snapshot import schema
from snapshot.engine.graph import Graph
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import SeedGenerator
from snapshot.engine.sharding import analyze
from snapshot.errors import RankError, ShardingError
from snapshot.reading_service._ranks.collective import Collective
from snapshot.reading_service._ranks.even import (
    FIRST,
    EvenBatches,
    First,
    deal,
    handout,
    saved_first,
    saved_last,
    saved_sharing,
)
from snapshot.reading_service._shards.service import ShardedService, resolve_logical_shards
from snapshot.reading_service.base import ReadingServiceInterface, ServiceCheckpoint, as_record
from snapshot.reading_service.in_process import InProcessReadingService
from snapshot.reading_service.reshard import ReshardPlan, SavedLayout, epoch_units, plan_restore, same_layout_problems
from snapshot.schema import HANDOUT, ServiceState

__all__ = ["Collective", "DistributedReadingService"]

#: ``even_batches`` values: every rank stops when the first runs out (the default), ranks that
#: run out repeat their last sample until all are done, or each rank yields its own share.
EVEN_BATCHES = ("drop", "pad", None)

_log = logging.getLogger(__name__)


class DistributedReadingService(ReadingServiceInterface):
    """Share the logical shards among the ranks of the default process group.

    Args:
        timeout: seconds any collective of the loader may take (gloo group timeout).
        logical_shards: L (default: ranks x workers per rank). Fixed by the first run.
        even_batches: ``"drop"`` (default: every rank yields as many samples; when one runs out, the
            ranks share what is left, sending samples from the ranks that have more to those that
            have none, and fewer than R samples of the epoch are dropped), ``"pad"`` (the same,
            and ranks left without a sample at the very end repeat their last one: fewer than R
            repeats) or ``None`` (each rank yields its whole share, and ranks may end the epoch
            after different numbers of samples: not with DDP's per-step collectives, unless
            the loop runs under ``torch.distributed.algorithms.Join``). Where the shares are equal, ``"drop"`` yields
            torchdata 0.9's stream; where they are not, 0.9 dropped every rank's rest when the
            first ran out. Each costs one tiny all-reduce per sample, and once a rank has run out
            an all-gather of two numbers per sample and the samples sent.
        executor: runs this rank's shards (default :class:`InProcessReadingService`);
            ``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``
            sets it.
    """

    reads_records = True
    takes_graph = True

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
        self._resume_sharing: tuple[bool, list[Any]] = (False, [])  # the ranks were sharing (see _even)
        self._first: list[Any] = []  # what this rank hands out before the restored stream
        self._stream: Iterator[Any] | None = None  # this epoch's local stream
        self._pending_first: list[list[Any]] = []  # given by hand_out_first() for the next restore

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_collective=None, _even=None, _resume_last=None, _resume_sharing=(False, []), _first=[],
                     _pending_first=[], _stream=None)
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
        datapipe = self.executor.prepare(datapipe)
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
        units = epoch_units(count, collective.world, self.executor.workers)
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
        self._resume_sharing = (False, [])
        units = epoch_units(self.executor.logical_shard_count, collective.world, self.executor.workers)
        self.executor.run_units(units, self.owned(units))  # the epoch after a split restore: whole again
        return self.executor.initialize_iteration(seed_generator, iter_reset_fn)

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
        record = self._even.state() if self._even is not None else EvenBatches.initial()
        record[FIRST] = list(self._stream.items) if isinstance(self._stream, First) else list(self._first)
        state.even_batches = record
        state.layout = {**state.layout, "ranks": collective.world, "rank": collective.rank,
                        "even_batches": self.even_batches, HANDOUT: handout(record).to_dict()}
        return state.to_dict()

    def plan(self, state: ServiceCheckpoint | ServiceState) -> ReshardPlan:
        """The re-shard plan of a restore of ``state`` onto this job's ranks (the same on every rank)."""
        return plan_restore(SavedLayout.from_state(as_record(state)), self._connect().world, self.executor.workers)

    def parts_to_read(self, index: schema.Manifest) -> list[int] | None:
        saved = SavedLayout.from_manifest(index)
        if saved is None:
            return None
        collective = self._connect()
        return list(plan_restore(saved, collective.world, self.executor.workers).rank(collective.rank).reads)

    def validate(self, state: ServiceCheckpoint | ServiceState) -> list[str]:
        state = as_record(state)
        problems = self.executor.validate(state)
        world = self._connect().world
        problems += [p for p in same_layout_problems(state, self.executor.reset_layout(), ranks=world)
                     if p not in problems]  # a worker_reset_fn's snapshot restores on its own ranks only
        return problems

    def restore(self, datapipe: Any, state: ServiceCheckpoint | ServiceState | None, *,
                strategy: Any = RestoreStrategy.AUTO, graph: Graph | None = None) -> _Output:
        state = as_record(state) if state else None
        if state is None:
            if not self.executor.configured:
                self.initialize(datapipe)
            return _Output(self)
        collective = self._connect()
        plan = self.plan(state)
        mine = plan.rank(collective.rank)
        if state.world != collective.world:
            _log.info("re-sharding: %d unit(s) saved on %d rank(s) now run as %d on %d; rank %d runs %s, reads "
                      "the parts of ranks %s", state.units, state.world, plan.units, collective.world,
                      collective.rank, list(mine.units), list(mine.reads))
        first = saved_first(state, mine.first, same_ranks=state.world == collective.world)
        if self._pending_first:
            first += deal(self._pending_first, collective.rank, collective.world)
        self._pending_first = []
        self.executor.restore(datapipe, state, strategy=strategy, plan=plan, rank=collective.rank, graph=graph)
        self._even, self._resume_last, self._first = None, saved_last(state, collective.rank), first
        self._resume_sharing = saved_sharing(state, collective.rank, collective.world)
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
        sharing, spare = self._resume_sharing
        self._even = EvenBatches(local, self._connect(), self.even_batches, self._resume_last, sharing=sharing,
                                 spare=spare)
        self._resume_last, self._resume_sharing = None, (False, [])
        return self._even


class _Output:
    def __init__(self, service: DistributedReadingService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        return self._service.stream()
