"""A manifest read into typed, validated records, for the commands to render.

The manifest comes from a file that may have been written by anyone: every field is checked
for its type here, once, so that rendering never meets a surprise. A missing optional field
gets its default; a field of the wrong type is a :class:`CorruptSnapshotError` naming it.
Fields this version does not know are kept (``extra``) and shown as they are, so a newer
writer's layout or per-shard positions still appear.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import CorruptSnapshotError

__all__ = ["Driver", "NodeDesc", "NodeTotals", "PartFile", "Position", "Router", "Shard", "Upstream", "View",
           "read_view"]

_REPLAY = "replay"


@dataclass(frozen=True)
class NodeDesc:
    """One node of the saved graph (``manifest["graph"]["nodes"][i]``)."""

    path: str
    type: str
    args: dict[str, str]
    fingerprint: str
    inputs: tuple[str, ...]

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
class Position:
    """Where one node of one logical shard stands."""

    yielded: int | None
    state_bytes: int | None
    buffered: int
    restore: str | None


@dataclass(frozen=True)
class Driver:
    """A node whose subgraph a restore replays, and how many samples it replays."""

    path: str
    replay: int


@dataclass(frozen=True)
class Shard:
    """One logical shard: its position, its restore plan and its nodes' positions."""

    index: int
    yielded: int
    exhausted: bool
    in_flight: int
    drivers: tuple[Driver, ...]
    reasons: dict[str, str]
    nodes: dict[str, Position]
    extra: dict[str, Any]


@dataclass(frozen=True)
class Router:
    """Where a sharding point stands in one copy of the graph above it."""

    position: int
    ended: bool
    queued: dict[str, int]


@dataclass(frozen=True)
class Upstream:
    """One copy of the graph above the sharding point (one per process), feeding some shards."""

    index: int
    shards: tuple[int, ...]
    routers: dict[str, Router]
    nodes: dict[str, Position]
    extra: dict[str, Any]


@dataclass(frozen=True)
class PartFile:
    """One rank's part of a distributed snapshot, as its manifest records it."""

    rank: int
    file: str
    sha256: str
    size: int


@dataclass(frozen=True)
class NodeTotals:
    """One node's figures summed over the logical shards."""

    yielded: int | None
    buffered: int
    state_bytes: int | None
    restore: str | None
    replay: int


@dataclass(frozen=True)
class View:
    """Everything the commands show, from one manifest."""

    source: str
    format: int
    created: str | None
    versions: dict[str, str]
    epoch: int
    yielded: int
    epoch_finished: bool
    lookahead: int
    seed: int | None
    seed_source: str | None
    node_seeds: dict[str, str]
    fingerprint: str
    graph_included: bool
    nodes: tuple[NodeDesc, ...]
    service: dict[str, Any]
    shards: tuple[Shard, ...]
    upstream: tuple[Upstream, ...]
    verify: dict[str, Any] | None
    payload_size: int | None
    payload_sha256: str | None
    payload_parts: dict[str, int]
    file_size: int | None
    #: A distributed snapshot: each rank's position, and the file that holds its part.
    ranks: tuple[dict[str, Any], ...] = ()
    part_files: tuple[PartFile, ...] = ()
    by_path: dict[str, NodeDesc] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_path", {node.path: node for node in self.nodes})

    @property
    def service_name(self) -> str:
        return str(self.service.get("name", "?"))

    @property
    def layout(self) -> dict[str, Any]:
        """The reading service's layout: every service field but its name."""
        return {key: value for key, value in self.service.items() if key != "name"}

    def totals(self) -> dict[str, NodeTotals]:
        """Per node path, the figures of every logical shard and every upstream copy added up.

        A node restored by replay is estimated to recompute as many samples as it had
        yielded; one restored from its state recomputes none.
        """
        out: dict[str, NodeTotals] = {}
        parts: list[Shard | Upstream] = [*self.shards, *self.upstream]
        for path in self.by_path:
            positions = [part.nodes[path] for part in parts if path in part.nodes]
            if not positions:
                continue
            counts = [p.yielded for p in positions if p.yielded is not None]
            sizes = [p.state_bytes for p in positions if p.state_bytes is not None]
            methods = {p.restore for p in positions if p.restore is not None}
            out[path] = NodeTotals(
                yielded=sum(counts) if counts else None,
                buffered=sum(p.buffered for p in positions),
                state_bytes=sum(sizes) if sizes else None,
                restore=methods.pop() if len(methods) == 1 else ("mixed" if methods else None),
                replay=sum(p.yielded or 0 for p in positions if p.restore == _REPLAY),
            )
        return out


class _Fields:
    """Type-checked access to a JSON document, naming the field that is wrong."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, expected: str) -> CorruptSnapshotError:
        return CorruptSnapshotError(
            f"the manifest's {where} is not {expected}: the file was not written by snapshot "
            "or was altered (its checksums only prove it was not damaged since)",
            source=self.source,
        )

    def mapping(self, value: Any, where: str, *, optional: bool = True) -> dict[str, Any]:
        if value is None and optional:
            return {}
        if not isinstance(value, dict):
            raise self.fail(where, "an object")
        return value

    def sequence(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, "a list")
        return value

    def integer(self, value: Any, where: str, default: int | None = 0) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, "an integer")
        return value

    def count(self, value: Any, where: str) -> int:
        number = self.integer(value, where, 0)
        assert number is not None
        return number

    def string(self, value: Any, where: str, *, optional: bool = True) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.fail(where, "a string")
        return value

    def text(self, value: Any, where: str) -> str:
        """A required string."""
        text = self.string(value, where, optional=False)
        assert text is not None
        return text

    def flag(self, value: Any, where: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(where, "true or false")
        return value

    def strings(self, value: Any, where: str) -> dict[str, str]:
        """An object whose values are shown as text (numbers are accepted and converted)."""
        out = {}
        for key, item in self.mapping(value, where).items():
            if isinstance(item, (dict, list)):
                raise self.fail(f"{where}.{key}", "a string")
            out[key] = str(item)
        return out


def _node(f: _Fields, value: Any, where: str) -> NodeDesc:
    node = f.mapping(value, where, optional=False)
    inputs = f.sequence(node.get("inputs"), f"{where}.inputs")
    return NodeDesc(
        path=f.text(node.get("path"), f"{where}.path"),
        type=f.text(node.get("type"), f"{where}.type"),
        args=f.strings(node.get("args"), f"{where}.args"),
        fingerprint=f.string(node.get("fingerprint"), f"{where}.fingerprint") or "",
        inputs=tuple(f.text(p, f"{where}.inputs[{i}]") for i, p in enumerate(inputs)),
    )


def _nodes(f: _Fields, graph: dict[str, Any]) -> tuple[NodeDesc, ...]:
    nodes = tuple(_node(f, value, f"graph.nodes[{i}]")
                  for i, value in enumerate(f.sequence(graph.get("nodes"), "graph.nodes")))
    paths = [node.path for node in nodes]
    if len(set(paths)) != len(paths):
        raise f.fail("graph.nodes", "a list of distinct node paths")
    known = set(paths)
    for node in nodes:
        for path in node.inputs:
            if path not in known:
                raise f.fail(f"graph.nodes ({node.path} reads from {path!r})", "a closed graph")
    return nodes


def _position(f: _Fields, value: Any, where: str) -> Position:
    record = f.mapping(value, where, optional=False)
    return Position(
        yielded=f.integer(record.get("yielded"), f"{where}.yielded", None),
        state_bytes=f.integer(record.get("state_bytes"), f"{where}.state_bytes", None),
        buffered=f.count(record.get("buffered"), f"{where}.buffered"),
        restore=f.string(record.get("restore"), f"{where}.restore"),
    )


_SHARD_KEYS = frozenset({"yielded", "exhausted", "in_flight", "plan", "nodes"})


def _shard(f: _Fields, index: int, value: Any) -> Shard:
    where = f"shards[{index}]"
    shard = f.mapping(value, where, optional=False)
    plan = f.mapping(shard.get("plan"), f"{where}.plan")
    drivers = []
    for i, item in enumerate(f.sequence(plan.get("drivers"), f"{where}.plan.drivers")):
        driver = f.mapping(item, f"{where}.plan.drivers[{i}]", optional=False)
        drivers.append(Driver(f.text(driver.get("path"), f"{where}.plan.drivers[{i}].path"),
                              f.count(driver.get("replay"), f"{where}.plan.drivers[{i}].replay")))
    nodes = {path: _position(f, record, f"{where}.nodes[{path!r}]")
             for path, record in f.mapping(shard.get("nodes"), f"{where}.nodes").items()}
    return Shard(
        index=index,
        yielded=f.count(shard.get("yielded"), f"{where}.yielded"),
        exhausted=f.flag(shard.get("exhausted"), f"{where}.exhausted"),
        in_flight=f.count(shard.get("in_flight"), f"{where}.in_flight"),
        drivers=tuple(drivers),
        reasons=f.strings(plan.get("reasons"), f"{where}.plan.reasons"),
        nodes=nodes,
        extra={key: item for key, item in shard.items() if key not in _SHARD_KEYS},
    )


_UPSTREAM_KEYS = frozenset({"shards", "routers", "nodes"})


def _upstream(f: _Fields, index: int, value: Any) -> Upstream:
    where = f"upstream[{index}]"
    copy = f.mapping(value, where, optional=False)
    routers = {}
    for path, item in f.mapping(copy.get("routers"), f"{where}.routers").items():
        at = f"{where}.routers[{path!r}]"
        router = f.mapping(item, at, optional=False)
        routers[path] = Router(
            position=f.count(router.get("position"), f"{at}.position"),
            ended=f.flag(router.get("ended"), f"{at}.ended"),
            queued={shard: f.count(n, f"{at}.queued.{shard}")
                    for shard, n in f.mapping(router.get("queued"), f"{at}.queued").items()},
        )
    shards = f.sequence(copy.get("shards"), f"{where}.shards")
    return Upstream(
        index=index,
        shards=tuple(f.count(s, f"{where}.shards[{i}]") for i, s in enumerate(shards)),
        routers=routers,
        nodes={path: _position(f, record, f"{where}.nodes[{path!r}]")
               for path, record in f.mapping(copy.get("nodes"), f"{where}.nodes").items()},
        extra={key: item for key, item in copy.items() if key not in _UPSTREAM_KEYS},
    )


def _part_file(f: _Fields, index: int, value: Any) -> PartFile:
    where = f"parts[{index}]"
    part = f.mapping(value, where, optional=False)
    name = f.text(part.get("file"), f"{where}.file")
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise f.fail(f"{where}.file ({name!r})", "a file name in the snapshot's directory")
    return PartFile(rank=f.count(part.get("rank"), f"{where}.rank"), file=name,
                    sha256=f.text(part.get("sha256"), f"{where}.sha256"),
                    size=f.count(part.get("size"), f"{where}.size"))


def read_view(manifest: Mapping[str, Any], source: str) -> View:
    """Check ``manifest`` field by field and return what the commands render."""
    f = _Fields(source)
    loader = f.mapping(manifest.get("loader"), "loader", optional=False)
    randomness = f.mapping(manifest.get("randomness"), "randomness")
    graph = f.mapping(manifest.get("graph"), "graph", optional=False)
    payload = f.mapping(manifest.get("payload"), "payload")
    parts = {key: f.count(size, f"payload.parts.{key}")
             for key, size in f.mapping(payload.get("parts"), "payload.parts").items()}
    verify = manifest.get("verify")
    return View(
        source=source,
        format=f.count(manifest.get("format"), "format"),
        created=f.string(manifest.get("created"), "created"),
        versions=f.strings(manifest.get("versions"), "versions"),
        epoch=f.count(loader.get("epoch"), "loader.epoch"),
        yielded=f.count(loader.get("yielded"), "loader.yielded"),
        epoch_finished=f.flag(loader.get("epoch_finished"), "loader.epoch_finished"),
        lookahead=f.count(loader.get("lookahead"), "loader.lookahead"),
        seed=f.integer(randomness.get("seed"), "randomness.seed", None),
        seed_source=f.string(randomness.get("seed_source"), "randomness.seed_source"),
        node_seeds=f.strings(randomness.get("node_seeds"), "randomness.node_seeds"),
        fingerprint=f.string(graph.get("fingerprint"), "graph.fingerprint") or "",
        graph_included=f.flag(graph.get("included"), "graph.included"),
        nodes=_nodes(f, graph),
        service=f.mapping(manifest.get("service"), "service"),
        # a rank's own part holds some of the shards: the others are null
        shards=tuple(_shard(f, i, s) for i, s in enumerate(f.sequence(manifest.get("shards"), "shards"))
                     if s is not None),
        upstream=tuple(_upstream(f, i, u) for i, u in enumerate(f.sequence(manifest.get("upstream"), "upstream"))),
        verify=f.mapping(verify, "verify") or None,
        payload_size=f.integer(payload.get("size"), "payload.size", None),
        payload_sha256=f.string(payload.get("sha256"), "payload.sha256"),
        payload_parts=parts,
        file_size=f.integer(f.mapping(manifest.get("_file"), "_file").get("size"), "_file.size", None),
        ranks=tuple(f.mapping(r, f"ranks[{i}]", optional=False)
                    for i, r in enumerate(f.sequence(manifest.get("ranks"), "ranks"))),
        part_files=tuple(_part_file(f, i, p) for i, p in enumerate(f.sequence(manifest.get("parts"), "parts"))),
    )
