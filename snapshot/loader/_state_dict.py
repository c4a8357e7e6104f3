"""A distributed loader's state dict: each rank's part, gathered where it will be written, never everywhere.

Who writes a state dict decides what each rank's holds (the form is :mod:`snapshot.container._parts`'s):

- ``torch.distributed.checkpoint`` writes every rank's: each rank's state dict holds its own part, and
  rank 0's the index too, under keys DCP writes once each. Nothing but the index's small records (the
  parts' manifests and digests) travels, to rank 0. DCP asks a loader for its state dict to save it,
  and, before a load, for the keys to read: then no state is captured, and the keys are the index and
  this rank's part, which is what a restore on the same layout reads (:func:`load_keys` names the parts
  that the re-shard plan of any layout reads).
- Any other caller (Lightning and accelerate write rank 0's state; so does a ``torch.save`` on rank 0):
  rank 0's state dict holds every part and the index, the other ranks' their own part only.

A framework is recognised by the module that calls ``state_dict()`` (a few frames up), as DCP calls it
with no arguments. Either way the dicts of two ranks agree on every key they share, so a writer that keeps
one copy of each key (DCP's planner does) writes a complete state whichever rank's copy it keeps.
"""

from __future__ import annotations

import io
import sys
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

from snapshot import schema
from snapshot.container import _dict_form, _parts, format
from snapshot.container.capture import LoaderState
from snapshot.errors import RankError
from snapshot.storage import _stream

__all__ = ["EVERY_RANK", "LOAD", "RANK_ZERO", "caller", "encode_part", "load_keys", "load_template", "ranks_state_dict"]

#: Who asks for the state dict: a writer of every rank's state (DCP's save), DCP's load (which asks
#: for the keys to read), or anyone else (who is taken to write rank 0's state).
EVERY_RANK, LOAD, RANK_ZERO = "every rank", "load", "rank 0"
_DCP = "torch.distributed.checkpoint"
_DCP_LOAD = f"{_DCP}.state_dict_loader"
#: Frames above ``state_dict()`` searched for DCP's (DCP calls it from its own module, maybe through a
#: logging wrapper or a user's object that holds the loader).
_FRAMES = 8


def caller() -> str:
    """Who asks for the loader's state dict: :data:`EVERY_RANK`, :data:`LOAD` or :data:`RANK_ZERO`."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            break
        name = str(frame.f_globals.get("__name__", ""))
        if name == _DCP_LOAD:
            return LOAD
        if name == _DCP or name.startswith(_DCP + "."):
            return EVERY_RANK
        frame = frame.f_back
    return RANK_ZERO


def ranks_state_dict(collective: Any, capture: Callable[[], LoaderState], *, writer: str) -> dict[str, Any]:
    """This rank's share of the loader's state dict for ``writer`` (:data:`EVERY_RANK` or :data:`RANK_ZERO`),
    a collective: every rank captures its state (``capture()``) and encodes its part with the save's id, and
    rank 0 builds the index. A rank that cannot is a :class:`RankError` on every rank, at once."""
    save = collective.broadcast(uuid.uuid4().hex[:12], "agreeing on the state dict's save id")
    failure: Exception | None = None
    part, info = b"", {}
    try:
        manifest, part = encode_part(capture(), save)
        info = _parts.part_info(collective.rank, manifest.to_dict(), part)
    except Exception as exc:  # noqa: BLE001 - every rank is told, then this rank raises it as the cause
        failure = exc
    # one small collective tells every rank whether any failed, so that none waits on the others
    if not collective.all_reduce_min(int(failure is None), "taking the loader's state"):
        error = f"{type(failure).__name__}: {failure}" if failure is not None else None
        errors = collective.all_gather(error, "taking the loader's state")
        raise RankError("the loader's state dict was not taken: " + "; ".join(
            f"rank {rank}: {e}" for rank, e in enumerate(errors) if e)) from failure
    infos = collective.gather(info, "gathering the index of the loader's state")
    name = schema.part_name(collective.rank)
    if writer == EVERY_RANK:
        held = {name: part}
    else:
        gathered = collective.gather(part, "gathering every rank's part of the loader's state on rank 0")
        held = {schema.part_name(rank): each for rank, each in enumerate(gathered)} if gathered else {name: part}
    index = _parts.distributed_manifest(infos, save=save) if infos is not None else None
    return _parts.parts_state_dict(index, held)


def encode_part(source: LoaderState, save: str) -> tuple[schema.Manifest, bytes]:
    """``source`` encoded as one snapshot file in memory, carrying the save's id (one copy of the state)."""
    buffer = io.BytesIO()
    manifest, _ = _stream.encode_into(buffer, source, key=None, save=save)
    return manifest, buffer.getvalue()  # the buffer's own bytes, not a copy, once nothing else refers to them


def load_template(collective: Any) -> dict[str, Any]:
    """What DCP is to read for this rank, asked before a load: the index, and this rank's part, all a restore
    on the layout of the save reads. :func:`load_keys` names the parts of any layout
    (``snapshot.integrations.dcp.load``)."""
    return {format.STATE_DICT_MARKER: format.FORMAT_VERSION, "manifest": "",
            _parts.PARTS: {schema.part_name(collective.rank): b""}}


def load_keys(service: Any, index: dict[str, Any]) -> dict[str, Any]:
    """The keys of a loader's saved state (besides its index, ``index``: the marker and the manifest) that a
    restore onto ``service`` reads: the parts its re-shard plan names, or the payload of a single snapshot."""
    manifest = _dict_form.read_manifest(index, source="the loader's index").info
    if not manifest.is_index or manifest.payload is not None:  # one snapshot, or every part joined in the payload
        return {"payload": b""}
    ranks = service.parts_to_read(manifest)
    entries = manifest.parts if ranks is None else [manifest.parts[r] for r in sorted(set(ranks))]
    return {_parts.PARTS: {entry.file: b"" for entry in entries}}
