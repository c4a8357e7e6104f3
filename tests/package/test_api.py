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
    assert importers == ["container/_serialization.py"]


def test_importing_snapshot_does_not_import_torchdata() -> None:
    code = "import sys, snapshot; print('torchdata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


#: The public modules that moved into the layer folders, by the path users import them by.
MOVED = {
    "snapshot.capture": "snapshot.container.capture",
    "snapshot.dataloader2": "snapshot.loader.dataloader2",
    "snapshot.execution": "snapshot.engine.execution",
    "snapshot.format": "snapshot.container.format",
    "snapshot.graph": "snapshot.engine.graph",
    "snapshot.multipart": "snapshot.storage.multipart",
    "snapshot.plan": "snapshot.engine.plan",
    "snapshot.randomness": "snapshot.engine.randomness",
    "snapshot.restore": "snapshot.loader.restore",
    "snapshot.sharding": "snapshot.engine.sharding",
}


def test_every_old_module_path_is_the_same_module_as_its_new_one() -> None:
    import importlib

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old


def test_patching_through_the_old_path_reaches_the_code_that_uses_the_new_one(monkeypatch) -> None:
    import snapshot.format
    from snapshot.container import capture

    monkeypatch.setattr(snapshot.format, "MAGIC", b"patched!")
    assert capture.format.MAGIC == b"patched!"


def test_the_old_paths_import_in_any_order_and_keep_the_package_functions() -> None:
    """``snapshot.capture`` and ``snapshot.restore`` are functions that share their names with
    modules: importing the modules by their old paths, first thing, leaves them functions."""
    code = ("import snapshot.restore, snapshot.capture, snapshot.dataloader2, snapshot.graph\n"
            "from snapshot.capture import Snapshot\nfrom snapshot.restore import restore\n"
            "import snapshot, types\n"
            "assert not isinstance(snapshot.capture, types.ModuleType), snapshot.capture\n"
            "assert not isinstance(snapshot.restore, types.ModuleType), snapshot.restore\n"
            "assert snapshot.Snapshot is Snapshot and snapshot.restore is restore\n"
            "print(snapshot.DataLoader2.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "snapshot.loader.dataloader2"
