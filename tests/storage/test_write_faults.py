"""The storage failing under a save: a file-size limit (EFBIG), a real full disk (ENOSPC), a read-only
filesystem (EROFS), a permission (EACCES), an I/O error when syncing (EIO), a directory removed mid-save.

Each is a ``StorageError`` naming the path, the cause and what is intact. The previous snapshot is
unchanged and restores exactly, no temporary file is left, the live stream goes on unchanged, a later
save works, and the process ends. The loader is the one of issue 32: a 4 MB shuffle buffer.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

import snapshot
from tests import graphs
from tests.faults import big_graph, fill, held_graph, index_of, remount_read_only, tmpfs
from tests.integration_jobs import run_job


@functools.cache
def reference() -> list[int]:
    """The uninterrupted epoch (sample indices) of :func:`big_graph` seeded with 3."""
    with snapshot.DataLoader2(big_graph()) as dl:
        dl.seed(3)
        return [index_of(x) for x in dl]


def restores_exactly(path: Path, taken: int) -> None:
    """The snapshot at ``path``, saved after ``taken`` samples, continues the reference exactly."""
    with snapshot.DataLoader2(big_graph()) as dl:
        dl.restore_snapshot(path)
        assert [index_of(x) for x in dl] == reference()[taken:]


def described(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "errno": getattr(exc, "errno", None),
            "cause": getattr(exc, "cause", None), "oserror": isinstance(exc, OSError)}


def check_error(error: dict[str, Any], dest: Path, cause: str, said: str, intact: str) -> None:
    assert error["type"] == "StorageError" and error["oserror"], error
    assert error["cause"] == cause and error["errno"] == getattr(errno, cause), error
    assert error["message"].startswith(f"{dest}: the snapshot was not written: {said}."), error["message"]
    assert intact in error["message"], error["message"]


#: Issue 32's reproducer: a snapshot at sample 100, then at 150 a save under a 1 MB file-size limit
#: (blocking, or in the background), the limit lifted, a later save, the epoch finished, the exit.
EFBIG_JOB = """
import json, os, resource, signal, sys
import snapshot
from tests.faults import big_graph, index_of
from tests.storage.test_write_faults import described

dest, mode = sys.argv[1], sys.argv[2]
dl = snapshot.DataLoader2(big_graph())
dl.seed(3)
it = iter(dl)
seen = [index_of(next(it)) for _ in range(100)]
dl.save_snapshot(dest)
seen += [index_of(next(it)) for _ in range(50)]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
error = None
try:
    if mode == "blocking":
        dl.save_snapshot(dest)
    else:
        dl.save_snapshot(dest, blocking=False).result(timeout=60)
except Exception as exc:
    error = described(exc)
left = sorted(os.listdir(os.path.dirname(dest)))
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
seen += [index_of(next(it)) for _ in range(10)]
dl.save_snapshot(dest + ".later")
seen += [index_of(x) for x in it]
print(json.dumps({"error": error, "left": left, "seen": seen}))
"""


@pytest.mark.parametrize("mode", ["blocking", "background"])
def test_a_file_size_limit_mid_save_is_a_storage_error_and_the_process_ends(tmp_path, mode: str) -> None:
    dest = tmp_path / "ckpt" / "data.snap"
    dest.parent.mkdir()
    (tmp_path / "job.py").write_text(EFBIG_JOB)
    output = run_job([str(tmp_path / "job.py"), str(dest), mode], cwd=tmp_path, timeout=240)
    result = json.loads(output.strip().splitlines()[-1])
    check_error(result["error"], dest, "EFBIG", "the file-size limit was reached (EFBIG: File too large)",
                f"The previous snapshot at {dest} is unchanged. No temporary file is left. Raise the limit")
    assert result["left"] == ["data.snap"]
    assert result["seen"] == reference()  # the live stream went on unchanged
    restores_exactly(dest, 100)
    restores_exactly(Path(f"{dest}.later"), 160)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_a_full_disk_mid_save_is_a_storage_error_and_loses_nothing(tmp_path, blocking: bool) -> None:
    with tmpfs(tmp_path / "disk", 10) as disk:
        fill(disk / "ballast", 3)  # with a 4 MB snapshot on it, no room for a second one
        dest = disk / "data.snap"
        with snapshot.DataLoader2(big_graph()) as dl:
            dl.seed(3)
            it = iter(dl)
            seen = [index_of(next(it)) for _ in range(100)]
            dl.save_snapshot(dest)
            before = dest.read_bytes()
            seen += [index_of(next(it)) for _ in range(50)]
            if blocking:
                with pytest.raises(snapshot.StorageError) as info:
                    dl.save_snapshot(dest)
                error: BaseException | None = info.value
            else:
                error = dl.save_snapshot(dest, blocking=False).exception(timeout=60)
            assert error is not None
            check_error(described(error), dest, "ENOSPC", "the disk is full (ENOSPC: No space left on device)",
                        f"The previous snapshot at {dest} is unchanged. No temporary file is left. Free space")
            assert sorted(os.listdir(disk)) == ["ballast", "data.snap"] and dest.read_bytes() == before
            (disk / "ballast").unlink()
            seen += [index_of(next(it)) for _ in range(10)]
            dl.save_snapshot(disk / "later.snap")  # room again: a later save works
            seen += [index_of(x) for x in it]
        assert seen == reference()
        restores_exactly(dest, 100)
        restores_exactly(disk / "later.snap", 160)


def test_a_read_only_filesystem_is_a_storage_error(tmp_path) -> None:
    with tmpfs(tmp_path / "disk", 4) as disk:
        dest = disk / "ckpt" / "data.snap"
        with snapshot.DataLoader2(graphs.linear()) as dl:
            dl.seed(0)
            it = iter(dl)
            next(it)
            dl.save_snapshot(dest)
            rest = list(it)
            remount_read_only(disk)
            with pytest.raises(snapshot.StorageError) as info:
                dl.save_snapshot(dest)
            check_error(described(info.value), dest, "EROFS",
                        "the filesystem is read-only (EROFS: Read-only file system)",
                        f"The previous snapshot at {dest} is unchanged. No temporary file is left. Save to a writable "
                        "filesystem.")
            with pytest.raises(snapshot.StorageError, match=r"cannot create the directory .*EROFS") as info:
                dl.save_snapshot(disk / "new" / "data.snap")
            assert info.value.cause == "EROFS"
        assert os.listdir(disk / "ckpt") == ["data.snap"]
        with snapshot.DataLoader2(graphs.linear()) as again:
            again.restore_snapshot(dest)  # reads work on a read-only filesystem
            assert list(again) == rest


#: A save as root, then as ``nobody`` (root writes anywhere): a save into root's directory, a load of a
#: snapshot only root may read.
EACCES_JOB = """
import json, os, sys
import snapshot
from tests import graphs
from tests.faults import drop_privileges
from tests.storage.test_write_faults import described

dest = sys.argv[1]
dl = snapshot.DataLoader2(graphs.linear())
dl.seed(0)
it = iter(dl)
next(it)
dl.save_snapshot(dest)
snapshot.load(dest)
next(it)
os.chmod(dest, 0o600)
drop_privileges()
out = {}
for name, call in (("save", lambda: dl.save_snapshot(dest)), ("load", lambda: snapshot.load(dest))):
    try:
        call()
        out[name] = None
    except Exception as exc:
        out[name] = described(exc)
print(json.dumps(out))
"""


def test_a_permission_refused_is_a_storage_error(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the test becomes 'nobody' to be refused (root may write anywhere)")
    work = Path(tempfile.mkdtemp(prefix="snapshot-eacces-"))  # outside root's private tmp_path
    try:
        work.chmod(0o755)
        dest = work / "data.snap"
        (tmp_path / "job.py").write_text(EACCES_JOB)
        output = run_job([str(tmp_path / "job.py"), str(dest)], cwd=tmp_path, timeout=120)
        result = json.loads(output.strip().splitlines()[-1])
        check_error(result["save"], dest, "EACCES", "permission denied (EACCES: Permission denied)",
                    f"The previous snapshot at {dest} is unchanged. No temporary file")
        load = result["load"]
        assert load["type"] == "StorageError" and load["cause"] == "EACCES", load
        assert load["message"].startswith(f"{dest}: cannot read the snapshot: permission denied (EACCES"), load
        assert os.listdir(work) == ["data.snap"]
    finally:
        shutil.rmtree(work)


def test_an_io_error_when_syncing_is_a_storage_error(tmp_path, monkeypatch) -> None:
    """EIO cannot be had from a real device here: ``os.fsync`` fails as a failing disk makes it fail."""
    dest = tmp_path / "data.snap"
    with snapshot.DataLoader2(graphs.linear()) as dl:
        dl.seed(0)
        it = iter(dl)
        next(it)
        dl.save_snapshot(dest)
        before = dest.read_bytes()
        next(it)

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fsync", failing)
        with pytest.raises(snapshot.StorageError) as info:
            dl.save_snapshot(dest)
    check_error(described(info.value), dest, "EIO", "an I/O error (EIO: Input/output error)",
                f"The previous snapshot at {dest} is unchanged. No temporary file is left. Check the device")
    assert dest.read_bytes() == before and os.listdir(tmp_path) == ["data.snap"]


def test_a_directory_removed_mid_save_is_a_storage_error(tmp_path, held) -> None:
    ckpt = tmp_path / "ckpt"
    dest = ckpt / "data.snap"
    with snapshot.DataLoader2(held_graph()) as dl:
        dl.seed(0)
        it = iter(dl)
        next(it)
        held.armed = True
        future = dl.save_snapshot(dest, blocking=False, include_graph=False)
        assert held.entered.wait(60)
        assert [name.startswith(".data.snap.snapshot-tmp.") for name in os.listdir(ckpt)] == [True]  # mid-write
        shutil.rmtree(ckpt)
        held.go.set()
        error = future.exception(timeout=60)
        assert len(list(it)) == 29  # the stream goes on
    assert isinstance(error, snapshot.StorageError) and error.cause == "ENOENT"
    assert str(error).startswith(f"{dest}: the snapshot was not written: a directory of the path does not exist "
                                 "(removed meanwhile?) (ENOENT"), str(error)
    assert f"Nothing was written: the directory {ckpt} does not exist (any more)." in str(error)
    assert not ckpt.exists()
