"""Atomic writes: a file holds its old content or all of the new, never a part.

Saves write ``.NAME.snapshot-tmp.<pid>.<host>-<random>`` and rename it over ``NAME``; the
next save into a directory removes such files whose writer is gone (a killed save). A path
with a scheme (``s3://...``) is written in one upload through :mod:`snapshot.storage._fsspec`.
A write the storage refuses (a full disk, a file-size limit, ...) removes its temporary file and
raises a :class:`~snapshot.errors.StorageError` saying so (:mod:`snapshot.storage._failures`).

This module knows nothing of snapshots: bytes in, bytes out.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import secrets
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from snapshot.container.format import PathOrFile
from snapshot.errors import SnapshotError, SnapshotFileError
from snapshot.storage import _failures, _fsspec

__all__ = ["atomic_file", "atomic_write", "remove_stale_temporaries", "temp_name"]

#: A temporary file of a save in progress: ``.NAME.snapshot-tmp.<pid>.<host>-<random>``.
_TEMP = re.compile(r"\.(?P<name>.+)\.snapshot-tmp\.(?P<pid>\d+)\.(?P<host>[0-9a-f]{8})-[0-9a-z_]+")


@functools.lru_cache(maxsize=1)
def _host_tag() -> str:
    """Eight hex digits naming this machine, so that a temporary file written by another machine
    sharing the directory is never taken for one whose writer is gone."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def temp_name(dest_name: str) -> str:
    """A fresh temporary name for a save of ``dest_name`` by this process."""
    return f".{dest_name}.snapshot-tmp.{os.getpid()}.{_host_tag()}-{secrets.token_hex(4)}"


def remove_stale_temporaries(directory: str) -> list[str]:
    """Remove the temporary files that saves killed mid-way left in ``directory``.

    Only files named like ours (see :func:`temp_name`), written on this machine by a process
    that no longer exists, are removed; a save running in another process is left alone.
    Returns the names removed.
    """
    removed: list[str] = []
    host, me = _host_tag(), os.getpid()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TEMP.fullmatch(name)
        if match is None or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == me or _pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:  # gone meanwhile, a directory, or the storage refuses: the save reports its own failure
            pass
    return removed


def _check_writable(dest: Any) -> None:
    if isinstance(dest, (str, os.PathLike)):
        if isinstance(os.fspath(dest), bytes):
            raise TypeError("a snapshot path must be a str or an os.PathLike of str, not bytes")
        return
    if not callable(getattr(dest, "write", None)):
        raise TypeError(f"a snapshot is saved to a path (str or os.PathLike) or a binary file object open for "
                        f"writing, not a {type(dest).__name__}")
    if isinstance(dest, io.TextIOBase):
        raise TypeError("a snapshot is binary: open the file with mode 'wb', not in text mode")


_NO_TEMPORARY = "No temporary file is left."
#: Bytes per write when a save reports its progress.
_CHUNK = 8 << 20


def atomic_write(dest: PathOrFile, data: bytes | Sequence[bytes], *,
                 progress: Callable[[int], None] | None = None) -> None:
    """Write ``data`` (bytes, or pieces written one after the other) so that ``dest`` holds
    either its old content or all of ``data`` (see :func:`atomic_file`). ``progress(n)`` is told of
    every chunk written."""
    _check_writable(dest)
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    if _fsspec.is_url(dest):
        _fsspec.write_bytes(str(dest), chunks)
        return
    with atomic_file(dest) as f:
        for chunk in chunks:
            if progress is None:
                f.write(chunk)
                continue
            view = memoryview(chunk)
            for start in range(0, len(view), _CHUNK):
                progress(f.write(view[start:start + _CHUNK]))


@contextlib.contextmanager
def atomic_file(dest: PathOrFile) -> Iterator[IO[bytes]]:
    """A seekable binary file to write ``dest`` through: ``dest`` holds its old content or all of
    what was written once the block ends without an error.

    Paths are written to a temporary file in the same directory (named ``.NAME.snapshot-tmp.
    <pid>.<host>-<random>``), flushed and fsync'ed, then renamed over ``dest``; the directory
    is fsync'ed so the rename survives a crash. Temporary files left by saves that were killed
    are removed first (see :func:`remove_stale_temporaries`). Missing parent directories are
    created. A URL is written to a local temporary file, uploaded whole at the end. A binary file
    object is written to directly when it can seek, else through a local temporary file.
    """
    _check_writable(dest)
    if not isinstance(dest, (str, os.PathLike)):
        name = str(getattr(dest, "name", "<file object>"))
        try:
            if _seekable(dest):
                yield dest
            else:
                with tempfile.TemporaryFile() as spool:
                    yield spool
                    spool.seek(0)
                    for chunk in iter(lambda: spool.read(_CHUNK), b""):
                        dest.write(chunk)
            flush = getattr(dest, "flush", None)
            if flush is not None:
                flush()
        except OSError as exc:
            if isinstance(exc, SnapshotError):
                raise
            raise _failures.write_error(exc, name, intact="A file object is written in place, not atomically: "
                                        "it may hold a part of the snapshot.") from exc
        return
    if _fsspec.is_url(dest):
        url = str(dest)
        try:
            with tempfile.TemporaryFile() as spool:
                yield spool
                spool.seek(0)
                _fsspec.write_bytes(url, iter(lambda: spool.read(_CHUNK), b""))  # type: ignore[arg-type]
        except OSError as exc:
            if isinstance(exc, SnapshotError):
                raise
            raise _failures.write_error(exc, url, intact=_fsspec.intact_at(url),
                                        what="the snapshot was not written (its local temporary copy failed)"
                                        ) from exc
        return
    path, directory = _prepare(dest)
    tmp = os.path.join(directory, temp_name(os.path.basename(path)))
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise _failures.write_error(exc, path, intact=f"{_failures.intact_at(path)} {_NO_TEMPORARY}") from exc
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        left = _remove(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, SnapshotError):
            raise _failures.write_error(exc, path, intact=f"{_failures.intact_at(path)} {left}") from exc
        raise
    try:
        _sync_directory(directory)
    except OSError as exc:
        raise _failures.write_error(
            exc, path, what="the snapshot was written but may not survive a crash",
            intact=f"The new snapshot is at {path}, but its directory could not be synced: after a crash of the "
                   "machine the previous one may be back.") from exc


def _remove(tmp: str) -> str:
    """Remove a failed save's temporary file; what is left, in a sentence."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return (f"Its temporary file {tmp} could not be removed ({exc.strerror or exc}); the next save into the "
                "directory removes it.")
    return _NO_TEMPORARY


def _sync_directory(directory: str) -> None:
    """fsync ``directory``, so that a rename in it survives a crash."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _seekable(f: Any) -> bool:
    try:
        return bool(f.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _prepare(dest: str | os.PathLike[str]) -> tuple[str, str]:
    """The absolute path and directory of ``dest``, the directory made, stale temporaries removed."""
    path = os.path.abspath(os.fspath(dest))
    source = os.fspath(dest)
    if os.path.isdir(path):
        raise SnapshotFileError(
            "is a directory; a snapshot file needs a file path (a distributed run's directory snapshot is "
            "written by save_snapshot() on every rank)", source=source)
    directory = os.path.dirname(path)
    try:
        if not os.path.isdir(directory):  # one stat where it exists (makedirs tries mkdir, then stats)
            os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise SnapshotFileError(
            f"cannot create the directory {directory}: a file is in the way ({exc.filename or directory})",
            source=source) from exc
    except OSError as exc:
        raise _failures.write_error(exc, source, what=f"the snapshot was not written (cannot create the directory "
                                    f"{directory})") from exc
    remove_stale_temporaries(directory)
    return path, directory
