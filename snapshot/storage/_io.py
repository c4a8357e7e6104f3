"""Saving and loading snapshots: files, file objects, bytes, state dicts, directories, URLs.

:func:`save` packs a :class:`~snapshot.capture.Snapshot` into a container (:mod:`snapshot.format`)
and writes it atomically (:mod:`snapshot.storage._atomic`). :func:`load` reads bytes, checks them
(:mod:`snapshot.format`), joins a distributed snapshot's parts (:mod:`snapshot.multipart`,
:mod:`snapshot.storage._object_directory`), and decodes the result into a :class:`~snapshot.capture.Snapshot`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from snapshot import _progress, schema
from snapshot.container import _parts, format
from snapshot.container.capture import LoaderState, Snapshot
from snapshot.errors import ManifestError, SnapshotFileError
from snapshot.storage import _atomic, _failures, _fsspec, _object_directory, _sources, _stream, multipart

__all__ = ["is_directory", "load", "merge_parts", "save", "write"]

_log = logging.getLogger(__name__)

#: Saves of at least this many bytes show a progress bar (see :mod:`snapshot._progress`).
SAVE_PROGRESS = 256 << 20


def save(snap: Snapshot, dest: format.PathOrFile, *, key: bytes | str | None = None,
         progress: bool = True) -> None:
    """Write ``snap`` to ``dest`` atomically (a path) or to a binary file object.

    ``progress=False`` never shows a progress bar (a background save must not draw one).
    """
    if not isinstance(snap, Snapshot):
        raise TypeError(f"snapshot.save() takes a Snapshot (from capture() or save_snapshot()) as its first "
                        f"argument, not a {type(snap).__name__}")
    start = time.perf_counter()
    if snap.parts is not None:
        snap.to_bytes()  # raises: a distributed snapshot is a directory
    pieces = format.pack_parts(snap.manifest, snap._payload, key=key)  # written as they are: no joined copy
    size = sum(len(piece) for piece in pieces)
    name = os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else getattr(dest, "name", "<file object>")
    with _progress.bar(size, f"snapshot: saving {name}", minimum=SAVE_PROGRESS if progress else size + 1, unit="B",
                       unit_scale=True) as bar:
        _atomic.atomic_write(dest, pieces, progress=bar.update if bar.shown else None)
    _log.info("saved snapshot %s: %s bytes (epoch %d, sample %d) in %.3f s", name, f"{size:,}",
              snap.epoch, snap.yielded, time.perf_counter() - start)


def write(source: LoaderState, dest: str | os.PathLike[str], *, key: bytes | str | None = None,
          progress: bool = True) -> Snapshot:
    """Encode ``source`` straight into ``dest`` (a path or a URL), atomically; its :class:`Snapshot`.

    Node states and samples are written as they are encoded (see :mod:`snapshot.storage._stream`),
    so the save holds no copy of the state; the returned snapshot reads its payload back from
    ``dest`` only if it is asked for it.
    """
    start = time.perf_counter()
    name = os.fspath(dest)
    with _atomic.atomic_file(dest) as f, _progress.bar(None if progress else 0, f"snapshot: saving {name}",
                                                        unit="B", unit_scale=True) as bar:
        manifest, size = _stream.encode_into(f, source, key=key, progress=bar.update if bar.shown else None)
    _log.info("saved snapshot %s: %s bytes (epoch %d, sample %d) in %.3f s", name, f"{size:,}",
              manifest.loader.epoch, manifest.loader.yielded, time.perf_counter() - start)
    return _stream.written(name, manifest)


def merge_parts(manifest: dict[str, Any], parts: list[Snapshot]) -> Snapshot:
    """One snapshot from the ranks' parts: the logical shards, upstream copies and samples of the parts
    read (every rank's, or those a rank's re-shard plan names), and every rank's position, handout and
    owners from the index (``manifest``), whatever parts were read."""
    index = schema.Manifest.from_dict(manifest)
    by_rank = {p.saved.service.rank if p.saved.service is not None else 0: p for p in parts}
    parts = [by_rank[r] for r in sorted(by_rank)]
    first = parts[0]
    saved = first.saved
    ranks = [schema.RankState(r.rank, r.position.yielded, r.position.epoch_finished,
                              list(by_rank[r.rank].saved.lookahead) if r.rank in by_rank else
                              [None] * r.position.lookahead)  # another rank's: counted, not read
             for r in index.ranks]
    service = saved.service
    if service is not None:
        read = {rank: p.saved.service for rank, p in by_rank.items() if p.saved.service is not None}
        shards: list[schema.ShardState | None] = [None] * service.units
        for each in read.values():
            for i, record in enumerate(each.shards):
                if record is not None:
                    shards[i] = record
        layout = {k: v for k, v in service.layout.items() if k != schema.HANDOUT}  # per rank: in ranks[i]
        layout["owners"] = {k: o.to_dict() for k, o in index.service.owners.items()}  # every rank's units
        service = dataclasses.replace(
            service, layout=layout, merge=None, shards=shards,
            upstream=[u for rank in sorted(read) for u in read[rank].upstream],
            ranks=[schema.RankServiceState(r.rank, getattr(read.get(r.rank), "merge", None),
                                           getattr(read.get(r.rank), "even_batches", None), r.handout,
                                           r.position.epoch_finished)
                   for r in index.ranks])
    saved = dataclasses.replace(saved, service=service, ranks=ranks)
    snap = Snapshot(manifest, saved.to_dict(), first.graph, first.service, b"", parts=parts)
    snap.__dict__["saved"] = saved  # see Snapshot.saved
    return snap


def _decode(container: format.Container, source: str, trusted: bool) -> Snapshot:
    """The snapshot in a verified container, refused unless its manifest describes its payload's state."""
    snap = Snapshot.from_container(container, source=source, trusted=trusted)
    _check_state(snap, container.info, source)
    return snap


def _check_state(snap: Snapshot, info: schema.Manifest, source: str) -> None:
    try:
        info.check_state(snap.saved, source=source)
    except ManifestError as exc:
        raise exc.at(source) from None


_LOADABLE = ("a path (str or os.PathLike) to a snapshot file or a distributed snapshot's directory, a binary "
             "file object, bytes, a state dict or a Snapshot")


def is_directory(src: Any) -> bool:
    """Whether ``src`` is a distributed snapshot's directory (on disk or in an object store)."""
    return multipart.is_directory_snapshot(src) or _object_directory.is_directory(src)


def load(src: Any, *, key: bytes | str | None = None, allow_pickle: bool = False,
         parts: multipart.Select | None = None) -> Snapshot:
    """Read and verify a snapshot (path, directory, binary file, bytes or state dict); then decode it.

    With ``key`` (or ``$SNAPSHOT_KEY``) an unsigned or tampered file is refused before
    anything is decoded. The state is decoded as data: nothing named in the file is imported
    or called. A file whose state holds values that are not data (saved pickled), or a format-1
    file (one pickle), is refused with an :class:`~snapshot.errors.UntrustedStateError` unless
    it is signed with ``key`` or ``allow_pickle=True`` says that you trust it. The graph and the
    reading service stay pickled bytes (``from_snapshot`` unpickles them). A distributed
    snapshot (a directory, or a state dict of parts) loads as one snapshot of all ranks; given
    ``parts`` (the ranks whose parts to read, chosen from the index: a rank's re-shard plan), of those
    ranks' parts and the index only. Anything else is a :class:`TypeError`.
    """
    if isinstance(src, Snapshot):
        return src
    trusted = bool(allow_pickle) or format.resolve_key(key) is not None
    if key is not None and not isinstance(key, (bytes, str)):
        raise TypeError(f"key must be bytes or str, not {type(key).__name__}")
    if isinstance(src, (str, os.PathLike)) and not _fsspec.is_url(src):
        try:
            snap = _sources.read_snapshot(src, key=key, trusted=trusted)  # decoded as it is read: one copy
        except SnapshotFileError:
            if not multipart.is_directory_snapshot(src):  # asked only now: a file's restore makes no stat call
                raise
        else:
            _check_state(snap, snap.info, os.fspath(src))
            return snap
    if not isinstance(src, (str, os.PathLike, bytes, bytearray, memoryview, Mapping)) \
            and not callable(getattr(src, "read", None)):
        raise TypeError(f"snapshot.load() reads {_LOADABLE}; got a {type(src).__name__}")
    in_object_store = _object_directory.is_directory(src)
    if in_object_store or multipart.is_directory_snapshot(src):
        index, containers = (_object_directory.read_parts(str(src), key=key, select=parts) if in_object_store
                             else multipart.read_parts(src, key=key, select=parts))
        return merge_parts(index.manifest, [_decode(c, str(src), trusted) for c in containers])
    if isinstance(src, Mapping):
        source = "<state_dict>"
        container, chosen = _parts.read_state_dict(src, key=key, source=source, select=parts)
        if chosen is not None:
            return merge_parts(container.manifest, [_decode(part, source, trusted) for part in chosen])
    elif isinstance(src, (bytes, bytearray, memoryview)):
        container = format.unpack(bytes(src), source="<bytes>", key=key)
        source = "<bytes>"
    else:
        try:
            container = _sources.read_container(src, key=key)
        except OSError as exc:  # a file object's read
            raise _failures.read_error(exc, str(getattr(src, "name", src))) from exc
        source = str(getattr(src, "name", src))
    return _decode(container, source, trusted)
