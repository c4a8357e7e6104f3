"""Re-sharding: the engine states saved from one layout (W workers) turned into the state an
engine owning another set of shards needs. The router queues of the old owners are merged onto
the most-behind copy of the part above the sharding point."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from snapshot.engine.sharding import Topology
from snapshot.errors import LayoutError
from snapshot.reading_service._shards.engine import EngineState
from snapshot.schema.state import RouterState, ShardState, UpstreamState

__all__ = ["Part", "parts", "recombine"]

_log = logging.getLogger(__name__)


#: A part of the graph above the sharding point: its routers and the nodes above them.
Part = tuple[Sequence[str], frozenset[str]]


def parts(topology: Topology, *, filters: bool = True, dispatchers: bool = True) -> list[Part]:
    """The parts above the sharding point that one process runs: the one above the
    ``sharding_filter`` routers (run by every worker) and the one above the dispatchers (run
    once per loader process)."""
    found: list[Part] = []
    if filters and topology.filters:
        found.append((topology.filters, topology.upstream - topology.dispatched))
    if dispatchers and topology.dispatchers:
        found.append((topology.dispatchers, topology.dispatched))
    return found


def recombine(saved_upstream: Sequence[UpstreamState], saved_shards: Sequence[ShardState | None],
              shards: Sequence[int], wanted: Sequence[Part]) -> EngineState:
    """The restore state for an engine that owns ``shards``, from states saved in any layout.

    For each ``wanted`` part, the saved copy that had read the least is taken (every other
    copy's routers have queued, by value, what the shards still need from the samples it had
    read); each router's queues come from each shard's former owner.
    """
    upstream: UpstreamState | None = None
    if wanted:
        upstream = UpstreamState()
        for routers, prefix in wanted:
            _recombine_part(upstream, saved_upstream, shards, routers, prefix)
    return EngineState(upstream, {s: saved_shards[s] for s in shards})


def _recombine_part(into: UpstreamState, saved_upstream: Sequence[UpstreamState], shards: Sequence[int],
                    routers: Sequence[str], prefix: frozenset[str]) -> None:
    first = routers[0]
    copies = [u for u in saved_upstream if first in u.routers]
    if not copies:
        raise LayoutError(f"the snapshot holds no state for the part of the graph above {first}")
    base = min(copies, key=lambda u: u.routers[first].position)
    owners: dict[int, UpstreamState] = {}
    for candidate in copies:
        for shard in candidate.shards:
            owners[int(shard)] = candidate
    uneven = [r for r in routers if any(u.routers[r].position < base.routers[r].position for u in copies)]
    if uneven:
        _restart_part(into, base, owners, shards, routers, prefix)
        return
    for router in routers:
        saved = base.routers[router]
        queues, nexts = {}, {}
        for shard in shards:
            state = _owner(owners, shard).routers[router]
            nexts[shard] = int(state.next[shard])
            queues[shard] = [[i, x] for i, x in state.queues[shard]]
        into.routers[router] = RouterState(position=saved.position, kept=saved.kept, ended=saved.ended, next=nexts,
                                           queues={s: [e for e in q if int(e[0]) < saved.kept]
                                                   for s, q in queues.items()},
                                           deal=saved.deal)
    if base.rng is not None:  # the dispatching part's own generator states
        into.rng = base.rng
    into.nodes.update({p: r for p, r in base.nodes.items() if p in prefix})
    into.persistent.update({p: r for p, r in base.persistent.items() if p in prefix})


def _restart_part(into: UpstreamState, base: UpstreamState, owners: Mapping[int, UpstreamState],
                  shards: Sequence[int], routers: Sequence[str], prefix: frozenset[str]) -> None:
    """No saved copy of the part had read the least from every sharding point (two sharding
    points feeding one pipe, read at different paces by different workers): the part restarts
    from the start of the epoch, and each router deals every shard only what it had not read."""
    _log.info("the sharding points %s were read unevenly by the saved workers: the part above them "
              "replays from the start of the epoch", ", ".join(routers))
    for router in routers:
        into.routers[router] = RouterState(deal=base.routers[router].deal,
                                           next={s: _owner(owners, s).routers[router].next[s] for s in shards},
                                           queues={s: [] for s in shards})
    into.restart = True
    into.nodes.update({p: r for p, r in base.nodes.items() if p in prefix})
    into.persistent.update({p: r for p, r in base.persistent.items() if p in prefix})


def _owner(owners: Mapping[int, UpstreamState], shard: int) -> UpstreamState:
    owner = owners.get(int(shard))
    if owner is None:
        raise LayoutError(f"the snapshot has no owner for logical shard {shard}")
    return owner
