"""The manifest of a snapshot file and of a directory snapshot's index: the payload's record,
the parts of a distributed snapshot, and :class:`Manifest` itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import ManifestError
from snapshot.schema._fields import (
    FORMAT_VERSION,
    _counts,
    _fail,
    _Fields,
    _int,
    _optional,
    _records,
    _sha256,
    _str,
    _texts,
    check_format,
)
from snapshot.schema.layout import GraphDesc, LoaderPosition, Randomness, RankPosition, ServiceLayout
from snapshot.schema.positions import NodePosition, ShardPosition, UpstreamPosition, VerifyRecord


@dataclass(frozen=True)
class PayloadRecord:
    """The payload's size and digest, and the size of each part (``graph``, ``service``, ``state``)."""

    size: int
    sha256: str
    parts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "payload") -> PayloadRecord:
        f = _Fields(value, where)
        return cls(size=f.required("size", _int), sha256=f.required("sha256", _sha256),
                   parts=f.get("parts", _counts, {}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size, "sha256": self.sha256}
        if self.parts:
            out["parts"] = dict(self.parts)
        return out


def part_name(rank: int) -> str:
    """The file name of rank ``rank``'s part in a snapshot directory."""
    return f"rank-{rank:05d}.snap"


@dataclass(frozen=True)
class PartRecord:
    """An entry of a directory snapshot's index: one rank's file, its size and digest."""

    rank: int
    file: str
    sha256: str
    size: int

    @classmethod
    def from_dict(cls, value: Any, where: str = "part") -> PartRecord:
        f = _Fields(value, where)
        record = cls(rank=f.required("rank", _int), file=f.required("file", _str),
                     sha256=f.required("sha256", _sha256), size=f.required("size", _int))
        if record.file != part_name(record.rank):
            raise _fail(f"{where}.file", f"{part_name(record.rank)!r}, the part file name of rank {record.rank} "
                        "(refusing what is not a part file name: a part never lies outside the snapshot's "
                        "directory)", record.file)
        return record

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "file": self.file, "sha256": self.sha256, "size": self.size}


# -- the manifest -----------------------------------------------------------------------------

def _shards(value: Any, where: str) -> tuple[ShardPosition | None, ...]:
    return _records(value, where, _optional(ShardPosition.from_dict))


def _parts(value: Any, where: str) -> tuple[PartRecord, ...]:
    parts = _records(value, where, PartRecord.from_dict)
    for i, part in enumerate(parts):
        if part.rank != i:
            raise _fail(f"{where}[{i}].rank", f"{i} (the parts are listed by rank, from 0)", part.rank)
    return parts


@dataclass(frozen=True)
class Manifest:
    """A snapshot file's manifest (see the type tree in the module's docstring).

    A directory snapshot's ``manifest.snap`` is the *index*: it also lists every rank's
    position (``ranks``) and part file (``parts``), and its own payload is empty.
    """

    loader: LoaderPosition
    graph: GraphDesc
    service: ServiceLayout
    format: int = FORMAT_VERSION
    created: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    randomness: Randomness = field(default_factory=Randomness)
    shards: tuple[ShardPosition | None, ...] = ()
    upstream: tuple[UpstreamPosition, ...] = ()
    verify: VerifyRecord | None = None
    payload: PayloadRecord | None = None
    ranks: tuple[RankPosition, ...] = ()
    parts: tuple[PartRecord, ...] = ()
    #: A state dict's HMAC of its own manifest (files carry theirs after the payload).
    signature: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, *, source: str = "<manifest>") -> Manifest:
        """Check ``value`` (a parsed manifest) field by field; a :class:`ManifestError` names the first
        field that is wrong, a :class:`VersionSkewError` a format this version does not read."""
        try:
            f = _Fields(value, "")
            version = check_format(f.required("format", lambda v, w: v), source)
            # first: an index naming files outside its directory is refused as such
            parts: tuple[PartRecord, ...] = f.get("parts", _parts, ())
            manifest = cls(
                format=version,
                created=f.get("created", _str, None),
                versions=f.get("versions", _texts, {}),
                loader=f.required("loader", LoaderPosition.from_dict),
                randomness=f.get("randomness", Randomness.from_dict, Randomness()),
                graph=f.required("graph", GraphDesc.from_dict),
                service=f.get("service", ServiceLayout.from_dict, ServiceLayout("?")),
                shards=f.get("shards", _shards, ()),
                upstream=f.get("upstream", lambda v, w: _records(v, w, UpstreamPosition.from_dict), ()),
                verify=f.get("verify", VerifyRecord.from_dict, None),
                payload=f.get("payload", PayloadRecord.from_dict, None),
                ranks=f.get("ranks", lambda v, w: _records(v, w, RankPosition.from_dict), ()),
                parts=parts,
                signature=f.get("signature", _str, None),
                extra=f.extra(),
            )
            manifest._check_shards()
        except ManifestError as exc:
            raise exc.at(source) from None
        return manifest

    def _check_shards(self) -> None:
        count = self.service.units or self.service.logical_shards
        if count is not None and self.shards and len(self.shards) != count:
            what = "logical shard" if self.service.units is None else "logical shard or sub-shard"
            source = "logical_shards" if self.service.units is None else "units"
            raise _fail("shards", f"one entry per {what} ({count}, as service.{source} says)",
                        f"{len(self.shards)} entries")
        paths = self.graph.paths()
        records: list[tuple[str, dict[str, NodePosition]]] = [
            (f"shards[{i}]", s.nodes) for i, s in enumerate(self.shards) if s is not None]
        records += [(f"upstream[{i}]", u.nodes) for i, u in enumerate(self.upstream)]
        for where, nodes in records:
            for path in nodes:
                if path not in paths:
                    raise _fail(f"{where}.nodes", "paths of nodes of graph.nodes", path)
        for i, copy in enumerate(self.upstream):
            for j, shard in enumerate(copy.shards):
                if count is not None and shard >= count:
                    raise _fail(f"upstream[{i}].shards[{j}]", f"a logical shard below {count}", shard)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format, "created": self.created, "versions": dict(self.versions),
            "loader": self.loader.to_dict(), "randomness": self.randomness.to_dict(),
            "graph": self.graph.to_dict(), "service": self.service.to_dict(),
            "shards": [None if s is None else s.to_dict() for s in self.shards],
            "upstream": [u.to_dict() for u in self.upstream],
            "verify": None if self.verify is None else self.verify.to_dict(),
        }
        if self.ranks:
            out["ranks"] = [r.to_dict() for r in self.ranks]
        if self.parts:
            out["parts"] = [p.to_dict() for p in self.parts]
        if self.payload is not None:
            out["payload"] = self.payload.to_dict()
        if self.signature is not None:
            out["signature"] = self.signature
        return {**out, **self.extra}

    @property
    def is_index(self) -> bool:
        """A directory snapshot's index (its parts hold the state)."""
        return bool(self.parts)


# -- the payload's state ----------------------------------------------------------------------
