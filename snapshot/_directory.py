"""A snapshot as a directory: one part per rank, a manifest, swapped in atomically.

::

    ckpt/data.snap  ->  .data.snap.<token>/     (a symbolic link)
                          manifest.snap          the global manifest (parts, their digests)
                          rank-00000.snap        rank 0's part: a complete snapshot file
                          rank-00001.snap        ...

Each rank writes its part into a fresh staging directory; rank 0 writes the manifest last
and then replaces the link in one ``rename``. A crash at any point leaves the link pointing
at the previous complete directory. Readers check every part against the digest the
manifest records for it.

This module knows nothing of processes or ranks; the distributed service orchestrates it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any

from snapshot import format, schema
from snapshot.errors import CorruptSnapshotError, SnapshotFileError

__all__ = ["MANIFEST", "commit", "is_directory_snapshot", "part_name", "read_parts", "staging"]

MANIFEST = format.DIRECTORY_MANIFEST
part_name = schema.part_name


def staging(dest: str, token: str) -> str:
    """The directory the ranks write into before :func:`commit` (created here)."""
    dest = os.path.abspath(dest)
    path = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.{token}")
    os.makedirs(path, exist_ok=True)
    return path


def commit(dest: str, directory: str) -> None:
    """Point ``dest`` at ``directory`` atomically, then remove the directory it replaced."""
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and not os.path.islink(dest):
        raise SnapshotFileError(
            "exists and is not a snapshot written by a distributed run (a link to a directory); "
            "choose another path or remove it", source=dest)
    previous = os.path.realpath(dest) if os.path.islink(dest) else None
    link = f"{directory}.link"
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.basename(directory), link)
    os.replace(link, dest)
    parent = os.open(os.path.dirname(dest), os.O_RDONLY)
    try:
        os.fsync(parent)
    finally:
        os.close(parent)
    if previous and previous != os.path.realpath(directory) and os.path.isdir(previous):
        shutil.rmtree(previous, ignore_errors=True)


def is_directory_snapshot(src: Any) -> bool:
    return isinstance(src, (str, os.PathLike)) and os.path.isdir(src)


def read_parts(src: str, *, key: bytes | str | None = None) -> tuple[format.Container, list[format.Container]]:
    """The index (the global manifest) and every rank's part, each verified against the index.

    Every way a directory can be wrong is a :class:`SnapshotFileError` naming the file: no
    index, an index that is not one (or is malformed: a ``ManifestError``), a part that is
    missing, is a directory, or does not match the digest, size or rank the index records.
    """
    root = os.fspath(src)
    path = os.path.join(root, MANIFEST)
    if not os.path.lexists(path):
        raise SnapshotFileError(
            f"is a directory without {MANIFEST}: not a complete distributed snapshot (a save that "
            "was interrupted writes elsewhere, so this is not one of ours). Pass a snapshot file, or "
            "a directory written by save_snapshot() in a distributed run", source=root)
    if os.path.isdir(path):
        raise SnapshotFileError(f"{MANIFEST} is a directory where the snapshot's index file should be",
                                source=root)
    index = format.read_container(path, key=key)
    if not index.info.is_index:
        raise CorruptSnapshotError(
            f"{MANIFEST} lists no parts: it is not the index of a distributed snapshot", source=path)
    parts = []
    for entry in index.info.parts:
        part_path = os.path.join(root, entry.file)
        try:
            with open(part_path, "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise SnapshotFileError(
                f"the index lists {entry.file} (rank {entry.rank}), which is missing: the directory is "
                "incomplete; use another snapshot", source=root) from exc
        except IsADirectoryError as exc:
            raise SnapshotFileError(f"{entry.file} is a directory where rank {entry.rank}'s part file should be",
                                    source=root) from exc
        except OSError as exc:
            raise SnapshotFileError(f"cannot read {entry.file}: {exc.strerror or exc}", source=root) from exc
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CorruptSnapshotError(
                f"{entry.file} ({len(data)} bytes) is not the part the index records ({entry.size} bytes, "
                f"sha256 {entry.sha256[:16]}...): the directory mixes parts of different saves, or a part "
                "was altered. Use another snapshot", source=root)
        part = format.unpack(data, source=part_path, key=key)
        if part.info.is_index:
            raise CorruptSnapshotError(f"{entry.file} is an index, not a rank's part", source=root)
        rank = part.info.service.rank
        if rank is not None and rank != entry.rank:
            raise CorruptSnapshotError(
                f"{entry.file} holds rank {rank}'s part, where the index expects rank {entry.rank}'s",
                source=root)
        parts.append(part)
    return index, parts
