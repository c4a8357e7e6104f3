"""Multi-part snapshots: one part per rank, an index, joined and split, committed atomically.

::

    ckpt/data.snap  ->  .data.snap.<token>/     (a symbolic link)
                          manifest.snap          the global manifest (parts, their digests)
                          rank-00000.snap        rank 0's part: a complete snapshot file
                          rank-00001.snap        ...

Each rank writes its part into a fresh staging directory; rank 0 writes the manifest last
and then replaces the link in one ``rename``. A crash at any point leaves the link pointing
at the previous complete directory. Readers check every part against the digest the
manifest records for it, and against the save: the ranks agree on a save id (the staging
directory's token) before writing, which each part carries in its own manifest (``save``, encoded
with the part: :func:`snapshot.storage._stream.write_part`) and the index too, so a part copied in
from another save is refused even when the index's digest was updated to match it
(:func:`check_part`). Directories written before save ids carry none in the index nor in the
parts, and still load.

The same parts also travel joined in one payload (a distributed snapshot's state dict):
:func:`join_parts` and :func:`split_parts`. The index is rank 0's manifest with every
rank's shards and its parts (:func:`distributed_manifest`).

:func:`save_directory` is the one write path of a directory: a collective that the loader calls with
the distributed service's collective operations (this module knows nothing of processes; it is handed
``rank``, ``broadcast`` and ``all_gather``). It is the I/O half (directories on disk); the parts
themselves (check, join, split, the index) are :mod:`snapshot.container._parts`, whose names this
module hands on.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from snapshot import schema
from snapshot.container import format
from snapshot.container._parts import (
    Select,
    check_part,
    distributed_manifest,
    join_parts,
    part_info,
    parts_state_dict,
    selected,
    split_parts,
)
from snapshot.container.capture import LoaderState, Snapshot
from snapshot.errors import CorruptSnapshotError, RankError, SnapshotError, SnapshotFileError
from snapshot.storage import _atomic, _failures, _rotation, _sources, _stream

__all__ = ["MANIFEST", "Select", "check_part", "commit", "distributed_manifest", "is_directory_snapshot",
           "join_parts", "not_saved", "part_info", "part_name", "parts_state_dict", "read_index", "read_parts",
           "save_directory", "selected", "split_parts", "staging", "without_index", "write_part"]

MANIFEST = format.DIRECTORY_MANIFEST
_PART = re.compile(r"rank-\d{5}\.snap")
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


def read_parts(src: str, *, key: bytes | str | None = None,
               select: Select | None = None) -> tuple[format.Container, list[format.Container]]:
    """The index (the global manifest) and the parts ``select(index)`` names (default: every rank's), each
    verified against the index. A restore on one rank of many reads only the parts its re-shard plan names.

    Every way a directory can be wrong is a :class:`SnapshotFileError` naming the file: no
    index, an index that is not one (or is malformed: a ``ManifestError``), a part that is
    missing, is a directory, or does not match the digest, size or rank the index records.
    """
    root = os.fspath(src)
    index = read_index(root, key=key)
    parts = [_read_part(root, entry, index, key) for entry in selected(index, select, source=root)]
    return index, parts


def read_index(src: str, *, key: bytes | str | None = None) -> format.Container:
    """The index of the directory snapshot ``src`` (its ``manifest.snap``), checked."""
    root = os.fspath(src)
    path = os.path.join(root, MANIFEST)
    if not os.path.lexists(path):
        raise SnapshotFileError(without_index(root), source=root)
    if os.path.isdir(path):
        raise SnapshotFileError(f"{MANIFEST} is a directory where the snapshot's index file should be",
                                source=root)
    index = _sources.read_container(path, key=key)
    if not index.info.is_index:
        raise CorruptSnapshotError(
            f"{MANIFEST} lists no parts: it is not the index of a distributed snapshot", source=path)
    return index


def _read_part(root: str, entry: schema.PartRecord, index: format.Container,
               key: bytes | str | None) -> format.Container:
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
    check_part(index.info, entry, part.info, source=root)
    return part


def without_index(root: str) -> str:
    """Why the directory ``root``, which has no index, is not a snapshot: a folder of snapshot files (a
    checkpoint folder of ``step-*.snap``) is named as such, with the way to pick the newest of them."""
    try:
        held = sorted(name for name in os.listdir(root) if name.endswith(".snap") and not name.startswith(".")
                      and not _PART.fullmatch(name))  # a part of a directory without its index is no snapshot
    except OSError:
        held = []
    newest = _rotation.latest(root) if held else None
    if newest is not None:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        return (f"is a folder of snapshots ({shown}), not one snapshot: pass one of them; the newest, "
                f"{os.path.basename(newest)}, is what snapshot.latest({root!r}) returns")
    return (f"is a directory without {MANIFEST}: not a complete distributed snapshot (a save that was interrupted "
            "writes elsewhere, so this is not one of ours). Pass a snapshot file, or a directory written by "
            "save_snapshot() in a distributed run")


def save_directory(collective: Any, source: LoaderState, dest: Any, key: bytes | str | None) -> Snapshot:
    """Each rank encodes ``source`` straight into its part; rank 0 writes the global manifest and swaps the
    directory in (a collective). This rank's part, as a :class:`Snapshot` that reads its payload back
    from the file only if asked.

    The ranks agree on the save's id first, so that each part is written once, carrying it (no copy of
    the state is held: :func:`snapshot.storage._stream.write_part`). On any failure (a rank that cannot
    write, dies or hangs) nothing is published, the staging directory is removed, and the previous
    snapshot stays: every rank raises a :class:`RankError` that names ``dest`` and says so.
    """
    token = collective.broadcast(uuid.uuid4().hex[:12], "agreeing on a snapshot directory")
    try:
        directory = staging(os.fspath(dest), token)
    except OSError as exc:
        directory, failure = None, _failures.write_error(exc, os.fspath(dest), what="cannot create the directory "
                                                         "of this rank's part")
    try:
        if directory is None:
            write_part(collective, source, "", token, key, failure=failure)
        return _save_parts(collective, directory, source, dest, key, token)  # type: ignore[arg-type]
    except BaseException as exc:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if isinstance(exc, RankError):
            raise not_saved(exc, os.fspath(dest), _rotation.intact_at(os.path.abspath(os.fspath(dest)))
                            ) from exc.__cause__
        raise


def not_saved(exc: RankError, dest: str, intact: str) -> RankError:
    """The :class:`RankError` every rank raises when a collective save to ``dest`` failed: what failed, and
    what is intact (raise it from ``exc.__cause__``: the failure itself, on the rank where it happened)."""
    return RankError(f"{dest}: the snapshot was not saved: {exc} {intact}")


def write_part(collective: Any, source: LoaderState, path: str, token: str, key: bytes | str | None, *,
               on_failure: Callable[[], None] | None = None,
               failure: BaseException | None = None) -> tuple[schema.Manifest, list[dict[str, Any]] | None]:
    """This rank's part of the save ``token``, encoded straight into ``path`` (a path or a URL); then, on rank
    0, every rank's record of its part (``None`` on the others: a collective), or a :class:`RankError` on
    every rank, naming each rank that could not write (after ``on_failure()``, on rank 0: remove what the
    ranks wrote). Every rank learns of a failure from one small all-reduce; only rank 0 gets the records.
    ``failure`` is why this rank cannot write at all (it only takes part in the collectives)."""
    error: str | None = f"{type(failure).__name__}: {failure}" if failure is not None else None
    info: dict[str, Any] = {}
    manifest: schema.Manifest | None = None
    if failure is None:
        try:
            manifest, info = _stream.write_part(source, path, rank=collective.rank, save=token, key=key)
        except (OSError, SnapshotError) as exc:
            error, failure = f"{type(exc).__name__}: {exc}", exc
    if not collective.all_reduce_min(int(error is None), "writing the parts of a snapshot"):
        errors = collective.all_gather(error, "writing the parts of a snapshot")
        if on_failure is not None and collective.rank == 0:
            on_failure()
        raise RankError("; ".join(f"rank {rank} could not write its part: {e}" for rank, e in enumerate(errors) if e)
                        ) from failure
    assert manifest is not None
    return manifest, collective.gather(info, "gathering the records of a snapshot's parts")


def _save_parts(collective: Any, directory: str, source: LoaderState, dest: Any,
                key: bytes | str | None, token: str) -> Snapshot:
    path = os.path.join(directory, part_name(collective.rank))
    manifest, infos = write_part(collective, source, path, token, key)
    error = None
    if infos is not None:  # rank 0
        try:
            _atomic.atomic_write(os.path.join(directory, MANIFEST),
                                 format.pack(distributed_manifest(infos, save=token), b"", key=key))
            commit(os.fspath(dest), directory)
        except OSError as exc:
            error = _failures.describe(exc)
        except SnapshotError as exc:
            error = f"{type(exc).__name__}: {exc}"
    done = collective.broadcast(error, "publishing a snapshot")
    if done is not None:
        raise RankError(f"rank 0 could not publish it: {done}")
    return _stream.written(path, manifest)
