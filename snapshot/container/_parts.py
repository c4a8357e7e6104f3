"""The parts of a multi-part snapshot as bytes: a rank's part (which carries its save's id, written
with it by :mod:`snapshot.storage._stream`) checked against the index (:func:`check_part`), what the
index records of it (:func:`part_info`), the index itself (:func:`distributed_manifest`), and the
state-dict form (:func:`parts_state_dict`, read by :func:`read_state_dict`). Reading and writing the
directory is :mod:`snapshot.storage.multipart`.

A distributed loader's state dict is a rank's share of the snapshot::

    {"snapshot_format": 2, "parts": {"rank-00003.snap": b"..."}}            # rank 3
    {"snapshot_format": 2, "manifest": "<the index>", "parts": {...}}        # rank 0, with the index

Each part is a complete snapshot file under its file's name in a directory snapshot, so that a
framework that writes every rank's state (``torch.distributed.checkpoint``) writes each part once, by
the rank that holds it; the index, which lists every part with its digest, is on rank 0's only. A
trainer that writes rank 0's state alone gets every part on rank 0. State dicts of earlier versions
held every part joined in one payload (:func:`join_parts`, :func:`split_parts`); they still load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from snapshot import schema
from snapshot.container import _dict_form, format
from snapshot.errors import CorruptSnapshotError, SnapshotFileError, TruncatedSnapshotError

#: The key of a distributed state dict under which its parts are, each under its file's name.
PARTS = "parts"
#: Part names listed in an error before "and N more".
_LISTED = 4


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
    """What the index records of one rank's part: its bytes, or its pieces in order (read once, so they may
    be chunks read back from the written file), and its manifest: rank 0's whole, any other rank's positions
    only (:func:`positions`), all the index takes from it."""
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    digest, size = hashlib.sha256(), 0
    for piece in pieces:
        digest.update(piece)
        size += len(piece)
    return {"rank": rank, "file": schema.part_name(rank), "sha256": digest.hexdigest(), "size": size,
            "manifest": manifest if rank == 0 else positions(manifest)}


#: What the index takes from a part's manifest besides rank 0's (its graph, seeds and versions).
_POSITIONS = ("loader", "service", "upstream")


def positions(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A part's manifest as the index reads it: where the rank stands and the logical shards it ran (by
    index: the others' are absent, not null). Small whatever the number of ranks: a part's manifest lists
    a seed and a place for every logical shard of the job, which rank 0's index has once."""
    record = {key: manifest[key] for key in _POSITIONS if key in manifest}
    record["shards"] = {str(i): shard for i, shard in enumerate(manifest.get("shards") or ()) if shard is not None}
    return record


def distributed_manifest(infos: Sequence[Mapping[str, Any]], *, save: str | None = None) -> dict[str, Any]:
    """The index of a distributed snapshot: rank 0's manifest, with every rank's shards and its parts.

    ``save`` is the id of the save, which every part carries too (in its own manifest). Only rank 0's
    manifest is read whole; of the others, the positions (:func:`positions`): the time it takes grows
    with the ranks' logical shards, not with the job's.
    """
    first = schema.Manifest.from_dict(infos[0]["manifest"], source="rank 0")
    shards: list[schema.ShardPosition | None] = [None] * len(first.shards)
    owners: dict[str, schema.Owner] = {}
    loaders, upstream, ranks = [], [], []
    for info in infos:
        rank = int(info["rank"])
        record = info["manifest"]
        if not isinstance(record.get("shards"), Mapping):  # a whole manifest: rank 0's
            record = positions(record)
        where = f"rank {rank}"
        loader = schema.LoaderPosition.from_dict(record.get("loader"), f"{where}: loader")
        service = schema.ServiceLayout.from_dict(record.get("service"), f"{where}: service")
        for key, shard in record.get("shards", {}).items():
            index = int(key)
            shards.extend([None] * (index + 1 - len(shards)))
            shards[index] = schema.ShardPosition.from_dict(shard, f"{where}: shards[{index}]")
        for shard_key, owner in service.owners.items():
            owners[shard_key] = schema.Owner(worker=owner.worker, rank=rank)
        upstream += [schema.UpstreamPosition.from_dict(u, f"{where}: upstream") for u in record.get("upstream", ())]
        loaders.append(loader)
        ranks.append(schema.RankPosition(rank, loader, _handout(service)))
    combined = dataclasses.replace(
        first,
        loader=schema.LoaderPosition(epoch=loaders[0].epoch, yielded=sum(x.yielded for x in loaders),
                                     epoch_finished=all(x.epoch_finished for x in loaders),
                                     lookahead=sum(x.lookahead for x in loaders)),
        service=dataclasses.replace(first.service, rank=None, ranks=len(infos), owners=owners,
                                    extra={k: v for k, v in first.service.extra.items() if k != schema.HANDOUT}),
        shards=tuple(shards),
        upstream=tuple(upstream),
        ranks=tuple(ranks),
        parts=tuple(schema.PartRecord(int(i["rank"]), i["file"], i["sha256"], int(i["size"])) for i in infos),
        payload=None,
        save=save,
    )
    return combined.to_dict()


def _handout(service: schema.ServiceLayout) -> schema.Handout | None:
    record = service.extra.get(schema.HANDOUT)
    return None if record is None else schema.Handout.from_dict(record, "service.handout")


def parts_state_dict(index: Mapping[str, Any] | None, parts: Mapping[str, bytes], *,
                     key: bytes | str | None = None) -> dict[str, Any]:
    """A distributed snapshot's state-dict form (or a rank's share of it): ``parts`` (each a snapshot file's
    bytes under its file's name) and, where given, the index that lists and checks them (signed with a key)."""
    state: dict[str, Any] = {format.STATE_DICT_MARKER: format.FORMAT_VERSION}
    if index is not None:
        state.update(_dict_form.to_state_dict(index, None, key=key))
    state[PARTS] = dict(parts)
    return state


#: Which ranks' parts to read, given the index (``None``: all of them).
Select = Callable[[schema.Manifest], Sequence[int] | None]


def selected(index: format.Container, select: Select | None, *, source: str) -> list[schema.PartRecord]:
    """The index's entries of the parts ``select`` names (all, without it or where it says ``None``: then every
    record of the index is checked in full too, as a reader of the whole snapshot uses them all)."""
    entries = list(index.info.parts)
    ranks = None if select is None else select(index.info)
    if ranks is None:
        for records in (index.info.shards, index.info.upstream):
            if isinstance(records, schema.Records):
                records.check()
        return entries
    missing = sorted(set(ranks) - set(range(len(entries))))
    if missing:
        raise CorruptSnapshotError(f"the index lists {len(entries)} parts, none for rank(s) {missing}", source=source)
    return [entries[r] for r in sorted(set(ranks))]


def read_state_dict(state: Any, *, key: bytes | str | None = None, source: str = "<state_dict>",
                    select: Select | None = None) -> tuple[format.Container, list[format.Container] | None]:
    """A state dict verified: a single snapshot's container (and ``None``), or a distributed snapshot's
    index and the parts ``select(index)`` names (default: every part), each checked against it (the form of
    :func:`parts_state_dict`, or the earlier form with the parts joined in the payload)."""
    if isinstance(state, Mapping) and PARTS in state:
        return _keyed_parts(state, key=key, source=source, select=select)
    container = _dict_form.from_state_dict(state, key=key, source=source)
    if not container.info.is_index:
        return container, None
    assert container.payload is not None
    blobs = split_parts(container.payload)
    if len(blobs) != len(container.info.parts):
        raise CorruptSnapshotError(f"the state dict's index lists {len(container.info.parts)} parts but its payload "
                                   f"holds {len(blobs)}", source=source)
    return container, [_checked(container.info, entry, blobs[entry.rank], source=source, key=key)
                       for entry in selected(container, select, source=source)]


def _keyed_parts(state: Mapping[str, Any], *, key: bytes | str | None, source: str, select: Select | None
                 ) -> tuple[format.Container, list[format.Container]]:
    parts = state[PARTS]
    if not isinstance(parts, Mapping) or not all(isinstance(b, (bytes, bytearray)) for b in parts.values()):
        raise CorruptSnapshotError(f"the state dict's {PARTS!r} is not a dict of part files' bytes", source=source)
    if "manifest" not in state:
        raise SnapshotFileError(
            f"this state dict holds {_names(sorted(parts))} of a distributed loader's state, without the index "
            "(the manifest that lists every part), which rank 0's state dict holds: restore from rank 0's "
            "state_dict() (it holds every part), or load a torch.distributed.checkpoint checkpoint with "
            "snapshot.integrations.dcp.load()", source=source)
    index = _dict_form.read_manifest(state, key=key, source=source)
    if not index.info.is_index:
        raise CorruptSnapshotError("the state dict holds parts, but its manifest is not an index that lists them",
                                   source=source)
    needed = selected(index, select, source=source)
    missing = [entry.file for entry in needed if entry.file not in parts]
    if missing:
        raise SnapshotFileError(
            f"this state dict holds {len(parts)} of the {len(index.info.parts)} parts its index lists, and not "
            f"{_names(missing)}, which this restore reads. It is one rank's share of a distributed loader's "
            "state (torch.distributed.checkpoint writes each rank's): load a DCP checkpoint with "
            "snapshot.integrations.dcp.load(), which reads the parts each rank needs", source=source)
    return index, [_checked(index.info, entry, parts[entry.file], source=source, key=key) for entry in needed]


def _checked(index: schema.Manifest, entry: schema.PartRecord, blob: bytes, *, source: str,
             key: bytes | str | None) -> format.Container:
    """The part ``entry`` from its bytes, checked against the index's record of it and against the index."""
    if len(blob) != entry.size or hashlib.sha256(blob).hexdigest() != entry.sha256:
        raise CorruptSnapshotError(
            f"{entry.file} ({len(blob)} bytes) is not the part the index records ({entry.size} bytes, sha256 "
            f"{entry.sha256[:16]}...): the state dict mixes parts of different saves, or a part was altered",
            source=source)
    part = format.unpack(bytes(blob), source=f"{source}: {entry.file}", key=key)
    check_part(index, entry, part.info, source=source)
    return part


def _names(files: Sequence[str]) -> str:
    shown = ", ".join(files[:_LISTED])
    return shown if len(files) <= _LISTED else f"{shown} and {len(files) - _LISTED} more"
