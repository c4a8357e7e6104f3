"""The root of the payload's state: the loader's record and the reading service's record (see
:mod:`snapshot.schema.state` for the tree and the records they nest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from snapshot.schema._fields import (
    MAX_COUNT,
    SHARDED_SERVICES,
    _bool,
    _fail,
    _Fields,
    _int,
    _items,
    _list,
    _object,
    _optional,
    _records,
    _seed,
    _str,
)
from snapshot.schema._quick import (
    ANY,
    BOOL,
    COUNT,
    REQUIRED,
    STR,
    Doubt,
    Quick,
    build,
    quick_copy,
    quick_int,
    quick_list,
    quick_list_copy,
    quick_optional,
    quick_records,
    quick_seed,
)
from snapshot.schema.layout import Handout, LoaderPosition, ServiceLayout, quick_handout, quick_layout
from snapshot.schema.seeds import SeedsState, _generator, _quick_generator, quick_seeds
from snapshot.schema.state import (
    NodeState,
    ShardState,
    TailState,
    UpstreamState,
    _any,
    quick_shard_state,
    quick_tail,
    quick_upstream_state,
)

__all__ = ["RankServiceState", "RankState", "SavedState", "ServiceState", "map_node_states"]


@dataclass
class RankServiceState:
    """One rank's service in a distributed snapshot joined from its parts (never written as such)."""

    VERSION: ClassVar[int] = 1

    rank: int
    #: That rank's merge position (``reading_service._shards.merge.RoundRobin.state()``; ``None``: not read).
    merge: Any = None
    #: That rank's ``even_batches`` record (``reading_service._ranks.even``; ``None``: its part was not read).
    even_batches: Any = None
    #: What it hands out besides its stream, counted (from the index: known for every rank).
    handout: Handout | None = None
    #: Its loader had ended the saved epoch (from the index).
    epoch_finished: bool = False

    @classmethod
    def from_dict(cls, value: Any, where: str = "rank") -> RankServiceState:
        try:
            return _RANK_SERVICE(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(rank=f.required("rank", _int), merge=f.get("merge", _any, None),
                   even_batches=f.get("even_batches", _any, None), handout=f.get("handout", Handout.from_dict, None),
                   epoch_finished=f.get("epoch_finished", _bool, False))

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "merge": self.merge, "even_batches": self.even_batches,
               "epoch_finished": self.epoch_finished}
        if self.handout is not None:
            out["handout"] = self.handout.to_dict()
        return out


_RANK_SERVICE = Quick(RankServiceState, (("rank", COUNT, REQUIRED), ("merge", ANY, None), ("even_batches", ANY, None),
                                         ("handout", quick_handout, None), ("epoch_finished", BOOL, False)))


def _shards(value: Any, where: str) -> list[ShardState | None]:
    return list(_records(value, where, _optional(ShardState.from_dict)))


@dataclass
class ServiceState:
    """A reading service's checkpoint, as it travels in the payload (``{}``, read as ``None``, before
    the first epoch).

    The built-in services write every field; a service of the user's own writes at least
    ``service``, ``layout`` and ``shards``, and what else it writes is kept in ``extra``.
    """

    VERSION: ClassVar[int] = 1

    service: str
    #: Workers, ranks, logical shards, units, owners (the manifest's ``service`` but its name).
    layout: dict[str, Any]
    shards: list[ShardState | None]
    upstream: list[UpstreamState] = field(default_factory=list)
    seeds: SeedsState | None = None
    #: Where the round robin over the shards stands (``reading_service._shards.merge.RoundRobin.state()``).
    merge: Any = None
    #: ``DistributedReadingService``'s even-batches record (``reading_service._ranks.even``).
    even_batches: Any = None
    #: The part below a non-replicable pipe (``reading_service._shards.tail.Tail.capture()``).
    tail: TailState | None = None
    ranks: list[RankServiceState] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "state.service") -> ServiceState | None:
        if isinstance(value, dict) and not value:
            return None
        try:
            return _quick_service(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        state = cls(service=f.required("service", _str), layout=dict(f.required("layout", _object)),
                    shards=f.required("shards", _shards),
                    upstream=f.get("upstream", _items(UpstreamState.from_dict), []),
                    seeds=f.get("seeds", SeedsState.from_dict, None), merge=f.get("merge", _any, None),
                    even_batches=f.get("even_batches", _any, None), tail=f.get("tail", TailState.from_dict, None),
                    ranks=f.get("ranks", _items(RankServiceState.from_dict), []),
                    extra=f.extra())
        if state.service not in SHARDED_SERVICES and "logical_shards" not in state.layout:
            return state  # a service of the user's own: its layout is its business
        count = _int(state.layout.get("logical_shards"), f"{where}.layout.logical_shards", minimum=1)
        if "name" in state.layout:
            raise _fail(f"{where}.layout", "no 'name' (the service's name is state.service.service)", "name")
        layout = ServiceLayout.from_dict({"name": state.service, **state.layout}, f"{where}.layout")
        state.__dict__["_layout_record"] = ((state.service, dict(state.layout)), layout)  # see layout_record
        units = layout.units or count
        if len(state.shards) != units:
            what = "logical shard" if units == count else "logical shard or sub-shard"
            raise _fail(f"{where}.shards", f"{units} records (one per {what})", f"{len(state.shards)}")
        return state

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"service": self.service, "layout": dict(self.layout)}
        if self.seeds is not None:
            out["seeds"] = self.seeds.to_dict()
        if self.seeds is not None or self.merge is not None:
            out["merge"] = self.merge
        out.update(self.extra)
        out.update(upstream=[u.to_dict() for u in self.upstream],
                   shards=[None if s is None else s.to_dict() for s in self.shards])
        if self.tail is not None:
            out["tail"] = self.tail.to_dict()
        if self.even_batches is not None:
            out["even_batches"] = self.even_batches
        if self.ranks:
            out["ranks"] = [r.to_dict() for r in self.ranks]
        return out

    # -- the layout, read --------------------------------------------------------------------

    def layout_record(self) -> ServiceLayout:
        """The layout read as a manifest's ``service`` (named :attr:`service`): once per layout, however many
        steps of a restore ask (the check against the manifest, the re-shard plan)."""
        cached = self.__dict__.get("_layout_record")
        if cached is None or cached[0] != (self.service, self.layout):
            layout = ServiceLayout.from_dict({"name": self.service, **self.layout}, "state.service.layout")
            cached = self.__dict__["_layout_record"] = ((self.service, dict(self.layout)), layout)
        return cached[1]

    def _count(self, key: str, default: int) -> int:
        value = self.layout.get(key)
        return default if value is None else int(value)

    @property
    def logical_shards(self) -> int:
        return int(self.layout["logical_shards"])

    @property
    def units(self) -> int:
        """The epoch's units: the logical shards, or the sub-shards they were split into."""
        return self._count("units", self.logical_shards)

    @property
    def workers(self) -> int:
        return self._count("workers", 0)

    @property
    def world(self) -> int:
        """The ranks that saved it (1: not distributed)."""
        return self._count("ranks", 1)

    @property
    def rank(self) -> int:
        return self._count("rank", 0)

    @property
    def even_batches_records(self) -> list[Any]:
        """Each rank's ``even_batches`` record (one per rank of a joined snapshot, else this one's)."""
        return [r.even_batches for r in self.ranks] or [self.even_batches]


_SERVICE = Quick(ServiceState, (
    ("service", STR, REQUIRED), ("layout", quick_copy, REQUIRED),
    ("shards", quick_records(quick_optional(quick_shard_state), list), REQUIRED),
    ("upstream", quick_records(quick_upstream_state, list), list), ("seeds", quick_seeds, None), ("merge", ANY, None),
    ("even_batches", ANY, None), ("tail", quick_tail, None), ("ranks", quick_records(_RANK_SERVICE, list), list)),
    extra=True)


def _quick_service(value: Any) -> ServiceState | None:
    """``ServiceState.from_dict``'s quick reader, its checks and all."""
    if type(value) is dict and not value:
        return None
    state = _SERVICE(value)
    if state.service not in SHARDED_SERVICES and "logical_shards" not in state.layout:
        return state
    count = state.layout.get("logical_shards")
    if type(count) is not int or not 1 <= count <= MAX_COUNT or "name" in state.layout:
        raise Doubt
    layout = quick_layout({"name": state.service, **state.layout})
    state.__dict__["_layout_record"] = ((state.service, dict(state.layout)), layout)  # see layout_record
    if len(state.shards) != (layout.units or count):
        raise Doubt
    return state


@dataclass
class RankState:
    """One rank's loader position in a distributed snapshot joined from its parts (never written as such)."""

    VERSION: ClassVar[int] = 1

    rank: int
    yielded: int = 0
    epoch_finished: bool = False
    lookahead: list[Any] = field(default_factory=list)

    @classmethod
    def from_dict(cls, value: Any, where: str = "rank") -> RankState:
        try:
            return _RANK(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(rank=f.required("rank", _int), yielded=f.get("yielded", _int, 0),
                   epoch_finished=f.get("epoch_finished", _bool, False), lookahead=list(f.get("lookahead", _list, [])))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "yielded": self.yielded, "epoch_finished": self.epoch_finished,
                "lookahead": list(self.lookahead)}


_RANK = Quick(RankState, (("rank", COUNT, REQUIRED), ("yielded", COUNT, 0), ("epoch_finished", BOOL, False),
                          ("lookahead", quick_list_copy, list)))


@dataclass
class SavedState:
    """The loader's state in the payload: its position, randomness, lookahead and service state."""

    VERSION: ClassVar[int] = 1

    position: LoaderPosition
    seed: int | None
    seed_given: bool
    pending_seed: int | None
    #: The loader's seed generator (``randomness.SeedGenerator.state()``); ``None`` before epoch 0.
    generator: dict[str, Any] | None
    service: ServiceState | None
    lookahead: tuple[Any, ...] = ()
    #: A distributed snapshot joined from its parts: each rank's position (``[]``: one process).
    ranks: list[RankState] = field(default_factory=list)

    @classmethod
    def from_dict(cls, value: Any, where: str = "state") -> SavedState:
        try:
            return _quick_saved(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        lookahead: list[Any] = f.get("lookahead", _list, [])
        position = LoaderPosition(
            epoch=f.required("epoch", lambda v, w: _int(v, w, minimum=-1)),
            yielded=f.required("yielded", _int), epoch_finished=f.required("epoch_finished", _bool),
            lookahead=len(lookahead))
        saved = cls(position=position, seed=f.get("seed", _seed, None),
                    seed_given=f.get("seed_given", _bool, False),
                    pending_seed=f.get("pending_seed", _seed, None),
                    generator=f.get("generator", _generator, None),
                    service=f.required("service", ServiceState.from_dict),
                    lookahead=tuple(lookahead),
                    ranks=f.get("ranks", _items(RankState.from_dict), []))
        if position.epoch >= 0 and saved.generator is None:
            raise _fail(f"{where}.generator", f"the seed generator of epoch {position.epoch} (every epoch has one)",
                        None)
        return saved

    def to_dict(self) -> dict[str, Any]:
        out = {"epoch": self.position.epoch, "yielded": self.position.yielded,
               "epoch_finished": self.position.epoch_finished, "seed": self.seed,
               "seed_given": self.seed_given, "pending_seed": self.pending_seed,
               "generator": self.generator,
               "service": {} if self.service is None else self.service.to_dict(),
               "lookahead": list(self.lookahead)}
        if self.ranks:
            out["ranks"] = [r.to_dict() for r in self.ranks]
        return out


_SAVED = Quick(dict, (("epoch", quick_int(-1), REQUIRED), ("yielded", COUNT, REQUIRED),
                      ("epoch_finished", BOOL, REQUIRED), ("seed", quick_seed, None), ("seed_given", BOOL, False),
                      ("pending_seed", quick_seed, None), ("generator", _quick_generator, None),
                      ("service", _quick_service, REQUIRED), ("lookahead", quick_list, list),
                      ("ranks", quick_records(_RANK, list), list)))


def _quick_saved(value: Any) -> SavedState:
    """``SavedState.from_dict``'s quick reader, its check and all."""
    v = _SAVED.values(value)
    if v["epoch"] >= 0 and v["generator"] is None:
        raise Doubt
    position = build(LoaderPosition, {"epoch": v["epoch"], "yielded": v["yielded"],
                                      "epoch_finished": v["epoch_finished"], "lookahead": len(v["lookahead"])})
    return build(SavedState, {"position": position, "seed": v["seed"], "seed_given": v["seed_given"],
                              "pending_seed": v["pending_seed"], "generator": v["generator"], "service": v["service"],
                              "lookahead": tuple(v["lookahead"]), "ranks": v["ranks"]})


def _with_states(nodes: dict[str, NodeState], convert: Callable[[str, Any], Any]) -> dict[str, NodeState]:
    return {path: node if node.state is None else replace(node, state=convert(path, node.state))
            for path, node in nodes.items()}


def map_node_states(service: ServiceState, convert: Callable[[str, Any], Any]) -> ServiceState:
    """A copy of ``service`` with ``convert(path, state)`` applied to every node state of its shards
    and upstream copies (to encode or decode them one node at a time)."""
    return replace(service,
                   shards=[None if s is None else replace(s, nodes=_with_states(s.nodes, convert))
                           for s in service.shards],
                   upstream=[replace(u, nodes=_with_states(u.nodes, convert)) for u in service.upstream])
