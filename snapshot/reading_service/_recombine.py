"""Re-sharding: the engine states saved from one layout (W workers) turned into the state an
engine owning another set of shards needs. The router queues of the old owners are merged onto
the most-behind copy of the part above the sharding point."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from snapshot.errors import LayoutError
from snapshot.sharding import Topology

__all__ = ["Part", "parts", "recombine"]


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


def recombine(saved_upstream: Sequence[Mapping[str, Any]], saved_shards: Sequence[Mapping[str, Any]],
              shards: Sequence[int], wanted: Sequence[Part]) -> dict[str, Any]:
    """The restore state for an engine that owns ``shards``, from states saved in any layout.

    For each ``wanted`` part, the saved copy that had read the least is taken (every other
    copy's routers have queued, by value, what the shards still need from the samples it had
    read); each router's queues come from each shard's former owner.
    """
    upstream: dict[str, Any] | None = None
    if wanted:
        upstream = {"nodes": {}, "routers": {}, "persistent": {}}
        for routers, prefix in wanted:
            _recombine_part(upstream, saved_upstream, shards, routers, prefix)
    return {"upstream": upstream, "shards": {s: saved_shards[s] for s in shards}}


def _recombine_part(into: dict[str, Any], saved_upstream: Sequence[Mapping[str, Any]], shards: Sequence[int],
                    routers: Sequence[str], prefix: frozenset[str]) -> None:
    first = routers[0]
    copies = [u for u in saved_upstream if first in u["routers"]]
    if not copies:
        raise LayoutError(f"the snapshot holds no state for the part of the graph above {first}")
    base = min(copies, key=lambda u: int(u["routers"][first]["position"]))
    owners: dict[int, Mapping[str, Any]] = {}
    for candidate in copies:
        for shard in candidate["shards"]:
            owners[int(shard)] = candidate
    for router in routers:
        position = int(base["routers"][router]["position"])
        behind = [u for u in copies if int(u["routers"][router]["position"]) < position]
        if behind:
            raise LayoutError(
                f"the sharding points of this graph were read unevenly ({router}); restore onto the "
                "same number of workers and ranks as when the snapshot was taken")
        queues, nexts = {}, {}
        for shard in shards:
            owner = owners.get(int(shard))
            if owner is None:
                raise LayoutError(f"the snapshot has no owner for logical shard {shard}")
            state = owner["routers"][router]
            nexts[shard] = int(state["next"][shard])
            queues[shard] = [[i, x] for i, x in state["queues"][shard]]
        kept = int(base["routers"][router]["kept"])
        into["routers"][router] = {"position": position, "kept": kept, "ended": bool(base["routers"][router]["ended"]),
                                   "next": nexts,
                                   "queues": {s: [e for e in q if int(e[0]) < kept] for s, q in queues.items()}}
    if base.get("rng") is not None:  # the dispatching part's own generator states
        into["rng"] = base["rng"]
    into["nodes"].update({p: r for p, r in base["nodes"].items() if p in prefix})
    into["persistent"].update({p: r for p, r in base.get("persistent", {}).items() if p in prefix})
