"""A logical shard that reads its sharding point again within the epoch: a ``cycle`` below a
``sharding_filter``.

The first pass of every shard comes from the shared :class:`~._routing.Router` (the part above
the sharding point runs once per process and deals sample i to shard i % L). A later pass of
one shard cannot come from there: the other shards are elsewhere in their own passes. So the
shard reads the part above the sharding point again on its own, from a copy of it, and keeps
its share through a router of its own, exactly as the shared one deals:

- the copy is taken from this process's pipes above the sharding point when they have ended
  their epoch (a shard's first pass ends only after the shared router has), with the state
  those pipes keep across epochs saved alongside, so a restore builds the same copy;
- each random pipe of the copy gets the seed of that pass, derived from its shared epoch seed
  and the pass key (:func:`snapshot.randomness.pass_seed`), so every shard sees the same order
  and pass k's shares still partition that pass (its router deals as the shared one does,
  sub-shards of an epoch split between ranks included);
- its state is the copy's node records and its router's position, saved under the sharding
  point's path in the shard's record, so it moves with the shard onto any other layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from snapshot.container._serialization import clone
from snapshot.engine.execution import Run, capture_persistent, restore_persistent
from snapshot.engine.graph import ROOT, Graph
from snapshot.engine.plan import RestoreStrategy, make_plan
from snapshot.engine.randomness import pass_seed
from snapshot.errors import ShardingError
from snapshot.hooks._base import ResumableIterator
from snapshot.reading_service._shards.routing import Router
from snapshot.schema.state import NodeState, RouterState, ShardState

__all__ = ["Reread", "later_pass", "reread"]

NODES = "nodes"
ROUTER = "router"
PERSISTENT = "persistent"


class Reread(ResumableIterator):
    """The cell of a sharding point that one logical shard reads again (one pass)."""

    def __init__(self, datapipe: Any, run: Run, router: Router, shard: int, persistent: dict[str, Any]):
        super().__init__(datapipe, [])
        self._run, self._router, self._shard, self._persistent = run, router, shard, persistent

    def next(self) -> Any:
        return self._router.next_for(self._shard)

    def buffered(self) -> int:
        return sum(len(q) for q in self._router.queues.values())

    def get_state(self) -> dict[str, Any]:
        """The copy's node records and its router's position, as plain dicts (a node state is data)."""
        return {NODES: {path: node.to_dict() for path, node in self._run.capture().items()},
                ROUTER: self._router.state().to_dict(), PERSISTENT: self._persistent}

    def set_state(self, state: dict[str, Any]) -> None:
        raise TypeError("a Reread is restored by reread(), with its state")


def reread(port: Any, key: tuple[int, ...], state: Mapping[str, Any] | None, *, seeds: Mapping[str, int],
           buffer_state: str = "values") -> Reread:
    """The cell of ``port`` (a :class:`~._routing.RouterPort`) for its pass ``key``, from its saved
    ``state`` (``None``: from the pass's start); ``seeds`` are the epoch's shared seeds."""
    router = port.router
    if not isinstance(router, Router):
        raise ShardingError(
            f"a pipe below the sharding_round_robin_dispatch at {router.path} iterates its input again, "
            "which would read the dispatched part again; put the re-iterating pipe (cycle) above the "
            "dispatcher, or run with one logical shard (logical_shards=1).")
    source: Any = router.source  # the cell of the sharding point's input in the shared part
    base = source.path
    copy = Graph(clone(source.datapipe)[0])
    persistent = dict(state[PERSISTENT]) if state is not None else capture_persistent(copy)
    restore_persistent(copy, persistent)

    def original(path: str) -> str:
        return base + path[len(ROOT):]

    own = {n.path: pass_seed(seeds[original(n.path)], key) for n in copy.nodes if original(n.path) in seeds}
    records = plan = None
    if state is not None:
        records = {path: NodeState.from_dict(node, f"{port.path}.state.nodes") for path, node in state[NODES].items()}
        plan = make_plan(copy, {p: r.yielded for p, r in records.items()}, RestoreStrategy.AUTO)
    run = Run(copy, own, records=records, plan=plan, buffer_state=buffer_state)
    if state is None:  # a new pass, dealt as the shared router deals (sub-shards included)
        dealt = RouterState(deal=router.deal.state(), next={port.shard: 0}, queues={port.shard: []})
    else:
        dealt = RouterState.from_dict(state[ROUTER], f"{port.path}.state.router")
    shared = Router(run, router.count, [port.shard], dealt, outer=router.outer)
    return Reread(port.datapipe, run, shared, port.shard, persistent)


def later_pass(shards: Sequence[ShardState | None], routers: Sequence[str]) -> str | None:
    """Why the units of a mid-epoch snapshot cannot be split into sub-shards when one of them was
    reading its sharding point again (sub-shards split a unit where it stood in its first pass);
    ``None`` when none was."""
    for unit, record in enumerate(shards):
        nodes = record.nodes if record is not None else {}
        for path in routers:
            if (node := nodes.get(path)) is not None and node.passes:
                return (f"unit {unit} was reading its sharding point {path} again (a later pass of a cycle below "
                        "the sharding_filter)")
    return None
