"""Reading services: where a DataLoader2's graph runs, and how its position is saved.

The services import torch; :mod:`snapshot.reading_service.reshard` (the re-shard plan) does not, so the
services load on first use (``snapshot inspect --plan-for`` runs without torch).
"""

import importlib
from typing import Any

__all__ = ["DistributedReadingService", "GlobalRNG", "InProcessReadingService", "MultiProcessingReadingService",
           "ReadingServiceInterface", "SequentialReadingService", "ServiceCheckpoint"]

_HOMES = {
    "DistributedReadingService": "distributed",
    "GlobalRNG": "_rng",
    "InProcessReadingService": "in_process",
    "MultiProcessingReadingService": "multiprocessing",
    "ReadingServiceInterface": "base",
    "SequentialReadingService": "sequential",
    "ServiceCheckpoint": "base",
    "ServiceState": "base",  # deprecated (see base.py)
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
