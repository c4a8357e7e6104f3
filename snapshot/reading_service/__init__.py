"""Reading services: where a DataLoader2's graph runs, and how its position is saved."""

from typing import Any

from snapshot.reading_service import base as _base
from snapshot.reading_service._rng import GlobalRNG
from snapshot.reading_service.base import ReadingServiceInterface, ServiceCheckpoint
from snapshot.reading_service.distributed import DistributedReadingService
from snapshot.reading_service.in_process import InProcessReadingService
from snapshot.reading_service.multiprocessing import MultiProcessingReadingService
from snapshot.reading_service.sequential import SequentialReadingService

__all__ = ["DistributedReadingService", "GlobalRNG", "InProcessReadingService", "MultiProcessingReadingService",
           "ReadingServiceInterface", "SequentialReadingService", "ServiceCheckpoint"]


def __getattr__(name: str) -> Any:
    if name == "ServiceState":  # deprecated (see base.py)
        return getattr(_base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
