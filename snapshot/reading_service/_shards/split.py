"""Sub-shards: the units a logical shard is split into when ranks cannot share whole shards.

An epoch's samples are dealt to *units* at the sharding point: sample ``i`` to unit
``i % M`` (see :class:`~snapshot.reading_service._shards.routing.Deal`), and rank ``r`` of ``R`` runs
the units ``u`` with ``u % R == r``. With ``M = L`` (the logical shards) whenever ``R`` divides
``L``, this is the stream every fixed layout reads. When it does not, the epoch uses
``M = lcm(L, R)`` units: unit ``u`` is a sub-shard of logical shard ``u % L``, whose part below
the sharding point runs once per sub-shard with seeds derived from the shard's, and rank ``r``
gets exactly the samples ``i`` with ``i % R == r``: equal shares, every sample once.

A snapshot restored mid-epoch onto ``R'`` ranks that do not divide its ``M`` units splits each
unit from the sample where it had stopped (:func:`split`): the unit keeps its state and its
samples ``i = u mod M'`` (``M' = lcm(M, R')``); its new sub-units take the others from there on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from snapshot.engine.sharding import Topology
from snapshot.errors import LayoutError
from snapshot.reading_service._shards.reread import later_pass
from snapshot.reading_service._shards.routing import Deal
from snapshot.schema import RouterState, ServiceState, ShardState, UpstreamState

__all__ = ["cut", "no_split", "split", "unsplittable"]


def split(state: ServiceState, units: int, topology: Topology, *, finished: bool) -> ServiceState:
    """``state`` (a sharded service's checkpoint) with its units split into ``units``.

    Each unit keeps its record and the samples its sub-deal gives it; the new sub-units start
    with no record (their part below the sharding point starts fresh, seeded for them) and
    receive the samples of their parent unit that no one had read. Router queues are dealt
    again. Refused where a unit's remaining samples cannot be split at a router. The ranks'
    shares of the rest of the epoch need not be equal: the equalizing policy evens them out as
    they are read (see :mod:`snapshot.reading_service._ranks.even`).
    """
    saved = state.units
    if units % saved:
        raise LayoutError(f"the snapshot's {saved} units cannot be split into {units}")
    if units != saved and not finished and (why := unsplittable(state, topology)) is not None:
        raise LayoutError(
            f"this mid-epoch snapshot has {saved} unit(s), which the ranks now running cannot share equally, and "
            f"they cannot be split into sub-shards before the epoch ends: {why}. Restore on a number of ranks "
            f"that divides {saved} (any number of workers), or from a snapshot taken at the end of an epoch (the "
            f"next epoch is split into {units} sub-shards from its start)")
    if not state.upstream and topology.routers:
        state = cut(state, topology)
    copies = state.upstream
    starts = _starts(copies)
    upstream = [_split_copy(copy, saved, units, starts) for copy in copies]
    _hand_over(upstream)
    shards = list(state.shards) + [_ended_like(state.shards[sub % saved], sub) for sub in range(saved, units)]
    return replace(state, layout={**state.layout, "units": units}, upstream=upstream, shards=shards, merge=None,
                   ranks=[replace(rank, merge=None) for rank in state.ranks])


def cut(state: ServiceState, topology: Topology) -> ServiceState:
    """``state`` of one logical shard run whole (one unit runs the graph in one piece, with no router),
    cut at its sharding points as a run of more units would have saved it: the nodes above them become
    the part above the sharding point, each ``sharding_filter`` a router that has dealt every sample it
    passed to unit 0, and the rest stays the unit's."""
    record = state.shards[0]
    if record is None:
        return state
    above, nodes = set(topology.upstream), record.nodes
    routers = {}
    for path in topology.filters:
        node = nodes.get(path)
        kept = int(node.yielded or 0) if node is not None else 0
        # the filter's own count of what it read (it keeps every sample unless sharded by hand)
        read = int(node.state.get("index", kept)) if node is not None and isinstance(node.state, dict) else kept
        routers[path] = RouterState(position=read, kept=kept, ended=record.graph_exhausted, next={0: kept},
                                    queues={0: []})
    copy = UpstreamState(shards=[0], nodes={p: n for p, n in nodes.items() if p in above}, routers=routers,
                         persistent={p: v for p, v in record.persistent.items() if p in above})
    below = {p: (replace(n, state=None) if p in routers else n) for p, n in nodes.items() if p not in above}
    unit = replace(record, nodes=below, persistent={p: v for p, v in record.persistent.items() if p not in above})
    return replace(state, upstream=[copy], shards=[unit, *state.shards[1:]])


def _ended_like(parent: ShardState | None, sub: int) -> ShardState | None:
    """A new sub-unit's record: none (it starts fresh), or ended where its parent had ended."""
    if parent is None or not parent.graph_exhausted:
        return None
    return ShardState(produced=None, graph_exhausted=True, shard=sub, finished=True)


def unsplittable(state: ServiceState, topology: Topology) -> str | None:
    """Why the units of ``state``, saved in the middle of an epoch, cannot be split into sub-shards before
    the epoch ends (``None``: they can). Not splitting them is exact too: they run as they are, on the
    workers (and ranks) they can keep busy, and the next epoch is split from its start."""
    one_piece = state.units == 1 and not state.upstream
    return no_split(topology, one_piece=one_piece) or later_pass(state.shards, topology.routers)


def no_split(topology: Topology, *, one_piece: bool) -> str | None:
    """Why the units of a graph cut as ``topology`` says cannot be split mid-epoch, whatever their state
    (so the same on every rank); ``one_piece``: one unit ran the graph whole, not cut at its sharding
    point."""
    where = topology.replicated or topology.dispatchers
    if where:
        return f"{where[0]} shards its own data (there is no sharding_filter to split its units at)"
    if one_piece and topology.tail:
        return (f"its one logical shard ran the whole graph, with the non-replicable tail below "
                f"{topology.merge_point}, which more units run in the loader's process")
    return None


def _starts(copies: list[UpstreamState]) -> dict[str, dict[int, int]]:
    """Per router, where each unit splits: the next sample its owner's router would give it."""
    starts: dict[str, dict[int, int]] = {}
    for copy in copies:
        for path, state in copy.routers.items():
            starts.setdefault(path, {}).update({int(s): state.next_for(int(s)) for s in copy.shards})
    return starts


def _split_copy(copy: UpstreamState, saved: int, units: int,
                starts: Mapping[str, Mapping[int, int]]) -> UpstreamState:
    """One saved copy of the part above the sharding point, its routers dealing to ``units``."""
    owned = [int(s) for s in copy.shards]
    routers = {}
    for path, state in copy.routers.items():
        deal = Deal(saved, state.deal).split(units, starts[path])
        saved_queues = {int(s): q for s, q in state.queues.items()}
        queues: dict[Any, list[Any]] = {}
        next_of: dict[Any, int] = {}
        for shard in owned:
            for sub in range(shard, units, saved):
                queues[sub] = []
                next_of[sub] = state.next_for(shard)
            for index, item in saved_queues[shard]:
                queues.setdefault(deal.unit(int(index)), []).append([index, item])
        routers[path] = replace(state, deal=deal.state(), next=next_of, queues=queues)
    subs = [sub for shard in owned for sub in range(shard, units, saved)]
    return replace(copy, shards=sorted(subs), routers=routers)


def _hand_over(copies: list[UpstreamState]) -> None:
    """Queued samples moved to a unit another copy owns go to that copy's queue (in order); where that
    copy was not read (its part holds another rank's units), they are that rank's to take."""
    owner = {int(s): copy for copy in copies for s in copy.shards}
    for copy in copies:
        mine = set(copy.shards)
        for path, state in copy.routers.items():
            for unit in [u for u in state.queues if u not in mine]:
                items = state.queues.pop(unit)
                if unit in owner:
                    queue = owner[unit].routers[path].queues[unit]
                    queue.extend(items)
                    queue.sort(key=lambda entry: int(entry[0]))
