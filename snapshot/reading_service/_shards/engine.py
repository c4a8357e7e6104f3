"""Running logical shards: the engine every reading service shares.

A :class:`ShardEngine` runs the logical shards one process owns: one copy of the part of
the graph above the sharding point (with a :class:`Router` per ``sharding_filter`` dealing
its samples to shards by index) and one copy of the part below it per owned shard. It knows
nothing of processes: the in-process service runs one engine for all shards, each worker
runs one for its own.

Around it: :mod:`.routing` deals samples to shards, :mod:`snapshot.reading_service._rng` isolates the
global generators per shard, :mod:`.merge` merges the shards into the loader's stream and builds the
service's checkpoint, and :mod:`.recombine` carries saved states onto another layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapshot.engine._hooked import generation
from snapshot.engine.execution import Run, capture_persistent, restore_persistent, rewind
from snapshot.engine.graph import Graph
from snapshot.engine.plan import PlanLayout, RestoreStrategy, make_plan, plan_layout
from snapshot.engine.randomness import EpochSeeds
from snapshot.engine.sharding import Topology, WorkerInfo
from snapshot.reading_service._rng import GlobalRNG, _ShardRNG, raw_from_plain, seeded_rng
from snapshot.reading_service._shards.reread import reread
from snapshot.reading_service._shards.routing import RemoteFetch, RemoteRouter, Router, RouterPort, _outer
from snapshot.schema.state import NodeState, RouterState, ShardState, UpstreamState

__all__ = ["EngineState", "ShardEngine", "counts", "restore_plans", "shard_layout", "start_upstream"]


@dataclass
class EngineState:
    """What one engine runs, captured or to restore: the part above the sharding point (``None``:
    none runs here) and each owned shard's record (``None``: it starts afresh)."""

    upstream: UpstreamState | None
    shards: dict[int, ShardState | None] = field(default_factory=dict)


def counts(nodes: Mapping[str, NodeState]) -> dict[str, int | None]:
    """Per node path, the samples a saved run's node had yielded."""
    return {path: node.yielded for path, node in nodes.items()}


def restore_plans(graphs: Mapping[int, Graph], topology: Topology, saved: Mapping[int, ShardState | None],
                  strategy: RestoreStrategy, layouts: dict[int, PlanLayout] | None = None
                  ) -> tuple[dict[int, Any], set[int]]:
    """Each saved shard's restore plan, and the shards whose plan replays up to a router (their layouts
    into ``layouts``, when given)."""
    plans = {}
    for shard, graph in graphs.items():
        record = saved.get(shard)
        if record is not None and not record.graph_exhausted:
            layout = shard_layout(graph, topology, strategy)
            if layouts is not None:
                layouts[shard] = layout
            plans[shard] = layout.at(counts(record.nodes))
    return plans, {s for s, plan in plans.items() if plan.reaches_ports}


def shard_layout(graph: Graph, topology: Topology, strategy: RestoreStrategy) -> PlanLayout:
    """The layout of a logical shard's plans: its part of the graph, from its sharding points down."""
    return plan_layout(graph, strategy, sinks=[topology.shard_sink], ports=frozenset(topology.routers))


def start_upstream(graph: Graph, routers: Sequence[str], prefix: frozenset[str], count: int, shards: Sequence[int],
                   seeds: EpochSeeds, saved: UpstreamState | None, replayed: set[int],
                   strategy: RestoreStrategy, buffer_state: str = "values") -> tuple[Run, dict[str, Router]]:
    """Run the part above ``routers`` (the nodes in ``prefix``), restored from ``saved`` if given.

    When some shard replays up to its router (``replayed``), the part restarts from the
    start of the epoch and each router skips, for the other shards, what they had read.
    """
    sinks = [graph[r].inputs[0] for r in routers]
    records = plan = None
    routers_state: dict[str, RouterState] = {}
    if saved is not None:
        restore_persistent(graph, saved.persistent)
        if saved.restart and not replayed:  # read unevenly: replay, routers skip what was read
            rewind(graph, saved.nodes, prefix)
            routers_state = saved.routers
        elif not replayed:
            records = saved.nodes
            plan = make_plan(graph, counts(records), strategy, sinks=sinks)
            routers_state = saved.routers
        else:  # restart the routers, skipping what was read
            rewind(graph, saved.nodes, prefix)
            routers_state = {r: RouterState(deal=state.deal, queues={s: [] for s in shards},
                                            next={s: (0 if s in replayed else state.next[s]) for s in shards})
                             for r, state in saved.routers.items()}
    shared = {p: s for p, s in seeds.shared.items() if p in prefix}
    run = Run(graph, shared, sink=sinks[0], sinks=tuple(sinks[1:]), records=records, plan=plan,
              buffer_state=buffer_state)
    built = {r: Router(run.cell(graph[r].inputs[0]), count, shards, routers_state.get(r),
                       outer=_outer(graph[r].datapipe))
             for r in routers}
    return run, built


class ShardEngine:
    """Runs the logical ``shards`` this process owns, out of ``count`` in all.

    ``graph`` is the live graph (used for the part above the sharding point and for the
    first owned shard); ``make_copy`` builds a fresh copy of the graph for each further shard.
    With ``remote``, the part above each dispatcher runs elsewhere (the main process) and
    its samples are fetched through ``remote``.
    """

    def __init__(self, graph: Graph, make_copy: Callable[[], Any], topology: Topology, count: int,
                 shards: Sequence[int], *, worker: WorkerInfo, init_fn: Callable[..., Any] | None = None,
                 global_rng: GlobalRNG = GlobalRNG.SHARED, protect_caller_rng: bool = True,
                 remote: RemoteFetch | None = None, buffer_state: str = "values"):
        self.topology = topology
        self.buffer_state = buffer_state
        self._remote = remote if topology.dispatchers else None
        self.count = count
        self.shards = list(shards)
        self.graph = graph
        self.worker = worker
        self._shard_graphs: dict[int, Graph] = {}
        for i, shard in enumerate(self.shards):
            datapipe = graph.sink if i == 0 else make_copy()
            if init_fn is not None:
                datapipe = init_fn(datapipe, worker) or datapipe
            shard_graph = graph if datapipe is graph.sink else Graph(datapipe)
            topology.configure_shard(shard_graph, count, shard)
            self._shard_graphs[shard] = shard_graph
        self._downstream = topology.downstream(graph)
        #: the part above the routers that runs here
        self._prefix = topology.upstream - topology.dispatched if self._remote is not None else topology.upstream
        self._rng = _ShardRNG(GlobalRNG(global_rng), protect_caller_rng)
        self._upstream: Run | None = None
        self._routers: dict[str, Router | RemoteRouter] = {}
        self._runs: dict[int, Run | None] = {}
        self._seeds: EpochSeeds | None = None
        # The epoch's plan layouts (the restore's, when it planned as a save does; else made when the epoch
        # starts, see _lay_out): each save of the epoch plans its shards at their counts without walking their
        # graphs again, and the first one does not make them. They hold while the hooks registered do.
        self._layouts: dict[int, PlanLayout] = {}
        self._upstream_layout: PlanLayout | None = None
        self._hooks_seen = -1

    # -- epochs ---------------------------------------------------------------------------

    def close(self) -> None:
        for run in [self._upstream, *self._runs.values()]:
            if run is not None:
                run.close()
        self._upstream, self._runs, self._routers = None, {}, {}
        self._layouts, self._upstream_layout = {}, None

    def start(self, seeds: EpochSeeds, restore: EngineState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        """Start the epoch with ``seeds``, or put it back where ``restore`` (see recombine) says.

        A shard whose restore plan replays up to its sharding point (fast-forward, or a
        hookless pipe right below it) must receive its samples again from the start of the
        epoch: then the part above the sharding point restarts too, and the router skips, for
        the other shards, the samples they had already read.
        """
        self.close()
        self._seeds = seeds
        graph, topology = self.graph, self.topology
        shard_states = restore.shards if restore is not None else {}
        plans, replayed = restore_plans(self._shard_graphs, topology, shard_states, strategy,
                                        self._layouts if strategy is RestoreStrategy.AUTO else None)
        upstream_state = restore.upstream if restore is not None else None
        local = topology.filters if self._remote is not None else topology.routers
        if local:
            self._upstream, routers = start_upstream(graph, local, self._prefix, self.count, self.shards, seeds,
                                                     upstream_state, replayed, strategy, self.buffer_state)
            self._routers.update(routers)
        if self._remote is not None:
            for path in topology.dispatchers:
                received = {s: 0 if s in replayed or (record := shard_states.get(s)) is None
                            else record.read_from(path) for s in self.shards}
                self._routers[path] = RemoteRouter(path, self._remote, self.shards, received)
        rng_states = {}
        for shard in self.shards:
            saved = shard_states.get(shard)
            if self._rng.enabled:
                plain = saved.rng if saved is not None else None
                rng_states[shard] = raw_from_plain(plain) if plain else seeded_rng(seeds.rng_seed(shard))
            self._runs[shard] = self._shard_run(shard, seeds, saved, plans.get(shard), shard in replayed)
        self._rng.reset(rng_states)
        self._lay_out()

    def _lay_out(self) -> None:
        """Make the layouts a capture plans with (0.1 ms a shard), while the epoch starts rather than in the
        first save's blocking part. They depend on the graph and the hooks registered, not on the position.
        A graph that cannot be planned is refused by the save that plans it, not here."""
        try:
            self._upstream_plan_layout()
            for shard in self.shards:
                if self._runs.get(shard) is not None:
                    self._shard_plan_layout(shard)
        except Exception:  # noqa: BLE001 - refused when a save needs the layout (see capture)
            self._layouts, self._upstream_layout = {}, None
        # (after: a package's hooks loaded at their first look-up are registered before they are read)
        self._hooks_seen = generation()

    def _upstream_plan_layout(self) -> PlanLayout | None:
        """The layout of the part above the routers that runs here (``None``: none does)."""
        if self._upstream is not None and self._upstream_layout is None:
            sinks = [self.graph[r].inputs[0] for r in self._routers]
            self._upstream_layout = plan_layout(self.graph, RestoreStrategy.AUTO, sinks=sinks)
        return self._upstream_layout

    def _shard_plan_layout(self, shard: int) -> PlanLayout:
        layout = self._layouts.get(shard)
        if layout is None:
            layout = self._layouts[shard] = shard_layout(self._shard_graphs[shard], self.topology,
                                                         RestoreStrategy.AUTO)
        return layout

    def _shard_run(self, shard: int, seeds: EpochSeeds, saved: ShardState | None, plan: Any,
                   replays_port: bool) -> Run | None:
        graph = self._shard_graphs[shard]
        if saved is not None:
            restore_persistent(graph, saved.persistent)
            if saved.graph_exhausted:
                return None
        ports = {r: RouterPort(self._routers[r], shard, graph[r].datapipe) for r in self.topology.routers}
        records = None
        if saved is not None:
            records = saved.nodes
            if not replays_port:
                for path, port in ports.items():
                    port.yielded = saved.read_from(path)
        own = {p: s for p, s in seeds.for_shard(shard).items() if p in self._downstream}
        again = functools.partial(reread, seeds=seeds.shared, buffer_state=self.buffer_state)
        return Run(graph, own, sink=self.topology.shard_sink, ports=ports, records=records, plan=plan,
                   buffer_state=self.buffer_state, reread=again)

    # -- iterating ------------------------------------------------------------------------

    def next(self, shard: int) -> Any:
        """The next sample of ``shard``; ``StopIteration`` when the shard is exhausted."""
        run = self._runs.get(shard)
        if run is None:
            raise StopIteration
        self._rng.enter(shard)
        try:
            return next(run)
        finally:
            self._rng.leave()

    def produced(self, shard: int) -> int:
        run = self._runs.get(shard)
        return run.yielded if run is not None else -1

    # -- capturing ------------------------------------------------------------------------

    def capture(self) -> EngineState:
        """This engine's state: the part above the sharding point and each owned shard."""
        upstream = None
        if self._hooks_seen != generation():  # hooks registered since the layouts were made
            self._layouts, self._upstream_layout, self._hooks_seen = {}, None, generation()
        upstream_layout = self._upstream_plan_layout()
        if self._upstream is not None and upstream_layout is not None:
            replayed = upstream_layout.replay
            upstream = UpstreamState(shards=list(self.shards), nodes=self._upstream.capture(replayed),
                                     routers={r: router.state() for r, router in self._routers.items()
                                              if isinstance(router, Router)},
                                     persistent={p: s for p, s in capture_persistent(self.graph).items()
                                                 if p in self._prefix})
        shards: dict[int, ShardState | None] = {}
        for shard in self.shards:
            run = self._runs.get(shard)
            graph = self._shard_graphs[shard]
            persistent = {p: s for p, s in capture_persistent(graph).items() if p in self._downstream}
            if run is None:
                shards[shard] = ShardState(produced=None, graph_exhausted=True, rng=self._rng.state(shard),
                                           persistent=persistent)
                continue
            plan = self._shard_plan_layout(shard).at(run.counts())
            records = run.capture(plan.replay)
            shards[shard] = ShardState(produced=run.yielded, graph_exhausted=run.exhausted, nodes=records,
                                       plan=plan.record(), rng=self._rng.state(shard),
                                       persistent=persistent)
        return EngineState(upstream, shards)
