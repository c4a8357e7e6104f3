"""What ran: the graph's description, the loader's position and randomness, and the reading
service's layout (shards, workers, ranks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from snapshot.schema._fields import (
    EVEN_BATCHES,
    MAX_COUNT,
    SEED_SOURCES,
    SHARDED_SERVICES,
    T,
    _bool,
    _choice,
    _fail,
    _Fields,
    _int,
    _key,
    _object,
    _records,
    _seed,
    _str,
    _texts,
)


@dataclass(frozen=True)
class NodeDesc:
    """One node of the saved graph: its path from the sink, its type, its arguments' reprs."""

    path: str
    type: str
    args: dict[str, str]
    fingerprint: str
    inputs: tuple[str, ...]
    #: Code fingerprint per function argument (``"3.11:<digest>"``); absent in older snapshots.
    code: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodeDesc:
        f = _Fields(value, where)
        return cls(path=f.required("path", _str), type=f.required("type", _str),
                   args=f.get("args", _texts, {}), fingerprint=f.get("fingerprint", _str, ""),
                   inputs=f.get("inputs", lambda v, w: _records(v, w, _str), ()), code=f.get("code", _texts, {}))

    def to_dict(self) -> dict[str, Any]:
        described = {"path": self.path, "type": self.type, "args": dict(self.args),
                     "fingerprint": self.fingerprint, "inputs": list(self.inputs)}
        return {**described, "code": dict(self.code)} if self.code else described

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
    #: The saving loader's policy for changed functions (``plan.CodeChanges``); absent when "refuse".
    code_changes: str = "refuse"

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
                   nodes=nodes, code_changes=f.get("code_changes", _str, "refuse"))

    def to_dict(self) -> dict[str, Any]:
        described = {"fingerprint": self.fingerprint, "included": self.included,
                     "nodes": [node.to_dict() for node in self.nodes]}
        return described if self.code_changes == "refuse" else {**described, "code_changes": self.code_changes}

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
class Handout:
    """What a rank hands out besides its shards' streams, counted (the values are in its part): samples
    to yield before its restored stream (``first``), samples it had read to share with ranks that ran
    out (``spare``), whether the ranks were sharing the rest of the epoch, and whether the equalizing
    policy had ended it (``reading_service._ranks.even``)."""

    first: int = 0
    spare: int = 0
    sharing: bool = False
    ended: bool = False

    @classmethod
    def from_dict(cls, value: Any, where: str = "handout") -> Handout:
        f = _Fields(value, where)
        return cls(first=f.get("first", _int, 0), spare=f.get("spare", _int, 0),
                   sharing=f.get("sharing", _bool, False), ended=f.get("ended", _bool, False))

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "spare": self.spare, "sharing": self.sharing, "ended": self.ended}


#: The layout key of a rank's :class:`Handout` (in a part's ``service``; the index moves it to ``ranks``).
HANDOUT = "handout"


@dataclass(frozen=True)
class RankPosition:
    """One rank's loader position, in a distributed snapshot's manifest, and what it hands out."""

    rank: int
    position: LoaderPosition
    handout: Handout | None = None

    @classmethod
    def from_dict(cls, value: Any, where: str = "rank") -> RankPosition:
        rank = _int(_object(value, where).get("rank"), _key(where, "rank"))
        fields = {key: item for key, item in value.items() if key not in ("rank", HANDOUT)}
        handout = Handout.from_dict(value[HANDOUT], _key(where, HANDOUT)) if value.get(HANDOUT) is not None else None
        return cls(rank, LoaderPosition.from_dict(fields, where), handout)

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, **self.position.to_dict()}
        if self.handout is not None:
            out[HANDOUT] = self.handout.to_dict()
        return out


@dataclass(frozen=True)
class Randomness:
    """The loader's seed, where it came from (``user``, ``drawn``), fingerprints of node seeds."""

    seed: int | None = None
    seed_source: str | None = None
    node_seeds: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "randomness") -> Randomness:
        f = _Fields(value, where)
        randomness = cls(seed=f.get("seed", _seed, None),
                         seed_source=f.get("seed_source", lambda v, w: _choice(v, w, SEED_SOURCES), None),
                         node_seeds=f.get("node_seeds", _texts, {}))
        if (randomness.seed is None) != (randomness.seed_source is None):
            # a seed is always written with where it came from, and a source never without its seed
            raise _fail(f"{where}.seed_source" if randomness.seed is None else f"{where}.seed",
                        "a seed and its source together, or neither",
                        f"seed={randomness.seed!r}, seed_source={randomness.seed_source!r}")
        return randomness

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
    # an index lists an owner for every unit of the job: the plain ones read at once, any other in full
    plain = {key: Owner(item["worker"], item["rank"]) for key, item in _object(value, where).items()
             if type(item) is dict and _count(item.get("worker")) and _count(item.get("rank")) and key.isdigit()}
    return plain if len(plain) == len(value) else _shard_keys(value, where, Owner.from_dict)


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


@dataclass(frozen=True)
class ServiceLayout:
    """The reading service: its class name, logical shards (and the epoch's units, when they are
    split into sub-shards), workers, ranks and the owners of the units."""

    name: str
    logical_shards: int | None = None
    units: int | None = None
    workers: int | None = None
    ranks: int | None = None
    rank: int | None = None
    owners: dict[str, Owner] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "service") -> ServiceLayout:
        f = _Fields(value, where)
        layout = cls(name=f.required("name", _str),
                     logical_shards=f.get("logical_shards", lambda v, w: _int(v, w, minimum=1), None),
                     units=f.get("units", lambda v, w: _int(v, w, minimum=1), None),
                     workers=f.get("workers", _int, None),
                     ranks=f.get("ranks", lambda v, w: _int(v, w, minimum=1), None),
                     rank=f.get("rank", _int, None),
                     owners=f.get("owners", _owners, {}),
                     extra=f.extra())
        layout._check(where, f.data.get("owners"))
        return layout

    def _check(self, where: str, owners: Any) -> None:
        """The layout agrees with itself: ranks, units, policies and owners within their bounds."""
        if self.rank is not None and (self.ranks is None or self.rank >= self.ranks):
            raise _fail(f"{where}.rank", f"a rank below service.ranks ({self.ranks})", self.rank)
        if "even_batches" in self.extra and self.extra["even_batches"] not in EVEN_BATCHES:
            raise _fail(f"{where}.even_batches", "one of 'drop', 'pad', null", self.extra["even_batches"])
        units = self.units
        if self.logical_shards is None:
            return  # before the first epoch, or a service of the user's own
        if units is not None:
            _int(units, f"{where}.units", minimum=self.logical_shards)
            if units % self.logical_shards:
                raise _fail(f"{where}.units", f"a multiple of logical_shards ({self.logical_shards})", units)
        if self.name in SHARDED_SERVICES:
            for key in ("workers", "ranks"):
                if getattr(self, key) is None:
                    raise _fail(f"{where}.{key}", f"a value (the field is missing; {self.name} writes it)",
                                "nothing")
            if not self.owners:
                raise _fail(f"{where}.owners", f"the worker that runs each logical shard (an object "
                            f"{{shard: worker}}; {self.name} with {self.logical_shards} logical shards has "
                            "at least one)", owners)
        limit = max(self.logical_shards, units or 0)
        for key, owner in self.owners.items():
            if int(key) >= limit:
                raise _fail(f"{where}.owners", f"logical shards below {limit}", key)
            if self.workers is not None and owner.worker >= max(self.workers, 1):
                raise _fail(f"{where}.owners[{key!r}].worker", f"a worker below service.workers "
                            f"({self.workers}; 0 means the loader's own process)", owner.worker)
            if owner.rank is not None and self.ranks is not None and owner.rank >= self.ranks:
                raise _fail(f"{where}.owners[{key!r}].rank", f"a rank below service.ranks ({self.ranks})",
                            owner.rank)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for key in ("logical_shards", "units", "workers", "ranks", "rank"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.owners:
            out["owners"] = {key: owner.to_dict() for key, owner in self.owners.items()}
        return {**out, **self.extra}

    @property
    def layout(self) -> dict[str, Any]:
        """Every field but the name, as written."""
        return {key: value for key, value in self.to_dict().items() if key != "name"}
