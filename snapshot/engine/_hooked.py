"""What the hooks say of a graph's nodes, for a restore's plan: which no strategy can put back, which must
replay (and why), and which, restored from their state, read something again.

The hooks import torch: their registry is imported when a restore is first planned (this module is imported
without torch, by :mod:`snapshot.engine.plan`), and looked up once.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

from snapshot.errors import RestoreError

if TYPE_CHECKING:
    from snapshot.engine.graph import Graph

__all__ = ["check_restorable", "generation", "needs_replay", "rereads"]


def check_restorable(graph: Graph, nodes: set[str] | None = None) -> None:
    """Raise :class:`RestoreError` naming every node (of ``nodes``, default all) that no
    strategy can put back (see :func:`snapshot.hooks.register_refusal`)."""
    refused = []
    for node in _refusable(graph):
        if nodes is None or node.path in nodes:
            reason = _registry().refusal_for(node.datapipe)
            if reason is not None:
                refused.append(f"  {node.path}: {node.signature}: {reason}")
    if refused:
        raise RestoreError(
            f"this graph cannot be snapshotted exactly: {len(refused)} node(s) draw from a "
            "generator that neither a state hook nor a replay can put back:\n" + "\n".join(refused)
        )


def _refusable(graph: Graph) -> list[Any]:
    """The nodes whose class has a refusal registered (it decides per instance, when asked), found once per
    graph while no hook or refusal is registered: each save checks its graph (0.03 ms of a save by position)."""
    key, now = "refusable", generation()
    found = graph.memo.get(key)
    if found is None or found[0] != now:
        condition = _registry().refusal_condition
        found = graph.memo[key] = (now, [n for n in graph.nodes if condition(type(n.datapipe)) is not None])
    nodes: list[Any] = found[1]
    return nodes


def rereads(graph: Graph, nodes: set[str]) -> dict[str, str]:
    """Of ``nodes`` (restored from state), those whose restore reads something again, and what."""
    found: dict[str, str] = {}
    for node in graph.nodes:
        hook = _registry().hook_for(node.datapipe) if node.path in nodes else None
        what = hook.iterator.rereads(node, graph) if hook is not None and hook.iterator is not None else None
        if what is not None:
            found[node.path] = what
    return found


def needs_replay(graph: Graph, nodes: set[str] | None = None) -> dict[str, str]:
    """Nodes (of ``nodes``, default all) that cannot be restored from state, with the reason."""
    from torch.utils.data import MapDataPipe

    hook_for = _registry().hook_for
    reasons: dict[str, str] = {}
    for node in graph.nodes:
        if nodes is not None and node.path not in nodes:
            continue
        if isinstance(node.datapipe, MapDataPipe):
            continue  # map-style pipes have no position
        hook = hook_for(node.datapipe)
        if hook is None:
            reasons[node.path] = "no state hook (its position lives in its generator)"
        elif hook.iterator is not None and not hook.iterator.always_restorable:
            reason = hook.iterator.can_restore(node, graph)
            if reason is not None:
                reasons[node.path] = reason
            elif (why := hook.iterator.replays_input(node, graph)) is not None:
                source = node.inputs[0]  # replayed up to what the node took (unless the part's input: then it)
                where = source if nodes is None or source in nodes else node.path
                reasons.setdefault(where, f"{node.path} {why}")
    return reasons


@functools.cache
def _registry() -> ModuleType:
    """The hooks' registry, imported when a restore is first planned (it imports torch), then kept: an import
    statement in a function costs microseconds on every call, and a restore asks the hooks several times."""
    import snapshot.hooks._registry as registry

    return registry


def generation() -> int:
    """How many times the hooks and refusals registered changed (what the hooks say of a graph holds while it
    stays the same)."""
    return int(_registry().generation())
