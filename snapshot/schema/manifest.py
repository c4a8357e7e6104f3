"""The manifest of a snapshot file and of a directory snapshot's index: the payload's record,
the parts of a distributed snapshot, and :class:`Manifest` itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import ManifestError
from snapshot.schema import _native
from snapshot.schema._fields import (
    FORMAT_VERSION,
    SHARDED_SERVICES,
    _fail,
    _Fields,
    _int,
    _records,
    _sha256,
    _show,
    _str,
    _texts,
    check_format,
)
from snapshot.schema._lazy import index_shards, index_upstream, missing, unknown_node, upstream_shards
from snapshot.schema._metadata import METADATA_LIMIT, _metadata, check_metadata  # noqa: F401 (their home before)
from snapshot.schema._quick import (
    REQUIRED,
    STR,
    Doubt,
    Quick,
    quick_copy,
    quick_optional,
    quick_records,
    quick_texts,
)
from snapshot.schema.graph import GraphDesc, quick_graph
from snapshot.schema.layout import (
    LoaderPosition,
    Randomness,
    RankPosition,
    ServiceLayout,
    quick_layout,
    quick_loader,
    quick_randomness,
)

# PAYLOAD_ENCODINGS and PickledValue: importable from here as before
from snapshot.schema.payload import PAYLOAD_ENCODINGS, PayloadRecord, PickledValue, quick_payload  # noqa: F401
from snapshot.schema.positions import (
    ShardPosition,
    UpstreamPosition,
    VerifyRecord,
    quick_shard,
    quick_upstream,
    quick_verify,
)
from snapshot.schema.saved import SavedState

_SAVE_ID = re.compile(r"[0-9a-f]{12,32}")


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

def _save_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SAVE_ID.fullmatch(value):
        raise _fail(where, "a save id (12 to 32 lowercase hex digits)", value)
    return value


def _shard(value: Any, where: str) -> ShardPosition | None:
    return None if value is None else ShardPosition.from_dict(value, where)


def _shards(value: Any, where: str) -> tuple[ShardPosition | None, ...]:
    return _records(value, where, _shard)


def _upstream(value: Any, where: str) -> tuple[UpstreamPosition, ...]:
    return _records(value, where, UpstreamPosition.from_dict)


def _position_readers(index: bool, source: str) -> tuple[Callable[[Any, str], Sequence[ShardPosition | None]],
                                                         Callable[[Any, str], Sequence[UpstreamPosition]]]:
    """How ``shards`` and ``upstream`` are read: in full, or (an index's, which lists every shard of the job,
    few of which a rank's restore uses) checked for shape, each record in full when it is used."""
    if not index:
        return _shards, _upstream
    return (lambda v, w: index_shards(v, w, _shard, source),
            lambda v, w: index_upstream(v, w, UpstreamPosition.from_dict, source))


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
    #: One per logical shard (or unit); an index's are :class:`Records`, each read in full when used.
    shards: Sequence[ShardPosition | None] = ()
    upstream: Sequence[UpstreamPosition] = ()
    verify: VerifyRecord | None = None
    payload: PayloadRecord | None = None
    ranks: tuple[RankPosition, ...] = ()
    parts: tuple[PartRecord, ...] = ()
    #: A state dict's HMAC of its own manifest (files carry theirs after the payload).
    signature: str | None = None
    #: A directory snapshot's save: the id its index and every part carry (see :mod:`snapshot.multipart`).
    save: str | None = None
    #: ``save_snapshot(metadata=...)``: the user's plain JSON data (a step), this save's only (see
    #: :func:`check_metadata`); a directory's index carries rank 0's. Absent from older files.
    metadata: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, *, source: str = "<manifest>") -> Manifest:
        """Check ``value`` (a parsed manifest) field by field; a :class:`ManifestError` names the first
        field that is wrong, a :class:`VersionSkewError` a format this version does not read."""
        try:
            return _quick_manifest(value)
        except Doubt:
            pass
        try:
            f = _Fields(value, "")
            version = check_format(f.required("format", lambda v, w: v), source)
            # first: an index naming files outside its directory is refused as such
            parts: tuple[PartRecord, ...] = f.get("parts", _parts, ())
            shards, upstream = _position_readers(bool(parts), source)
            manifest = cls(
                format=version,
                created=f.get("created", _str, None),
                versions=f.get("versions", _texts, {}),
                loader=f.required("loader", LoaderPosition.from_dict),
                randomness=f.get("randomness", Randomness.from_dict, Randomness()),
                graph=f.required("graph", GraphDesc.from_dict),
                service=f.required("service", ServiceLayout.from_dict),
                shards=f.required("shards", shards),
                upstream=f.get("upstream", upstream, ()),
                verify=f.get("verify", VerifyRecord.from_dict, None),
                payload=f.get("payload", PayloadRecord.from_dict, None),
                ranks=f.get("ranks", lambda v, w: _records(v, w, RankPosition.from_dict), ()),
                parts=parts,
                signature=f.get("signature", _str, None),
                save=f.get("save", _save_id, None),
                metadata=f.get("metadata", _metadata, None),
                extra=f.extra(),
            )
            manifest._check_shards()
            manifest._check_ranks()
        except ManifestError as exc:
            raise exc.at(source) from None
        return manifest

    def _check_shards(self) -> None:
        count = self.service.units or self.service.logical_shards
        if self.loader.epoch < 0 and (self.shards or self.loader.yielded):
            raise _fail("shards" if self.shards else "loader.yielded",
                        "nothing before the first epoch (loader.epoch is -1)",
                        f"{len(self.shards)} shards" if self.shards else self.loader.yielded)
        if count is not None and len(self.shards) != count:
            what = "logical shard" if self.service.units is None else "logical shard or sub-shard"
            source = "logical_shards" if self.service.units is None else "units"
            raise _fail("shards", f"one entry per {what} ({count}, as service.{source} says)",
                        f"{len(self.shards)} entries")
        absent = missing(self.shards) if count is not None and self.service.rank is None else None
        if absent is not None:  # not a rank's part: every shard is here
            raise _fail(f"shards[{absent}]", f"the position of logical shard {absent} (only a rank's part leaves out "
                        "the shards of other ranks)", None)
        paths = self.graph.paths()
        unknown = unknown_node(self.shards, "shards", paths) or unknown_node(self.upstream, "upstream", paths)
        if unknown is not None:
            raise _fail(f"{unknown[0]}.nodes", "paths of nodes of graph.nodes", unknown[1])
        units = self.service.extra.get("units")
        limit = None if count is None else max(count, units if isinstance(units, int) else 0)
        for i, copy_shards in upstream_shards(self.upstream):
            for j, shard in enumerate(copy_shards):
                if limit is not None and shard >= limit:
                    raise _fail(f"upstream[{i}].shards[{j}]", f"a logical shard below {limit}", shard)

    def _check_ranks(self) -> None:
        """A directory's index lists every rank, each with its part; a rank's part is no index."""
        if self.ranks and not self.parts:
            raise _fail("parts", f"one part per entry of ranks ({len(self.ranks)}), but this index lists no parts",
                        "nothing")
        if self.parts and not self.ranks:
            raise _fail("ranks", f"one position per part ({len(self.parts)}), but this index lists no ranks",
                        "nothing")
        if not self.parts:
            return
        for i, rank in enumerate(self.ranks):
            if rank.rank != i:
                raise _fail(f"ranks[{i}].rank", f"{i} (the ranks are listed in order, from 0)", rank.rank)
            if rank.position.epoch != self.loader.epoch:
                raise _fail(f"ranks[{i}].epoch", f"the index's epoch ({self.loader.epoch})", rank.position.epoch)
        if len(self.ranks) != len(self.parts):
            raise _fail("ranks", f"one entry per part ({len(self.parts)})", f"{len(self.ranks)} entries")
        if self.service.rank is not None:
            raise _fail("service.rank", "nothing in an index (it describes every rank)", self.service.rank)
        if self.service.ranks != len(self.parts):
            raise _fail("service.ranks", f"the number of parts ({len(self.parts)})", self.service.ranks)
        total = sum(rank.position.yielded for rank in self.ranks)
        if self.loader.yielded != total:
            raise _fail("loader.yielded", f"the sum of the ranks' (ranks[].yielded: {total})", self.loader.yielded)

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
        if self.save is not None:
            out["save"] = self.save
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return {**out, **self.extra}

    def check_state(self, state: SavedState, *, source: str = "<manifest>") -> None:
        """Refuse a payload whose state (``state``, read after the payload's checksum) is not the one
        this manifest describes: each field the manifest shows must say what the state says."""
        source_of_seed = None if state.seed is None else "user" if state.seed_given else "drawn"
        pairs: list[tuple[str, Any, Any]] = [
            ("loader.epoch", self.loader.epoch, state.position.epoch),
            ("loader.yielded", self.loader.yielded, state.position.yielded),
            ("loader.epoch_finished", self.loader.epoch_finished, state.position.epoch_finished),
            ("loader.lookahead", self.loader.lookahead, state.position.lookahead),
            ("randomness.seed", self.randomness.seed, state.seed),
            ("randomness.seed_source", self.randomness.seed_source, source_of_seed),
        ]
        service = state.service
        if service is not None and self.service.name in SHARDED_SERVICES:  # else a wrapper (sequential) or the user's
            pairs.append(("service.name", self.service.name, service.service))
        if service is None or service.service != self.service.name or service.layout_record() != self.service:
            # the records differ (or cannot be compared): their layouts, to say how
            layout = {} if service is None else service.layout_record().layout \
                if service.service == self.service.name else \
                ServiceLayout.from_dict({"name": self.service.name, **service.layout}, "state.service.layout").layout
            pairs.append(("service", self.service.layout, layout))
        records = () if service is None else service.shards
        pairs.append(("upstream", len(self.upstream), 0 if service is None else len(service.upstream)))
        pairs.append(("shards", len(self.shards), len(records)))
        for i, (shard, record) in enumerate(zip(self.shards, records)):  # named only where they differ
            if (shard is None) != (record is None):
                pairs.append((f"shards[{i}]", shard is None, record is None))
            elif shard is not None and record is not None and shard.yielded != record.yielded:
                pairs.append((f"shards[{i}].yielded", shard.yielded, record.yielded))
        for where, shown, saved in pairs:
            if shown != saved:
                raise ManifestError(where, f"what the payload's state says ({_show(saved)}): the manifest "
                                    "describes another payload", _show(shown), source=source)

    @property
    def is_index(self) -> bool:
        """A directory snapshot's index (its parts hold the state)."""
        return bool(self.parts)


def _quick_format(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= FORMAT_VERSION:
        raise Doubt
    return value


def _quick_none(value: Any) -> tuple[()]:
    """``ranks`` and ``parts`` of a file's manifest (an index, which lists them, is read by ``from_dict``)."""
    if type(value) is not list or value:
        raise Doubt
    return ()


def _quick_save_id(value: Any) -> str:
    if type(value) is not str or not _SAVE_ID.fullmatch(value):
        raise Doubt
    return value


_MANIFEST = Quick(Manifest, (
    ("loader", quick_loader, REQUIRED), ("graph", quick_graph, REQUIRED), ("service", quick_layout, REQUIRED),
    ("format", _quick_format, REQUIRED), ("created", STR, None), ("versions", quick_texts, dict),
    ("randomness", quick_randomness, Randomness), ("shards", quick_records(quick_optional(quick_shard)), REQUIRED),
    ("upstream", quick_records(quick_upstream), ()), ("verify", quick_verify, None), ("payload", quick_payload, None),
    ("ranks", _quick_none, ()), ("parts", _quick_none, ()), ("signature", STR, None), ("save", _quick_save_id, None),
    ("metadata", quick_copy, None)), extra=True)


def _quick_manifest(value: Any) -> Manifest:
    if type(value) is dict and (value.get("parts") or value.get("ranks")):
        raise Doubt  # an index, whose records of every shard are read when used (see _lazy)
    return _checked_manifest(_MANIFEST(value))


def _checked_manifest(manifest: Manifest) -> Manifest:
    try:
        manifest._check_shards()
        manifest._check_ranks()
    except ManifestError:
        raise Doubt from None
    return manifest


_NATIVE = _native.reader(_MANIFEST, _checked_manifest)


def native_manifest(data: bytes) -> Manifest:
    """The manifest in ``data`` (its JSON, as a file holds it) read by msgspec's C decoder against the schema
    (see :mod:`snapshot.schema._native`), or :class:`Doubt`: read it with ``json`` and :meth:`Manifest.from_dict`,
    which judges. (An index's ``ranks`` and ``parts`` are Doubt: it is read as before.)"""
    if _NATIVE is None:
        raise Doubt
    manifest: Manifest = _NATIVE.read(data)
    return manifest


# -- the payload's state ----------------------------------------------------------------------
