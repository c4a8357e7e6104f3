"""What a failed read or write of a snapshot says: the storage's cause and what the failure left intact.

Every failure of the storage under a save or a load (a full disk, a file-size limit, a permission, a
read-only filesystem, an I/O error, a directory removed meanwhile, an object store's error once its
retries are spent) becomes one :class:`~snapshot.errors.StorageError` that names the path, the cause
(the errno's name, or the HTTP status and the store's error code) and what is intact, with a hint::

    /ckpt/data.snap: the snapshot was not written: the disk is full (ENOSPC: No space left on device).
    The previous snapshot at /ckpt/data.snap is unchanged, and no temporary file is left. Free space or
    save elsewhere, then save again.

This module knows nothing of snapshots' contents: an exception and a path in, a sentence out.
"""

from __future__ import annotations

import errno as errnos
import os
from typing import Any

from snapshot.errors import StorageError

__all__ = ["cause_of", "describe", "intact_at", "read_error", "write_error"]

#: What each errno means for a snapshot's storage, and what to do about it.
_MEANINGS: dict[int, tuple[str, str]] = {
    errnos.ENOSPC: ("the disk is full", "Free space or save elsewhere, then save again."),
    errnos.EDQUOT: ("the disk quota is exceeded", "Free space or save elsewhere, then save again."),
    errnos.EFBIG: ("the file-size limit was reached", "Raise the limit (`ulimit -f`, RLIMIT_FSIZE) or save "
                   "elsewhere, then save again."),
    errnos.EACCES: ("permission denied", "Check the permissions of the directory and the file."),
    errnos.EPERM: ("the operation is not permitted", "Check the permissions of the directory and the file."),
    errnos.EROFS: ("the filesystem is read-only", "Save to a writable filesystem."),
    errnos.EIO: ("an I/O error", "Check the device (`dmesg`) or the network filesystem, then try again."),
    errnos.ENOENT: ("a directory of the path does not exist (removed meanwhile?)",
                    "Check the path; create the directory again if it was removed."),
    errnos.ENOTDIR: ("a part of the path is a file, not a directory", "Check the path."),
    errnos.ESTALE: ("a stale file handle (the network filesystem changed under the file)", "Try again."),
    errnos.ETIMEDOUT: ("the storage timed out", "Check the storage, then try again."),
    errnos.EBUSY: ("the storage is busy (throttled)", "Try again later, or at a lower request rate."),
}
#: ``EREMOTEIO``, which s3fs gives a store's internal error (Linux only in :mod:`errno`).
_REMOTE = getattr(errnos, "EREMOTEIO", 121)
_STORE_HINT = ("The object store failed after its retries (see the storage docs' retry settings): check the "
               "bucket, the credentials and the store's health, then try again.")


def _http_status(exc: BaseException) -> str | None:
    """``"HTTP 503 SlowDown"`` for an object store's response anywhere in ``exc``'s chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response: Any = getattr(current, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            if status or code:
                return " ".join(str(part) for part in ("HTTP", status, code if code != str(status) else None)
                                if part)
        current = current.__cause__ or current.__context__
    return None


def cause_of(exc: BaseException) -> tuple[str, int | None, str | None]:
    """The cause's short name (``"ENOSPC"``, ``"HTTP 503 SlowDown"``, or the exception's type), errno and
    the system's message for it."""
    status = _http_status(exc)
    code = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    strerror = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
    if status is not None:
        return status, None, strerror or str(exc)
    if isinstance(code, int) and code in errnos.errorcode:
        return errnos.errorcode[code], code, strerror or os.strerror(code)
    return type(exc).__name__, None, str(exc) or None


def _explain(exc: BaseException) -> tuple[str, str, int | None, str | None]:
    """What happened, in words with the cause in brackets; the hint; the cause's name, errno and message."""
    name, code, message = cause_of(exc)
    if name.startswith("HTTP"):
        return f"the object store answered {name}" + (f" ({message})" if message else ""), _STORE_HINT, code, message
    meaning, hint = _MEANINGS.get(code, ("", "")) if code is not None else ("", "")
    if code == _REMOTE:
        meaning, hint = "the object store failed", _STORE_HINT
    detail = f"{name}: {message}" if message else name
    return (f"{meaning} ({detail})" if meaning else detail), hint, code, message


def describe(exc: BaseException) -> str:
    """What happened, in words, with the cause: ``the disk is full (ENOSPC: No space left on device)``."""
    return _explain(exc)[0]


def intact_at(dest: str) -> str:
    """What a save that failed before its commit left at the local path ``dest`` (looked at after the
    failure; a URL's is :func:`snapshot.storage._fsspec.intact_at`)."""
    try:
        os.lstat(dest)
    except FileNotFoundError:
        pass
    except OSError:  # it cannot be looked at (a permission, a stale handle): a failed save never replaces it
        return f"What was at {dest} is unchanged."
    else:
        return f"The previous snapshot at {dest} is unchanged."
    directory = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(directory):
        return f"Nothing was written: the directory {directory} does not exist (any more)."
    return f"Nothing was written at {dest} (there was no snapshot there before)."


def write_error(exc: BaseException, dest: str, *, intact: str | None = None,
                what: str = "the snapshot was not written") -> StorageError:
    """The :class:`StorageError` for a write of ``dest`` that failed with ``exc`` (raise it ``from exc``);
    ``intact`` says what is unchanged (by default: what is at ``dest``, see :func:`intact_at`)."""
    said, hint, code, message = _explain(exc)
    intact = intact_at(dest) if intact is None else intact
    text = " ".join(part for part in (f"{what}: {said}.", intact, hint) if part)
    return StorageError(text, source=dest, cause=cause_of(exc)[0], intact=intact, errno=code, strerror=message)


def read_error(exc: BaseException, src: str, *, what: str = "cannot read the snapshot") -> StorageError:
    """The :class:`StorageError` for a read of ``src`` that failed with ``exc`` (raise it ``from exc``)."""
    said, hint, code, message = _explain(exc)
    intact = "Nothing was changed."
    text = " ".join(part for part in (f"{what}: {said}.", intact, hint) if part)
    return StorageError(text, source=src, cause=cause_of(exc)[0], intact=intact, errno=code, strerror=message)
