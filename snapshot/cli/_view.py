"""A manifest read into the records the commands render.

The manifest is checked field by field by :mod:`snapshot.schema` when it is read (a wrong
field is a :class:`~snapshot.errors.ManifestError` naming it), so rendering never meets a
surprise. This module only arranges the schema's records for display: logical shards and
upstream copies get their index, and each node's figures are summed over them. Fields this
version does not know are kept (``extra``) and shown as they are, so a newer writer's layout
or per-shard positions still appear.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshot import schema
from snapshot.schema import Driver, NodeDesc, PartRecord, RouterPosition

__all__ = ["Driver", "NodeDesc", "NodeTotals", "PartFile", "Position", "Router", "Shard", "Unit", "Upstream", "View",
           "read_view"]

_REPLAY = "replay"
#: Pipes whose items are batches of their input's (torch's ``batch``, torchdata's bucket batchers), and
#: the one that undoes them; a pipe between the sink and a batcher that keeps one input (``collate``,
#: ``map``, ``in_batch_shuffle``) keeps the batcher's items.
_BATCHERS = ("BatcherIterDataPipe", "BucketBatcherIterDataPipe", "MaxTokenBucketizerIterDataPipe")
_UNBATCHERS = ("UnBatcherIterDataPipe",)

#: The schema's records, under the names the commands use.
Position = schema.NodePosition
Router = RouterPosition
PartFile = PartRecord


@dataclass(frozen=True)
class Shard:
    """One logical shard: its position, its restore plan and its nodes' positions."""

    index: int
    yielded: int
    exhausted: bool
    in_flight: int
    drivers: tuple[Driver, ...]
    reasons: dict[str, str]
    rereads: dict[str, str]
    nodes: dict[str, Position]
    extra: dict[str, Any]


@dataclass(frozen=True)
class Upstream:
    """One copy of the graph above the sharding point (one per process), feeding some shards."""

    index: int
    shards: tuple[int, ...]
    routers: dict[str, Router]
    nodes: dict[str, Position]
    extra: dict[str, Any]


@dataclass(frozen=True)
class Unit:
    """What the loader yields: ``samples``, or ``batches`` made by the batcher at ``batcher`` of the
    samples its input (at ``source``) yields."""

    name: str
    batcher: str | None = None
    source: str | None = None


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
    #: ``data`` (format 2) or ``pickle`` (format 1), and the values saved pickled (restoring them needs trust).
    payload_encoding: str | None
    pickled: tuple[schema.PickledValue, ...]
    file_size: int | None
    #: A distributed snapshot: each rank's position, and the file that holds its part.
    ranks: tuple[dict[str, Any], ...] = ()
    part_files: tuple[PartFile, ...] = ()
    #: ``save_snapshot(metadata=...)``: the user's data saved with the snapshot (``{}``: none).
    metadata: dict[str, Any] = field(default_factory=dict)
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

    def unit(self) -> Unit:
        """What the loader yields: batches when the graph's sink is a batcher, or reads one (through pipes
        that keep one input: ``collate``, ``map``), else samples."""
        node = self.by_path.get("0") or (self.nodes[0] if self.nodes else None)
        for _ in range(len(self.nodes)):
            if node is None or node.short_type in _UNBATCHERS:
                break
            if node.short_type in _BATCHERS:
                return Unit("batches", node.path, node.inputs[0] if len(node.inputs) == 1 else None)
            if len(node.inputs) != 1:
                break
            node = self.by_path.get(node.inputs[0])
        return Unit("samples")

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


def _shard(index: int, shard: schema.ShardPosition) -> Shard:
    return Shard(index=index, yielded=shard.yielded, exhausted=shard.exhausted, in_flight=shard.in_flight,
                 drivers=shard.plan.drivers, reasons=shard.plan.reasons, rereads=shard.plan.rereads, nodes=shard.nodes,
                 extra={**({"produced": shard.produced} if shard.produced is not None else {}), **shard.extra})


def _upstream(index: int, copy: schema.UpstreamPosition) -> Upstream:
    return Upstream(index=index, shards=copy.shards, routers=copy.routers, nodes=copy.nodes, extra=copy.extra)


def read_view(manifest: Mapping[str, Any] | schema.Manifest, source: str) -> View:
    """What the commands render, from ``manifest`` (checked against the schema if it is a dict)."""
    info = manifest if isinstance(manifest, schema.Manifest) else schema.Manifest.from_dict(manifest, source=source)
    file_record = info.extra.get("_file")
    file_size = file_record.get("size") if isinstance(file_record, dict) else None
    payload = info.payload
    return View(
        source=source,
        format=info.format,
        created=info.created,
        versions=info.versions,
        epoch=info.loader.epoch,
        yielded=info.loader.yielded,
        epoch_finished=info.loader.epoch_finished,
        lookahead=info.loader.lookahead,
        seed=info.randomness.seed,
        seed_source=info.randomness.seed_source,
        node_seeds=info.randomness.node_seeds,
        fingerprint=info.graph.fingerprint,
        graph_included=info.graph.included,
        nodes=info.graph.nodes,
        service=info.service.to_dict(),
        # a rank's own part holds some of the shards: the others are null
        shards=tuple(_shard(i, s) for i, s in enumerate(info.shards) if s is not None),
        upstream=tuple(_upstream(i, u) for i, u in enumerate(info.upstream)),
        verify=None if info.verify is None else info.verify.to_dict(),
        payload_size=None if payload is None else payload.size,
        payload_sha256=None if payload is None else payload.sha256,
        payload_parts={} if payload is None else payload.parts,
        payload_encoding=None if payload is None or info.is_index else payload.encoding,
        pickled=() if payload is None else payload.pickled,
        file_size=file_size if isinstance(file_size, int) and not isinstance(file_size, bool) else None,
        ranks=tuple(rank.to_dict() for rank in info.ranks),
        part_files=info.parts,
        metadata=dict(info.metadata or {}),
    )
