"""File format v1: round trips, atomic writes, and a clear error for every kind of bad file."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import format as fmt
from tests import graphs, helpers


def make_snapshot(factory=graphs.linear, samples: int = 3) -> snapshot.Snapshot:
    return helpers.snapshot_after(factory, samples, seed=1)


def test_round_trip_through_a_file(tmp_path) -> None:
    snap = make_snapshot()
    path = tmp_path / "a.snap"
    snapshot.save(snap, path)
    loaded = snapshot.load(path)
    assert loaded.manifest == snap.manifest
    assert loaded.state == snap.state
    assert loaded.graph == snap.graph
    assert snapshot.read_manifest(path)["loader"] == {"epoch": 0, "yielded": 3, "epoch_finished": False,
                                                      "lookahead": 0}


def test_round_trip_through_a_file_object_and_bytes() -> None:
    snap = make_snapshot()
    buffer = io.BytesIO()
    snapshot.save(snap, buffer)
    assert snapshot.load(io.BytesIO(buffer.getvalue())).state == snap.state
    assert snapshot.load(buffer.getvalue()).state == snap.state


def test_manifest_is_plain_json_with_versions_and_checksums(tmp_path) -> None:
    path = tmp_path / "a.snap"
    snapshot.save(make_snapshot(), path)
    manifest = snapshot.read_manifest(path)
    assert manifest["format"] == fmt.FORMAT_VERSION
    assert set(manifest["versions"]) >= {"snapshot", "torch", "python", "dill"}
    assert len(manifest["payload"]["sha256"]) == 64
    assert [n["path"] for n in manifest["graph"]["nodes"]][0] == "0"
    json.dumps(manifest)


def test_atomic_save_keeps_the_previous_file_when_the_write_fails(tmp_path, monkeypatch) -> None:
    path = tmp_path / "a.snap"
    snapshot.save(make_snapshot(samples=1), path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(snapshot.StorageError, match=f"{path}: the snapshot was not written: OSError: disk full. "
                       f"The previous snapshot at {path} is unchanged. No temporary file is left."):
        snapshot.save(make_snapshot(samples=2), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.snap"]  # no temp file left


def test_a_process_killed_mid_save_leaves_the_previous_file_intact(tmp_path) -> None:
    path = tmp_path / "a.snap"
    snapshot.save(make_snapshot(samples=1), path)
    before = path.read_bytes()
    # A child writes a large file through atomic_write and is killed while writing.
    script = textwrap.dedent(f"""
        import os, signal
        from snapshot.storage import _atomic
        class Killer:
            def __init__(self): self.n = 0
        real_write = os.write
        data = b"x" * (64 * 1024 * 1024)
        import builtins
        real_open = os.fdopen
        def fdopen(fd, *a, **k):
            f = real_open(fd, *a, **k)
            w = f.write
            def write(b):
                w(b[: len(b) // 2]); f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            f.write = write
            return f
        os.fdopen = fdopen
        _atomic.atomic_write({str(path)!r}, data)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9
    assert path.read_bytes() == before
    snapshot.load(path)


def file_bytes() -> bytes:
    return make_snapshot().to_bytes()


def test_empty_file(tmp_path) -> None:
    path = tmp_path / "empty.snap"
    path.write_bytes(b"")
    with pytest.raises(snapshot.EmptySnapshotError, match="empty"):
        snapshot.load(path)
    with pytest.raises(snapshot.EmptySnapshotError):
        snapshot.read_manifest(path)


@pytest.mark.parametrize("keep", [1, 10, 20, 94, 200, -100, -1])
def test_truncated_file_at_many_offsets(tmp_path, keep: int) -> None:
    data = file_bytes()
    path = tmp_path / "cut.snap"
    path.write_bytes(data[:keep])
    with pytest.raises(snapshot.TruncatedSnapshotError) as info:
        snapshot.load(path)
    assert str(path) in str(info.value)
    assert "cut short" in str(info.value) or "ends after" in str(info.value)


def test_every_truncation_is_a_snapshot_error() -> None:
    data = file_bytes()
    for keep in range(0, len(data), max(1, len(data) // 300)):
        with pytest.raises(snapshot.SnapshotFileError):
            snapshot.load(data[:keep])


def test_corrupted_manifest_and_payload_are_detected() -> None:
    data = bytearray(file_bytes())
    payload_len = struct.unpack_from("<IQ", data, len(fmt.MAGIC) + 4)[1]
    # format 2: the header (93 bytes), the payload, then the manifest
    places = ((94 + 5, "payload"), (94 + payload_len - 2, "payload"), (94 + payload_len + 5, "manifest"),
              (len(data) - 1, "manifest"))
    for offset, what in places:
        broken = bytearray(data)
        broken[offset] ^= 0xFF
        with pytest.raises(snapshot.CorruptSnapshotError, match=f"{what} checksum"):
            snapshot.load(bytes(broken))


def test_trailing_garbage_is_detected() -> None:
    with pytest.raises(snapshot.CorruptSnapshotError, match="unexpected bytes"):
        snapshot.load(file_bytes() + b"junk")


def test_a_corrupted_payload_is_never_unpickled(tmp_path) -> None:
    """A payload that would run code is refused by its checksum before unpickling."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    data = bytearray(file_bytes())
    manifest_len, payload_len = struct.unpack_from("<IQ", data, len(fmt.MAGIC) + 4)
    evil = b"P" + pickle.dumps(Evil())
    start = 94 + manifest_len
    data[start:start + payload_len] = evil
    data[len(fmt.MAGIC) + 8:len(fmt.MAGIC) + 16] = struct.pack("<Q", len(evil))
    with pytest.raises(snapshot.CorruptSnapshotError):
        snapshot.load(bytes(data))
    assert not marker.exists()


@pytest.mark.parametrize("content, looks_like", [
    (b"\x80\x04K\x01.", "raw pickle"),
    (b'{"a": 1}', "JSON"),
    (b"hello world, not a snapshot", "starting with"),
])
def test_foreign_files(tmp_path, content: bytes, looks_like: str) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    with pytest.raises(snapshot.ForeignFileError, match=looks_like):
        snapshot.load(path)


def test_a_torch_checkpoint_is_recognised(tmp_path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(snapshot.ForeignFileError, match="zip archive"):
        snapshot.load(path)
    with pytest.raises(snapshot.ForeignFileError):
        snapshot.read_manifest(path)


def test_newer_container_version_is_version_skew() -> None:
    data = bytearray(file_bytes())
    struct.pack_into("<H", data, len(fmt.MAGIC), 4)
    with pytest.raises(snapshot.VersionSkewError,
                       match=r"format 4.*reads formats 1 to 3.*pip install -U datapipe-snapshot"):
        snapshot.load(bytes(data))


def test_newer_manifest_format_is_version_skew() -> None:
    snap = make_snapshot()
    manifest = dict(snap.manifest, format=7)
    data = fmt.pack(manifest, snap.state_dict()["payload"])
    with pytest.raises(snapshot.VersionSkewError, match="format 7"):
        snapshot.load(data)


def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(snapshot.SnapshotFileError, match="no such file"):
        snapshot.load(tmp_path / "nope.snap")
    with pytest.raises(snapshot.SnapshotFileError, match="directory"):
        snapshot.load(tmp_path)


def test_read_manifest_never_unpickles(tmp_path) -> None:
    """A snapshot whose graph uses a module that is not importable here still inspects."""
    module = tmp_path / "gone_module.py"
    module.write_text("def f(x):\n    return x + 1\n")
    snap_path = tmp_path / "a.snap"
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import gone_module, snapshot
        from torch.utils.data.datapipes.iter import IterableWrapper
        dl = snapshot.DataLoader2(IterableWrapper(range(5)).map(gone_module.f))
        it = iter(dl); next(it)
        dl.save_snapshot({str(snap_path)!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    module.unlink()
    manifest = snapshot.read_manifest(snap_path)
    assert manifest["graph"]["nodes"][0]["args"]["fn"] == "gone_module.f"
    snapshot.load(snap_path)  # the state loads; the graph stays pickled until it is needed
    with pytest.raises(snapshot.SerializationError, match="gone_module.*not importable"):
        snapshot.DataLoader2.from_snapshot(snap_path)


def test_state_dict_form_survives_torch_save_with_weights_only(tmp_path) -> None:
    snap = make_snapshot()
    path = tmp_path / "ckpt.pt"
    torch.save({"data": snap.state_dict()}, path)
    state = torch.load(path, weights_only=True)["data"]
    assert snapshot.load(state).state == snap.state


def test_tampered_state_dict_is_refused() -> None:
    state = make_snapshot().state_dict()
    state["payload"] = state["payload"][:-1] + b"x"
    with pytest.raises(snapshot.CorruptSnapshotError, match="payload checksum"):
        snapshot.load(state)


def test_torchdata_state_dict_is_named(tmp_path) -> None:
    with pytest.raises(snapshot.ForeignFileError, match="torchdata 0.9"):
        snapshot.load({"serialized_datapipe": b"", "reading_service_state": None})


def test_signed_files(tmp_path) -> None:
    snap = make_snapshot()
    path = tmp_path / "signed.snap"
    snapshot.save(snap, path, key="secret")
    assert snapshot.load(path, key="secret").state == snap.state
    assert snapshot.load(path).state == snap.state  # checksums still verified without a key
    with pytest.raises(snapshot.SignatureError, match="another key"):
        snapshot.load(path, key="other")
    unsigned = tmp_path / "unsigned.snap"
    snapshot.save(snap, unsigned)
    with pytest.raises(snapshot.SignatureError, match="not signed"):
        snapshot.load(unsigned, key="secret")


def test_graph_that_cannot_be_pickled_names_the_pipe() -> None:
    gen = (i for i in range(3))
    with pytest.raises(snapshot.SerializationError) as info:
        snapshot.DataLoader2(IterableWrapper(range(3)).map(graphs.double).zip(IterableWrapper(gen)))
    message = str(info.value)
    assert "0/datapipes/1" in message and "iterable" in message and "include_graph=False" in message


def test_a_corrupted_payload_is_placed_in_the_payload_not_at_its_start() -> None:
    """A digest of the whole payload cannot say which byte changed: the message gives the payload's range."""
    data = bytearray(file_bytes())
    _, payload_len = struct.unpack_from("<IQ", data, len(fmt.MAGIC) + 4)
    start, end = 93, 93 + payload_len - 1  # format 2: the payload follows the header
    data[end] ^= 0xFF
    with pytest.raises(snapshot.CorruptSnapshotError) as caught:
        snapshot.load(bytes(data))
    assert f"some byte in the payload (bytes {start:,} to {end:,} of the file)" in str(caught.value)
    assert "at byte" not in str(caught.value) and caught.value.offset is None


def test_an_unpicklable_buffered_sample_is_named_once_in_plain_words(tmp_path) -> None:
    """A sample that is neither data nor picklable (a generator) fails the save with where it sits."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    dl = snapshot.DataLoader2(IterableWrapper(range(10)).map(_counting_from).shuffle(buffer_size=5))
    dl.seed(0)
    it = iter(dl)
    next(it)
    with pytest.raises(snapshot.SerializationError) as info:
        dl.save_snapshot(tmp_path / "a.snap")
    dl.shutdown()
    message = str(info.value)
    assert message.startswith("cannot pickle the state of the DataPipe at "), message
    assert "the the" not in message and "generator" in message


def _counting_from(start: int) -> object:
    return (n for n in range(start, start + 3))
