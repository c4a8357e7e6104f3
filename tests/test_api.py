"""The public surface is pinned: additions and removals are deliberate."""

import subprocess
import sys

import snapshot

EXPECTED = [
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


def test_all_is_pinned_and_sorted() -> None:
    assert snapshot.__all__ == EXPECTED
    assert snapshot.__all__ == sorted(snapshot.__all__)
    for name in snapshot.__all__:
        assert hasattr(snapshot, name), name


def test_every_error_derives_from_snapshot_error() -> None:
    for name in snapshot.__all__:
        obj = getattr(snapshot, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, snapshot.SnapshotError), name


def test_exactly_one_module_imports_dill() -> None:
    import pathlib

    root = pathlib.Path(snapshot.__file__).parent
    importers = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py")
        if any(line.strip().startswith(("import dill", "from dill")) for line in p.read_text().splitlines())
    )
    assert importers == ["_serialization.py"]


def test_importing_snapshot_does_not_import_torchdata() -> None:
    code = "import sys, snapshot; print('torchdata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
