"""Snapshot files behind fsspec URLs (``s3://``, ``gs://``, ``memory://``, ...).

A path with a scheme (``scheme://...``) is read and written through fsspec, an optional
dependency (the ``storage`` extra installs fsspec and s3fs). A file is
written in one upload, which object stores publish only when it completes: a reader sees
the previous object or the whole new one, never a part. A distributed snapshot behind a
URL is a prefix holding an index and the parts (see ``_object_directory``).

Object stores throttle (``503 SlowDown``), fail (``500``), drop connections and stall. Requests to
``s3://`` retry with exponential back-off and jitter and time out, with the botocore settings in
:data:`S3_CONFIG`: the ``standard`` retry mode (it retries throttling, 500/502/503/504 and dropped
or timed-out connections), ``connect_timeout`` and ``read_timeout``; s3fs tries each call again
around them (``S3FileSystem.retries`` times, 5 by default) on timeouts and ``SlowDown``. fsspec's
configuration wins where it sets them (``fsspec.config.conf["s3"] = {"config_kwargs":
{"read_timeout": 120}}``, or the environment variable ``FSSPEC_S3``). A request that still fails is
a :class:`~snapshot.errors.StorageError` naming the URL and the HTTP status.

This module knows nothing of snapshots: bytes in, bytes out.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from typing import Any

from snapshot.errors import SnapshotError, SnapshotFileError
from snapshot.storage import _failures

__all__ = ["S3_CONFIG", "exists", "index_or_object", "intact_at", "is_url", "read_bytes", "remove", "write_bytes"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: What an ``s3://`` request does against a failing store (botocore's ``Config``), unless fsspec's
#: configuration says otherwise: ``standard`` retries (``total_max_attempts`` tries in all, the first
#: included, with exponential back-off and jitter of at most 20 s), and timeouts in seconds.
S3_CONFIG: dict[str, Any] = {"retries": {"mode": "standard", "total_max_attempts": 5}, "connect_timeout": 10,
                             "read_timeout": 60}


def is_url(path: Any) -> bool:
    """Whether ``path`` is an fsspec URL rather than a local path."""
    return isinstance(path, str) and bool(_URL.match(path))


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec  # type: ignore[import-untyped]
        import fsspec.config  # type: ignore[import-untyped]
    except ImportError:
        raise SnapshotFileError(
            "is an object-storage URL, which needs fsspec (and the store's driver, s3fs for s3://): "
            "pip install fsspec s3fs (the package's 'storage' extra), or use a local path", source=url) from None
    try:
        filesystem, path = fsspec.core.url_to_fs(url, **_options(url, fsspec.config.conf))
    except (ImportError, ValueError) as exc:
        raise SnapshotFileError(f"cannot open this URL's storage: {exc}", source=url) from exc
    return filesystem, path


def _options(url: str, conf: dict[str, Any]) -> dict[str, Any]:
    """:data:`S3_CONFIG` for an ``s3://`` URL, under what fsspec's configuration ``conf`` sets."""
    protocol = url.split("://", 1)[0]
    if protocol not in ("s3", "s3a"):
        return {}
    # a copy: botocore rewrites the retries it is given, in place
    return {"config_kwargs": copy.deepcopy({**S3_CONFIG, **conf.get(protocol, {}).get("config_kwargs", {})})}


def intact_at(url: str) -> str:
    """What a save to ``url`` that failed left there."""
    return (f"The object at {url} is unchanged, unless the store completed the upload and lost its answer; it is never "
            "a part of a snapshot (an object store publishes an upload only once it is complete).")


def write_bytes(url: str, chunks: Sequence[Any]) -> None:
    """Write ``chunks`` as one object at ``url`` (published whole when the upload completes)."""
    filesystem, path = _filesystem(url)
    parent = os.path.dirname(path.rstrip("/"))
    try:
        if parent:
            filesystem.makedirs(parent, exist_ok=True)
        with filesystem.open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except SnapshotError:
        raise
    except Exception as exc:  # the store's driver raises its own types (botocore's, aiohttp's)
        raise _failures.write_error(exc, url, intact=intact_at(url)) from exc


def exists(url: str) -> bool:
    filesystem, path = _filesystem(url)
    try:
        return bool(filesystem.exists(path))
    except Exception as exc:  # see write_bytes
        raise _failures.read_error(exc, url, what="cannot look up the snapshot") from exc


def remove(url: str) -> None:
    """Remove ``url`` and everything under it (best effort: an old prefix left over is harmless)."""
    filesystem, path = _filesystem(url)
    try:
        filesystem.rm(path, recursive=True)
    except Exception:  # noqa: BLE001 - see write_bytes; what is left is never read (no index names it)
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
    except Exception as exc:  # see write_bytes
        raise _failures.read_error(exc, url) from exc
    return data
