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
    │   └── nodes: {path: NodePosition}   reading: ReaderPosition | None (a file reader: file, member, offset)
    ├── upstream: [UpstreamPosition]  per copy of the graph above the sharding point
    │   ├── routers: {path: RouterPosition}
    │   └── nodes: {path: NodePosition}
    ├── verify: VerifyRecord | None   fingerprints of the samples after the snapshot
    ├── payload: PayloadRecord | None size, sha256, size of each part; formats 2, 3: encoding, sections
    │   └── pickled: [PickledValue]   values that are not data: where, type, size (restoring needs trust)
    ├── metadata: {...} | None        save_snapshot(metadata=...): the user's plain JSON data (a step)
    ├── ranks: [RankPosition]         directory index only: each rank's LoaderPosition, Handout
    └── parts: [PartRecord]           directory index only: each rank's file, size, sha256

    SavedState                        the loader's state inside the payload (schema.saved)
    ├── ranks: [RankState]            a distributed snapshot joined from its parts
    └── service: ServiceState         the reading service's checkpoint ({} before epoch 0)
        ├── seeds: SeedsState
        ├── upstream: [UpstreamState] routers: {path: RouterState}, nodes: {path: NodeState}
        ├── tail: TailState | None    the part below a non-replicable pipe: nodes: {path: NodeState}
        └── shards: [ShardState|None] per logical shard: plan (PlanState), nodes ({path: NodeState})

The payload's records (:mod:`~snapshot.schema.state`, :mod:`~snapshot.schema.saved`) are the only
readers of its keys: code elsewhere reads their attributes.

Two ideas that look alike: in the payload a shard record says ``exhausted`` when the shard's
graph has produced its last sample (:attr:`ShardState.graph_exhausted`), and ``finished`` when the
loader has also taken that sample, nothing in flight (:attr:`ShardState.finished`). The manifest
shows only the second, as ``shards[i].exhausted`` (:attr:`ShardState.taken_all` and
:func:`shard_finished` read it from a record; names kept for compatibility with files already
written).

The package imports neither torch nor dill: the command line uses it to inspect files. Its modules:
:mod:`~snapshot.schema._fields` (constants, the field readers and the quick reader that reads a
well-formed record in one pass, leaving anything else to them), :mod:`~snapshot.schema.graph` (the
graph's description), :mod:`~snapshot.schema.layout` (what ran), :mod:`~snapshot.schema.positions` (where
each part stood), :mod:`~snapshot.schema.payload` (the payload's record), :mod:`~snapshot.schema.manifest`
(the manifest and a directory's index), :mod:`~snapshot.schema._metadata` (the user's metadata) and
:mod:`~snapshot.schema._lazy` (an index's records of every shard, each read in full when used).
"""

from snapshot.schema._fields import FORMAT_VERSION, check_format
from snapshot.schema._lazy import Mapped, Records
from snapshot.schema.graph import GraphDesc, NodeDesc
from snapshot.schema.layout import (
    HANDOUT,
    Handout,
    LoaderPosition,
    Owner,
    Randomness,
    RankPosition,
    ServiceLayout,
)
from snapshot.schema.manifest import Manifest, PartRecord, part_name
from snapshot.schema.payload import PayloadRecord, PickledValue
from snapshot.schema.positions import (
    Driver,
    NodePosition,
    PlanSummary,
    ReaderPosition,
    RouterPosition,
    ShardPosition,
    UpstreamPosition,
    VerifyRecord,
    shard_finished,
)
from snapshot.schema.saved import RankServiceState, RankState, SavedState, ServiceState
from snapshot.schema.state import NodeState, PlanState, RouterState, SeedsState, ShardState, TailState, UpstreamState

__all__ = [
    "Driver",
    "FORMAT_VERSION",
    "GraphDesc",
    "HANDOUT",
    "Handout",
    "LoaderPosition",
    "Manifest",
    "Mapped",
    "NodeDesc",
    "NodePosition",
    "NodeState",
    "Owner",
    "PartRecord",
    "PayloadRecord",
    "PickledValue",
    "PlanState",
    "PlanSummary",
    "Randomness",
    "ReaderPosition",
    "RankPosition",
    "RankServiceState",
    "RankState",
    "Records",
    "RouterPosition",
    "RouterState",
    "SavedState",
    "SeedsState",
    "ServiceLayout",
    "ServiceState",
    "ShardPosition",
    "ShardState",
    "TailState",
    "UpstreamPosition",
    "UpstreamState",
    "VerifyRecord",
    "check_format",
    "part_name",
    "shard_finished",
]
