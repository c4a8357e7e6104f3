"""A distributed snapshot in object storage: the index written last commits the save.

::

    s3://bucket/ckpt/data.snap/
        manifest.snap                 the index: the global manifest, with the parts' prefix
        <token>/rank-00000.snap       rank 0's part, written by rank 0 itself
        <token>/rank-00001.snap       ...

Object stores have no rename, so a save writes every part under a fresh prefix (``token``)
first, and rank 0 then overwrites the index, which a store replaces in one piece. A crash
before that leaves the previous index, whose parts (under their own prefix) are untouched;
the previous prefix is removed only after the new index is written. Readers check every
part against the digest the index records for it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from typing import Any

from snapshot.container import format
from snapshot.container._parts import check_part, distributed_manifest
from snapshot.container.capture import LoaderState, Snapshot
from snapshot.errors import CorruptSnapshotError, RankError, SnapshotError, SnapshotFileError, StorageError
from snapshot.storage import _fsspec, _sources, _stream, multipart

__all__ = ["PREFIX", "is_directory", "read_index", "read_parts", "save_directory"]

#: The index's key naming the prefix its parts live under.
PREFIX = "parts_prefix"
_TOKEN = re.compile(r"[0-9a-f]{12}")
_log = logging.getLogger(__name__)


def _index(url: str) -> str:
    return f"{url.rstrip('/')}/{format.DIRECTORY_MANIFEST}"


def is_directory(url: Any) -> bool:
    """Whether ``url`` is a directory snapshot in object storage (it holds an index)."""
    return _fsspec.is_url(url) and _fsspec.exists(_index(str(url)))


def read_index(url: str, *, key: bytes | str | None = None) -> format.Container:
    """The index of the directory snapshot at ``url``, checked (with the prefix its parts live under)."""
    index = _index(url)
    container = _sources.read_container(index, key=key)
    prefix = container.manifest.get(PREFIX)
    if not isinstance(prefix, str) or not _TOKEN.fullmatch(prefix):
        raise CorruptSnapshotError(f"the index names no valid parts prefix ({prefix!r})", source=index)
    if not container.info.parts:
        raise CorruptSnapshotError("the index lists no parts", source=index)
    return container


def read_parts(url: str, *, key: bytes | str | None = None,
               select: multipart.Select | None = None) -> tuple[format.Container, list[format.Container]]:
    """The index and the parts ``select(index)`` names (default: every rank's), each verified against the index (the
    shape of :func:`snapshot.storage.multipart.read_parts`): a restore on one rank of many GETs only the
    parts its re-shard plan names."""
    container = read_index(url, key=key)
    prefix = container.manifest[PREFIX]
    parts = []
    for entry in multipart.selected(container, select, source=url):  # names checked: part file names, never paths
        part_url = f"{url.rstrip('/')}/{prefix}/{entry.file}"
        data = _fsspec.read_bytes(part_url)
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CorruptSnapshotError(f"{entry.file} (rank {entry.rank}) does not match the digest the index "
                                       "recorded for it: use another snapshot", source=url)
        part = format.unpack(data, source=part_url, key=key)
        check_part(container.info, entry, part.info, source=url)
        parts.append(part)
    return container, parts


def save_directory(collective: Any, source: LoaderState, dest: str, key: bytes | str | None) -> Snapshot:
    """Each rank encodes ``source`` into its part and uploads it; rank 0 then writes the index (the commit).
    A collective; this rank's part, as a :class:`Snapshot` that reads its payload back only if asked.

    The part is encoded into a local temporary file (no copy of the state in memory) and uploaded whole
    (:func:`snapshot.storage._atomic.atomic_file`), carrying the save's id, agreed on first. On any failure
    every rank raises a :class:`RankError` naming ``dest``; the previous index and its parts are unchanged,
    and the parts written for this save are removed unless the index names them (an upload that the store
    completed though its answer was lost)."""
    url = dest.rstrip("/")
    try:
        return _save(collective, source, url, key)
    except RankError as exc:
        raise multipart.not_saved(exc, dest, _fsspec.intact_at(_index(url))) from exc.__cause__


def _save(collective: Any, source: LoaderState, url: str, key: bytes | str | None) -> Snapshot:
    token = collective.broadcast(uuid.uuid4().hex[:12], "agreeing on a snapshot prefix")
    part = f"{url}/{token}/rank-{collective.rank:05d}.snap"
    manifest, infos = multipart.write_part(collective, source, part, token, key,
                                           on_failure=lambda: _fsspec.remove(f"{url}/{token}"))
    error = None
    if infos is not None:  # rank 0
        error = _publish(url, infos, token, key)
    done = collective.broadcast(error, "publishing a snapshot")
    if done is not None:
        raise RankError(f"rank 0 could not publish it: {done}")
    return _stream.written(part, manifest)


def _prefix(url: str) -> str | None:
    """The parts prefix the index at ``url`` names (``None`` without an index or a valid prefix); a
    :class:`SnapshotFileError` when the store cannot tell."""
    if not _fsspec.exists(_index(url)):
        return None
    try:
        prefix = _sources.read_manifest(_index(url)).get(PREFIX)
    except StorageError:
        raise
    except SnapshotFileError:  # a damaged index: the save replaces it
        return None
    return prefix if isinstance(prefix, str) and _TOKEN.fullmatch(prefix) else None


def _publish(url: str, infos: list[dict[str, Any]], token: str, key: bytes | str | None) -> str | None:
    """Write the index naming ``token``'s parts, then remove the previous save's; why it failed, or ``None``."""
    try:
        previous = _prefix(url)
        index = {**distributed_manifest(infos, save=token), PREFIX: token}
        _fsspec.write_bytes(_index(url), format.pack_parts(index, b"", key=key))
    except SnapshotError as exc:
        try:
            published = _prefix(url) == token  # the store may have taken the index and lost its answer
        except SnapshotFileError:
            return f"{type(exc).__name__}: {exc}"  # the store cannot tell: the new parts stay, never read
        if not published:
            _fsspec.remove(f"{url}/{token}")
            return f"{type(exc).__name__}: {exc}"
        _log.warning("%s: the store reported a failure of the index it took (%s); the snapshot is published",
                     url, exc)
        return None
    if previous is not None and previous != token:
        _fsspec.remove(f"{url}/{previous}")
    return None
