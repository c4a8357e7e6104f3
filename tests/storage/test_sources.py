"""Reading a snapshot file: a small one in one read, checked and decoded in memory; a large one as it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.container import format
from snapshot.container._header import PREFIX
from snapshot.errors import CorruptSnapshotError


def _saved_twice(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A snapshot file of a loader after 3 samples, and the bytes of two saves (after 3 and after 5)."""
    loader = snapshot.DataLoader2(IterableWrapper(range(100)).shuffle(buffer_size=10))
    loader.seed(1)
    it = iter(loader)
    path = tmp_path / "a.snap"
    for _ in range(3):
        next(it)
    loader.save_snapshot(path)
    first = path.read_bytes()
    for _ in range(2):
        next(it)
    second = loader.save_snapshot(None).to_bytes()
    loader.shutdown()
    return path, first, second


def test_a_small_file_is_read_in_one_call_and_keeps_the_payload_it_checked(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of at most 256 KiB is read whole (one read; msgpack would buffer as much) and decoded from
    memory; the snapshot keeps the payload whose digest it checked, so writing it again after the file was
    replaced gives the bytes that were read (a snapshot read as it goes reads its payload again, and refuses)."""
    path, first, second = _saved_twice(tmp_path)
    streamed: list[str] = []
    real = format.open_payload
    monkeypatch.setattr(format, "open_payload", lambda *a, **k: streamed.append(a[2]) or real(*a, **k))
    snap = snapshot.load(path)
    assert streamed == []
    path.write_bytes(second)
    assert snap.to_bytes() == first
    assert snapshot.load(path).yielded == 5


def test_a_large_file_is_still_decoded_as_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 256 KiB the payload is decoded from the file as it comes (one copy of the state)."""
    loader = snapshot.DataLoader2(IterableWrapper([bytes([i % 251]) * 4096 for i in range(200)])
                                  .shuffle(buffer_size=100))
    loader.seed(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    path = tmp_path / "big.snap"
    loader.save_snapshot(path)
    loader.shutdown()
    assert os.path.getsize(path) > 256 << 10
    streamed: list[str] = []
    real = format.open_payload
    monkeypatch.setattr(format, "open_payload", lambda *a, **k: streamed.append(a[2]) or real(*a, **k))
    assert snapshot.load(path).yielded == 3
    assert streamed == [str(path)]


def test_a_damaged_small_file_is_refused_by_its_digest_before_anything_is_decoded(tmp_path: Path) -> None:
    path, first, _ = _saved_twice(tmp_path)
    damaged = bytearray(first)
    damaged[PREFIX + 5] ^= 0xFF  # a byte of the payload
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptSnapshotError, match="payload checksum does not match"):
        snapshot.load(path)
