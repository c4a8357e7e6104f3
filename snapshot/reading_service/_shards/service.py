"""What the in-process and multi-process services share: running a set of logical shards.

A :class:`ShardedService` cuts the graph into L logical shards, runs the shards it owns (all
of them, or a rank's share when a :class:`~snapshot.DistributedReadingService` drives it)
through an *executor* (one engine in this process, or a pool of worker processes) and merges
them round-robin. Its checkpoint and restore work on the same state whatever the executor,
so a snapshot moves freely between in-process, any number of workers and any number of ranks.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from snapshot.container import _serialization
from snapshot.engine.graph import Graph
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import EpochSeeds, SeedGenerator, epoch_seeds
from snapshot.engine.sharding import WHOLE, Topology, WorkerInfo, analyze
from snapshot.errors import LayoutError, ShardingError
from snapshot.reading_service._rng import GlobalRNG
from snapshot.reading_service._shards.engine import EngineState, ShardEngine
from snapshot.reading_service._shards.merge import RoundRobin, Taken, merge_state_for
from snapshot.reading_service._shards.recombine import parts, recombine
from snapshot.reading_service._shards.split import no_split, split, unsplittable
from snapshot.reading_service._shards.tail import Tail, check_restarted
from snapshot.reading_service.base import ReadingServiceInterface, ServiceCheckpoint, as_record
from snapshot.reading_service.reshard import (
    NO_SPLIT,
    ReshardPlan,
    SavedLayout,
    epoch_units,
    plan_restore,
    restore_units,
    same_layout_problems,
)
from snapshot.schema import HANDOUT, ServiceState

__all__ = ["Executor", "LocalExecutor", "ShardedService", "resolve_logical_shards"]

_log = logging.getLogger(__name__)


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


class Executor(Protocol):
    """Runs the engines of a set of logical shards."""

    def start(self, seeds: EpochSeeds, state: ServiceState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None: ...

    def fetch(self, shard: int) -> Any: ...

    def capture(self) -> tuple[list[EngineState], dict[int, list[Any]]]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """One engine, in this process, for every owned shard."""

    def __init__(self, graph: Graph, template: bytes, topology: Topology, count: int, shards: Sequence[int],
                 global_rng: GlobalRNG, buffer_state: str = "values"):
        self.topology = topology
        self.shards = list(shards)
        self.engine = ShardEngine(graph, lambda: _serialization.loads_graph(template), topology, count, shards,
                                  worker=WorkerInfo(1, 0), global_rng=global_rng, protect_caller_rng=True,
                                  buffer_state=buffer_state)

    def start(self, seeds: EpochSeeds, state: ServiceState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        restore = None
        if state is not None:
            restore = recombine(state.upstream, state.shards, self.shards, parts(self.topology))
        self.engine.start(seeds, restore, strategy)

    def fetch(self, shard: int) -> Any:
        return self.engine.next(shard)

    def capture(self) -> tuple[list[EngineState], dict[int, list[Any]]]:
        return [self.engine.capture()], {}

    def close(self) -> None:
        self.engine.close()


class ShardedService(ReadingServiceInterface):
    """Base of the services that run logical shards; see the module docstring."""

    #: How buffering pipes save their samples; set by ``DataLoader2(buffer_state=...)``.
    buffer_state: str = "values"
    reads_records = True
    takes_graph = True

    def __init__(self, *, logical_shards: int | None, global_rng: GlobalRNG | str):
        self.logical_shards = logical_shards
        self.global_rng = GlobalRNG(global_rng)
        self._clear()

    def _clear(self) -> None:
        self._graph: Graph | None = None
        self._topology: Topology | None = None
        self._analysis: Topology | None = None  # the graph's cut, whatever the units (_topology: for them)
        self._executor: Executor | None = None
        self._merge: RoundRobin | None = None
        self._seeds: EpochSeeds | None = None
        self._count = 0  # L, the logical shards
        self._units = 0  # this epoch's units: L, or sub-shards of them (see _split)
        self._owned: list[int] = []
        self._tail: Tail | None = None
        self._next: int | None = None  # the units of the next epoch, after a restore split this one

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_graph=None, _topology=None, _analysis=None, _executor=None, _merge=None, _seeds=None, _count=0,
                     _units=0, _owned=[], _tail=None, _next=None)
        return state

    # -- what subclasses decide -------------------------------------------------------------

    @abstractmethod
    def _default_shards(self) -> int:
        """L for a first run when ``logical_shards`` is not given (for a sharded graph)."""

    @abstractmethod
    def _make_executor(self, datapipe: Any, graph: Graph, topology: Topology, count: int,
                       shards: list[int]) -> Executor:
        """The executor that runs ``shards`` out of ``count``."""

    @abstractmethod
    def _layout(self) -> dict[str, Any]:
        """Workers and their shards, for the manifest."""

    def prepare(self, datapipe: Any) -> Any:
        """Transform the graph once before the first epoch (``init_fn``)."""
        return datapipe

    @property
    def workers(self) -> int:
        """Worker processes per rank (0: in the calling process)."""
        return 0

    @property
    def configured(self) -> bool:
        """Whether the service has its graph and the units it runs (``initialize`` or ``configure``)."""
        return self._executor is not None

    @property
    def logical_shard_count(self) -> int:
        """L, once configured (0 before)."""
        return self._count

    # -- lifecycle --------------------------------------------------------------------------

    def initialize(self, datapipe: Any) -> _Output:
        datapipe = self.prepare(datapipe)
        graph = Graph(datapipe)
        analysis = analyze(graph)
        count = resolve_logical_shards(self.logical_shards, analysis, self._default_shards())
        units = epoch_units(count, 1, self.workers)
        self.configure(datapipe, count, range(units), units, graph=graph, analysis=analysis)
        return _Output(self)

    def configure(self, datapipe: Any, count: int, shards: Sequence[int], units: int | None = None, *,
                  graph: Graph | None = None, analysis: Topology | None = None) -> None:
        """Run ``shards`` (a rank's share, or all) of the ``units`` (default: ``count``) units of
        ``count`` logical shards of ``datapipe``. A caller that has built ``datapipe``'s graph
        (and analyzed it: ``analysis`` is ``analyze(graph)``) passes it, so that neither is done twice."""
        self.finalize()
        units = units or count
        if graph is None:
            graph, analysis = Graph(datapipe), None
        if analysis is None and units > 1:  # one unit runs the graph whole: its cut is found when asked
            analysis = analyze(graph)
        if analysis is not None and not analysis.sharded and units > count:  # no sharding point to split at
            units, shards = count, [s for s in shards if s < count]
        topology = WHOLE if analysis is None else analysis.for_shards(units)
        self._graph, self._topology, self._count, self._units = graph, topology, count, units
        self._analysis = analysis
        self._owned = list(shards)
        self._executor = self._make_executor(datapipe, graph, self._topology, units, self._owned)
        if topology.tail:  # the part below a non-replicable pipe: once, here, over the merged stream
            self._tail = Tail(graph, topology, units, self._owned, global_rng=self.global_rng,
                              buffer_state=self.buffer_state)

    def run_units(self, units: int, shards: Sequence[int]) -> None:
        """From the next epoch on, run ``shards`` of ``units`` units (a rank's share of an epoch that starts
        whole after a restore split the saved one into other units): configured again only if they differ."""
        if self._graph is not None and (units, list(shards)) != (self._units, self._owned):
            self.configure(self._graph.sink, self._count, shards, units)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        if self._next is not None:  # the epoch after a split restore starts whole (as this layout runs it)
            units, self._next = self._next, None
            self.run_units(units, range(units))
        executor, graph = self._require()
        self._seeds = epoch_seeds(seed_generator, graph, self._count)
        executor.start(self._seeds)
        self._merge = RoundRobin(self._owned, executor.fetch)
        if self._tail is not None:
            self._tail.start(self._seeds, self._merge)
        return None

    def finalize(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    # -- checkpoint / restore ---------------------------------------------------------------

    def checkpoint(self) -> ServiceCheckpoint:
        taken = self._take()  # (a background save may make the dict in its thread: see Taken.later)
        return {} if taken is None else taken.later(self, type(self).checkpoint is ShardedService.checkpoint)

    def record(self) -> ServiceState | None:
        """The running epoch's state as its record (``None`` before the first epoch); see :meth:`checkpoint`."""
        return None if (taken := self._take()) is None else taken.record()

    def _take(self) -> Taken | None:
        """What the record is made of, taken now (see :class:`.Taken`)."""
        if self._executor is None or self._merge is None or self._seeds is None:
            return None
        engines, pending = self._executor.capture()
        for shard, items in pending.items():
            self._merge.in_flight[shard].extend(items)
        layout = self._layout()
        if self._units != self._count:
            layout["units"] = self._units
        why = no_split(self._require_analysis(), one_piece=self._units == 1)
        if why is not None:
            layout[NO_SPLIT] = why
        return Taken.take(type(self).__name__, layout, self._seeds, self._merge, engines, self._units,
                          self._tail.capture() if self._tail is not None else None)

    def plan(self, state: ServiceCheckpoint | ServiceState) -> ReshardPlan:
        """The re-shard plan of a restore of ``state`` onto this service alone (one rank)."""
        return plan_restore(SavedLayout.from_state(as_record(state)), 1, self.workers)

    def validate(self, state: ServiceCheckpoint | ServiceState) -> list[str]:
        """Problems that stop a restore of ``state`` (no layout does: :func:`.plan_restore` splits units
        where the ranks or workers need it)."""
        state = as_record(state)
        saved = state.logical_shards
        problems = same_layout_problems(state, self.reset_layout())
        if self.logical_shards is not None and self.logical_shards != saved:
            problems.append(f"the snapshot has {saved} logical shards but this service asks for logical_shards="
                            f"{self.logical_shards}; the number of logical shards is fixed by the first run (leave "
                            "logical_shards unset to take the saved value)")
        return problems

    def reset_layout(self) -> dict[str, Any] | None:
        """The ``worker_reset_fn`` a restore would call, if any (see :mod:`snapshot.reading_service._workers.reset`)."""
        return None

    def restore(self, datapipe: Any, state: ServiceCheckpoint | ServiceState | None, *,
                strategy: Any = RestoreStrategy.AUTO, plan: ReshardPlan | None = None, rank: int = 0,
                graph: Graph | None = None) -> _Output:
        """Continue from ``state``, running what ``plan`` gives rank ``rank`` (default: this service's own
        plan, every unit): the saved units, or sub-shards of them (see :mod:`.split`). ``graph``: the caller's
        analysis of ``datapipe``, used when :meth:`prepare` leaves ``datapipe`` as it is."""
        state = as_record(state) if state else None
        if state is None:
            if self._executor is None:
                self.initialize(datapipe)
            return _Output(self)
        count = state.logical_shards
        graph = self._graph if self._graph is not None else _graph_of(self.prepare(datapipe), graph)
        analysis = self._analysis if graph is self._graph else None
        if plan is None:  # this service alone: its later epochs are its own to lay out
            self._next = epoch_units(count, 1, self.workers)
        own = _own_units(state, self.workers) if plan is None else None
        if own is None:  # another layout, or ranks: the re-shard plan says what runs here
            plan, analysis = plan or self.plan(state), analysis or analyze(graph)
            own = _restored_units(state, plan, rank, analysis)
        units, owned = own
        if self._executor is None or (count, units, owned) != (self._count, self._units, self._owned):
            self.configure(graph.sink, count, owned, units, graph=graph, analysis=analysis)
        units, owned = self._units, self._owned  # (one unit, whole, where the graph has no sharding point)
        if units != state.units:
            plan = plan or self.plan(state)
            _log.info("re-sharding: the saved %d unit(s) of %d logical shard(s) run as %d on %d rank(s) of %d "
                      "worker(s)", state.units, count, units, plan.ranks, plan.workers)
            state = split(state, units, self._require_analysis(), finished=plan.saved.finished)
        saved_workers, workers = state.workers, int(self._layout()["workers"])
        if saved_workers != workers:
            _log.info("re-sharding: %d logical shard(s) saved with %d worker(s) per rank now run on %d "
                      "(this process owns shards %s)", count, saved_workers, workers, owned)
        executor, _ = self._require()
        if state.seeds is None:
            raise LayoutError("the snapshot's service state has no seeds (state.service.seeds): it was not written "
                              f"by {type(self).__name__}; restore it with the service that saved it")
        self._seeds = EpochSeeds.from_state(state.seeds)
        strategy = RestoreStrategy.parse(strategy)
        restart = self._tail is not None and self._tail.restarts_epoch(state.tail, strategy)
        executor.start(self._seeds, None if restart else state, strategy)  # restart: see _tail
        self._merge = RoundRobin(owned, executor.fetch)
        if not restart:
            self._merge.load(merge_state_for(state, owned), state.shards)
        if self._tail is not None:
            self._tail.start(self._seeds, self._merge, state.tail, strategy, restarted=restart)
            if restart:
                check_restarted(self._merge, merge_state_for(state, owned))
        return _Output(self)

    def _require_analysis(self) -> Topology:
        """The graph's cut (found when first asked after a restore that ran one unit)."""
        if self._analysis is None:
            if self._graph is None:
                raise RuntimeError("initialize() must be called before iterating")
            self._analysis = analyze(self._graph)
        return self._analysis

    def _require(self) -> tuple[Executor, Graph]:
        if self._executor is None or self._graph is None:
            raise RuntimeError("initialize() must be called before iterating")
        return self._executor, self._graph

    def progress(self) -> tuple[int, bool]:
        """Samples this service yielded in the epoch, and whether its shards are all exhausted."""
        if self._merge is None:
            return 0, False
        if self._tail is not None:
            return self._tail.progress()
        return sum(self._merge.consumed.values()), len(self._merge.exhausted) == len(self._merge.shards)

    def stream(self) -> Iterator[Any]:
        """The current epoch's merged stream."""
        if self._merge is None:
            return iter(())
        return self._tail if self._tail is not None else self._merge


def _graph_of(datapipe: Any, analyzed: Graph | None) -> Graph:
    """``datapipe``'s graph: the caller's (``analyzed``) when it is of ``datapipe``."""
    return analyzed if analyzed is not None and analyzed.sink is datapipe else Graph(datapipe)


def _own_units(state: ServiceState, workers: int) -> tuple[int, list[int]] | None:
    """The units one process with ``workers`` workers runs the rest of the saved epoch as, when they are
    the saved ones, all of them (what :func:`.plan_restore` says of one rank then, known without making the
    plan); ``None`` where the plan decides (the units are split, the snapshot spans ranks)."""
    units = state.units
    if state.ranks or HANDOUT in state.layout or restore_units(units, 1, workers) != units:
        return None
    return units, list(range(units))


def _restored_units(state: ServiceState, plan: ReshardPlan, rank: int, analysis: Topology) -> tuple[int, list[int]]:
    """The units rank ``rank`` runs the rest of the saved epoch as: the plan's; or, where the saved units
    cannot be split before the epoch ends and the ranks can share them, its share of them (on the workers
    they keep busy: the next epoch is split from its start)."""
    units, owned = plan.units, list(plan.rank(rank).units)
    if units != state.units and state.units % plan.ranks == 0:
        why = unsplittable(state, analysis)
        if why is not None:
            _log.info("re-sharding: the rest of the epoch runs as the saved %d unit(s), not split: %s", state.units,
                      why)
            return state.units, [u for u in range(state.units) if u % plan.ranks == rank]
    return units, owned


class _Output:
    """What the loader iterates: the current epoch's merged stream."""

    def __init__(self, service: ShardedService):
        self._service = service

    def __iter__(self) -> Iterator[Any]:
        return self._service.stream()

