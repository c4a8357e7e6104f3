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
from snapshot.reading_service._shards.reread import check_one_pass
from snapshot.reading_service._shards.routing import Deal
from snapshot.schema import ServiceState, ShardState, UpstreamState

__all__ = ["split"]


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
    if units != saved and not finished:
        _check_splittable(topology, saved, units)
        check_one_pass(state.shards, topology.routers)
    copies = state.upstream
    starts = _starts(copies)
    upstream = [_split_copy(copy, saved, units, starts) for copy in copies]
    _hand_over(upstream)
    shards = list(state.shards) + [_ended_like(state.shards[sub % saved], sub) for sub in range(saved, units)]
    return replace(state, layout={**state.layout, "units": units}, upstream=upstream, shards=shards, merge=None,
                   ranks=[replace(rank, merge=None) for rank in state.ranks])


def _ended_like(parent: ShardState | None, sub: int) -> ShardState | None:
    """A new sub-unit's record: none (it starts fresh), or ended where its parent had ended."""
    if parent is None or not parent.graph_exhausted:
        return None
    return ShardState(produced=None, graph_exhausted=True, shard=sub, finished=True)


def _check_splittable(topology: Topology, saved: int, units: int) -> None:
    where = topology.replicated or topology.dispatchers
    if where:
        raise LayoutError(
            f"this mid-epoch snapshot has {saved} logical shard(s), which the ranks now running cannot share "
            f"equally, and {where[0]} shards its own data (there is no sharding_filter to split them at): "
            f"restore on a number of ranks that divides {saved}, or from a snapshot taken at the end of an epoch "
            f"(the next epoch is split into {units} sub-shards from its start)")


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
