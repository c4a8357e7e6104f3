"""Where every part of the graph stood: node and shard positions, routers, the upstream copies,
the replay plan's summary, verification, and the payload's saved state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshot.schema._fields import (
    RESTORE_METHODS,
    SHARD_FINISHED,
    SHARD_PRODUCED_ALL,
    SHARDED_SERVICES,
    _bool,
    _by_path,
    _choice,
    _fail,
    _Fields,
    _int,
    _list,
    _object,
    _optional,
    _records,
    _seed,
    _str,
    _texts,
)
from snapshot.schema.layout import LoaderPosition, ServiceLayout, _shard_keys


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
        count = _int(state.layout.get("logical_shards"), f"{where}.layout.logical_shards", minimum=1)
        if "name" in state.layout:
            raise _fail(f"{where}.layout", "no 'name' (the service's name is state.service.service)", "name")
        layout = ServiceLayout.from_dict({"name": state.service, **state.layout}, f"{where}.layout")
        units = layout.units or count
        if len(state.shards) != units:
            what = "logical shard" if units == count else "logical shard or sub-shard"
            raise _fail(f"{where}.shards", f"{units} records (one per {what})",
                        f"{len(state.shards)}")
        for i, record in enumerate(state.shards):
            if record is not None:  # the figures the manifest shows of it
                _Fields(record, f"{where}.shards[{i}]").get("yielded", _int, 0)
        return state

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "layout": dict(self.layout), **self.extra,
                "upstream": list(self.upstream), "shards": list(self.shards)}


def _object_copy(value: Any, where: str) -> dict[str, Any]:
    return dict(_object(value, where))


def _words(value: Any, where: str, count: int) -> list[int]:
    words = _list(value, where)
    if len(words) != count:
        raise _fail(where, f"{count} 32-bit words", value)
    return [_int(word, f"{where}[{i}]", maximum=2**32 - 1) for i, word in enumerate(words)]


def _philox(value: Any, where: str) -> dict[str, Any]:
    f = _Fields(value, where)
    return {"key": f.required("key", lambda v, w: _words(v, w, 2)),
            "counter": f.required("counter", lambda v, w: _words(v, w, 4)),
            "cached": f.get("cached", lambda v, w: _words(v, w, 2), None),
            "spawn_key": f.required("spawn_key", lambda v, w: _words(v, w, 2))}


def _generator(value: Any, where: str) -> dict[str, Any]:
    """The loader's seed generator (``snapshot.randomness.SeedGenerator.state()``): two Philox streams."""
    f = _Fields(value, where)
    return {"shared": f.required("shared", _philox), "shard": f.required("shard", _philox)}


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
        saved = cls(position=LoaderPosition(position.epoch, position.yielded, position.epoch_finished,
                                            len(lookahead)),
                    seed=f.get("seed", _seed, None),
                    seed_given=f.get("seed_given", _bool, False),
                    pending_seed=f.get("pending_seed", _seed, None),
                    generator=f.get("generator", _generator, None),
                    service=f.required("service", ServiceState.from_dict),
                    lookahead=tuple(lookahead))
        if position.epoch >= 0 and saved.generator is None:
            raise _fail(f"{where}.generator", f"the seed generator of epoch {position.epoch} (every epoch has one)",
                        None)
        return saved

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.position.epoch, "yielded": self.position.yielded,
                "epoch_finished": self.position.epoch_finished, "seed": self.seed,
                "seed_given": self.seed_given, "pending_seed": self.pending_seed,
                "generator": self.generator,
                "service": {} if self.service is None else self.service.to_dict(),
                "lookahead": list(self.lookahead)}
