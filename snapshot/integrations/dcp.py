"""torch.distributed.checkpoint: ``load`` in place of ``dcp.load``, reading only what each rank needs.

A :class:`~snapshot.DataLoader2` is ``Stateful``: ``dcp.save({"model": ..., "data": loader})`` writes,
in a distributed run, each rank's part of the loader's state under a key of its own
(``data.parts.rank-00003.snap``) and the index once (``data.manifest``, from rank 0). No rank gathers
another's part. Loading is two steps, since which parts a rank needs depends on the index, and on the
number of ranks and workers it is loaded on::

    from snapshot.integrations import dcp as snapshot_dcp

    state = {"model": model.state_dict(), "data": loader}
    snapshot_dcp.load(state, checkpoint_id="ckpt/step7")     # dcp.load's arguments

:func:`load` reads the index of every loader in ``state_dict`` (a few kilobytes), then, in one
``dcp.load`` with everything else, the parts each rank needs (those its re-shard plan names: its own on
the same layout, its units' on another), and restores the loaders. ``dcp.load`` itself reads the index
and the rank's own part: enough on the layout the checkpoint was saved on.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.checkpoint as dcp

import snapshot
from snapshot.loader import _state_dict

__all__ = ["load"]


def load(state_dict: dict[str, Any], *, checkpoint_id: Any = None, storage_reader: Any = None,
         planner: Any = None, process_group: Any = None, no_dist: bool = False) -> None:
    """``torch.distributed.checkpoint.load(state_dict, ...)``, where every :class:`~snapshot.DataLoader2` among
    ``state_dict``'s values reads its index first, then only the parts of its state it needs.

    Call it on every rank, as ``dcp.load``. The loaders are restored in place (``load_state_dict``); every
    other entry is loaded as ``dcp.load`` loads it, in the same call as the loaders' parts.
    """
    options = {"checkpoint_id": checkpoint_id, "storage_reader": storage_reader, "process_group": process_group,
               "no_dist": no_dist}
    loaders = {key: value for key, value in state_dict.items() if isinstance(value, snapshot.DataLoader2)}
    if not loaders:
        dcp.load(state_dict, planner=planner, **options)
        return
    indexes: dict[str, Any] = {key: {"snapshot_format": 0, "manifest": ""} for key in loaders}
    dcp.load(indexes, **options)
    rest = dict(state_dict)
    for key in loaders:
        rest[key] = _state_dict.load_keys(loaders[key].reading_service, indexes[key])
    dcp.load(rest, planner=planner, **options)
    for key, loader in loaders.items():
        loader.load_state_dict({**indexes[key], **rest[key]})
    for key, value in rest.items():
        if key not in loaders:
            state_dict[key] = value
