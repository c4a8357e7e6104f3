"""Exact, portable snapshots of PyTorch DataPipe graphs, and the DataLoader2 that runs them.

Save where a data stream stands at any step, and continue it later, bit for bit, in another
process or on another machine::

    import snapshot

    dl = snapshot.DataLoader2(datapipe)
    dl.seed(42)
    for step, batch in enumerate(dl):
        ...
        if step % 1000 == 0:
            dl.save_snapshot("ckpt/data.snap")

    # later, in a new process
    dl = snapshot.DataLoader2.from_snapshot("ckpt/data.snap")

See ``docs/`` for the concepts (graph, restore strategies, logical shards) and the file format.
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from snapshot._version import __version__
from snapshot.capture import Snapshot, capture
from snapshot.engine.plan import CodeChanges, RestoreStrategy
from snapshot.errors import (
    CorruptSnapshotError,
    EmptySnapshotError,
    ExecutionError,
    ForeignFileError,
    GraphMismatchError,
    LayoutError,
    ManifestError,
    PositionError,
    RankError,
    RestoreError,
    SerializationError,
    ShardingError,
    SignatureError,
    SnapshotError,
    SnapshotFileError,
    StorageError,
    StrategyError,
    TruncatedSnapshotError,
    UntrustedStateError,
    VerificationError,
    VersionSkewError,
    WorkerError,
)
from snapshot.restore import restore
from snapshot.storage._io import load, save
from snapshot.storage._rotation import latest
from snapshot.storage._sources import read_manifest

# Loggers are "snapshot.<module>"; the library prints nothing unless the application
# configures logging (for example ``logging.basicConfig(level=logging.INFO)``).
logging.getLogger(__name__).addHandler(logging.NullHandler())

# The rest imports torch; it loads on first use, so that `snapshot inspect` and friends,
# which only read manifests, start without it. (``capture`` and ``restore`` are imported
# above: they share their names with their modules, which would otherwise shadow them.)
_LAZY = {
    "DataLoader2": "snapshot.loader.dataloader2",
    "DataLoader2Iterator": "snapshot.loader.dataloader2",
    "DistributedReadingService": "snapshot.reading_service.distributed",
    "GlobalRNG": "snapshot.reading_service._rng",
    "InProcessReadingService": "snapshot.reading_service.in_process",
    "MultiProcessingReadingService": "snapshot.reading_service.multiprocessing",
    "ReadingServiceInterface": "snapshot.reading_service.base",
    "SeedGenerator": "snapshot.engine.randomness",
    "SequentialReadingService": "snapshot.reading_service.sequential",
    "WorkerInfo": "snapshot.engine.sharding",
    "register_state_hook": "snapshot.hooks",
}

if TYPE_CHECKING:
    from snapshot.engine.randomness import SeedGenerator
    from snapshot.engine.sharding import WorkerInfo
    from snapshot.hooks import register_state_hook
    from snapshot.loader.dataloader2 import DataLoader2, DataLoader2Iterator
    from snapshot.reading_service._rng import GlobalRNG
    from snapshot.reading_service.base import ReadingServiceInterface
    from snapshot.reading_service.distributed import DistributedReadingService
    from snapshot.reading_service.in_process import InProcessReadingService
    from snapshot.reading_service.multiprocessing import MultiProcessingReadingService
    from snapshot.reading_service.sequential import SequentialReadingService


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapshot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CodeChanges",
    "CorruptSnapshotError",
    "DataLoader2",
    "DataLoader2Iterator",
    "DistributedReadingService",
    "EmptySnapshotError",
    "ExecutionError",
    "ForeignFileError",
    "GlobalRNG",
    "GraphMismatchError",
    "InProcessReadingService",
    "LayoutError",
    "ManifestError",
    "MultiProcessingReadingService",
    "PositionError",
    "RankError",
    "ReadingServiceInterface",
    "RestoreError",
    "RestoreStrategy",
    "SeedGenerator",
    "SequentialReadingService",
    "SerializationError",
    "ShardingError",
    "SignatureError",
    "Snapshot",
    "SnapshotError",
    "SnapshotFileError",
    "StorageError",
    "StrategyError",
    "TruncatedSnapshotError",
    "UntrustedStateError",
    "VerificationError",
    "VersionSkewError",
    "WorkerError",
    "WorkerInfo",
    "__version__",
    "capture",
    "latest",
    "load",
    "read_manifest",
    "register_state_hook",
    "restore",
    "save",
]
