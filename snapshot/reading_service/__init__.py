"""Reading services: where a DataLoader2's graph runs, and how its position is saved."""

from snapshot.reading_service.base import ReadingServiceInterface, ServiceState
from snapshot.reading_service.in_process import InProcessReadingService

__all__ = ["InProcessReadingService", "ReadingServiceInterface", "ServiceState"]
