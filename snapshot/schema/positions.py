"""Where every part of the graph stood: node and shard positions, routers, the upstream copies,
the replay plan's summary, verification, and the payload's saved state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshot.schema import _native
from snapshot.schema._fields import (
    MAX_COUNT,
    RESTORE_METHODS,
    SHARD_FINISHED,
    SHARD_PRODUCED_ALL,
    _bool,
    _by_path,
    _choice,
    _fail,
    _Fields,
    _int,
    _records,
    _str,
    _texts,
)
from snapshot.schema._quick import (
    BOOL,
    COUNT,
    REQUIRED,
    STR,
    Doubt,
    Quick,
    quick_by_path,
    quick_choice,
    quick_ints,
    quick_records,
    quick_strs,
    quick_texts,
)
from snapshot.schema.layout import _shard_keys


@dataclass(frozen=True)
class ReaderPosition:
    """Where a file reader stands (what its state says, read at save time so that ``inspect`` needs no
    payload): the file or URL, the archive member it is reading, and its offset in the stream it reads
    (bytes of the member, of the file, or of the file's decompressed view when ``inflated``); or, for
    ``load_from_zip``, the index of the archive's next ``entry``."""

    file: str
    member: str | None = None
    offset: int | None = None
    entry: int | None = None
    #: The stream is a decompressed view (``decompress``, a compressed tar): a restore inflates it up to ``offset``.
    inflated: bool = False

    @classmethod
    def from_dict(cls, value: Any, where: str = "reading") -> ReaderPosition:
        try:
            return _READER(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(file=f.required("file", _str), member=f.get("member", _str, None),
                   offset=f.get("offset", _int, None), entry=f.get("entry", _int, None),
                   inflated=f.get("inflated", _bool, False))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file}
        out.update((key, value) for key, value in (("member", self.member), ("offset", self.offset),
                                                   ("entry", self.entry)) if value is not None)
        if self.inflated:
            out["inflated"] = True
        return out


_READER = Quick(ReaderPosition, (("file", STR, REQUIRED), ("member", STR, None), ("offset", COUNT, None),
                                 ("entry", COUNT, None), ("inflated", BOOL, False)))


@dataclass(frozen=True)
class NodePosition:
    """Where one node of one logical shard (or upstream copy) stands, and how it is restored."""

    yielded: int | None = None
    state_bytes: int | None = None
    buffered: int = 0
    restore: str | None = None
    #: For a buffering node: how its samples were saved, ``"positions"`` or ``"values[: why]"``.
    buffer_state: str | None = None
    #: For a file reader restored from its state: where it stands (absent from older files).
    reading: ReaderPosition | None = None

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodePosition:
        try:
            return _NODE(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(yielded=f.get("yielded", _int, None), state_bytes=f.get("state_bytes", _int, None),
                   buffered=f.get("buffered", _int, 0),
                   restore=f.get("restore", lambda v, w: _choice(v, w, RESTORE_METHODS), None),
                   buffer_state=f.get("buffer_state", _str, None),
                   reading=f.get("reading", ReaderPosition.from_dict, None))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"yielded": self.yielded, "state_bytes": self.state_bytes, "buffered": self.buffered,
                               "restore": self.restore}
        if self.buffer_state is not None:
            out["buffer_state"] = self.buffer_state
        if self.reading is not None:
            out["reading"] = self.reading.to_dict()
        return out


_NODE = Quick(NodePosition, (("yielded", COUNT, None), ("state_bytes", COUNT, None), ("buffered", COUNT, 0),
                             ("restore", quick_choice(RESTORE_METHODS), None), ("buffer_state", STR, None),
                             ("reading", _READER, None)))


@dataclass(frozen=True)
class Driver:
    """A node whose subgraph a restore replays, and how many samples it replays."""

    path: str
    replay: int

    @classmethod
    def from_dict(cls, value: Any, where: str = "driver") -> Driver:
        try:
            return _DRIVER(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(path=f.required("path", _str), replay=f.get("replay", _int, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "replay": self.replay}


_DRIVER = Quick(Driver, (("path", STR, REQUIRED), ("replay", COUNT, 0)))


@dataclass(frozen=True)
class PlanSummary:
    """A logical shard's ``auto`` restore plan: the drivers, and why each node needs replay."""

    drivers: tuple[Driver, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    #: How each buffering node saved its samples (``buffer_state`` of its :class:`NodePosition`).
    buffers: dict[str, str] = field(default_factory=dict)
    #: Nodes restored from their state whose restore reads something again, and what (a file
    #: reader behind ``decompress`` re-inflates its current file up to the saved offset).
    rereads: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "plan") -> PlanSummary:
        try:
            return _PLAN(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(drivers=f.get("drivers", lambda v, w: _records(v, w, Driver.from_dict), ()),
                   reasons=f.get("reasons", _texts, {}), buffers=f.get("buffers", _texts, {}),
                   rereads=f.get("rereads", _texts, {}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"drivers": [d.to_dict() for d in self.drivers], "reasons": dict(self.reasons)}
        if self.buffers:
            out["buffers"] = dict(self.buffers)
        if self.rereads:
            out["rereads"] = dict(self.rereads)
        return out


_PLAN = Quick(PlanSummary, (("drivers", quick_records(_DRIVER), ()), ("reasons", quick_texts, dict),
                            ("buffers", quick_texts, dict), ("rereads", quick_texts, dict)))


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
        try:
            return quick_shard(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(yielded=f.required("yielded", _int), produced=f.get("produced", _int, None),
                   exhausted=f.get("exhausted", _bool, False), in_flight=f.get("in_flight", _int, 0),
                   plan=f.get("plan", PlanSummary.from_dict, PlanSummary()),
                   nodes=f.get("nodes", _positions, {}), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded, "produced": self.produced, "exhausted": self.exhausted,
                "in_flight": self.in_flight, "plan": self.plan.to_dict(),
                "nodes": {path: node.to_dict() for path, node in self.nodes.items()}, **self.extra}


_NODES = quick_by_path(_NODE)
#: The quick reader of :class:`ShardPosition` (Doubt: read it with ``from_dict``).
quick_shard = Quick(ShardPosition, (("yielded", COUNT, REQUIRED), ("produced", COUNT, None),
                                    ("exhausted", BOOL, False), ("in_flight", COUNT, 0), ("plan", _PLAN, PlanSummary),
                                    ("nodes", _NODES, dict)), extra=True)


@dataclass(frozen=True)
class RouterPosition:
    """Where a sharding point stands in one upstream copy, and samples queued per shard."""

    position: int
    ended: bool = False
    queued: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "router") -> RouterPosition:
        try:
            return _ROUTER(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(position=f.required("position", _int), ended=f.get("ended", _bool, False),
                   queued=f.get("queued", lambda v, w: _shard_keys(v, w, _int), {}))

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "ended": self.ended, "queued": dict(self.queued)}


def _quick_queued(value: Any) -> dict[str, int]:
    """``_shard_keys(..., _int)``."""
    if type(value) is not dict:
        raise Doubt
    for key, item in value.items():
        if type(key) is not str or not key.isdigit() or type(item) is not int or not 0 <= item <= MAX_COUNT:
            raise Doubt
    return dict(value)


_ROUTER = Quick(RouterPosition, (("position", COUNT, REQUIRED), ("ended", BOOL, False),
                                 ("queued", _quick_queued, dict)))


@dataclass(frozen=True)
class UpstreamPosition:
    """One copy of the graph above the sharding point (one per process), feeding ``shards``."""

    shards: tuple[int, ...] = ()
    routers: dict[str, RouterPosition] = field(default_factory=dict)
    nodes: dict[str, NodePosition] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "upstream") -> UpstreamPosition:
        try:
            return quick_upstream(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(shards=f.get("shards", lambda v, w: _records(v, w, _int), ()),
                   routers=f.get("routers", lambda v, w: _by_path(v, w, RouterPosition.from_dict), {}),
                   nodes=f.get("nodes", _positions, {}), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"shards": list(self.shards),
                "routers": {path: r.to_dict() for path, r in self.routers.items()},
                "nodes": {path: node.to_dict() for path, node in self.nodes.items()}, **self.extra}


#: The quick reader of :class:`UpstreamPosition` (Doubt: read it with ``from_dict``).
quick_upstream = Quick(UpstreamPosition, (("shards", quick_ints(), ()), ("routers", quick_by_path(_ROUTER), dict),
                                          ("nodes", _NODES, dict)), extra=True)


# -- checks and the payload -------------------------------------------------------------------

@dataclass(frozen=True)
class VerifyRecord:
    """``save_snapshot(verify=K)``: fingerprints of the next K samples; ``ends``: the epoch ended sooner."""

    count: int
    fingerprints: tuple[str, ...]
    ends: bool

    @classmethod
    def from_dict(cls, value: Any, where: str = "verify") -> VerifyRecord:
        try:
            return quick_verify(value)
        except Doubt:
            pass
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


_VERIFY = Quick(VerifyRecord, (("count", COUNT, REQUIRED), ("fingerprints", quick_strs, REQUIRED),
                               ("ends", BOOL, False)))


def _checked_verify(record: VerifyRecord) -> VerifyRecord:
    if len(record.fingerprints) > record.count:
        raise Doubt
    return record


def quick_verify(value: Any) -> VerifyRecord:
    """The quick reader of :class:`VerifyRecord` (Doubt: read it with ``from_dict``)."""
    return _checked_verify(_VERIFY(value))


_native.register(quick_verify, _VERIFY, _checked_verify)


def shard_finished(record: Mapping[str, Any]) -> bool:
    """Whether the loader has taken a saved logical shard's last sample (the manifest's ``exhausted``)."""
    return bool(record.get(SHARD_FINISHED, record.get(SHARD_PRODUCED_ALL, False)))


# The payload's records moved to snapshot.schema.saved (with the records they nest, in
# snapshot.schema.state); importable from here as before.
from snapshot.schema.saved import SavedState, ServiceState  # noqa: E402,F401
