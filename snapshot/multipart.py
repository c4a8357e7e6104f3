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
directory's token) that each part carries in its own manifest (``save``, :func:`stamp`) and
the index too, so a part copied in from another save is refused even when the index's
digest was updated to match it (:func:`check_part`). Directories written before save ids
carry none in the index nor in the parts, and still load.

The same parts also travel joined in one payload (a distributed snapshot's state dict):
:func:`join_parts` and :func:`split_parts`. The index is rank 0's manifest with every
rank's shards and its parts (:func:`distributed_manifest`).

This module knows nothing of processes or ranks; the distributed service orchestrates it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from snapshot import _dict_form, _sources, format, schema
from snapshot.errors import CorruptSnapshotError, SnapshotFileError, TruncatedSnapshotError

__all__ = ["MANIFEST", "check_part", "commit", "distributed_manifest", "is_directory_snapshot", "join_parts",
           "part_info", "part_name", "parts_state_dict", "read_parts", "split_parts", "stamp", "staging"]

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
    index = _sources.read_container(path, key=key)
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
        check_part(index.info, entry, part.info, source=root)
        parts.append(part)
    return index, parts


def check_part(index: schema.Manifest, entry: schema.PartRecord, part: schema.Manifest, *, source: str) -> None:
    """Refuse a part (its checksums verified) that is not the one ``index`` lists as ``entry``: an index,
    another rank's part, a part of another save (its save id, or its position, differs from the index's)."""
    name = f"{entry.file} (rank {entry.rank})"
    if part.is_index:
        raise CorruptSnapshotError(f"{name} is an index, not a rank's part", source=source)
    rank = part.service.rank
    if rank is not None and rank != entry.rank:
        raise CorruptSnapshotError(
            f"{entry.file} holds rank {rank}'s part, where the index expects rank {entry.rank}'s", source=source)
    if part.save != index.save:
        raise CorruptSnapshotError(
            f"{name} comes from another save than the index: its save id is {part.save or 'none'}, the index's "
            f"{index.save or 'none'}. The directory mixes parts of different saves (a part was copied in from "
            "another snapshot), whatever digest the index records for it: use another snapshot", source=source)
    listed = index.ranks[entry.rank].position if entry.rank < len(index.ranks) else None
    if listed is not None and listed != part.loader:
        raise CorruptSnapshotError(
            f"{name} stands at epoch {part.loader.epoch}, sample {part.loader.yielded}, where the index records "
            f"epoch {listed.epoch}, sample {listed.yielded} for rank {entry.rank}: the directory mixes parts of "
            "different saves; use another snapshot", source=source)


def stamp(part: bytes, save: str, *, key: bytes | str | None = None) -> list[bytes]:
    """``part`` (a rank's snapshot file) with ``save``, the id of the save that writes it, in its manifest:
    the file's pieces (:func:`snapshot.format.pack_parts`), signed again like the original."""
    container = format.unpack(part, source="<part>", with_payload=False)
    payload = format.payload_region(part)
    return format.pack_parts({**container.manifest, "save": save}, payload, key=key)  # type: ignore[arg-type]


_PART_SIZE = struct.Struct("<Q")


def join_parts(parts: list[bytes]) -> bytes:
    """Several snapshot files as one payload (a distributed snapshot's state dict)."""
    return b"".join(_PART_SIZE.pack(len(p)) + p for p in parts)


def split_parts(payload: bytes, *, source: str = "<state_dict>") -> list[bytes]:
    """Inverse of :func:`join_parts`."""
    parts, offset = [], 0
    while offset < len(payload):
        if offset + _PART_SIZE.size > len(payload):
            raise TruncatedSnapshotError("a part's length is cut short", source=source, offset=offset)
        (size,) = _PART_SIZE.unpack_from(payload, offset)
        offset += _PART_SIZE.size
        if offset + size > len(payload):
            raise TruncatedSnapshotError(f"a part declares {size} bytes past the end", source=source, offset=offset)
        parts.append(payload[offset:offset + size])
        offset += size
    return parts


def part_info(rank: int, manifest: dict[str, Any], data: bytes | Sequence[bytes]) -> dict[str, Any]:
    """What the distributed manifest records of one rank's part (its bytes, or its pieces)."""
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return {"rank": rank, "file": schema.part_name(rank), "sha256": digest.hexdigest(),
            "size": sum(len(piece) for piece in pieces), "manifest": manifest}


def distributed_manifest(infos: Sequence[Mapping[str, Any]], *, save: str | None = None) -> dict[str, Any]:
    """The index of a distributed snapshot: rank 0's manifest, with every rank's shards and its parts.

    ``save`` is the id of the save, which every part carries too (:func:`stamp`).
    """
    manifests = [schema.Manifest.from_dict(info["manifest"], source=f"rank {info['rank']}") for info in infos]
    first = manifests[0]
    shards: list[schema.ShardPosition | None] = []
    owners: dict[str, schema.Owner] = {}
    for info, manifest in zip(infos, manifests):
        for index, shard in enumerate(manifest.shards):
            while len(shards) <= index:
                shards.append(None)
            if shard is not None:
                shards[index] = shard
        for shard_key, owner in manifest.service.owners.items():
            owners[shard_key] = schema.Owner(worker=owner.worker, rank=int(info["rank"]))
    loaders = [m.loader for m in manifests]
    combined = dataclasses.replace(
        first,
        loader=schema.LoaderPosition(epoch=loaders[0].epoch, yielded=sum(x.yielded for x in loaders),
                                     epoch_finished=all(x.epoch_finished for x in loaders),
                                     lookahead=sum(x.lookahead for x in loaders)),
        service=dataclasses.replace(first.service, rank=None, ranks=len(infos), owners=owners),
        shards=tuple(shards),
        upstream=tuple(u for m in manifests for u in m.upstream),
        ranks=tuple(schema.RankPosition(int(info["rank"]), m.loader) for info, m in zip(infos, manifests)),
        parts=tuple(schema.PartRecord(int(i["rank"]), i["file"], i["sha256"], int(i["size"])) for i in infos),
        payload=None,
        save=save,
    )
    return combined.to_dict()


def parts_state_dict(infos: Sequence[Mapping[str, Any]], parts: list[bytes], *,
                     key: bytes | str | None = None) -> dict[str, Any]:
    """The state-dict form of a distributed snapshot: the same three keys as any other."""
    manifest = distributed_manifest(infos)
    payload = join_parts(parts)
    manifest[format.PAYLOAD] = format.payload_record(payload)
    return _dict_form.to_state_dict(manifest, payload, key=key)
