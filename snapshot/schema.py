"""The snapshot's schema, version 1: every record a snapshot holds, typed, and validated on read.

A manifest is JSON written by anyone (another version, another tool, a person): its checksum
proves only that it was not damaged since it was written. So every record is read through one
constructor, ``Record.from_dict(value)``, which checks structure, types and ranges before
anything uses it and raises :class:`~snapshot.errors.ManifestError` naming the field path and
what was expected (``graph.nodes[3].path: expected a string, got 5``). Writing goes through
the same types: ``record.to_dict()`` gives the JSON-able dict, and
``Record.from_dict(record.to_dict()) == record``. Fields that this version does not know are
kept in ``extra`` and written back, so a file from a newer writer of the same format
round-trips.

::

    Manifest                          the JSON manifest of a snapshot file (format 1)
    ├── versions: {package: version}
    ├── loader: LoaderPosition        epoch, samples yielded in it, epoch_finished, lookahead
    ├── randomness: Randomness        the seed, where it came from, fingerprints of node seeds
    ├── graph: GraphDesc              fingerprint, included?, nodes
    │   └── nodes: [NodeDesc]         path, type, args (reprs), fingerprint, inputs (paths)
    ├── service: ServiceLayout        the reading service's name, shards, workers, ranks
    │   └── owners: {shard: Owner}    the worker (and rank) that runs each logical shard
    ├── shards: [ShardPosition|None]  per logical shard (None: run by another rank)
    │   ├── plan: PlanSummary         drivers ([Driver]) and why each node replays
    │   └── nodes: {path: NodePosition}
    ├── upstream: [UpstreamPosition]  per copy of the graph above the sharding point
    │   ├── routers: {path: RouterPosition}
    │   └── nodes: {path: NodePosition}
    ├── verify: VerifyRecord | None   fingerprints of the samples after the snapshot
    ├── payload: PayloadRecord | None size, sha256, size of each part
    ├── ranks: [RankPosition]         directory index only: each rank's LoaderPosition
    └── parts: [PartRecord]           directory index only: each rank's file, size, sha256

    SavedState                        the loader's state inside the (pickled) payload
    └── service: ServiceState         the reading service's checkpoint ({} before epoch 0)
        └── shards: [dict | None]     per logical shard: its service's record (nodes, plan, ...)

Two ideas that look alike: in the payload a shard record says ``exhausted`` when the shard's
graph has produced its last sample, and ``finished`` when the loader has also taken that
sample (nothing in flight). The manifest shows only the second, as ``shards[i].exhausted``
(:func:`shard_finished` reads it from a record; names kept for compatibility with files
already written).

This module imports neither torch nor dill: the command line uses it to inspect files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from snapshot._version import DISTRIBUTION, __version__
from snapshot.errors import ManifestError, VersionSkewError

__all__ = [
    "FORMAT_VERSION",
    "Driver",
    "GraphDesc",
    "LoaderPosition",
    "Manifest",
    "NodeDesc",
    "NodePosition",
    "Owner",
    "PartRecord",
    "PayloadRecord",
    "PlanSummary",
    "RankPosition",
    "Randomness",
    "RouterPosition",
    "SavedState",
    "ServiceLayout",
    "ServiceState",
    "ShardPosition",
    "UpstreamPosition",
    "VerifyRecord",
    "check_format",
    "part_name",
    "shard_finished",
]

#: The version of the container and of this schema; written as the manifest's ``format``.
FORMAT_VERSION = 1
#: Which release of ``snapshot`` reads each format version.
READERS = {1: "snapshot 0.1 and later"}

RESTORE_METHODS = ("state", "replay")
#: The reading services whose state is cut into logical shards (``layout.logical_shards``).
SHARDED_SERVICES = frozenset({"InProcessReadingService", "MultiProcessingReadingService",
                              "DistributedReadingService"})
SEED_SOURCES = ("user", "drawn")
#: In a payload's shard record: the loader took the shard's last sample / its graph produced it.
SHARD_FINISHED, SHARD_PRODUCED_ALL = "finished", "exhausted"
_PART_NAME = re.compile(r"rank-(\d{5})\.snap")
_SHA256 = re.compile(r"[0-9a-f]{64}")

T = TypeVar("T")


# -- checking one value -----------------------------------------------------------------------

def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(where: str, expected: str, value: Any) -> ManifestError:
    return ManifestError(where, expected, _show(value))


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    return value


def _int(value: Any, where: str, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        expected = "a non-negative int" if minimum == 0 else "an int" if minimum is None else f"an int >= {minimum}"
        raise _fail(where, expected, value)
    if minimum is not None and value < minimum:
        raise _fail(where, "a non-negative int" if minimum == 0 else f"an int >= {minimum}", value)
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, "a string", value)
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "true or false", value)
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices or not isinstance(value, str):
        raise _fail(where, "one of " + ", ".join(repr(c) for c in choices), value)
    return value


def _sha256(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _fail(where, "a sha256 digest (64 lowercase hex digits)", value)
    return value


def _optional(read: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def optional(value: Any, where: str) -> T | None:
        return None if value is None else read(value, where)
    return optional


def _texts(value: Any, where: str) -> dict[str, str]:
    """An object of strings (a number or a boolean is accepted and kept as its text)."""
    out = {}
    for key, item in _object(value, where).items():
        if isinstance(item, (dict, list)) or item is None:
            raise _fail(f"{where}[{key!r}]", "a string", item)
        out[key] = item if isinstance(item, str) else str(item)
    return out


def _counts(value: Any, where: str) -> dict[str, int]:
    return {key: _int(item, f"{where}[{key!r}]") for key, item in _object(value, where).items()}


class _Fields:
    """The fields of one JSON object, read once each; what is left over is ``extra``."""

    def __init__(self, value: Any, where: str):
        self.where = where
        self.data = _object(value, where)
        self.seen: set[str] = set()

    def required(self, key: str, read: Callable[[Any, str], T]) -> T:
        self.seen.add(key)
        if key not in self.data:
            raise ManifestError(_key(self.where, key), "a value (the field is missing)", "nothing")
        return read(self.data[key], _key(self.where, key))

    def get(self, key: str, read: Callable[[Any, str], T], default: T) -> T:
        self.seen.add(key)
        value = self.data.get(key)
        return default if value is None else read(value, _key(self.where, key))

    def extra(self) -> dict[str, Any]:
        return {key: value for key, value in self.data.items() if key not in self.seen}


def _records(value: Any, where: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
    return tuple(read(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


def _by_path(value: Any, where: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    return {path: read(item, f"{where}[{path!r}]") for path, item in _object(value, where).items()}


def check_format(version: Any, source: str) -> int:
    """``version`` if this installation reads it, else a :class:`VersionSkewError` saying what does."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ManifestError("format", "an int (the 'format' version)", _show(version), source=source)
    if version == FORMAT_VERSION:
        return version
    reader = READERS.get(version)
    if version > FORMAT_VERSION or reader is None:
        newer = version > FORMAT_VERSION
        raise VersionSkewError(
            f"written in snapshot format {version}, which {'a newer release of' if newer else 'no release of'} "
            f"snapshot reads; this installation (snapshot {__version__}) reads format {FORMAT_VERSION} only"
            + (f". Upgrade with `pip install -U {DISTRIBUTION}` on this machine" if newer else
               ": the file is damaged or not one of ours"), source=source)
    raise VersionSkewError(
        f"written in snapshot format {version}, which {reader} read; this installation (snapshot "
        f"{__version__}) reads format {FORMAT_VERSION} only: load it with that release and save it again",
        source=source)


# -- the graph --------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeDesc:
    """One node of the saved graph: its path from the sink, its type, its arguments' reprs."""

    path: str
    type: str
    args: dict[str, str]
    fingerprint: str
    inputs: tuple[str, ...]

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodeDesc:
        f = _Fields(value, where)
        return cls(path=f.required("path", _str), type=f.required("type", _str),
                   args=f.get("args", _texts, {}), fingerprint=f.get("fingerprint", _str, ""),
                   inputs=f.get("inputs", lambda v, w: _records(v, w, _str), ()))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.type, "args": dict(self.args),
                "fingerprint": self.fingerprint, "inputs": list(self.inputs)}

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    def signature(self, *, skip_none: bool = False, width: int = 0, limit: int = 0) -> str:
        """``Type(arg=value, ...)``; ``skip_none`` drops ``None`` arguments, ``width`` shortens
        each value and ``limit`` the whole text (``…`` marks a cut)."""
        parts = []
        for key, value in self.args.items():
            if skip_none and value == "None":
                continue
            if width and len(value) > width:
                value = value[: width - 1] + "…"
            parts.append(f"{key}={value}")
        text = f"{self.short_type}({', '.join(parts)})"
        if limit and len(text) > limit:
            text = text[: limit - 2] + "…)"
        return text


@dataclass(frozen=True)
class GraphDesc:
    """The saved graph as a tree of node paths (nothing unpickled)."""

    fingerprint: str
    included: bool
    nodes: tuple[NodeDesc, ...]

    @classmethod
    def from_dict(cls, value: Any, where: str = "graph") -> GraphDesc:
        f = _Fields(value, where)
        nodes = f.required("nodes", lambda v, w: _records(v, w, NodeDesc.from_dict))
        seen: set[str] = set()
        for i, node in enumerate(nodes):
            if node.path in seen:
                raise _fail(f"{where}.nodes[{i}].path", "a path no other node has", node.path)
            seen.add(node.path)
        for i, node in enumerate(nodes):
            for j, path in enumerate(node.inputs):
                if path not in seen:
                    raise _fail(f"{where}.nodes[{i}].inputs[{j}]", "the path of a node of the graph", path)
        return cls(fingerprint=f.get("fingerprint", _str, ""), included=f.get("included", _bool, False),
                   nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "included": self.included,
                "nodes": [node.to_dict() for node in self.nodes]}

    def paths(self) -> set[str]:
        return {node.path for node in self.nodes}


# -- positions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoaderPosition:
    """Where the loader stands: ``epoch`` (-1 before the first), samples ``yielded`` in it."""

    epoch: int
    yielded: int
    epoch_finished: bool
    lookahead: int = 0

    @classmethod
    def from_dict(cls, value: Any, where: str = "loader") -> LoaderPosition:
        f = _Fields(value, where)
        return cls(epoch=f.required("epoch", lambda v, w: _int(v, w, minimum=-1)),
                   yielded=f.required("yielded", _int),
                   epoch_finished=f.required("epoch_finished", _bool),
                   lookahead=f.get("lookahead", _int, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": self.yielded, "epoch_finished": self.epoch_finished,
                "lookahead": self.lookahead}


@dataclass(frozen=True)
class RankPosition:
    """One rank's loader position, in a distributed snapshot's manifest."""

    rank: int
    position: LoaderPosition

    @classmethod
    def from_dict(cls, value: Any, where: str = "rank") -> RankPosition:
        rank = _int(_object(value, where).get("rank"), _key(where, "rank"))
        fields = {key: item for key, item in value.items() if key != "rank"}
        return cls(rank, LoaderPosition.from_dict(fields, where))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, **self.position.to_dict()}


@dataclass(frozen=True)
class Randomness:
    """The loader's seed, where it came from (``user``, ``drawn``), fingerprints of node seeds."""

    seed: int | None = None
    seed_source: str | None = None
    node_seeds: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "randomness") -> Randomness:
        f = _Fields(value, where)
        return cls(seed=f.get("seed", lambda v, w: _int(v, w, minimum=None), None),
                   seed_source=f.get("seed_source", lambda v, w: _choice(v, w, SEED_SOURCES), None),
                   node_seeds=f.get("node_seeds", _texts, {}))

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "seed_source": self.seed_source, "node_seeds": dict(self.node_seeds)}


@dataclass(frozen=True)
class Owner:
    """The worker (and, in a distributed run, the rank) that runs a logical shard."""

    worker: int
    rank: int | None = None

    @classmethod
    def from_dict(cls, value: Any, where: str = "owner") -> Owner:
        if isinstance(value, dict):
            f = _Fields(value, where)
            return cls(worker=f.required("worker", _int), rank=f.required("rank", _int))
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _fail(where, "a worker index or an object {rank, worker}", value)
        return cls(worker=value)

    def to_dict(self) -> int | dict[str, int]:
        return self.worker if self.rank is None else {"rank": self.rank, "worker": self.worker}


def _shard_keys(value: Any, where: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    out = {}
    for key, item in _object(value, where).items():
        if not key.isdigit():
            raise _fail(where, "an object keyed by logical shard numbers", key)
        out[key] = read(item, f"{where}[{key!r}]")
    return out


def _owners(value: Any, where: str) -> dict[str, Owner]:
    if isinstance(value, list):  # written before 0.1: the worker of each logical shard, in order
        return {str(shard): Owner.from_dict(worker, f"{where}[{shard}]") for shard, worker in enumerate(value)}
    return _shard_keys(value, where, Owner.from_dict)


@dataclass(frozen=True)
class ServiceLayout:
    """The reading service: its class name, logical shards, workers, ranks and shard owners."""

    name: str
    logical_shards: int | None = None
    workers: int | None = None
    ranks: int | None = None
    rank: int | None = None
    owners: dict[str, Owner] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "service") -> ServiceLayout:
        f = _Fields(value, where)
        layout = cls(name=f.get("name", _str, "?"),
                     logical_shards=f.get("logical_shards", lambda v, w: _int(v, w, minimum=1), None),
                     workers=f.get("workers", _int, None),
                     ranks=f.get("ranks", lambda v, w: _int(v, w, minimum=1), None),
                     rank=f.get("rank", _int, None),
                     owners=f.get("owners", _owners, {}),
                     extra=f.extra())
        if layout.logical_shards is not None:
            for key in layout.owners:
                if int(key) >= layout.logical_shards:
                    raise _fail(f"{where}.owners", f"logical shards below {layout.logical_shards}", key)
        return layout

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for key in ("logical_shards", "workers", "ranks", "rank"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.owners:
            out["owners"] = {key: owner.to_dict() for key, owner in self.owners.items()}
        return {**out, **self.extra}

    @property
    def layout(self) -> dict[str, Any]:
        """Every field but the name, as written."""
        return {key: value for key, value in self.to_dict().items() if key != "name"}


@dataclass(frozen=True)
class NodePosition:
    """Where one node of one logical shard (or upstream copy) stands, and how it is restored."""

    yielded: int | None = None
    state_bytes: int | None = None
    buffered: int = 0
    restore: str | None = None
    #: For a buffering node: how its samples were saved, ``"positions"`` or ``"values[: why]"``.
    buffer_state: str | None = None

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodePosition:
        f = _Fields(value, where)
        return cls(yielded=f.get("yielded", _int, None), state_bytes=f.get("state_bytes", _int, None),
                   buffered=f.get("buffered", _int, 0),
                   restore=f.get("restore", lambda v, w: _choice(v, w, RESTORE_METHODS), None),
                   buffer_state=f.get("buffer_state", _str, None))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"yielded": self.yielded, "state_bytes": self.state_bytes, "buffered": self.buffered,
                               "restore": self.restore}
        if self.buffer_state is not None:
            out["buffer_state"] = self.buffer_state
        return out


@dataclass(frozen=True)
class Driver:
    """A node whose subgraph a restore replays, and how many samples it replays."""

    path: str
    replay: int

    @classmethod
    def from_dict(cls, value: Any, where: str = "driver") -> Driver:
        f = _Fields(value, where)
        return cls(path=f.required("path", _str), replay=f.get("replay", _int, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "replay": self.replay}


@dataclass(frozen=True)
class PlanSummary:
    """A logical shard's ``auto`` restore plan: the drivers, and why each node needs replay."""

    drivers: tuple[Driver, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    #: How each buffering node saved its samples (``buffer_state`` of its :class:`NodePosition`).
    buffers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "plan") -> PlanSummary:
        f = _Fields(value, where)
        return cls(drivers=f.get("drivers", lambda v, w: _records(v, w, Driver.from_dict), ()),
                   reasons=f.get("reasons", _texts, {}), buffers=f.get("buffers", _texts, {}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"drivers": [d.to_dict() for d in self.drivers], "reasons": dict(self.reasons)}
        if self.buffers:
            out["buffers"] = dict(self.buffers)
        return out


def _positions(value: Any, where: str) -> dict[str, NodePosition]:
    return _by_path(value, where, NodePosition.from_dict)


@dataclass(frozen=True)
class ShardPosition:
    """One logical shard: samples the loader took from it, its plan, its nodes' positions.

    ``exhausted``: the loader has taken the shard's last sample this epoch.
    """

    yielded: int
    produced: int | None = None
    exhausted: bool = False
    in_flight: int = 0
    plan: PlanSummary = field(default_factory=PlanSummary)
    nodes: dict[str, NodePosition] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "shard") -> ShardPosition:
        f = _Fields(value, where)
        return cls(yielded=f.required("yielded", _int), produced=f.get("produced", _int, None),
                   exhausted=f.get("exhausted", _bool, False), in_flight=f.get("in_flight", _int, 0),
                   plan=f.get("plan", PlanSummary.from_dict, PlanSummary()),
                   nodes=f.get("nodes", _positions, {}), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded, "produced": self.produced, "exhausted": self.exhausted,
                "in_flight": self.in_flight, "plan": self.plan.to_dict(),
                "nodes": {path: node.to_dict() for path, node in self.nodes.items()}, **self.extra}


@dataclass(frozen=True)
class RouterPosition:
    """Where a sharding point stands in one upstream copy, and samples queued per shard."""

    position: int
    ended: bool = False
    queued: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "router") -> RouterPosition:
        f = _Fields(value, where)
        return cls(position=f.required("position", _int), ended=f.get("ended", _bool, False),
                   queued=f.get("queued", lambda v, w: _shard_keys(v, w, _int), {}))

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "ended": self.ended, "queued": dict(self.queued)}


@dataclass(frozen=True)
class UpstreamPosition:
    """One copy of the graph above the sharding point (one per process), feeding ``shards``."""

    shards: tuple[int, ...] = ()
    routers: dict[str, RouterPosition] = field(default_factory=dict)
    nodes: dict[str, NodePosition] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "upstream") -> UpstreamPosition:
        f = _Fields(value, where)
        return cls(shards=f.get("shards", lambda v, w: _records(v, w, _int), ()),
                   routers=f.get("routers", lambda v, w: _by_path(v, w, RouterPosition.from_dict), {}),
                   nodes=f.get("nodes", _positions, {}), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"shards": list(self.shards),
                "routers": {path: r.to_dict() for path, r in self.routers.items()},
                "nodes": {path: node.to_dict() for path, node in self.nodes.items()}, **self.extra}


# -- checks and the payload -------------------------------------------------------------------

@dataclass(frozen=True)
class VerifyRecord:
    """``save_snapshot(verify=K)``: fingerprints of the next K samples; ``ends``: the epoch ended sooner."""

    count: int
    fingerprints: tuple[str, ...]
    ends: bool

    @classmethod
    def from_dict(cls, value: Any, where: str = "verify") -> VerifyRecord:
        f = _Fields(value, where)
        record = cls(count=f.required("count", _int),
                     fingerprints=f.required("fingerprints", lambda v, w: _records(v, w, _str)),
                     ends=f.get("ends", _bool, False))
        if len(record.fingerprints) > record.count:
            raise _fail(f"{where}.fingerprints", f"at most count={record.count} fingerprints",
                        f"{len(record.fingerprints)} of them")
        return record

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "fingerprints": list(self.fingerprints), "ends": self.ends}


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
        count = self.service.logical_shards
        if count is not None and self.shards and len(self.shards) != count:
            raise _fail("shards", f"one entry per logical shard ({count}, as service.logical_shards says)",
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

def shard_finished(record: Mapping[str, Any]) -> bool:
    """Whether the loader has taken a saved logical shard's last sample (the manifest's ``exhausted``)."""
    return bool(record.get(SHARD_FINISHED, record.get(SHARD_PRODUCED_ALL, False)))


@dataclass(frozen=True)
class ServiceState:
    """A reading service's checkpoint, as it travels in the payload (``{}`` before the first epoch).

    Only its frame is typed here: the layout and one record (or ``None``) per logical shard
    (required of the built-in services, and of any service whose layout names
    ``logical_shards``). The records' contents belong to the service that wrote them.
    """

    service: str
    layout: dict[str, Any]
    shards: tuple[dict[str, Any] | None, ...]
    upstream: tuple[dict[str, Any], ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "state.service") -> ServiceState | None:
        if isinstance(value, dict) and not value:
            return None
        f = _Fields(value, where)
        state = cls(service=f.required("service", _str), layout=f.required("layout", _object_copy),
                    shards=f.required("shards", lambda v, w: _records(v, w, _optional(_object_copy))),
                    upstream=f.get("upstream", lambda v, w: _records(v, w, _object_copy), ()),
                    extra=f.extra())
        if state.service not in SHARDED_SERVICES and "logical_shards" not in state.layout:
            return state  # a service of the user's own: its layout is its business
        _int(state.layout.get("logical_shards"), f"{where}.layout.logical_shards", minimum=1)
        if len(state.shards) != state.layout["logical_shards"]:
            raise _fail(f"{where}.shards", f"{state.layout['logical_shards']} records (one per logical shard)",
                        f"{len(state.shards)}")
        return state

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "layout": dict(self.layout), **self.extra,
                "upstream": list(self.upstream), "shards": list(self.shards)}


def _object_copy(value: Any, where: str) -> dict[str, Any]:
    return dict(_object(value, where))


@dataclass(frozen=True)
class SavedState:
    """The loader's state in the payload: its position, randomness, lookahead and service state."""

    position: LoaderPosition
    seed: int | None
    seed_given: bool
    pending_seed: int | None
    generator: dict[str, Any] | None
    service: ServiceState | None
    lookahead: tuple[Any, ...] = ()

    @classmethod
    def from_dict(cls, value: Any, where: str = "state") -> SavedState:
        f = _Fields(value, where)
        position = LoaderPosition(
            epoch=f.required("epoch", lambda v, w: _int(v, w, minimum=-1)),
            yielded=f.required("yielded", _int), epoch_finished=f.required("epoch_finished", _bool))
        lookahead: list[Any] = f.get("lookahead", _list, [])
        return cls(position=LoaderPosition(position.epoch, position.yielded, position.epoch_finished,
                                           len(lookahead)),
                   seed=f.get("seed", lambda v, w: _int(v, w, minimum=None), None),
                   seed_given=f.get("seed_given", _bool, False),
                   pending_seed=f.get("pending_seed", lambda v, w: _int(v, w, minimum=None), None),
                   generator=f.get("generator", _object_copy, None),
                   service=f.required("service", ServiceState.from_dict),
                   lookahead=tuple(lookahead))

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.position.epoch, "yielded": self.position.yielded,
                "epoch_finished": self.position.epoch_finished, "seed": self.seed,
                "seed_given": self.seed_given, "pending_seed": self.pending_seed,
                "generator": self.generator,
                "service": {} if self.service is None else self.service.to_dict(),
                "lookahead": list(self.lookahead)}
