"""Sub-shards: the units a logical shard is split into when ranks cannot share whole shards.

An epoch's samples are dealt to *units* at the sharding point: sample ``i`` to unit
``i % M`` (see :class:`~snapshot.reading_service._routing.Deal`), and rank ``r`` of ``R`` runs
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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from snapshot.engine.sharding import Topology
from snapshot.errors import LayoutError
from snapshot.reading_service._even import saved_ended
from snapshot.reading_service._reread import check_one_pass
from snapshot.reading_service._routing import Deal
from snapshot.schema import ServiceState, ShardState, UpstreamState

__all__ = ["Shares", "epoch_finished", "epoch_units", "per_output", "restore_units", "shares", "split"]


def epoch_units(logical_shards: int, ranks: int) -> int:
    """The units of an epoch that starts with ``ranks`` ranks: ``L``, or ``lcm(L, R)``."""
    return math.lcm(logical_shards, max(ranks, 1))


def restore_units(saved_units: int, ranks: int) -> int:
    """The units for the rest of a saved epoch on ``ranks`` ranks: the saved ones when the
    ranks can share them, else each split into as few sub-shards as equal shares need."""
    return saved_units if saved_units % max(ranks, 1) == 0 else math.lcm(saved_units, ranks)


def split(state: ServiceState, units: int, topology: Topology, *, finished: bool, ranks: int = 1,
          rebalance: bool = False, ahead: Sequence[int] = ()) -> ServiceState:
    """``state`` (a sharded service's checkpoint) with its units split into ``units``.

    Each unit keeps its record and the samples its sub-deal gives it; the new sub-units start
    with no record (their part below the sharding point starts fresh, seeded for them) and
    receive the samples of their parent unit that no one had read. Router queues are dealt
    again. With ``rebalance`` (a mid-epoch restore onto another number of ``ranks``), the first
    samples that no one had read go to the ranks with the fewest samples already waiting for
    them (``ahead``: outputs each rank's caller hands out first), so the ranks' shares of the
    rest of the epoch are equal. Refused where a unit's
    remaining samples cannot be split at a router.
    """
    saved = state.units
    if units % saved:
        raise LayoutError(f"the snapshot's {saved} units cannot be split into {units}")
    if units != saved and not finished:
        _check_splittable(topology, saved, units)
        check_one_pass(state.shards, topology.routers)
    copies = state.upstream
    starts = _starts(copies)
    moved: dict[str, dict[int, int]] = {}
    if rebalance and not finished and len(starts) == 1:
        path = next(iter(starts))
        levels = next(c.routers[path].deal for c in copies if path in c.routers)
        moved[path] = _evening(Deal(saved, levels), path, starts[path], state.shards, units, ranks, ahead)
    upstream = [_split_copy(copy, saved, units, starts, moved) for copy in copies]
    _hand_over(upstream)
    shards = list(state.shards) + [_ended_like(state.shards[sub % saved], sub) for sub in range(saved, units)]
    return replace(state, layout={**state.layout, "units": units}, upstream=upstream, shards=shards, merge=None,
                   ranks=[replace(rank, merge=None) for rank in state.ranks])


@dataclass(frozen=True)
class Shares:
    """The rest of a split epoch as :func:`split` evens it out onto ``ranks`` ranks (see :func:`shares`)."""

    #: Per rank, the samples of the sharding point it has left: complete when ``counted``, else
    #: up to where the ranks are even.
    left: list[int]
    #: Whether ``left`` runs to the end of the epoch (the sharding point's length is known, and
    #: the evening reaches it).
    counted: bool
    #: Whether the sharding point's length is known.
    known: bool
    #: Samples not read yet that evening the ranks out hands to the ranks holding fewest.
    needed: int
    #: Samples of the sharding point per output of the graph, on average.
    per_output: float
    #: Samples held in the units' buffers below the sharding point (:func:`_held`).
    held: int


def shares(state: ServiceState, units: int, ranks: int, ahead: Sequence[int] = (),
           length: Mapping[str, int | None] | None = None) -> Shares | None:
    """What :func:`split` with ``rebalance`` leaves each rank of the rest of ``state``'s epoch
    (``None`` where it does not even out: several sharding points, or an ended epoch). ``length``:
    per sharding point, the samples its share deals in a whole epoch, where known."""
    starts = _starts(state.upstream)
    if len(starts) != 1 or epoch_finished(state):
        return None
    path = next(iter(starts))
    routers = [c.routers[path] for c in state.upstream if path in c.routers]
    end = max(r.kept for r in routers) if any(r.ended for r in routers) else (length or {}).get(path)
    first, last = min(starts[path].values()), max(starts[path].values())
    deal = Deal(state.units, routers[0].deal)
    _, left, needed = _even_out(deal, path, starts[path], state.shards, units, ranks, ahead, end)
    counted = end is not None and last - first <= _EVENING_LIMIT and end - last <= _EVENING_LIMIT
    records = state.shards[:state.units]
    held = round(sum(_held(r, path) for r in records if r is not None))
    return Shares(left, counted, end is not None, needed, per_output(records, path), held)


#: How far (in samples of a sharding point) evening out the ranks' shares may look.
_EVENING_LIMIT = 1 << 16


def _evening(deal: Deal, router: str, starts: Mapping[int, int], records: list[ShardState | None], units: int,
             ranks: int, ahead: Sequence[int] = ()) -> dict[int, int]:
    """The samples to move so that every rank has as many samples left in the epoch (see :func:`_even_out`)."""
    return _even_out(deal, router, starts, records, units, ranks, ahead)[0]


def _even_out(deal: Deal, router: str, starts: Mapping[int, int], records: list[ShardState | None], units: int,
              ranks: int, ahead: Sequence[int] = (), end: int | None = None) -> tuple[dict[int, int], list[int], int]:
    """The samples to move so that every rank has as many samples left in the epoch, the samples
    each rank then has left (counted up to where they are even, or to ``end``, the sharding point's
    last index if known) and how many unread samples evening them out takes. A unit's samples
    already read from the sharding point count for its rank: those in its pipes' buffers
    (:func:`_held`) and those produced and saved with it (``in_flight``), as many samples of the
    sharding point as each output took (a batch of 4: 4)."""
    saved = deal.modulus
    waiting = [0] * ranks
    ended: set[int] = set()
    for unit, record in enumerate(records[:saved]):
        if record is not None:
            waiting[unit % ranks] += round(_held(record, router)
                                           + len(record.in_flight) * _inputs_per_output(record, router))
            if record.graph_exhausted:
                ended.update(range(unit, units, saved))
    if any(ahead):
        ratio = per_output(records[:saved], router)
        waiting = [n + round(a * ratio) for n, a in zip(waiting, list(ahead) + [0] * ranks)]
    needed = sum(max(waiting) - n for n in waiting)
    first, last = min(starts.values()), max(starts.values())
    if last - first > _EVENING_LIMIT:
        return {}, waiting, needed
    plain = deal.split(units, starts)
    moved: dict[int, int] = {}
    stop = last + _EVENING_LIMIT if end is None else min(end, last + _EVENING_LIMIT)
    for index in range(first, stop):
        if index >= last and max(waiting) == min(waiting):
            break
        parent = deal.unit(index)
        if index < starts.get(parent, index + 1):
            continue
        default = plain.unit(index) % ranks
        fewest = min(waiting)
        rank = default if waiting[default] == fewest else waiting.index(fewest)
        if rank != default:
            options = [u for u in range(parent, units, saved) if u % ranks == rank and u not in ended] or \
                [u for u in range(rank, units, ranks) if u not in ended]
            if not options:
                continue
            moved[index] = options[0]
        waiting[rank] += 1
    return moved, waiting, needed


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


def _split_copy(copy: UpstreamState, saved: int, units: int, starts: Mapping[str, Mapping[int, int]],
                moved: Mapping[str, Mapping[int, int]]) -> UpstreamState:
    """One saved copy of the part above the sharding point, its routers dealing to ``units``."""
    owned = [int(s) for s in copy.shards]
    routers = {}
    for path, state in copy.routers.items():
        deal = Deal(saved, state.deal).split(units, starts[path], moved.get(path))
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


def _inputs_per_output(record: ShardState, router: str) -> float:
    """How many samples of the sharding point a unit's output took, on average so far (those
    still held in its buffers left out)."""
    read = record.read_from(router) - _held(record, router)
    produced = record.produced
    return read / produced if isinstance(produced, int) and produced > 0 and read > 0 else 1.0


def per_output(records: Sequence[ShardState | None], router: str) -> float:
    """How many samples of the sharding point an output took, on average over the units that produced some."""
    ratios = [_inputs_per_output(r, router) for r in records if r is not None and r.produced]
    return sum(ratios) / len(ratios) if ratios else 1.0


def _held(record: ShardState, router: str) -> float:
    """Samples of the sharding point that a unit had read and still holds in the buffers of the
    pipes between it and the sharding point (a ``shuffle``'s buffer, a ``batch`` being filled),
    each buffered item counted as the samples of the sharding point its pipe's input took."""
    read = record.read_from(router)
    chain = sorted((p for p in record.nodes if router.startswith(p + "/")), key=len) + [router]
    held = 0.0
    for path, source in zip(chain, chain[1:]):
        node, below = record.nodes[path], record.nodes.get(source)
        if node.buffered:
            took = below.yielded if below is not None else None
            held += node.buffered * (read / took if took else 1.0)
    return held


def _hand_over(copies: list[UpstreamState]) -> None:
    """Queued samples moved to a unit another copy owns go to that copy's queue (in order)."""
    owner = {int(s): copy for copy in copies for s in copy.shards}
    for copy in copies:
        mine = set(copy.shards)
        for path, state in copy.routers.items():
            for unit in [u for u in state.queues if u not in mine]:
                queue = owner[unit].routers[path].queues[unit]
                queue.extend(state.queues.pop(unit))
                queue.sort(key=lambda entry: int(entry[0]))


def epoch_finished(state: ServiceState) -> bool:
    """Whether the saved epoch had ended: the loader had taken the last sample of every unit, or
    a distributed policy had ended it on every rank."""
    if saved_ended(state):
        return True
    shards = [record for record in state.shards if record is not None]
    return bool(shards) and all(record.taken_all for record in shards)
