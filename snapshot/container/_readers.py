"""Where each file reader stands, written into the manifest when a snapshot is encoded.

A reader's state (the address of the stream it reads and its position there) is in the payload, which
``snapshot inspect`` does not read. So at save time each reader's hook says where its state stands
(``where``: the file or URL, the archive member, the offset) and the manifest keeps it beside the
node's other figures (``schema.ReaderPosition``): the question "which file, and where in it" is then
answered from the manifest alone, and a re-shard plan can read it without decoding a payload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from snapshot import schema

__all__ = ["with_readers"]


def with_readers(manifest: schema.Manifest, service: schema.ServiceState | None,
                 readers: Mapping[str, Any]) -> schema.Manifest:
    """``manifest`` with the position of each reader of ``readers`` (per node path, a hook with a
    ``where(state)`` classmethod) read from its state in ``service`` (the state the manifest describes)."""
    if not readers or service is None:
        return manifest
    shards = tuple(None if position is None or state is None else
                   dataclasses.replace(position, nodes=_nodes(position.nodes, state.nodes, readers))
                   for position, state in zip(manifest.shards, service.shards))
    upstream = tuple(dataclasses.replace(position, nodes=_nodes(position.nodes, state.nodes, readers))
                     for position, state in zip(manifest.upstream, service.upstream))
    return dataclasses.replace(manifest, shards=shards, upstream=upstream)


def _nodes(positions: Mapping[str, schema.NodePosition], states: Mapping[str, schema.NodeState],
           readers: Mapping[str, Any]) -> dict[str, schema.NodePosition]:
    out = dict(positions)
    for path, hook in readers.items():
        record = states.get(path)
        if path not in out or record is None or record.state is None:
            continue
        where = hook.where(record.state)
        if where is not None:
            out[path] = dataclasses.replace(out[path], reading=schema.ReaderPosition.from_dict(where))
    return out
