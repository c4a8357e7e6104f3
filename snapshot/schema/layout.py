"""What ran: the graph's description, the loader's position and randomness, and the reading
service's layout (shards, workers, ranks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import ManifestError
from snapshot.schema import _native
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
    _seed,
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
    build,
    quick_choice,
    quick_int,
    quick_seed,
    quick_texts,
)
from snapshot.schema.graph import GraphDesc, NodeDesc, quick_graph  # noqa: F401 (their home before)

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
        try:
            return quick_loader(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(epoch=f.required("epoch", lambda v, w: _int(v, w, minimum=-1)),
                   yielded=f.required("yielded", _int),
                   epoch_finished=f.required("epoch_finished", _bool),
                   lookahead=f.get("lookahead", _int, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": self.yielded, "epoch_finished": self.epoch_finished,
                "lookahead": self.lookahead}


quick_loader = Quick(LoaderPosition, (("epoch", quick_int(-1), REQUIRED), ("yielded", COUNT, REQUIRED),
                                 ("epoch_finished", BOOL, REQUIRED), ("lookahead", COUNT, 0)))


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
        try:
            return quick_handout(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(first=f.get("first", _int, 0), spare=f.get("spare", _int, 0),
                   sharing=f.get("sharing", _bool, False), ended=f.get("ended", _bool, False))

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "spare": self.spare, "sharing": self.sharing, "ended": self.ended}


quick_handout = Quick(Handout, (("first", COUNT, 0), ("spare", COUNT, 0), ("sharing", BOOL, False),
                                ("ended", BOOL, False)))


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
        try:
            return quick_randomness(value)
        except Doubt:
            pass
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


_RANDOMNESS = Quick(Randomness, (("seed", quick_seed, None), ("seed_source", quick_choice(SEED_SOURCES), None),
                                 ("node_seeds", quick_texts, dict)))


def _checked_randomness(randomness: Randomness) -> Randomness:
    if (randomness.seed is None) != (randomness.seed_source is None):
        raise Doubt
    return randomness


def quick_randomness(value: Any) -> Randomness:
    return _checked_randomness(_RANDOMNESS(value))


_native.register(quick_randomness, _RANDOMNESS, _checked_randomness)


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
        try:
            return quick_layout(value)
        except Doubt:
            pass
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


def _quick_owners(value: Any) -> dict[str, Owner]:
    """``_owners`` of an object whose keys are shard numbers and whose owners are plain."""
    if type(value) is not dict:
        raise Doubt
    out = {}
    for key, item in value.items():
        if type(key) is not str or not key.isdigit():
            raise Doubt
        if type(item) is int and 0 <= item <= MAX_COUNT:
            out[key] = build(Owner, {"worker": item, "rank": None})
        elif type(item) is dict and _count(item.get("worker")) and _count(item.get("rank")):
            out[key] = build(Owner, {"worker": item["worker"], "rank": item["rank"]})
        else:
            raise Doubt
    return out


_LAYOUT = Quick(ServiceLayout, (("name", STR, REQUIRED), ("logical_shards", quick_int(1), None),
                                ("units", quick_int(1), None), ("workers", COUNT, None), ("ranks", quick_int(1), None),
                                ("rank", COUNT, None), ("owners", _quick_owners, dict)), extra=True)


def _checked_layout(layout: ServiceLayout) -> ServiceLayout:
    try:
        layout._check("", None)  # the owners as written are only shown in the error, which Doubt leaves out
    except ManifestError:
        raise Doubt from None
    return layout


def quick_layout(value: Any) -> ServiceLayout:
    """The quick reader of :class:`ServiceLayout` (Doubt: read it with ``from_dict``)."""
    return _checked_layout(_LAYOUT(value))


_native.register(quick_layout, _LAYOUT, _checked_layout)
