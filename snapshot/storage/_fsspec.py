"""Snapshot files behind fsspec URLs (``s3://``, ``gs://``, ``memory://``, ...).

A path with a scheme (``scheme://...``) is read and written through fsspec, an optional
dependency (the ``storage`` extra installs fsspec and s3fs). A file is
written in one upload, which object stores publish only when it completes: a reader sees
the previous object or the whole new one, never a part. A distributed snapshot behind a
URL is a prefix holding an index and the parts (see ``_object_directory``).

This module knows nothing of snapshots: bytes in, bytes out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from snapshot.errors import SnapshotFileError

__all__ = ["exists", "index_or_object", "is_url", "read_bytes", "remove", "write_bytes"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: Any) -> bool:
    """Whether ``path`` is an fsspec URL rather than a local path."""
    return isinstance(path, str) and bool(_URL.match(path))


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError:
        raise SnapshotFileError(
            "is an object-storage URL, which needs fsspec (and the store's driver, s3fs for s3://): "
            "pip install fsspec s3fs (the package's 'storage' extra), or use a local path", source=url) from None
    try:
        filesystem, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise SnapshotFileError(f"cannot open this URL's storage: {exc}", source=url) from exc
    return filesystem, path


def write_bytes(url: str, chunks: Sequence[Any]) -> None:
    """Write ``chunks`` as one object at ``url`` (published whole when the upload completes)."""
    filesystem, path = _filesystem(url)
    parent = os.path.dirname(path.rstrip("/"))
    if parent:
        filesystem.makedirs(parent, exist_ok=True)
    try:
        with filesystem.open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except OSError as exc:
        raise SnapshotFileError(f"cannot write the snapshot: {type(exc).__name__}: {exc}", source=url) from exc


def exists(url: str) -> bool:
    filesystem, path = _filesystem(url)
    return bool(filesystem.exists(path))


def remove(url: str) -> None:
    """Remove ``url`` and everything under it (best effort: an old prefix left over is harmless)."""
    filesystem, path = _filesystem(url)
    try:
        filesystem.rm(path, recursive=True)
    except OSError:
        pass


def index_or_object(url: str) -> str:
    """``url`` itself, or the index of the directory snapshot at ``url``."""
    index = f"{url.rstrip('/')}/manifest.snap"
    return index if not exists(url) or exists(index) else url


def read_bytes(url: str) -> bytes:
    """The whole object at ``url``."""
    filesystem, path = _filesystem(url)
    try:
        data: bytes = filesystem.cat_file(path)
    except FileNotFoundError as exc:
        raise SnapshotFileError("no such object; check the URL", source=url) from exc
    except IsADirectoryError as exc:
        raise SnapshotFileError("this is a directory; a distributed snapshot needs a filesystem path",
                                source=url) from exc
    return data
