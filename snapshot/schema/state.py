"""The loader's state in the payload, typed: one record per component, nested as the components are.

::

    SavedState (schema.saved)        the loader (DataLoader2): position, randomness, lookahead
    ├── ranks: [RankState]           a distributed snapshot joined from its parts: each rank's position
    └── service: ServiceState        the reading service's checkpoint (None: ``{}``, before epoch 0)
        ├── seeds: SeedsState        this epoch's seeds (randomness.EpochSeeds)
        ├── upstream: [UpstreamState]    one per copy of the part above the sharding point
        │   ├── routers: {path: RouterState}
        │   └── nodes: {path: NodeState}
        ├── tail: TailState | None       the part below a non-replicable pipe: nodes: {path: NodeState}
        └── shards: [ShardState | None]  one per logical shard (or sub-shard); None: another rank's
            ├── plan: PlanState | None   its ``auto`` restore plan (plan.Plan.describe())
            └── nodes: {path: NodeState}

Each record has a ``VERSION``, ``from_dict(value, where)`` that checks it (a
:class:`~snapshot.errors.ManifestError` names the field path) and ``to_dict()`` that gives the dict
written in format 1 (``Record.from_dict(record.to_dict()) == record``). The dict keys are the
on-disk names and are read only here. What a record holds that is not this package's data (a node's
``state``, buffered samples, a generator's state) is kept as it is: opaque to the schema.

Two ideas that share an on-disk word: a shard's graph has produced its last sample
(:attr:`ShardState.graph_exhausted`, written ``exhausted``), and the loader has also taken it
(:attr:`ShardState.finished`). A node's :attr:`NodeState.exhausted` is the first idea for one node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from snapshot.schema._fields import (
    MAX_COUNT,
    SHARD_FINISHED,
    SHARD_PRODUCED_ALL,
    _bool,
    _by_path,
    _Fields,
    _int,
    _items,
    _list,
    _object,
    _records,
    _str,
)
from snapshot.schema._quick import (
    ANY,
    BOOL,
    COUNT,
    STR,
    Doubt,
    Quick,
    quick_by_path,
    quick_copy,
    quick_ints,
    quick_list,
    quick_list_copy,
    quick_records,
    quick_strs,
)

__all__ = ["NodeState", "PlanState", "RouterState", "SeedsState", "ShardState", "TailState", "UpstreamState"]


def _any(value: Any, where: str) -> Any:
    return value


def _dict(value: Any, where: str) -> dict[Any, Any]:
    return dict(_object(value, where))


def _opaque_by_path(value: Any, where: str) -> dict[str, Any]:
    return dict(_object(value, where))


@dataclass
class NodeState:
    """One node of one run (``execution.Run.capture``): samples yielded, its state, its buffer."""

    VERSION: ClassVar[int] = 1

    yielded: int | None = None
    #: The node has produced its last sample this epoch.
    exhausted: bool = False
    #: The hook's state (``None``: no hook); in a payload of format 1, its pickle.
    state: Any = None
    buffered: int = 0
    #: For a buffering node: how its samples were saved, ``"positions"`` or ``"values[: why]"``.
    buffer_state: str | None = None
    #: The node's current pass when a ``cycle`` started it again (``_passes.Pass.plain()``).
    passes: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodeState:
        try:
            return _NODE(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(yielded=f.get("yielded", _int, None), exhausted=f.get("exhausted", _bool, False),
                   state=f.get("state", _any, None), buffered=f.get("buffered", _int, 0),
                   buffer_state=f.get("buffer_state", _str, None), passes=f.get("passes", _any, None),
                   extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"yielded": self.yielded, "exhausted": self.exhausted, "state": self.state,
                               "buffered": self.buffered}
        if self.buffer_state is not None:
            out["buffer_state"] = self.buffer_state
        if self.passes is not None:
            out["passes"] = self.passes
        return {**out, **self.extra}


_NODE = Quick(NodeState, (("yielded", COUNT, None), ("exhausted", BOOL, False), ("state", ANY, None),
                          ("buffered", COUNT, 0), ("buffer_state", STR, None), ("passes", ANY, None)), extra=True)
_NODES = quick_by_path(_NODE)


def _nodes(value: Any, where: str) -> dict[str, NodeState]:
    return _by_path(value, where, NodeState.from_dict)


def _nodes_dict(nodes: dict[str, NodeState]) -> dict[str, Any]:
    return {path: node.to_dict() for path, node in nodes.items()}


@dataclass
class PlanState:
    """A logical shard's ``auto`` restore plan as saved (``plan.Plan.describe()``)."""

    VERSION: ClassVar[int] = 1

    strategy: str = "auto"
    #: ``(path, samples to replay)`` per driver.
    drivers: tuple[tuple[str, int], ...] = ()
    replayed_nodes: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    reaches_sharding_point: bool = False
    rereads: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "plan") -> PlanState | None:
        """The plan; ``None`` for ``{}`` (a shard that had ended: nothing to plan)."""
        if isinstance(value, dict) and not value:
            return None
        try:
            return _PLAN(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(strategy=f.get("strategy", _str, "auto"),
                   drivers=f.get("drivers", lambda v, w: _records(v, w, _driver), ()),
                   replayed_nodes=f.get("replayed_nodes", lambda v, w: _records(v, w, _str), ()),
                   reasons=f.get("reasons", _dict, {}),
                   reaches_sharding_point=f.get("reaches_sharding_point", _bool, False),
                   rereads=f.get("rereads", _dict, {}), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "drivers": [{"path": p, "replay": n} for p, n in self.drivers],
                "replayed_nodes": list(self.replayed_nodes), "reasons": dict(self.reasons),
                "reaches_sharding_point": self.reaches_sharding_point, "rereads": dict(self.rereads),
                **self.extra}


def _driver(value: Any, where: str) -> tuple[str, int]:
    f = _Fields(value, where)
    return f.required("path", _str), f.get("replay", _int, 0)


def _quick_driver(value: Any) -> tuple[str, int]:
    if type(value) is not dict:
        raise Doubt
    path, replay = value.get("path"), value.get("replay")
    replay = 0 if replay is None else replay
    if type(path) is not str or type(replay) is not int or not 0 <= replay <= MAX_COUNT:
        raise Doubt
    return path, replay


_PLAN = Quick(PlanState, (("strategy", STR, "auto"), ("drivers", quick_records(_quick_driver), ()),
                          ("replayed_nodes", quick_strs, ()), ("reasons", quick_copy, dict),
                          ("reaches_sharding_point", BOOL, False), ("rereads", quick_copy, dict)), extra=True)


def _quick_plan(value: Any) -> PlanState | None:
    return None if type(value) is dict and not value else _PLAN(value)


@dataclass
class ShardState:
    """One logical shard (or sub-shard) of a sharded service: its run and what the loader took of it.

    Written by ``reading_service._shards.engine`` (the run) and completed by ``reading_service._shards.merge``
    (``shard``, ``yielded``, ``in_flight``, ``finished``).
    """

    VERSION: ClassVar[int] = 1

    #: Samples the shard's graph produced this epoch (``None``: its graph had ended).
    produced: int | None = None
    #: The shard's graph has produced its last sample (written ``exhausted``).
    graph_exhausted: bool = False
    nodes: dict[str, NodeState] = field(default_factory=dict)
    plan: PlanState | None = None
    #: Its own ``random``/``numpy``/``torch`` generator states (``_rng.plain_rng``), if isolated.
    rng: Any = None
    #: Per node path, the state its pipe keeps across epochs.
    persistent: dict[str, Any] = field(default_factory=dict)
    shard: int | None = None
    #: Samples the loader took from the shard this epoch.
    yielded: int = 0
    #: Samples produced but not yet taken by the loader (kept by value).
    in_flight: list[Any] = field(default_factory=list)
    #: The loader has taken the shard's last sample (``None``: not written, by an older writer).
    finished: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "shard") -> ShardState:
        try:
            return quick_shard_state(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(produced=f.get("produced", _int, None),
                   graph_exhausted=f.get(SHARD_PRODUCED_ALL, _bool, False),
                   nodes=f.get("nodes", _nodes, {}),
                   plan=f.get("plan", PlanState.from_dict, None),
                   rng=f.get("rng", _any, None), persistent=f.get("persistent", _opaque_by_path, {}),
                   shard=f.get("shard", _int, None), yielded=f.get("yielded", _int, 0),
                   in_flight=list(f.get("in_flight", _list, [])),
                   finished=f.get(SHARD_FINISHED, _bool, None), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"produced": self.produced, SHARD_PRODUCED_ALL: self.graph_exhausted,
                               "nodes": _nodes_dict(self.nodes),
                               "plan": {} if self.plan is None else self.plan.to_dict(), "rng": self.rng,
                               "persistent": dict(self.persistent)}
        if self.shard is not None:
            out["shard"] = self.shard
        out.update(yielded=self.yielded, in_flight=list(self.in_flight))
        if self.finished is not None:
            out[SHARD_FINISHED] = self.finished
        return {**out, **self.extra}

    @property
    def taken_all(self) -> bool:
        """Whether the loader has taken the shard's last sample (the manifest's ``shards[i].exhausted``);
        a record written before ``finished`` existed says it with ``exhausted``."""
        return self.finished if self.finished is not None else self.graph_exhausted

    def read_from(self, path: str) -> int:
        """Samples the shard had read from node ``path`` (a sharding point), 0 if none."""
        node = self.nodes.get(path)
        return int(node.yielded or 0) if node is not None else 0


#: The quick reader of :class:`ShardState` (Doubt: read it with ``from_dict``).
quick_shard_state = Quick(ShardState, (
    ("produced", COUNT, None), ("graph_exhausted", SHARD_PRODUCED_ALL, BOOL, False), ("nodes", _NODES, dict),
    ("plan", _quick_plan, None), ("rng", ANY, None), ("persistent", quick_copy, dict), ("shard", COUNT, None),
    ("yielded", COUNT, 0), ("in_flight", quick_list_copy, list), ("finished", SHARD_FINISHED, BOOL, None)), extra=True)


@dataclass
class RouterState:
    """A sharding point in one upstream copy (``reading_service._shards.routing.Router.state()``)."""

    VERSION: ClassVar[int] = 1

    #: Samples read from the sharding point's input.
    position: int = 0
    #: Samples of the filter's own share so far (the index shards are dealt by).
    kept: int = 0
    ended: bool = False
    #: Per unit: the index of the next sample dealt to it.
    next: dict[Any, int] = field(default_factory=dict)
    #: Per unit: ``[index, sample]`` pairs dealt but not yet read.
    queues: dict[Any, list[Any]] = field(default_factory=dict)
    #: The deal's levels when a restore split the units (``_routing.Deal.state()``); ``None``: plain.
    deal: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "router") -> RouterState:
        try:
            return _ROUTER(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(position=f.get("position", _int, 0), kept=f.get("kept", _int, 0),
                   ended=f.get("ended", _bool, False), next=f.get("next", _dict, {}),
                   queues=f.get("queues", _dict, {}), deal=f.get("deal", _list, None), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        deal = {} if self.deal is None else {"deal": self.deal}
        return {**deal, "position": self.position, "kept": self.kept, "ended": self.ended, "next": dict(self.next),
                "queues": dict(self.queues), **self.extra}

    def next_for(self, unit: int) -> int:
        """The index of the next sample dealt to ``unit`` (keys are ints, or their text in older files)."""
        return int(self.next[unit] if unit in self.next else self.next[str(unit)])


_ROUTER = Quick(RouterState, (("position", COUNT, 0), ("kept", COUNT, 0), ("ended", BOOL, False),
                              ("next", quick_copy, dict), ("queues", quick_copy, dict), ("deal", quick_list, None)),
                extra=True)


@dataclass
class UpstreamState:
    """One copy of the part above the sharding point (one per process), feeding ``shards``."""

    VERSION: ClassVar[int] = 1

    shards: list[int] = field(default_factory=list)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    routers: dict[str, RouterState] = field(default_factory=dict)
    persistent: dict[str, Any] = field(default_factory=dict)
    #: The dispatching part's own generator states (absent where the part does not isolate them).
    rng: Any = None
    #: For a restore only: the part restarts from the epoch's start (read unevenly).
    restart: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "upstream") -> UpstreamState:
        try:
            return quick_upstream_state(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(shards=f.get("shards", _items(_int), []),
                   nodes=f.get("nodes", _nodes, {}),
                   routers=f.get("routers", lambda v, w: _by_path(v, w, RouterState.from_dict), {}),
                   persistent=f.get("persistent", _opaque_by_path, {}), rng=f.get("rng", _any, None),
                   restart=f.get("restart", _bool, False), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shards": list(self.shards), "nodes": _nodes_dict(self.nodes),
                               "routers": {path: r.to_dict() for path, r in self.routers.items()},
                               "persistent": dict(self.persistent)}
        if self.rng is not None:
            out["rng"] = self.rng
        if self.restart:
            out["restart"] = True
        return {**out, **self.extra}


#: The quick reader of :class:`UpstreamState` (Doubt: read it with ``from_dict``).
quick_upstream_state = Quick(UpstreamState, (
    ("shards", quick_ints(list), list), ("nodes", _NODES, dict), ("routers", quick_by_path(_ROUTER), dict),
    ("persistent", quick_copy, dict), ("rng", ANY, None), ("restart", BOOL, False)), extra=True)


@dataclass
class TailState:
    """The part below a non-replicable pipe, run once over the merged stream (``reading_service._shards.tail``)."""

    VERSION: ClassVar[int] = 1

    nodes: dict[str, NodeState] = field(default_factory=dict)
    persistent: dict[str, Any] = field(default_factory=dict)
    #: Its own generator states (``_rng.plain_rng``), if isolated.
    rng: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "tail") -> TailState:
        try:
            return quick_tail(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(nodes=f.get("nodes", _nodes, {}), persistent=f.get("persistent", _opaque_by_path, {}),
                   rng=f.get("rng", _any, None), extra=f.extra())

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": _nodes_dict(self.nodes), "persistent": dict(self.persistent), "rng": self.rng, **self.extra}


#: The quick reader of :class:`TailState` (Doubt: read it with ``from_dict``).
quick_tail = Quick(TailState, (("nodes", _NODES, dict), ("persistent", quick_copy, dict), ("rng", ANY, None)),
                   extra=True)


# SeedsState has a module of its own; importable from here as before.
from snapshot.schema.seeds import SeedsState  # noqa: E402
