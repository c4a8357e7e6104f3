"""What a restore says when it is given the wrong thing: a folder of snapshots, or a snapshot of another
pipeline (said first, with a few of its differences, not forty lines of them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from tests import file_corpus, graphs
from tests.cli.test_cli import run_cli


def test_a_folder_of_snapshots_is_named_as_one_with_the_newest(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with snapshot.DataLoader2(IterableWrapper(range(45))) as loader:
        for step, _ in enumerate(loader):
            if step % 10 == 0 and step:
                loader.save_snapshot(f"{ckpt}/step-{step:06d}.snap", keep_last=3)
    with snapshot.DataLoader2(IterableWrapper(range(45))) as loader, \
            pytest.raises(snapshot.SnapshotFileError) as raised:
        loader.restore_snapshot(ckpt)
    message = str(raised.value)
    assert (f"{ckpt}: is a folder of snapshots (step-000020.snap, step-000030.snap, step-000040.snap), not one "
            f"snapshot: pass one of them; the newest, step-000040.snap, is what snapshot.latest('{ckpt}') returns"
            ) == message
    assert snapshot.latest(ckpt) == str(ckpt / "step-000040.snap")
    inspect = run_cli("inspect", str(ckpt))
    assert inspect.returncode == 2 and "is a folder of snapshots (step-000020.snap" in inspect.stderr
    (tmp_path / "empty").mkdir()  # a directory of nothing: not one of ours, as before
    with snapshot.DataLoader2(graphs.linear()) as loader, pytest.raises(snapshot.SnapshotFileError,
                                                                       match="is a directory without manifest.snap"):
        loader.restore_snapshot(tmp_path / "empty")


def test_a_snapshot_of_another_pipeline_says_so_first(tmp_path: Path) -> None:
    data = file_corpus.write_corpus(str(tmp_path / "data"))
    with snapshot.DataLoader2(file_corpus.webdataset(data).batch(2)) as loader:
        loader.seed(0)
        next(iter(loader))
        saved = loader.save_snapshot()
    other = file_corpus.gzip_lines(data).batch(2)
    with snapshot.DataLoader2(other) as loader, pytest.raises(snapshot.GraphMismatchError) as raised:
        loader.restore_snapshot(saved)
    message = str(raised.value)
    first = message.splitlines()[0]
    assert first == (
        "the graph given to the loader does not match the graph in the snapshot: the snapshot is of another "
        "pipeline (its graph: Batcher ← Mapper ← WebDataset ← TarArchiveLoader ← FileOpener ← ShardingFilter ← "
        "Shuffler ← FileLister ← Mapper ← IterableWrapper; this one: Batcher ← Mapper ← LineReader ← Decompressor "
        "← FileOpener ← ShardingFilter ← FileLister ← Mapper ← IterableWrapper): of its 10 nodes, 2 are of the "
        "same type at the same place here. Restore it with the pipeline that saved it (`snapshot inspect FILE` "
        "shows its graph); the first 5 of its 14 differences:")
    assert message.count("  at ") == 5 and "  ... and " in message          # a few differences, then a count


def test_a_batch_added_at_the_sink_is_not_another_pipeline() -> None:
    """Every path moves down one edge, but the saved nodes are all there: a change, not a stranger."""
    saved = snapshot.DataLoader2(IterableWrapper(range(20)).map(graphs.double)).save_snapshot()
    with snapshot.DataLoader2(IterableWrapper(range(20)).map(graphs.double).batch(2)) as loader, \
            pytest.raises(snapshot.GraphMismatchError) as raised:
        loader.restore_snapshot(saved)
    assert str(raised.value).startswith("the graph given to the loader does not match the graph in the snapshot "
                                        "(3 differences):")
    assert "another pipeline" not in str(raised.value)


def test_a_graph_that_differs_in_one_place_lists_it_as_before() -> None:
    saved = snapshot.DataLoader2(IterableWrapper(range(20)).shuffle(buffer_size=5).batch(2)).save_snapshot()
    with snapshot.DataLoader2(IterableWrapper(range(20)).shuffle(buffer_size=6).batch(2)) as loader, \
            pytest.raises(snapshot.GraphMismatchError) as raised:
        loader.restore_snapshot(saved)
    message = str(raised.value)
    assert message.startswith("the graph given to the loader does not match the graph in the snapshot (1 difference)")
    assert "another pipeline" not in message
