"""A loader's state encoded straight into a file: the one way a save writes a snapshot file from a
:class:`~snapshot.capture.LoaderState`, for a single process (:func:`snapshot.storage._io.write`) and for
a rank's part of a directory (:func:`write_part`).

Node states and samples go to the file as they are encoded (:class:`snapshot.format.Writer`: a
placeholder header, the payload, the manifest, then the real header), so a save holds no copy of the
state. A part's size and digest (of the whole file, header included) are read back from the file in
chunks once it is complete. The :class:`Snapshot` returned reads its payload back from the file only
if it is asked for it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

from snapshot import schema
from snapshot.container import format
from snapshot.container._parts import part_info
from snapshot.container.capture import LoaderState, Snapshot, encode
from snapshot.storage import _atomic, _sources

__all__ = ["encode_into", "write_part", "written"]

#: Bytes read at a time when a written part is read back for its digest.
_CHUNK = 1 << 20


def encode_into(f: IO[bytes], source: LoaderState, *, key: bytes | str | None, save: str | None = None,
                progress: Callable[[int], None] | None = None) -> tuple[schema.Manifest, int]:
    """Write ``source`` into ``f`` (seekable, at the container's start) as one container; its manifest
    (carrying ``save``, a directory's save id, when given) and the container's size in bytes."""
    writer = format.Writer(f, key=key, progress=progress)
    manifest = encode(source, writer)
    if save is not None:
        manifest = dataclasses.replace(manifest, save=save)
    return manifest, writer.finish(manifest.to_dict())


def write_part(source: LoaderState, dest: str, *, rank: int, save: str,
               key: bytes | str | None) -> tuple[schema.Manifest, dict[str, Any]]:
    """Encode ``source`` as rank ``rank``'s part of the save ``save`` straight into ``dest`` (a path or a
    URL, written atomically); its manifest and what the index records of it (:func:`part_info`)."""
    with _atomic.atomic_file(dest) as f:
        manifest, _ = encode_into(f, source, key=key, save=save)
        info = part_info(rank, manifest.to_dict(), _read_back(f))
    return manifest, info


def _read_back(f: IO[bytes]) -> Iterator[bytes]:
    """The bytes of the file ``f`` (complete, header and all) from its start, a chunk at a time."""
    f.flush()
    f.seek(0)
    while chunk := f.read(_CHUNK):
        yield chunk


def written(name: str | os.PathLike[str], manifest: schema.Manifest) -> Snapshot:
    """The :class:`Snapshot` this process wrote at ``name``, its payload read back only if asked for."""
    return Snapshot(manifest, payload=lambda: _sources.reread_payload(os.fspath(name), manifest.to_dict()))
