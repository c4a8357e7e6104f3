"""``SequentialReadingService``: torchdata 0.9's way to combine services, for the combinations
that make sense with exact snapshots.

``SequentialReadingService(DistributedReadingService(...), MultiProcessingReadingService(n))``
runs n workers per rank: the distributed service deals logical shards to ranks, the
multi-process service runs a rank's share in its workers. A single service is accepted as it
is. Other combinations are refused with a message that says which ones work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import SeedGenerator
from snapshot.reading_service._shards.service import ShardedService
from snapshot.reading_service.base import ReadingServiceInterface, ServiceCheckpoint
from snapshot.reading_service.distributed import DistributedReadingService

__all__ = ["SequentialReadingService"]


class SequentialReadingService(ReadingServiceInterface):
    """Combine a :class:`DistributedReadingService` with the service that runs each rank's share."""

    def __init__(self, *reading_services: ReadingServiceInterface):
        services = list(reading_services)
        first = services[0] if services else None
        second = services[1] if len(services) > 1 else None
        if len(services) == 1 and isinstance(first, ReadingServiceInterface):
            inner: ReadingServiceInterface = first
        elif len(services) == 2 and isinstance(first, DistributedReadingService) \
                and isinstance(second, ShardedService):
            inner = DistributedReadingService(first.timeout, logical_shards=first.logical_shards,
                                              even_batches=first.even_batches, executor=second)
        else:
            names = ", ".join(type(s).__name__ for s in services) or "nothing"
            raise TypeError(
                f"SequentialReadingService({names}) is not supported. Use "
                "SequentialReadingService(DistributedReadingService(...), MultiProcessingReadingService(n)) "
                "for n workers per rank (or InProcessReadingService() instead of the second), or pass a "
                "single service.")
        self.reading_services = services
        self.inner = inner

    @property
    def collective(self) -> Any:
        return getattr(self.inner, "collective", None)

    def initialize(self, datapipe: Any) -> Iterable[Any]:
        return self.inner.initialize(datapipe)

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        return self.inner.initialize_iteration(seed_generator, iter_reset_fn)

    def finalize_iteration(self) -> None:
        self.inner.finalize_iteration()

    def finalize(self) -> None:
        self.inner.finalize()

    @property
    def reads_records(self) -> bool:  # type: ignore[override]
        return self.inner.reads_records

    @property
    def takes_graph(self) -> bool:  # type: ignore[override]
        return self.inner.takes_graph

    def checkpoint(self) -> ServiceCheckpoint:
        return self.inner.checkpoint()

    def validate(self, state: Any) -> list[str]:
        return self.inner.validate(state)

    def parts_to_read(self, index: Any) -> Sequence[int] | None:
        return self.inner.parts_to_read(index)

    def restore(self, datapipe: Any, state: Any, *,
                strategy: Any = RestoreStrategy.AUTO, graph: Any = None) -> Iterable[Any]:
        if graph is not None and self.inner.takes_graph:
            return self.inner.restore(datapipe, state, strategy=strategy, graph=graph)
        return self.inner.restore(datapipe, state, strategy=strategy)

    def hand_out_first(self, per_rank: list[list[Any]]) -> None:
        """See :meth:`DistributedReadingService.hand_out_first`."""
        if not isinstance(self.inner, DistributedReadingService):
            raise TypeError("hand_out_first() needs a DistributedReadingService")
        self.inner.hand_out_first(per_rank)

    def progress(self) -> tuple[int, bool]:
        progress: Callable[[], tuple[int, bool]] = getattr(self.inner, "progress")  # noqa: B009
        return progress()
