"""Re-sharding: the engine states saved from one layout (W workers) turned into the state an
engine owning another set of shards needs. The router queues of the old owners are merged onto
the most-behind copy of the part above the sharding point."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from snapshot.errors import LayoutError
from snapshot.sharding import Topology

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


def recombine(saved_upstream: Sequence[Mapping[str, Any]], saved_shards: Sequence[Mapping[str, Any]],
              shards: Sequence[int], wanted: Sequence[Part]) -> dict[str, Any]:
    """The restore state for an engine that owns ``shards``, from states saved in any layout.

    For each ``wanted`` part, the saved copy that had read the least is taken (every other
    copy's routers have queued, by value, what the shards still need from the samples it had
    read); each router's queues come from each shard's former owner.
    """
    upstream: dict[str, Any] | None = None
    if wanted:
        upstream = {"nodes": {}, "routers": {}, "persistent": {}, "restart": False}
        for routers, prefix in wanted:
            _recombine_part(upstream, saved_upstream, shards, routers, prefix)
        if not upstream["restart"]:
            del upstream["restart"]
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
    uneven = [r for r in routers
              if any(int(u["routers"][r]["position"]) < int(base["routers"][r]["position"]) for u in copies)]
    if uneven:
        _restart_part(into, base, owners, shards, routers, prefix)
        return
    for router in routers:
        position = int(base["routers"][router]["position"])
        queues, nexts = {}, {}
        for shard in shards:
            state = _owner(owners, shard)["routers"][router]
            nexts[shard] = int(state["next"][shard])
            queues[shard] = [[i, x] for i, x in state["queues"][shard]]
        kept = int(base["routers"][router]["kept"])
        deal = {"deal": base["routers"][router]["deal"]} if "deal" in base["routers"][router] else {}
        into["routers"][router] = {**deal, "position": position, "kept": kept,
                                   "ended": bool(base["routers"][router]["ended"]),
                                   "next": nexts,
                                   "queues": {s: [e for e in q if int(e[0]) < kept] for s, q in queues.items()}}
    if base.get("rng") is not None:  # the dispatching part's own generator states
        into["rng"] = base["rng"]
    into["nodes"].update({p: r for p, r in base["nodes"].items() if p in prefix})
    into["persistent"].update({p: r for p, r in base.get("persistent", {}).items() if p in prefix})


def _restart_part(into: dict[str, Any], base: Mapping[str, Any], owners: Mapping[int, Mapping[str, Any]],
                  shards: Sequence[int], routers: Sequence[str], prefix: frozenset[str]) -> None:
    """No saved copy of the part had read the least from every sharding point (two sharding
    points feeding one pipe, read at different paces by different workers): the part restarts
    from the start of the epoch, and each router deals every shard only what it had not read."""
    _log.info("the sharding points %s were read unevenly by the saved workers: the part above them "
              "replays from the start of the epoch", ", ".join(routers))
    for router in routers:
        state = base["routers"][router]
        into["routers"][router] = {
            "position": 0, "kept": 0, "ended": False, **({"deal": state["deal"]} if "deal" in state else {}),
            "next": {s: _owner(owners, s)["routers"][router]["next"][s] for s in shards},
            "queues": {s: [] for s in shards}}
    into["restart"] = True
    into["nodes"].update({p: r for p, r in base["nodes"].items() if p in prefix})
    into["persistent"].update({p: r for p, r in base.get("persistent", {}).items() if p in prefix})


def _owner(owners: Mapping[int, Mapping[str, Any]], shard: int) -> Mapping[str, Any]:
    owner = owners.get(int(shard))
    if owner is None:
        raise LayoutError(f"the snapshot has no owner for logical shard {shard}")
    return owner
