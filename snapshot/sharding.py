"""Sharding points: where a graph is split between workers, ranks and logical shards."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

from snapshot.graph import Graph

__all__ = ["WorkerInfo", "apply_sharding", "is_sharding_point"]


@dataclass(frozen=True)
class WorkerInfo:
    """Which worker a function runs in (torchdata 0.9's ``WorkerInfo``)."""

    num_workers: int
    worker_id: int


def is_sharding_point(datapipe: Any) -> bool:
    """``sharding_filter`` or any pipe with a bound ``apply_sharding`` method."""
    return inspect.ismethod(getattr(datapipe, "apply_sharding", None))


def apply_sharding(
    datapipe: Any,
    num_of_instances: int,
    instance_id: int,
    sharding_group: SHARDING_PRIORITIES = SHARDING_PRIORITIES.DEFAULT,
) -> Any:
    """Configure every sharding point of the graph as instance ``instance_id`` of ``num_of_instances``."""
    for node in Graph(datapipe):
        method = getattr(node.datapipe, "apply_sharding", None)
        if not inspect.ismethod(method):
            continue
        if len(inspect.signature(method).parameters) < 3:
            method(num_of_instances, instance_id)
        else:
            method(num_of_instances, instance_id, sharding_group=sharding_group)
    return datapipe
