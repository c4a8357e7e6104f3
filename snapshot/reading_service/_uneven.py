"""A mid-epoch restore onto another number of ranks that ``even_batches`` could not keep exact.

When the saved logical shards are split between the new ranks (:mod:`._split`), the samples
that a shard had already read from its sharding point stay with the rank that runs the shard:
those in the buffers of the pipes below the sharding point (each logical shard's own
``shuffle`` buffer, say) and those produced ahead. The split evens the ranks out by giving the
other ranks more of the samples no one has read yet; where too few are left in the epoch (a
snapshot near the end of an epoch, with full buffers), the ranks end the epoch with different
numbers of samples, and ``"drop"`` would silently drop (``"pad"`` repeat) the difference. That
is refused here, before the restore changes anything, with the same message on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from snapshot.engine.graph import Graph
from snapshot.engine.sharding import Topology
from snapshot.errors import LayoutError
from snapshot.reading_service._routing import _outer
from snapshot.reading_service._split import shares
from snapshot.schema import ServiceState

__all__ = ["check_even_rest", "sharding_lengths"]

_log = logging.getLogger(__name__)


def sharding_lengths(graph: Graph, topology: Topology) -> dict[str, int | None]:
    """Per ``sharding_filter``, the samples its share deals in a whole epoch (``None``: its
    input has no length)."""
    lengths: dict[str, int | None] = {}
    for path in topology.filters:
        node = graph[path]
        try:
            total = len(graph[node.inputs[0]].datapipe) if node.inputs else None
        except (TypeError, NotImplementedError, AttributeError, ValueError):  # a pipe without __len__
            total = None
        count, instance = _outer(node.datapipe)
        lengths[path] = None if total is None else len(range(instance, total, count))
    return lengths


def check_even_rest(state: ServiceState, units: int, ranks: int, ahead: Sequence[int], policy: str | None,
                    lengths: dict[str, int | None]) -> None:
    """Refuse (:class:`~snapshot.LayoutError`) a restore of ``state``'s epoch onto ``ranks``
    ranks in which ``policy`` would drop or repeat ``ranks`` samples or more."""
    if policy is None or ranks < 2 or state.world == ranks:
        return
    forecast = shares(state, units, ranks, ahead, lengths)
    if forecast is None:
        return
    left = forecast.left
    if not forecast.known:
        if forecast.held and forecast.needed >= ranks:
            _log.warning("re-sharding onto %d ranks: samples held in the saved shards' buffers stay with their "
                         "ranks, and the next %d samples no one has read are dealt to even the ranks out; if fewer "
                         "are left in the epoch, even_batches=%r drops or repeats the difference (the sharding "
                         "point's input has no length, so this cannot be checked before the restore)", ranks,
                         forecast.needed, policy)
        return
    if not forecast.counted:  # the samples left reach far beyond those that even the ranks out
        return
    off = sum(n - min(left) for n in left) if policy == "drop" else sum(max(left) - n for n in left)
    outputs = round(off / forecast.per_output)
    if outputs < ranks:
        return
    raise LayoutError(_message(state, ranks, left, outputs, policy))


def _message(state: ServiceState, ranks: int, left: Sequence[int], outputs: int, policy: Any) -> str:
    count = state.logical_shards
    effect = (f"every rank stops when the first runs out, so {outputs} sample(s) would be dropped from this epoch"
              if policy == "drop" else f"ranks that run out repeat their last sample, {outputs} time(s) in all")
    return (
        f"this mid-epoch snapshot ({count} logical shard(s) on {state.world} rank(s)) cannot be restored evenly onto "
        f"{ranks} ranks: the ranks would have {', '.join(str(n) for n in left)} sample(s) left in the epoch "
        f"(ranks 0 to {ranks - 1}), because samples already read below the sharding point (a shuffle's buffer per "
        f"logical shard, say) stay with their shard's rank and too few unread samples are left to even them out; "
        f"with even_batches={policy!r} {effect}. Restore onto {state.world} rank(s) or a number of ranks that "
        f"divides {count}, or use even_batches=None (each rank yields its whole share, and the training loop "
        "handles ranks that end the epoch at different steps), or save with the shuffle above the sharding_filter "
        "(its buffer is then split by sample index). The next epoch is split evenly from its start.")
