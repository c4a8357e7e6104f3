"""Where a snapshot's bytes come from: a path, a binary file, bytes, a URL (through fsspec) or
a distributed run's directory (its index). Reading is the first step of a restore and of every
command; checking and decoding the container is :mod:`snapshot.format`'s."""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import stat
from typing import IO, Any

from snapshot.container import _payload, format
from snapshot.container.capture import Snapshot
from snapshot.container.format import PathOrFile
from snapshot.errors import SnapshotFileError
from snapshot.storage import _failures, _fsspec

__all__ = ["path_error", "read_bytes", "read_container", "read_manifest", "read_snapshot", "reread_payload",
           "source_name"]


def source_name(src: PathOrFile) -> str:
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return str(getattr(src, "name", "<stream>"))


_ACCEPTED = "a path (str or os.PathLike), a binary file object open for reading, or bytes"


def _check_readable(src: Any) -> None:
    """A :class:`TypeError` saying what is accepted, for anything else."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return
    if isinstance(src, (str, os.PathLike)):
        if isinstance(os.fspath(src), bytes):
            raise TypeError("a snapshot path must be a str or an os.PathLike of str, not bytes")
        return
    if not callable(getattr(src, "read", None)):
        raise TypeError(f"a snapshot is read from {_ACCEPTED}, not from a {type(src).__name__}")
    if isinstance(src, io.TextIOBase):
        raise TypeError("a snapshot is binary: open the file with mode 'rb', not in text mode")


def path_error(exc: OSError, source: str) -> SnapshotFileError:
    """A clear error for a path that cannot be opened for reading."""
    parent = os.path.dirname(os.path.abspath(source))
    if isinstance(exc, FileNotFoundError):
        where = "" if os.path.isdir(parent) else f" (its directory {parent} does not exist either)"
        return SnapshotFileError(f"no such file{where}; check the path (a distributed snapshot is a directory)",
                                 source=source)
    if isinstance(exc, IsADirectoryError):
        return SnapshotFileError("this is a directory without a snapshot's index; pass the snapshot file "
                                 "inside it, or the directory a distributed run saved", source=source)
    if isinstance(exc, NotADirectoryError):
        return SnapshotFileError("a part of this path is a file, not a directory; check the path", source=source)
    return _failures.read_error(exc, source)


def read_bytes(src: PathOrFile) -> bytes:
    _check_readable(src)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if _fsspec.is_url(src):
        return _fsspec.read_bytes(str(src))
    if isinstance(src, (str, os.PathLike)):
        try:
            with open(src, "rb") as f:
                return f.read()
        except OSError as exc:
            raise path_error(exc, os.fspath(src)) from exc
    data = src.read()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"the file object returned {type(data).__name__} from read(), not bytes: open it in "
                        "binary mode ('rb')")
    return bytes(data)


def read_container(src: PathOrFile, *, key: bytes | str | None = None) -> format.Container:
    """Read and verify a snapshot file (path or binary file object)."""
    return format.unpack(read_bytes(src), source=source_name(src), key=key)


#: A snapshot file this small is read in one call and checked and decoded in memory: a read as it goes buffers
#: as much (msgpack reads 256 KiB at a time), and takes more calls.
_AT_ONCE = 256 << 10


def read_snapshot(path: str | os.PathLike[str], *, key: bytes | str | None = None, trusted: bool = False) -> Snapshot:
    """The snapshot in the file at ``path``, verified and decoded as the file is read: a format-3 payload with
    no pickled values is decoded from the file as it comes (its arrays read into their memory), so that the
    restore holds one copy of the state; any other payload, and a small file, is read, checked, then decoded."""
    source = os.fspath(path)
    try:
        # a small regular file in three calls (open, fstat, read): open() and read() of a file object take
        # more (each asks the size again), which counts in a small restore
        fd = os.open(source, os.O_RDONLY | _BINARY)
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), source)
            data = _read_all(fd, info.st_size) if stat.S_ISREG(info.st_mode) and info.st_size <= _AT_ONCE else None
            if data is None:  # a large file, or a pipe or device (read to its end)
                with open(fd, "rb", closefd=False) as f:
                    total = info.st_size
                    if total > _AT_ONCE:
                        return _read_large(f, total, source, key=key, trusted=trusted)
                    data = f.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise path_error(exc, source) from exc
    return Snapshot.from_container(format.unpack(data, source=source, key=key), source=source, trusted=trusted)


_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _read_all(fd: int, size: int) -> bytes:
    """The bytes of the file ``fd`` of ``size`` bytes, and any it has grown by since (as ``read()`` would)."""
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data  # a short read of a regular file is its end
    pieces = [data]
    while True:
        more = os.read(fd, 1 << 16)
        if not more:
            return b"".join(pieces)
        pieces.append(more)


def _read_large(f: IO[bytes], total: int, source: str, *, key: bytes | str | None, trusted: bool) -> Snapshot:
    container, reader = format.open_payload(f, total, source, key=key)
    record = container.info.payload
    if record is not None and record.encoding == _payload.ENCODING and not record.pickled \
            and not container.info.is_index:
        manifest = container.manifest
        return Snapshot.from_stream(container, reader, source=source,
                                    payload=lambda: reread_payload(source, manifest))
    payload = reader.read(reader.size)
    reader.verify()
    return Snapshot.from_container(dataclasses.replace(container, payload=payload), source=source, trusted=trusted)


def reread_payload(name: str, manifest: dict[str, Any]) -> bytes:
    """The payload of the snapshot file at ``name``, read again, checked against the manifest read before."""
    container = read_container(name)
    if container.manifest != manifest or container.payload is None:
        raise SnapshotFileError("the file was replaced since this snapshot was read from it (a later save to the "
                                "same path?): load the file again", source=name)
    return container.payload


def read_manifest(src: PathOrFile) -> dict[str, Any]:
    """The manifest of a snapshot file, verified, without reading or unpickling the payload.

    ``src`` is a path or a binary file object. The header and the manifest's checksum are
    checked (a damaged or foreign file raises a :class:`~snapshot.SnapshotFileError`); the
    payload is never read, so this is safe on a file of any origin.

    Examples:
        >>> import io
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> import snapshot
        >>> dl = snapshot.DataLoader2(IterableWrapper(range(10)).batch(2))
        >>> _ = next(iter(dl))
        >>> f = io.BytesIO()
        >>> snapshot.save(dl.save_snapshot(), f)
        >>> _ = f.seek(0)
        >>> manifest = snapshot.read_manifest(f)
        >>> manifest["loader"]["epoch"], manifest["loader"]["yielded"]
        (0, 1)
        >>> [node["path"] for node in manifest["graph"]["nodes"]]
        ['0', '0/datapipe']
    """
    _check_readable(src)
    source = source_name(src)
    if _fsspec.is_url(src):  # an object, or a distributed snapshot's index
        src = io.BytesIO(_fsspec.read_bytes(_fsspec.index_or_object(str(src))))
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(src) \
            and os.path.exists(os.path.join(src, format.DIRECTORY_MANIFEST)):
        src = os.path.join(src, format.DIRECTORY_MANIFEST)  # a distributed snapshot: its global manifest
        source = source_name(src)
    if isinstance(src, (str, os.PathLike)):
        try:
            with open(src, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                manifest = format.read_head(f, total, source)
        except OSError as exc:
            raise path_error(exc, source) from exc
        manifest.setdefault("_file", {})["size"] = total
        return manifest
    container = format.unpack(read_bytes(src), source=source, with_payload=False)
    manifest = dict(container.manifest)
    manifest.setdefault("_file", {})["size"] = container.size
    return manifest
