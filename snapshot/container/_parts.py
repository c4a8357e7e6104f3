"""The parts of a multi-part snapshot as bytes: a rank's part (which carries its save's id, written
with it by :mod:`snapshot.storage._stream`) checked against the index (:func:`check_part`), what the
index records of it (:func:`part_info`), parts joined into one payload and split again
(:func:`join_parts`, :func:`split_parts`), and the index itself (:func:`distributed_manifest`).
Reading and writing the directory is :mod:`snapshot.storage.multipart`."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from snapshot import schema
from snapshot.container import _dict_form, format
from snapshot.errors import CorruptSnapshotError, TruncatedSnapshotError


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


def part_info(rank: int, manifest: dict[str, Any], data: bytes | Iterable[bytes]) -> dict[str, Any]:
    """What the distributed manifest records of one rank's part: its bytes, or its pieces in order (read
    once, so they may be chunks read back from the written file)."""
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    digest, size = hashlib.sha256(), 0
    for piece in pieces:
        digest.update(piece)
        size += len(piece)
    return {"rank": rank, "file": schema.part_name(rank), "sha256": digest.hexdigest(), "size": size,
            "manifest": manifest}


def distributed_manifest(infos: Sequence[Mapping[str, Any]], *, save: str | None = None) -> dict[str, Any]:
    """The index of a distributed snapshot: rank 0's manifest, with every rank's shards and its parts.

    ``save`` is the id of the save, which every part carries too (in its own manifest).
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
        service=dataclasses.replace(first.service, rank=None, ranks=len(infos), owners=owners,
                                    extra={k: v for k, v in first.service.extra.items() if k != schema.HANDOUT}),
        shards=tuple(shards),
        upstream=tuple(u for m in manifests for u in m.upstream),
        ranks=tuple(schema.RankPosition(int(info["rank"]), m.loader, _handout(m)) for info, m in zip(infos, manifests)),
        parts=tuple(schema.PartRecord(int(i["rank"]), i["file"], i["sha256"], int(i["size"])) for i in infos),
        payload=None,
        save=save,
    )
    return combined.to_dict()


def _handout(manifest: schema.Manifest) -> schema.Handout | None:
    record = manifest.service.extra.get(schema.HANDOUT)
    return None if record is None else schema.Handout.from_dict(record, "service.handout")


def parts_state_dict(infos: Sequence[Mapping[str, Any]], parts: list[bytes], *,
                     key: bytes | str | None = None) -> dict[str, Any]:
    """The state-dict form of a distributed snapshot: the same three keys as any other."""
    manifest = distributed_manifest(infos)
    payload = join_parts(parts)
    manifest[format.PAYLOAD] = format.payload_record(payload)
    return _dict_form.to_state_dict(manifest, payload, key=key)
