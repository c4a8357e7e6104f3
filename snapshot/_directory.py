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
import re
import shutil
from typing import Any

from snapshot import format
from snapshot.errors import CorruptSnapshotError, SnapshotFileError

__all__ = ["MANIFEST", "commit", "is_directory_snapshot", "part_name", "read_parts", "staging"]

MANIFEST = format.DIRECTORY_MANIFEST
_PART_NAME = re.compile(r"rank-\d{5}\.snap")


def part_name(rank: int) -> str:
    return f"rank-{rank:05d}.snap"


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


def read_parts(src: str, *, key: bytes | str | None = None) -> tuple[dict[str, Any], list[format.Container]]:
    """The global manifest and every rank's part, each verified against the manifest."""
    root = os.fspath(src)
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        raise SnapshotFileError(
            f"is a directory without {MANIFEST}: not a complete distributed snapshot (a save that "
            "was interrupted writes elsewhere, so this is not one of ours)", source=root)
    manifest = format.read_container(path, key=key).manifest
    parts = []
    for entry in manifest.get("parts", []):
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _PART_NAME.fullmatch(name):
            raise CorruptSnapshotError(
                f"the manifest lists a part named {name!r}, which is not a part file name "
                "(rank-NNNNN.snap): refusing to read outside the snapshot directory", source=path)
        part_path = os.path.join(root, name)
        try:
            with open(part_path, "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise SnapshotFileError(f"the manifest lists {entry['file']}, which is missing", source=root) from exc
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CorruptSnapshotError(
                f"{entry['file']} does not match the digest the manifest recorded for it: the directory "
                "mixes parts of different saves, or a part was altered", source=root)
        parts.append(format.unpack(data, source=part_path, key=key))
    if not parts:
        raise CorruptSnapshotError("the manifest lists no parts", source=path)
    return manifest, parts
