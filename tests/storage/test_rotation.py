"""snapshot.latest(directory) and save_snapshot(..., keep_last=K): a directory of numbered snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import snapshot
from tests import graphs


def test_latest_of_nothing_is_none(tmp_path: Path) -> None:
    assert snapshot.latest(tmp_path) is None
    assert snapshot.latest(tmp_path / "never-made") is None


def test_keep_last_keeps_the_newest_and_latest_finds_the_last_one(tmp_path: Path) -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    dl.seed(1)
    expected = list(dl)
    dl.seed(1)
    for step, _ in enumerate(dl):
        if step % 2 == 0:
            dl.save_snapshot(tmp_path / f"step-{step}.snap", keep_last=3)
    steps = list(range(0, len(expected), 2))
    assert sorted(os.listdir(tmp_path)) == sorted(f"step-{s}.snap" for s in steps[-3:])
    newest = snapshot.latest(tmp_path)
    assert newest == str(tmp_path / f"step-{steps[-1]}.snap")
    assert list(snapshot.DataLoader2.from_snapshot(newest)) == expected[steps[-1] + 1:]


def test_numbers_order_the_snapshots_not_the_text_or_the_time(tmp_path: Path) -> None:
    snap = snapshot.DataLoader2(graphs.linear()).save_snapshot()
    for step in (900, 1000, 80):  # 80 written last, and "900" > "1000" as text
        snapshot.save(snap, tmp_path / f"step-{step}.snap")
    assert snapshot.latest(tmp_path) == str(tmp_path / "step-1000.snap")


def test_latest_skips_temporary_partial_and_foreign_files(tmp_path: Path) -> None:
    snap = snapshot.DataLoader2(graphs.linear()).save_snapshot()
    snapshot.save(snap, tmp_path / "step-10.snap")
    data = snap.to_bytes()
    (tmp_path / ".step-30.snap.abc123.tmp").write_bytes(data[:50])       # a save in progress
    (tmp_path / "step-20.snap").write_bytes(data[: len(data) // 2])      # a copy cut short
    (tmp_path / "step-40.txt").write_text("notes")                       # not a snapshot
    (tmp_path / "step-50.snap").write_bytes(b"")                         # empty
    assert snapshot.latest(tmp_path) == str(tmp_path / "step-10.snap")


def test_names_without_numbers_are_ordered_by_time(tmp_path: Path) -> None:
    snap = snapshot.DataLoader2(graphs.linear()).save_snapshot()
    for i, name in enumerate(["b.snap", "a.snap", "c.snap"]):
        snapshot.save(snap, tmp_path / name)
        os.utime(tmp_path / name, (1_000_000 + i, 1_000_000 + i))
    assert snapshot.latest(tmp_path) == str(tmp_path / "c.snap")


def test_keep_last_prunes_only_its_own_series_and_never_the_file_just_written(tmp_path: Path) -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    it = iter(dl)
    next(it)
    dl.save_snapshot(tmp_path / "best.snap")
    dl.save_snapshot(tmp_path / "other-1.snap")
    dl.save_snapshot(tmp_path / "step-500.snap")
    dl.save_snapshot(tmp_path / "step-600.snap")
    dl.save_snapshot(tmp_path / "step-510.snap", keep_last=1)   # a run resumed from an older one
    assert sorted(os.listdir(tmp_path)) == ["best.snap", "other-1.snap", "step-510.snap"]


def test_keep_last_refuses_what_it_cannot_order_before_saving(tmp_path: Path) -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    with pytest.raises(ValueError, match=r"numbered snapshot names.*'step-\{step\}.snap', not 'data.snap'"):
        dl.save_snapshot(tmp_path / "data.snap", keep_last=2)
    with pytest.raises(ValueError, match="at least 1"):
        dl.save_snapshot(tmp_path / "step-1.snap", keep_last=0)
    with pytest.raises(ValueError, match="needs dest to be a path"):
        dl.save_snapshot(keep_last=2)
    assert os.listdir(tmp_path) == []
