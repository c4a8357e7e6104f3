"""The one place that picks a reading service for a launcher's topology (shared by the integrations)."""

from __future__ import annotations

from typing import Any

import snapshot

__all__ = ["EVEN_BATCHES_DEFAULT", "choose"]

#: Ranks of a data-parallel job must take the same number of steps, or a gradient all-reduce
#: waits forever: by default every rank stops when the first one runs out ("drop", which
#: keeps snapshots exact and drops the tails of the longer shares; see DistributedReadingService).
EVEN_BATCHES_DEFAULT = "drop"


def choose(*, distributed: bool, num_workers: int, timeout: float, logical_shards: int | None,
           even_batches: str | None, worker_options: dict[str, Any]) -> snapshot.ReadingServiceInterface:
    """In-process or ``num_workers`` workers; on ranks, the distributed service in front of them."""
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if not distributed:
        if num_workers == 0:
            if worker_options:
                raise TypeError(f"options for worker processes given with num_workers=0: {sorted(worker_options)}")
            return snapshot.InProcessReadingService(logical_shards=logical_shards)
        return snapshot.MultiProcessingReadingService(num_workers, logical_shards=logical_shards, **worker_options)
    ranks = snapshot.DistributedReadingService(timeout, logical_shards=logical_shards, even_batches=even_batches)
    if num_workers == 0:
        if worker_options:
            raise TypeError(f"options for worker processes given with num_workers=0: {sorted(worker_options)}")
        return ranks
    return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(num_workers,
                                                                                           **worker_options))
