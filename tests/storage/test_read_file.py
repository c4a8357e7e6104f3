"""A snapshot file read by path (``_sources.read_snapshot``: a small regular file in three calls, anything else
through a file object) reads as the same file read from a file object, and is refused as before."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import snapshot
from tests import graphs, helpers


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("read") / "a.snap"
    with helpers.loader_at(graphs.sharded(), 7, seed=3) as (loader, _):
        loader.save_snapshot(path)
    return path


def _same(a: snapshot.Snapshot, b: snapshot.Snapshot) -> None:
    assert a.manifest == b.manifest
    assert a.state == b.state and a.graph == b.graph and a.service == b.service


def test_a_path_reads_as_its_file_object(saved: Path) -> None:
    with open(saved, "rb") as f:
        _same(snapshot.load(saved), snapshot.load(f))
    _same(snapshot.load(str(saved)), snapshot.load(saved.read_bytes()))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_is_read_to_its_end(saved: Path, tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.snap"
    os.mkfifo(pipe)
    data = saved.read_bytes()

    def write() -> None:
        with open(pipe, "wb") as f:  # blocks until the load opens it
            for i in range(0, len(data), 1000):
                f.write(data[i:i + 1000])
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    _same(snapshot.load(pipe), snapshot.load(saved))
    writer.join(timeout=30)
    assert not writer.is_alive()


def test_bytes_after_the_end_are_counted(saved: Path, tmp_path: Path) -> None:
    longer = tmp_path / "longer.snap"
    longer.write_bytes(saved.read_bytes() + b"12345")
    with pytest.raises(snapshot.CorruptSnapshotError, match="5 unexpected bytes after its end"):
        snapshot.load(longer)


def test_a_directory_without_an_index_and_a_missing_file_say_so(tmp_path: Path) -> None:
    with pytest.raises(snapshot.SnapshotFileError, match="directory without manifest.snap"):
        snapshot.load(tmp_path)
    with pytest.raises(snapshot.SnapshotFileError, match="no such file"):
        snapshot.load(tmp_path / "nothing.snap")
