"""Directories, arguments and killed saves: each refused with a clear error, nothing left behind.

A directory snapshot here is built the way a distributed save lays it out (``manifest.snap``,
the index, and ``rank-00000.snap``), from an in-process loader's snapshot, so these tests need
no process group. The kill loop runs real saving processes, holds each at a random point of its write
and SIGKILLs it there.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import snapshot
from snapshot import format as fmt
from snapshot import multipart
from snapshot.cli import main as cli
from snapshot.container import _dict_form
from snapshot.storage import _atomic
from tests import graphs, helpers


def saved(n: int = 30, steps: int = 2) -> tuple[snapshot.Snapshot, list[Any]]:
    with helpers.loader_at(graphs.linear(n=n), steps, seed=3) as (dl, it):
        return dl.save_snapshot(), list(it)


SNAP, REST = saved()
OTHER, _ = saved(steps=3)


def write_directory(path: Path, snap: snapshot.Snapshot = SNAP, index: dict[str, Any] | None = None) -> Path:
    path.mkdir()
    data = snap.to_bytes()
    (path / "rank-00000.snap").write_bytes(data)
    if index is None:
        index = multipart.distributed_manifest([multipart.part_info(0, snap.manifest, data)])
    (path / "manifest.snap").write_bytes(fmt.pack(index, b""))
    return path


def index_of(snap: snapshot.Snapshot = SNAP) -> dict[str, Any]:
    data = snap.to_bytes()
    return multipart.distributed_manifest([multipart.part_info(0, snap.manifest, data)])


# -- directories ------------------------------------------------------------------------------

def test_a_directory_snapshot_restores_exactly(tmp_path: Path) -> None:
    directory = write_directory(tmp_path / "d.snap")
    loader = snapshot.DataLoader2(graphs.linear(n=30))
    loader.restore_snapshot(str(directory))
    assert list(loader) == REST
    assert cli(["verify", str(directory)]) == 0


def _swap_part(directory: Path) -> None:
    (directory / "rank-00000.snap").write_bytes(OTHER.to_bytes())


def _index_with(edit: Any) -> dict[str, Any]:
    index = index_of()
    edit(index)
    return index


@pytest.mark.parametrize(("case", "error", "message"), [
    ("part from another save", snapshot.CorruptSnapshotError, "is not the part the index records"),
    ("missing part", snapshot.SnapshotFileError, "lists rank-00000.snap (rank 0), which is missing"),
    ("part is a directory", snapshot.SnapshotFileError, "rank-00000.snap is a directory where rank 0's part"),
    ("index is a directory", snapshot.SnapshotFileError, "manifest.snap is a directory"),
    ("no index", snapshot.SnapshotFileError, "is a directory without manifest.snap"),
    ("index lists no parts", snapshot.CorruptSnapshotError, "lists no parts"),
    ("parts not a list", snapshot.ManifestError, "parts: expected a list, got 'rank-00000.snap'"),
    ("part outside", snapshot.ManifestError, "parts[0].file: expected 'rank-00000.snap'"),
    ("bad digest", snapshot.ManifestError, "parts[0].sha256: expected a sha256 digest"),
    ("ranks out of order", snapshot.ManifestError, "parts[0].rank: expected 0"),
    ("index is garbage", snapshot.ForeignFileError, "not a snapshot file"),
])
def test_a_broken_directory_is_a_clear_snapshot_error(tmp_path: Path, case: str, error: type, message: str) -> None:
    directory = tmp_path / "d.snap"
    edits = {
        "parts not a list": lambda i: i.update(parts="rank-00000.snap"),
        "part outside": lambda i: i["parts"][0].update(file="../secret"),
        "bad digest": lambda i: i["parts"][0].update(sha256=5),
        "ranks out of order": lambda i: i["parts"][0].update(rank=1, file="rank-00001.snap"),
    }
    write_directory(directory, index=_index_with(edits[case]) if case in edits else None)
    if case == "part from another save":
        _swap_part(directory)
    elif case == "missing part":
        (directory / "rank-00000.snap").unlink()
    elif case == "part is a directory":
        (directory / "rank-00000.snap").unlink()
        (directory / "rank-00000.snap").mkdir()
    elif case == "index is a directory":
        (directory / "manifest.snap").unlink()
        (directory / "manifest.snap").mkdir()
    elif case == "no index":
        (directory / "manifest.snap").unlink()
    elif case == "index lists no parts":
        (directory / "manifest.snap").write_bytes(fmt.pack(_index_with(lambda i: i.pop("parts")), b""))
    elif case == "index is garbage":
        (directory / "manifest.snap").write_bytes(b"{not a snapshot}")
    with pytest.raises(error) as info:
        snapshot.load(str(directory))
    assert message in str(info.value)
    loader = snapshot.DataLoader2(graphs.linear(n=30))
    with pytest.raises(snapshot.SnapshotError):
        loader.restore_snapshot(str(directory))
    assert cli(["verify", str(directory)]) != 0


def test_an_index_passed_as_a_file_says_to_pass_its_directory(tmp_path: Path) -> None:
    directory = write_directory(tmp_path / "d.snap")
    with pytest.raises(snapshot.SnapshotFileError, match="index of a distributed snapshot.*pass the directory"):
        snapshot.load(str(directory / "manifest.snap"))


def test_a_state_dict_whose_index_and_payload_disagree_is_refused() -> None:
    index = index_of()
    index["parts"].append({**index["parts"][0], "rank": 1, "file": "rank-00001.snap"})
    index["ranks"].append({**index["ranks"][0], "rank": 1})
    index["service"]["ranks"] = 2  # an index consistent in itself: only the payload disagrees
    index["loader"]["yielded"] *= 2
    payload = multipart.join_parts([SNAP.to_bytes()])
    index["payload"] = fmt.payload_record(payload)
    with pytest.raises(snapshot.CorruptSnapshotError, match="lists 2 parts but its payload holds 1"):
        snapshot.load(_dict_form.to_state_dict(index, payload))


# -- arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("src", [None, 3, 2.5, object(), [b"x"]])
def test_loading_something_that_is_not_a_snapshot_source_is_a_type_error(src: Any) -> None:
    with pytest.raises(TypeError, match="reads a path .*got a"):
        snapshot.load(src)
    with pytest.raises(TypeError, match="reads a path"):
        snapshot.DataLoader2(graphs.linear(n=30)).restore_snapshot(src)
    with pytest.raises(TypeError, match="reads a path"):
        snapshot.restore(snapshot.DataLoader2(graphs.linear(n=30)), src)


def test_capture_and_restore_take_a_loader(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="takes a snapshot.DataLoader2, not a NoneType"):
        snapshot.capture(None)
    with pytest.raises(TypeError, match="got a str as the loader"):
        snapshot.restore("data.snap", SNAP)  # arguments swapped
    with pytest.raises(TypeError, match="verify must be a non-negative int"):
        snapshot.capture(snapshot.DataLoader2(graphs.linear(n=30)), verify=-1)


def test_a_text_mode_file_or_a_wrong_key_is_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "a.snap"
    snapshot.save(SNAP, str(path))
    with open(path, encoding="latin-1") as f, pytest.raises(TypeError, match="binary"):
        snapshot.load(f)
    with pytest.raises(TypeError, match="read from a path"):
        snapshot.read_manifest(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be bytes or str"):
        snapshot.load(str(path), key=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("snap", "dest", "message"), [
    ("not a snapshot", "x.snap", "takes a Snapshot"),
    (None, "x.snap", "takes a Snapshot"),
    (SNAP, None, "saved to a path .* not a NoneType"),
    (SNAP, 5, "saved to a path .* not a int"),
    (SNAP, io.StringIO(), "mode 'wb'"),
])
def test_saving_with_wrong_arguments_is_a_type_error(tmp_path: Path, snap: Any, dest: Any, message: str) -> None:
    if isinstance(dest, str):
        dest = str(tmp_path / dest)
    with pytest.raises(TypeError, match=message):
        snapshot.save(snap, dest)
    assert os.listdir(tmp_path) == []


def test_paths_that_cannot_be_read_or_written_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "a.snap"
    with pytest.raises(snapshot.SnapshotFileError) as info:
        snapshot.load(str(missing))
    assert str(missing) in str(info.value) and "does not exist either" in str(info.value)
    with pytest.raises(snapshot.SnapshotFileError, match="no such file"):
        snapshot.load(str(tmp_path / "a.snap"))
    with pytest.raises(snapshot.SnapshotFileError, match="directory without manifest.snap"):
        snapshot.load(str(tmp_path))
    with pytest.raises(snapshot.SnapshotFileError) as info:
        snapshot.save(SNAP, str(tmp_path))  # an existing directory where a file goes
    assert str(tmp_path) in str(info.value) and "is a directory" in str(info.value)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(snapshot.SnapshotFileError, match="a file is in the way"):
        snapshot.save(SNAP, str(tmp_path / "file" / "a.snap"))
    with pytest.raises(snapshot.SnapshotFileError, match="a part of this path is a file"):
        snapshot.load(str(tmp_path / "file" / "a.snap"))
    snapshot.save(SNAP, str(tmp_path / "new" / "a.snap"))  # a missing parent is created on save
    assert snapshot.load(str(tmp_path / "new" / "a.snap")).yielded == SNAP.yielded


# -- killed saves -----------------------------------------------------------------------------

SAVER = textwrap.dedent("""
    import sys
    from snapshot.storage import _atomic
    data, stop, size = open(sys.argv[1], "rb").read(), int(sys.argv[3]), 1 << 16

    def pieces():
        for n, start in enumerate(range(0, len(data), size)):
            if n == stop:
                print("written", start, flush=True)
                sys.stdin.read()  # held mid-write until the test kills this process
            yield data[start:start + size]

    _atomic.atomic_write(sys.argv[2], pieces())
""")


def ours(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if ".snapshot-tmp." in name)


def test_saves_killed_at_random_points_leave_the_previous_snapshot_and_no_temporary(tmp_path: Path) -> None:
    rng = random.Random(13)
    from torch.utils.data.datapipes.iter import IterableWrapper

    # about 3 MB: the source's items are pickled with the graph
    dl = snapshot.DataLoader2(IterableWrapper([f"{i:0>1000}" for i in range(3000)]).shuffle(buffer_size=50))
    dl.seed(1)
    it = iter(dl)
    next(it)
    snap = dl.save_snapshot()
    next(it)
    blob = tmp_path / "blob"  # the next snapshot, which the killed saves write over the first
    blob.write_bytes(dl.save_snapshot().to_bytes())
    new = blob.read_bytes()
    assert len(new) > 2_000_000
    target = tmp_path / "ckpt" / "data.snap"
    snapshot.save(snap, str(target))
    old = target.read_bytes()
    foreign = target.parent / ".data.snap.snapshot-tmp.notapid.x"  # not ours by name: never touched
    foreign.write_bytes(b"someone else's")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    left = 0
    for _ in range(12):
        stop = rng.randrange(1, len(new) >> 16)  # pieces of 64 KiB written before the kill
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(blob), str(target), str(stop)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout is not None
            written = int(proc.stdout.readline().split(b"written ")[1])
            (temporary,) = [n for n in ours(target.parent) if f".snapshot-tmp.{proc.pid}." in n]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        # the kill landed mid-write: the new snapshot's first bytes (not the old one's) are in its temporary
        partial = (target.parent / temporary).read_bytes()
        assert 0 < written == len(partial) < len(new) and partial == new[:written] != old[:written]
        assert target.read_bytes() == old  # the previous snapshot is intact, byte for byte
        assert snapshot.load(str(target)).yielded == 1
        left = max(left, len(ours(target.parent)) - 1)  # what the kills left, besides the foreign file
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)  # a writer that is surely gone, whatever the kills above left
    (target.parent / f".data.snap.snapshot-tmp.{gone.pid}.{_atomic._host_tag()}-dead").write_bytes(b"x" * 1000)
    (target.parent / f".data.snap.snapshot-tmp.{gone.pid}.00000000-othermachine").write_bytes(b"x")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a temporary of a writer that is still running is left alone
        alive = target.parent / f".data.snap.snapshot-tmp.{live.pid}.{_atomic._host_tag()}-abcd"
        alive.write_bytes(b"in progress")
        snapshot.save(snap, str(target))
        other_machine = f".data.snap.snapshot-tmp.{gone.pid}.00000000-othermachine"
        assert ours(target.parent) == sorted([alive.name, foreign.name, other_machine]), left
    finally:
        live.kill()
        live.wait(timeout=30)
    snapshot.save(snap, str(target))
    assert ours(target.parent) == sorted([foreign.name, other_machine])
    assert snapshot.load(str(target)).yielded == 1
    shutil.rmtree(target.parent)
