"""Sharding points: where a graph is cut into logical shards.

A graph is cut at its *sharding points*:

- a ``sharding_filter`` is a **router**: the part above it (its inputs and everything they
  read from) runs once per worker, and the samples reaching the filter are dealt to the
  logical shards by index (sample ``i`` goes to shard ``i % L``);
- a ``sharding_round_robin_dispatch`` (torchdata 0.9's dispatcher) is a router too, but the
  part above it is *non-replicable*: it runs once per process that drives the loader (the
  main process, not the workers), which deals its samples to the logical shards by index
  the same way. Sharding points above or below a dispatcher are left as they are (they
  pass everything through unless configured by hand), as in torchdata 0.9;
- any other pipe with an ``apply_sharding`` method (a source that reads its own share) is
  **replicated**: each logical shard runs its own copy, configured with
  ``apply_sharding(L, shard)``.

Everything not above a router runs once per logical shard, except the *non-replicable
tail*: a pipe whose ``is_replicable()`` returns ``False`` below the sharding point (torchdata
0.9's ``fullsync``, ``pin_memory``, or a pipe of your own), and everything below it down to the
sink, runs once, in the loader's process, over the merged stream of the logical shards (as
torchdata 0.9 ran it in the main process). The tail must read the rest of the graph through a
single node, the *merge point* (0.9's single replicable branch): each logical shard runs the
graph up to it. Above a ``sharding_filter``, a non-replicable pipe is refused (it would run in
every worker); above a dispatcher it runs once anyway. A graph without a sharding point has a
single logical shard, which runs it whole.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES, ShardingFilterIterDataPipe

from snapshot.engine._tokens import attribute
from snapshot.engine.graph import ROOT, Graph
from snapshot.errors import ShardingError

__all__ = ["WHOLE", "Topology", "WorkerInfo", "analyze", "apply_sharding", "is_dispatcher", "is_sharding_point"]

_DISPATCHER = ("torchdata.datapipes.iter.util.sharding", "ShardingRoundRobinDispatcherIterDataPipe")


@dataclass(frozen=True)
class WorkerInfo:
    """Which worker a function runs in (torchdata 0.9's ``WorkerInfo``)."""

    num_workers: int
    worker_id: int


def is_sharding_point(datapipe: Any) -> bool:
    """``sharding_filter`` or any pipe with a bound ``apply_sharding`` method."""
    return inspect.ismethod(attribute(datapipe, "apply_sharding"))


def is_dispatcher(datapipe: Any) -> bool:
    """torchdata 0.9's ``sharding_round_robin_dispatch`` (recognised without importing torchdata)."""
    kind = type(datapipe)
    return (kind.__module__, kind.__qualname__) == _DISPATCHER


def _is_non_replicable(datapipe: Any) -> bool:
    method = attribute(datapipe, "is_replicable")
    return callable(method) and method() is False


def apply_sharding(
    datapipe: Any,
    num_of_instances: int,
    instance_id: int,
    sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
) -> Any:
    """Configure every sharding point of the graph as instance ``instance_id`` of ``num_of_instances``."""
    for node in Graph(datapipe):
        _apply(node.datapipe, num_of_instances, instance_id, sharding_group)
    return datapipe


def _apply(datapipe: Any, count: int, instance: int,
           group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT) -> None:
    method = getattr(datapipe, "apply_sharding", None)
    if not inspect.ismethod(method):
        return
    if len(inspect.signature(method).parameters) < 3:
        method(count, instance)
    else:
        method(count, instance, sharding_group=group)


@dataclass(frozen=True)
class Topology:
    """How a graph is cut into logical shards (see the module docstring).

    ``routers`` are the ``sharding_filter`` and dispatcher paths, ``dispatchers`` the latter;
    ``upstream`` is everything above a router and ``dispatched`` the part of it above a
    dispatcher. ``tail`` is the non-replicable tail (run once, over the merged stream) and
    ``merge_point`` the node it reads the logical shards' samples from. ``problems`` lists why
    the graph cannot be cut (a node read both above and below the sharding point, two sharding
    points in a row); they matter only for more than one logical shard: with one, the graph
    runs whole, as it would on its own.
    """

    routers: tuple[str, ...]
    replicated: tuple[str, ...]
    upstream: frozenset[str]
    problems: tuple[str, ...] = ()
    dispatchers: tuple[str, ...] = ()
    dispatched: frozenset[str] = frozenset()
    tail: frozenset[str] = frozenset()
    merge_point: str | None = None

    @property
    def sharded(self) -> bool:
        return bool(self.routers or self.replicated)

    @property
    def filters(self) -> tuple[str, ...]:
        """The routers that are ``sharding_filter`` (their upstream runs in every worker)."""
        return tuple(r for r in self.routers if r not in self.dispatchers)

    def for_shards(self, count: int) -> Topology:
        """The cut to run ``count`` logical shards with (raises when it cannot be made)."""
        if count == 1:
            return WHOLE
        if self.problems:
            raise ShardingError("this graph cannot be cut into logical shards:\n  " + "\n  ".join(self.problems))
        return self

    @property
    def shard_sink(self) -> str:
        """The node each logical shard runs up to: the merge point, or the sink."""
        return self.merge_point if self.merge_point is not None else ROOT

    def downstream(self, graph: Graph) -> set[str]:
        """The nodes each logical shard runs (neither above the sharding point nor in the tail)."""
        return {n.path for n in graph.nodes if n.path not in self.upstream and n.path not in self.tail}

    def configure_shard(self, graph: Graph, count: int, shard: int) -> None:
        """Make a shard's copy of the graph read shard ``shard`` of ``count``."""
        for path in self.replicated:
            _apply(graph[path].datapipe, count, shard)

    def describe(self) -> dict[str, Any]:
        out = {"routers": list(self.routers), "replicated": list(self.replicated),
               "upstream_nodes": len(self.upstream), "dispatchers": list(self.dispatchers)}
        if self.tail:
            out.update(tail_nodes=len(self.tail), merge_point=self.merge_point)
        return out


#: The cut of a graph run as one unit: no cut, the whole graph in one piece.
WHOLE = Topology((), (), frozenset())


def _descendants(graph: Graph, paths: list[str]) -> set[str]:
    """Every node that reads, directly or not, from one of ``paths``."""
    seen: set[str] = set()
    stack = [c for p in paths for c in graph[p].consumers]
    while stack:
        path = stack.pop()
        if path not in seen:
            seen.add(path)
            stack.extend(graph[path].consumers)
    return seen


def analyze(graph: Graph) -> Topology:
    """Find the sharding points of ``graph``, and what would stop cutting it there."""
    problems = []
    candidates = [n.path for n in graph.nodes if is_dispatcher(n.datapipe)]
    for path in candidates:
        if len(graph[path].inputs) != 1:
            problems.append(f"{path}: a sharding_round_robin_dispatch must have exactly one input")
    candidates = [p for p in candidates if len(graph[p].inputs) == 1]
    above = {p: set(graph.ancestors(graph[p].inputs[0])) for p in candidates}
    dispatchers = [p for p in candidates if not any(p in above[q] for q in candidates)]
    dispatched = set().union(*(above[p] for p in dispatchers))
    below = _descendants(graph, dispatchers)
    passive = dispatched | below  # sharding points there are left alone, as in torchdata 0.9
    filters = [n.path for n in graph.nodes
               if isinstance(n.datapipe, ShardingFilterIterDataPipe) and n.path not in passive]
    replicated = [n.path for n in graph.nodes
                  if is_sharding_point(n.datapipe) and n.path not in passive
                  and not isinstance(n.datapipe, ShardingFilterIterDataPipe)]
    upstream: set[str] = set()
    for router in filters:
        if len(graph[router].inputs) != 1:
            problems.append(f"{router}: a sharding_filter must have exactly one input")
            continue
        upstream.update(graph.ancestors(graph[router].inputs[0]))
    for router in filters:
        if router in upstream:
            problems.append(
                f"{router}: sharding_filter above another sharding_filter; keep a single one "
                "(logical shards already cover workers and ranks)")
    for path in replicated:
        if path in upstream:
            problems.append(f"{path}: {graph[path].signature} shards its own data but sits above a "
                            "sharding_filter; remove one of the two")
    for path in sorted(upstream & dispatched):
        problems.append(
            f"{path}: {graph[path].signature} feeds both a sharding_round_robin_dispatch (run once) and a "
            "sharding_filter (run in every worker); give each branch its own source")
    for path in sorted(upstream - dispatched):
        outside = [c for c in graph[path].consumers if c not in upstream and c not in filters]
        if outside:
            problems.append(
                f"{path}: {graph[path].signature} feeds both a sharding_filter and "
                f"{', '.join(outside)} below it, so every logical shard would read it in full")
    routers_found = set(filters) | set(dispatchers)
    for path in sorted(dispatched):
        outside = [c for c in graph[path].consumers if c not in dispatched and c not in routers_found]
        if outside:
            problems.append(
                f"{path}: {graph[path].signature} feeds both a sharding_round_robin_dispatch and "
                f"{', '.join(outside)} below it, so every logical shard would read it in full")
    tail, merge_point = _tail(graph, upstream - dispatched, dispatched, problems)
    routers = [n.path for n in graph.nodes if n.path in filters or n.path in dispatchers]
    return Topology(tuple(routers), tuple(replicated), frozenset(upstream | dispatched), tuple(problems),
                    tuple(dispatchers), frozenset(dispatched), frozenset(tail), merge_point)


def _tail(graph: Graph, filtered: set[str], dispatched: set[str], problems: list[str]) -> tuple[set[str], str | None]:
    """The non-replicable tail (see the module docstring) and its merge point; appends to
    ``problems`` why it cannot run once over the merged stream. ``filtered`` is the part above
    the ``sharding_filter`` routers, ``dispatched`` the part above the dispatchers."""
    found = [n.path for n in graph.nodes if _is_non_replicable(n.datapipe) and n.path not in dispatched]
    for path in found:
        if path in filtered:
            problems.append(
                f"{path}: {graph[path].signature} is not replicable (its is_replicable() is False) but sits above "
                "a sharding_filter, so every worker would run it; put .sharding_round_robin_dispatch("
                "SHARDING_PRIORITIES.MULTIPROCESSING) below it so it runs once, or run with a single worker "
                "(logical_shards=1)")
    below = [p for p in found if p not in filtered]
    if not below or len(below) < len(found):
        return set(), None
    tail = set(below) | _descendants(graph, below)
    feeds = sorted({i for p in tail for i in graph[p].inputs if i not in tail})
    if len(feeds) != 1:
        problems.append(
            f"{', '.join(below)}: the part of the graph below a non-replicable pipe runs once, in the loader's "
            "process, over the merged stream of the logical shards, so it must read the rest of the graph "
            f"through one node; it reads {', '.join(feeds) or 'nothing'}. Put the non-replicable pipe below the "
            "point where the branches join, or run with a single worker (logical_shards=1)")
        return set(), None
    return tail, feeds[0]
