"""The re-shard plan: who runs and who reads what when a snapshot restores onto R' ranks x W' workers.

One pure step, computed from what a snapshot's index (its manifest) says of the saved layout and
from the target layout alone: the same on every rank, with no process group and before anything
changes. For each rank of the target it says

- the units it runs (logical shards, or the sub-shards they are split into: an epoch's samples are
  dealt at the sharding point to ``M`` units, and rank ``r`` runs the units ``u`` with
  ``u % R' == r``; when R' does not divide the saved ``M``, each unit is split into
  ``lcm(M, R') / M`` sub-shards from where it stood, see :mod:`snapshot.reading_service._shards.split`),
  and which of its workers runs each;
- which saved units it continues (their state is in the part of the rank that ran them) and which
  are new sub-shards (they start from their parent's position, with no state of their own);
- the parts it reads: the saved ranks that ran its units' parents, and those whose samples to hand
  out first it takes (so a rank's restore reads a few parts whatever the number of ranks);
- the samples it hands out first (saved samples not yet yielded), as slices of the saved ranks'
  lists, and the counts the saving run recorded for its units (samples in flight, items buffered);

What an equalizing policy drops or repeats is not predicted here: it is counted as the samples are
read (see :mod:`snapshot.reading_service._ranks.even`): fewer than R' an epoch, whatever the plan.

A snapshot taken with a ``worker_reset_fn`` restores only onto its own layout (that function sees
workers): :func:`same_layout_problems` says why a target does not match.

This module imports no torch: ``snapshot inspect --plan-for`` prints a plan from a file's manifest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from snapshot import schema
from snapshot.schema import Handout, ServiceState

__all__ = ["NO_SPLIT", "RESET_FN", "RankPlan", "ReshardPlan", "SavedLayout", "Slice", "epoch_units", "plan_restore",
           "restore_units", "same_layout_problems", "units_for"]


#: The service layout's key for why its units cannot be split into sub-shards before the epoch ends (a
#: pipe that shards its own data, ...): a restore then runs the rest of the epoch as the saved units.
NO_SPLIT = "no_split"


def units_for(count: int, ranks: int, workers: int = 0) -> int:
    """The units ``count`` units run as on ``ranks`` ranks of ``workers`` worker processes each: ``count``
    when every rank gets as many and every worker one at least; else each split into as few sub-shards as
    that needs (``lcm(count, R)``, or ``lcm(count, R x W)`` when that still leaves a worker idle)."""
    ranks, busy = max(ranks, 1), max(workers, 1)
    for units in (count, math.lcm(count, ranks)):
        if units % ranks == 0 and units // ranks >= busy:
            return units
    return math.lcm(count, ranks * busy)


def epoch_units(logical_shards: int, ranks: int, workers: int = 0) -> int:
    """The units of an epoch that starts with ``ranks`` ranks of ``workers`` workers: ``L``, or
    sub-shards of the L logical shards (see :func:`units_for`)."""
    return units_for(logical_shards, ranks, workers)


def restore_units(saved_units: int, ranks: int, workers: int = 0) -> int:
    """The units for the rest of a saved epoch on ``ranks`` ranks of ``workers`` workers: the saved
    ones when they can share them, else each split from where it stood (see :func:`units_for`)."""
    return units_for(saved_units, ranks, workers)


@dataclass(frozen=True)
class SavedLayout:
    """What a snapshot says of the layout it was saved in: all a plan needs, read from its manifest
    (:meth:`from_manifest`, no part of a directory needed) or from its service's state
    (:meth:`from_state`)."""

    logical_shards: int
    units: int
    ranks: int
    workers: int
    #: The saved rank that ran each unit.
    owners: tuple[int, ...]
    #: The saved epoch had ended (on every rank).
    finished: bool
    #: Per saved rank: what it had to hand out besides its stream.
    handouts: tuple[Handout, ...] = ()
    #: Per unit, as the saving run counted them: samples produced and not yet taken, and items held
    #: in the buffers of its pipes below the sharding point (``None``: the unit is not described).
    in_flight: Sequence[int | None] = ()
    buffered: Sequence[int | None] = ()
    #: Why the saved units cannot be split before the epoch ends (``None``: they can).
    no_split: str | None = None

    @classmethod
    def from_manifest(cls, manifest: schema.Manifest) -> SavedLayout | None:
        """The layout a manifest (a file's, or a directory's index) describes; ``None`` before the
        first epoch or for a service that does not run logical shards."""
        service = manifest.service
        if service.logical_shards is None or manifest.loader.epoch < 0:
            return None
        units = service.units or service.logical_shards
        if manifest.ranks:
            handouts = tuple(r.handout or Handout() for r in manifest.ranks)
        else:
            handouts = (_handout(service.extra.get(schema.HANDOUT)),)
        return cls(  # the units' counts read when asked: an index's shard records are read when used
            logical_shards=service.logical_shards, units=units, ranks=service.ranks or 1,
            workers=service.workers or 0, owners=_owner_ranks(service.owners, units),
            finished=manifest.loader.epoch_finished, handouts=handouts, no_split=service.extra.get(NO_SPLIT),
            in_flight=schema.Mapped(manifest.shards, attrgetter("in_flight"), units),
            buffered=schema.Mapped(manifest.shards, _buffered, units))

    @classmethod
    def from_state(cls, state: schema.ServiceState) -> SavedLayout:
        """The layout a service's state describes. A distributed snapshot's state, joined from the parts a
        rank read, has the layout, the owners and each rank's handout and end whatever parts were read."""
        layout = state.layout_record()
        units = state.units
        handouts = tuple(_handout(h) for h in ([r.handout for r in state.ranks] if state.ranks
                                               else [layout.extra.get(schema.HANDOUT)]))
        shards = list(state.shards) + [None] * (units - len(state.shards))
        if state.ranks:
            finished = all(r.epoch_finished for r in state.ranks)
        else:  # one process: every unit taken to its end, or the policy ended the epoch
            taken = [s.taken_all for s in shards if s is not None]
            finished = bool(taken) and all(taken) or handouts[0].ended
        return cls(
            logical_shards=state.logical_shards, units=units, ranks=state.world, workers=state.workers,
            owners=_owner_ranks(layout.owners, units), finished=finished,
            handouts=handouts, no_split=layout.extra.get(NO_SPLIT),
            in_flight=tuple(None if s is None else len(s.in_flight) for s in shards),
            buffered=tuple(None if s is None else sum(n.buffered for n in s.nodes.values()) for s in shards))


def _buffered(shard: schema.ShardPosition) -> int:
    return sum(n.buffered for n in shard.nodes.values())


def _handout(value: Any) -> Handout:
    if value is None:
        return Handout()
    return value if isinstance(value, Handout) else Handout.from_dict(value)


def _owner_ranks(owners: dict[str, schema.Owner], units: int) -> tuple[int, ...]:
    ranks = [0] * units
    for key, owner in owners.items():
        if int(key) < units:
            ranks[int(key)] = owner.rank or 0
    return tuple(ranks)


@dataclass(frozen=True)
class Slice:
    """Items ``start`` to ``stop`` of the list a saved rank had to hand out (its spare samples, then its
    samples to hand out first, on another number of ranks; those to hand out first, on the same)."""

    rank: int
    start: int
    stop: int


@dataclass(frozen=True)
class RankPlan:
    """One rank of a :class:`ReshardPlan`."""

    rank: int
    #: The units this rank runs, in the order its merge takes them.
    units: tuple[int, ...]
    #: Per worker, the units it runs (one entry, all of them, when the rank runs them in-process).
    workers: tuple[tuple[int, ...], ...]
    #: Saved units whose state it continues.
    continues: tuple[int, ...]
    #: New sub-shards: they start from their parent unit's position with no state of their own.
    splits: tuple[int, ...]
    #: The saved ranks whose parts it reads.
    reads: tuple[int, ...]
    #: The saved samples it yields before its restored stream, as slices of the saved ranks' lists.
    first: tuple[Slice, ...]
    #: Counted by the saving run for the units it continues: samples in flight, items buffered.
    in_flight: int = 0
    buffered: int = 0

    @property
    def handed_out(self) -> int:
        return sum(s.stop - s.start for s in self.first)


@dataclass(frozen=True)
class ReshardPlan:
    """Who runs and reads what in a restore of ``saved`` onto ``ranks`` x ``workers`` (see the module)."""

    saved: SavedLayout
    ranks: int
    workers: int
    #: The units the rest of the saved epoch runs as.
    units: int
    _plans: dict[int, RankPlan] = field(default_factory=dict, compare=False, repr=False)

    @property
    def splits(self) -> bool:
        """Whether the saved units are split into sub-shards."""
        return self.units != self.saved.units

    @property
    def later_units(self) -> int:
        """The units each later epoch runs as (each starts whole: sub-shards of the L logical shards only
        where this layout needs them)."""
        return epoch_units(self.saved.logical_shards, self.ranks, self.workers)

    @property
    def same_stream_later(self) -> bool:
        """Whether later epochs read the stream the saved run's later epochs would have read (they run as
        as many units; the stream depends on the seed and the units only)."""
        saved = self.saved
        return self.later_units == epoch_units(saved.logical_shards, saved.ranks, saved.workers)

    def rank(self, rank: int) -> RankPlan:
        """The plan of rank ``rank`` of the target."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} is not one of the plan's {self.ranks} ranks")
        plan = self._plans.get(rank)
        if plan is None:
            plan = self._plans[rank] = _rank_plan(self, rank)
        return plan

    def describe(self, *, limit: int | None = 16) -> str:
        """The plan as text (at most ``limit`` ranks' lines; ``None``: all)."""
        return _describe(self, limit=limit)


def plan_restore(saved: SavedLayout, ranks: int, workers: int = 0) -> ReshardPlan:
    """The plan for restoring a snapshot saved as ``saved`` onto ``ranks`` ranks of ``workers``
    worker processes each (0: in the rank's own process). No layout is refused: where the ranks
    cannot share the saved units equally, or a worker would have none, the units are split."""
    if ranks < 1 or workers < 0:
        raise ValueError(f"a restore runs on at least one rank and zero or more workers, not {ranks} x {workers}")
    kept = saved.no_split is not None and not saved.finished  # the rest of the epoch as saved, shares uneven
    return ReshardPlan(saved, ranks, workers, saved.units if kept else restore_units(saved.units, ranks, workers))


def _rank_plan(plan: ReshardPlan, rank: int) -> RankPlan:
    saved = plan.saved
    units = tuple(range(rank, plan.units, plan.ranks))
    continues = tuple(u for u in units if u < saved.units)
    reads = {saved.owners[u % saved.units] for u in units}
    first = _first(saved, rank, plan.ranks)
    reads.update(s.rank for s in first)
    if not reads:  # a rank with no unit (the saved units stay whole): one part, for the epoch's seeds
        reads.add(rank % saved.ranks)
    count = max(plan.workers, 1)
    workers = tuple(units[w::count] for w in range(min(count, len(units)) or 1)) if plan.workers else (units,)
    return RankPlan(
        rank=rank, units=units, workers=workers, continues=continues,
        splits=tuple(u for u in units if u >= saved.units), reads=tuple(sorted(reads)), first=first,
        in_flight=sum(saved.in_flight[u] or 0 for u in continues if u < len(saved.in_flight)),
        buffered=sum(saved.buffered[u] or 0 for u in continues if u < len(saved.buffered)))


def _first(saved: SavedLayout, rank: int, ranks: int) -> tuple[Slice, ...]:
    """``rank``'s samples to hand out first: its own list on the same ranks; else every saved rank's
    list (spare samples, then those to hand out first), joined in rank order and dealt in runs as
    equal as they can be."""
    handouts = list(saved.handouts) or [Handout()]
    if len(handouts) == ranks:
        own = handouts[rank]
        return (Slice(rank, 0, own.first),) if own.first else ()
    sizes = [h.spare + h.first for h in handouts]
    share, extra = divmod(sum(sizes), ranks)
    start = rank * share + min(rank, extra)
    stop = start + share + (1 if rank < extra else 0)
    return tuple(_slices(sizes, start, stop))


def _slices(sizes: Sequence[int], start: int, stop: int) -> list[Slice]:
    out, offset = [], 0
    for saved_rank, size in enumerate(sizes):
        low, high = max(start, offset), min(stop, offset + size)
        if low < high:
            out.append(Slice(saved_rank, low - offset, high - offset))
        offset += size
    return out


# -- as text ------------------------------------------------------------------------------------

def _layout(ranks: int, workers: int) -> str:
    return f"{ranks} rank(s) x {workers} worker(s)" if workers else f"{ranks} rank(s), in-process"


def _numbers(values: Sequence[int], width: int = 28) -> str:
    """Values compactly: runs with a fixed step as ``a..b/step``, cut to ``width`` characters."""
    if not values:
        return "-"
    if len(values) > 2 and len({b - a for a, b in zip(values, values[1:])}) == 1:
        step = values[1] - values[0]
        text = f"{values[0]}..{values[-1]}" + (f"/{step}" if step != 1 else "")
    else:
        text = " ".join(str(v) for v in values)
    return text if len(text) <= width else text[:width - 3] + "..."


def _rank_line(plan: RankPlan) -> str:
    first = " ".join(f"{s.rank}[{s.start}:{s.stop}]" for s in plan.first) or "-"
    return (f"  {plan.rank:>5}  {_numbers(plan.units):<28}  {_numbers(plan.continues, 16):<16}  "
            f"{_numbers(plan.splits, 16):<16}  {_numbers(plan.reads, 14):<14}  {first:<14}  "
            f"{plan.in_flight:>9}  {plan.buffered:>8}")


def _what_runs(plan: ReshardPlan) -> list[str]:
    """What the rest of the saved epoch and the later epochs run as, and what their stream is."""
    saved, lines = plan.saved, []
    if saved.finished:
        lines.append("the saved epoch had ended")
    elif plan.splits:
        lines.append(f"the rest of the saved epoch runs as {plan.units} unit(s): each saved unit u is split into "
                     f"{plan.units // saved.units} sub-shard(s) u, u+{saved.units}, ... from where it stood (every "
                     "sample once; the stream's order is that of the sub-shards, merged in turn)")
    elif saved.no_split is not None and plan.units != restore_units(saved.units, plan.ranks, plan.workers):
        lines.append(f"the rest of the saved epoch runs as the saved {plan.units} unit(s), not split ({saved.no_split})"
                     ": on the workers they keep busy, ranks' shares evened out as they are read")
    else:
        lines.append(f"the rest of the saved epoch runs as the saved {plan.units} unit(s): the saved run's stream")
    later = plan.later_units
    what = f"{later} sub-shard(s) of the" if later != saved.logical_shards else "the"
    if plan.same_stream_later:
        lines.append(f"later epochs run as {what} {saved.logical_shards} logical shard(s), as the saved run's "
                     "did: the same stream")
    else:
        lines.append(f"later epochs run as {what} {saved.logical_shards} logical shard(s): the stream of a job "
                     f"started with logical_shards={saved.logical_shards} on this layout, not the saved run's (to "
                     "keep one stream on every layout, start with logical_shards= a multiple of each ranks x "
                     "workers you will use)")
    return lines


def _describe(plan: ReshardPlan, *, limit: int | None = 16) -> str:
    saved = plan.saved
    lines = [f"re-shard plan: {saved.units} unit(s) of {saved.logical_shards} logical shard(s) saved on "
             f"{_layout(saved.ranks, saved.workers)} -> {_layout(plan.ranks, plan.workers)}"]
    lines += _what_runs(plan)
    lines.append(f"  {'rank':>5}  {'units':<28}  {'continues':<16}  {'new sub-shards':<16}  {'reads parts':<14}  "
                 f"{'hands out first':<14}  {'in flight':>9}  {'buffered':>8}")
    shown = range(plan.ranks) if limit is None else range(min(plan.ranks, limit))
    lines += [_rank_line(plan.rank(r)) for r in shown]
    if len(shown) < plan.ranks:
        lines.append(f"  ... {plan.ranks - len(shown)} more rank(s)")
    if plan.workers:
        groups = "; ".join(f"worker {w}: {_numbers(units, 16)}" for w, units in enumerate(plan.rank(0).workers))
        lines.append(f"workers: each rank's units go to its {plan.workers} worker(s) in turn (rank 0: {groups})")
    reads = [len(plan.rank(r).reads) for r in shown]
    lines.append(f"parts read per rank: at most {max(reads)} of {saved.ranks}" +
                 ("" if len(shown) == plan.ranks else f" (over the {len(shown)} ranks shown)"))
    if plan.ranks > 1:
        lines.append("equalizing (even_batches \"drop\"/\"pad\"): counted as the samples are read; when a rank runs "
                     "out the ranks share what is left, so fewer than "
                     f"{plan.ranks} sample(s) are dropped or repeated per epoch")
    return "\n".join(lines)


#: The layout key of a snapshot taken with a ``worker_reset_fn``: ``{"function": name, "num_workers": n}``.
RESET_FN = "worker_reset_fn"


def same_layout_problems(saved: ServiceState | Mapping[str, Any], current: Mapping[str, Any] | None,
                         ranks: int | None = None) -> list[str]:
    """Why a snapshot cannot restore onto a service, as far as a ``worker_reset_fn`` goes.

    ``saved`` is the snapshot's service record (or its layout); ``current`` is the service's :data:`RESET_FN` record
    (``None`` when it calls no such function); ``ranks``, when given, the number of ranks the
    restore runs on (a distributed service passes it).
    """
    if not isinstance(saved, ServiceState):
        saved = ServiceState(service="", layout=dict(saved), shards=[])
    before = saved.layout.get(RESET_FN)
    if before is None and current is None:
        return []
    if before is None:
        assert current is not None
        return [f"this service calls worker_reset_fn={current['function']}, but the snapshot was taken without "
                "one, so the function's effect on the saved epoch cannot be reproduced: restore onto a "
                "MultiProcessingReadingService without worker_reset_fn (the loader's seeds already reseed every "
                "random pipe each epoch)"]
    wanted = (f"MultiProcessingReadingService(num_workers={before['num_workers']}, "
              f"worker_reset_fn={before['function']})")
    why = (f"the snapshot was taken with worker_reset_fn={before['function']} in {before['num_workers']} "
           "worker(s); that function sees workers, so the stream depends on the layout and the snapshot "
           f"restores only onto the same one: use {wanted} with the same logical shards and ranks")
    if current is None:
        return [f"{why} (this service calls no worker_reset_fn)"]
    if int(current["num_workers"]) != int(before["num_workers"]):
        return [f"{why} (this service has num_workers={current['num_workers']})"]
    if current["function"] != before["function"]:
        return [f"{why} (this service calls worker_reset_fn={current['function']})"]
    saved_ranks = saved.world
    if ranks is not None and ranks != saved_ranks:
        return [f"{why} (the snapshot was taken on {saved_ranks} rank(s), this restore runs on {ranks})"]
    return []
