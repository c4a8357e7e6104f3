"""The manifest of a captured loader state: versions, position, seeds' fingerprints, the graph, the layout,
each logical shard's and node's position with the encoded size of its state, and the payload's record."""

from __future__ import annotations

import datetime
import functools
import hashlib
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from snapshot import schema
from snapshot._version import __version__
from snapshot.container import _serialization

__all__ = ["manifest_of", "node_states"]


def _seed_digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:12]



@functools.lru_cache(maxsize=1)
def _installed_versions() -> tuple[tuple[str, str], ...]:
    """Package versions, read once per process (reading package metadata costs milliseconds)."""
    import torch

    versions = {"snapshot": __version__, "torch": str(torch.__version__), "python": platform.python_version()}
    # dill is imported (by _serialization): its own version is its metadata's, without a search of sys.path for
    # it (0.4 ms at a process's first save); torchdata's own says "+cpu" where its metadata does not
    versions["dill"] = str(_serialization.dill.__version__)
    try:
        versions["torchdata"] = _version_of(metadata.distribution("torchdata"))
    except metadata.PackageNotFoundError:
        pass
    return tuple(versions.items())


def _version_of(dist: metadata.Distribution) -> str:
    """The ``Version`` header of ``dist``'s metadata, read from its header block (``metadata.version`` parses
    the whole file, README included, as an email: 6 ms for two packages at a process's first save, 1 ms so)."""
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if not line:
            break  # the end of the headers
        if line.startswith("Version:"):
            return line[len("Version:"):].strip()
    return str(dist.version)


def _versions() -> dict[str, str]:
    return dict(_installed_versions())


#: A node's place in a service's record: ``("shards" or "upstream", index, path)``.
NodePlace = tuple[str, int, str]


def node_states(service: schema.ServiceState | None) -> dict[int, tuple[NodePlace, ...]]:
    """The node states of ``service``, by ``id``, with their places: the encoder measures each one as it
    writes it (the manifest's ``state_bytes``). The same object at two places (a small int) has both."""
    marks: dict[int, tuple[NodePlace, ...]] = {}
    holders: list[tuple[str, int, dict[str, schema.NodeState]]] = [] if service is None else [
        *(("shards", i, s.nodes) for i, s in enumerate(service.shards) if s is not None),
        *(("upstream", i, u.nodes) for i, u in enumerate(service.upstream))]
    for part, index, nodes in holders:
        for path, record in nodes.items():
            if record.state is not None:
                marks[id(record.state)] = (*marks.get(id(record.state), ()), (part, index, path))
    return marks


def _node_positions(records: Mapping[str, schema.NodeState], replayed: set[str], sizes: dict[Any, int],
                    part: str, index: int) -> dict[str, schema.NodePosition]:
    return {path: schema.NodePosition(
        yielded=record.yielded,
        state_bytes=None if record.state is None else sizes[part, index, path],
        buffered=record.buffered,
        restore="replay" if path in replayed else "state",
        buffer_state=record.buffer_state,
    ) for path, record in records.items()}


def _shard_position(shard: schema.ShardState | None, sizes: dict[Any, int], index: int
                    ) -> schema.ShardPosition | None:
    if shard is None:
        return None  # run elsewhere (another rank)
    plan = shard.plan or schema.PlanState()
    return schema.ShardPosition(
        yielded=shard.yielded,
        produced=shard.produced,
        exhausted=shard.taken_all,
        in_flight=len(shard.in_flight),
        plan=schema.PlanSummary(tuple(schema.Driver(path, count) for path, count in plan.drivers),
                                dict(plan.reasons),
                                # how each buffering node saved its samples: "positions" or "values[: why]"
                                {path: record.buffer_state for path, record in shard.nodes.items()
                                 if record.buffer_state is not None},
                                {path: str(what) for path, what in plan.rereads.items()}),
        nodes=_node_positions(shard.nodes, set(plan.replayed_nodes), sizes, "shards", index),
    )


def _upstream_position(upstream: schema.UpstreamState, sizes: dict[Any, int], index: int
                       ) -> schema.UpstreamPosition:
    return schema.UpstreamPosition(
        shards=tuple(upstream.shards),
        routers={path: schema.RouterPosition(r.position, r.ended, {str(s): len(q) for s, q in r.queues.items()})
                 for path, r in upstream.routers.items()},
        nodes=_node_positions(upstream.nodes, set(), sizes, "upstream", index),
    )


def _node_seeds(seeds: schema.SeedsState | None) -> dict[str, str]:
    """Fingerprints of the epoch's seeds, per node path (``@shardN`` when there are several shards)."""
    if seeds is None:
        return {}
    node_seeds = {path: _seed_digest(seed) for path, seed in seeds.shared.items()}
    for shard_index, shard_seeds in enumerate(seeds.shards):
        for path, seed in shard_seeds.items():
            node_seeds[path if len(seeds.shards) == 1 else f"{path}@shard{shard_index}"] = _seed_digest(seed)
    return node_seeds


def manifest_of(source: Any, service: schema.ServiceState | None, payload: dict[str, Any],
              sizes: dict[Any, int]) -> schema.Manifest:
    """The manifest of ``source`` (a ``capture.LoaderState``, its service's state read into ``service``),
    whose payload ``payload`` records (size, digest, sections); ``sizes``: each node state's encoded size,
    by its place (see :func:`node_states`)."""
    verify = source.verify
    return schema.Manifest(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        versions=_versions(),
        loader=schema.LoaderPosition(source.epoch, source.yielded, source.epoch_finished, len(source.lookahead)),
        randomness=schema.Randomness(
            seed=source.seed,
            seed_source="user" if source.seed_given else ("drawn" if source.seed is not None else None),
            node_seeds=_node_seeds(None if service is None else service.seeds)),
        graph=schema.GraphDesc(source.graph_fingerprint, source.graph_bytes is not None,
                               tuple(schema.NodeDesc.from_dict(n) for n in source.graph_nodes),
                               source.code_changes),
        service=service.layout_record() if service is not None and service.service == source.service_name else
        schema.ServiceLayout.from_dict({"name": source.service_name, **({} if service is None else service.layout)}),
        shards=() if service is None else tuple(_shard_position(s, sizes, i) for i, s in enumerate(service.shards)),
        upstream=() if service is None else tuple(_upstream_position(u, sizes, i)
                                                  for i, u in enumerate(service.upstream)),
        verify=None if verify is None else schema.VerifyRecord.from_dict(verify),
        payload=schema.PayloadRecord.from_dict(payload),
        metadata=source.metadata or None,
    )
