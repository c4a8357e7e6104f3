"""Restoring: strategies, validation before anything changes, and :func:`restore`.

Three strategies (``RestoreStrategy`` or their string values):

``fast_forward``
    Rebuild the graph, reseed it with the saved seeds, and replay the saved number of
    samples. Works for any graph; costs O(samples since the epoch began).
``state``
    Put every node back from its saved state; costs O(size of the state). Refused up front,
    listing every node that has no state hook, when the graph needs replay.
``auto``
    Use state wherever the graph allows and replay only the smallest subgraphs that hold a
    node without a hook.

Everything is checked before the loader is touched: the file, the graph (node by node, with
saved and current side by side), the reading-service layout and the strategy. All
problems are collected and raised together.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from snapshot.errors import GraphMismatchError, StrategyError
from snapshot.graph import Graph, compare_nodes

if TYPE_CHECKING:
    from snapshot.capture import Snapshot

__all__ = ["RestoreStrategy", "check_graph", "check_strategy", "restore"]


class RestoreStrategy(str, enum.Enum):
    """How a restore puts the graph back at the saved position."""

    FAST_FORWARD = "fast_forward"
    STATE = "state"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: RestoreStrategy | str) -> RestoreStrategy:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value))
        except ValueError:
            choices = ", ".join(repr(s.value) for s in cls)
            raise ValueError(f"unknown restore strategy {value!r}; choose one of {choices}") from None


def check_graph(saved_nodes: list[dict[str, Any]], graph: Graph) -> None:
    """Raise :class:`GraphMismatchError` naming every node that differs."""
    diffs = compare_nodes(saved_nodes, graph)
    if not diffs:
        return
    listing = "\n".join(str(d) for d in diffs[:20])
    more = f"\n  ... and {len(diffs) - 20} more" if len(diffs) > 20 else ""
    raise GraphMismatchError(
        f"the graph given to the loader does not match the graph in the snapshot "
        f"({len(diffs)} difference{'s' if len(diffs) != 1 else ''}):\n{listing}{more}\n"
        "Build the graph exactly as when the snapshot was saved, or use "
        "DataLoader2.from_snapshot(...) to restore with the graph pickled inside it.",
        [(d.path, d.saved, d.current) for d in diffs],
    )


def check_strategy(graph: Graph, strategy: RestoreStrategy) -> None:
    """Refuse ``state`` when some node cannot be restored from a state hook."""
    if strategy is not RestoreStrategy.STATE:
        return
    missing = [node for node in graph.nodes]
    if missing:
        listing = "\n".join(f"  {n.path}: {n.signature}" for n in missing)
        raise StrategyError(
            f"strategy='state' needs a state hook on every node, and {len(missing)} node(s) "
            f"have none:\n{listing}\nUse strategy='auto' (replays only what needs it) or "
            "'fast_forward', or register hooks with snapshot.register_state_hook()."
        )


def restore(loader: Any, src: Any, *, strategy: RestoreStrategy | str = "auto",
            key: bytes | str | None = None) -> Snapshot:
    """Put ``loader`` (a :class:`~snapshot.DataLoader2`) at the position saved in ``src``.

    ``src`` is a path, a binary file, bytes, a :class:`Snapshot` or a state dict. Returns the
    snapshot that was applied.
    """
    from snapshot.capture import Snapshot, load

    snap = src if isinstance(src, Snapshot) else load(src, key=key)
    loader._restore(snap, RestoreStrategy.parse(strategy))
    return snap
