"""Snapshots behind fsspec URLs: save, load, restore, inspect; a clear error without fsspec."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.errors import SnapshotError, SnapshotFileError

fsspec = pytest.importorskip("fsspec")


def graph():
    return IterableWrapper(list(range(30))).shuffle(buffer_size=6).batch(2)


@pytest.fixture
def url():
    name = f"memory://snapshots-{uuid.uuid4().hex}/run/data.snap"
    yield name
    memory = fsspec.filesystem("memory")
    root = name.split("/run/")[0]
    if memory.exists(root):
        memory.rm(root, recursive=True)


def positioned(k: int = 3):
    dl = snapshot.DataLoader2(graph())
    dl.seed(5)
    it = iter(dl)
    for _ in range(k):
        next(it)
    return dl, it


@pytest.mark.parametrize("blocking", [True, False])
def test_save_and_restore_through_a_url(url: str, blocking: bool, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    dl, it = positioned()
    with dl:
        result = dl.save_snapshot(url, blocking=blocking)
        if not blocking:
            assert result.result(timeout=60) == url
        rest = list(it)
    assert not (tmp_path / "memory:").exists()  # never a local folder named after the scheme
    assert snapshot.read_manifest(url)["loader"]["yielded"] == 3
    assert snapshot.load(url).yielded == 3
    with snapshot.DataLoader2(graph()) as again:
        again.restore_snapshot(url)
        assert list(again) == rest
    with snapshot.DataLoader2.from_snapshot(url) as rebuilt:
        assert list(rebuilt) == rest


def test_a_missing_object_says_so(url: str) -> None:
    with pytest.raises(SnapshotFileError, match="no such object"):
        snapshot.load(url)


def test_a_url_without_fsspec_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if it were not installed
    monkeypatch.chdir(tmp_path)
    dl, _ = positioned()
    with dl, pytest.raises(SnapshotError, match=r"needs fsspec.*pip install"):
        dl.save_snapshot("s3://bucket/x.snap")
    assert not (tmp_path / "s3:").exists()
    with pytest.raises(SnapshotError, match="needs fsspec"):
        snapshot.load("s3://bucket/x.snap")


def test_an_unknown_scheme_is_a_clear_error() -> None:
    dl, _ = positioned()
    with dl, pytest.raises(SnapshotFileError, match="cannot open this URL's storage"):
        dl.save_snapshot("nosuchscheme-xyz://bucket/x.snap")


def test_the_command_line_reads_a_url(tmp_path) -> None:
    # memory:// lives in one process: write a file:// URL and inspect it from another process
    dest = f"file://{tmp_path}/cli.snap"
    dl, _ = positioned()
    with dl:
        dl.save_snapshot(dest)
    out = subprocess.run([sys.executable, "-m", "snapshot", "inspect", "--json", dest],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"yielded": 3' in out.stdout or '"yielded":3' in out.stdout
