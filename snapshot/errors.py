"""Every error this library raises on purpose.

All of them derive from :class:`SnapshotError`, so ``except snapshot.SnapshotError`` catches
every refusal. Each message says what happened, where (file, offset, node path, worker,
rank) and what to do next. A raw ``pickle``, ``zipfile``, ``struct`` or ``json`` error never
reaches the caller: it is wrapped in one of these, with the original as ``__cause__``.

::

    SnapshotError
    ├── SnapshotFileError              the bytes on disk cannot be used
    │   ├── EmptySnapshotError         a zero-length file
    │   ├── TruncatedSnapshotError     the file ends before its declared size
    │   ├── CorruptSnapshotError       a checksum does not match, or a part does not decode
    │   │   └── ManifestError          a field of the manifest (or saved state) is missing or wrong
    │   ├── ForeignFileError           not a snapshot at all (a torch checkpoint, a pickle, ...)
    │   ├── VersionSkewError           written by a format this version cannot read
    │   ├── SignatureError             unsigned, wrongly signed or tampered (with a key)
    │   ├── UntrustedStateError        restoring would unpickle from the file, and nothing vouches for it
    │   └── StorageError               the storage failed a read or a write (a full disk, an object store's
    │                                  error, ...); also an OSError, with the errno
    ├── GraphMismatchError             the graph built in code is not the saved graph
    ├── SerializationError             a pipe or a state cannot be pickled (names the pipe)
    ├── RestoreError                   the snapshot is valid but cannot be applied here
    │   ├── PositionError              a saved count is beyond the data available
    │   ├── StrategyError              the requested strategy cannot restore this graph
    │   ├── LayoutError                workers, ranks or logical shards cannot be honoured
    │   └── VerificationError          the restored stream differs from the recorded one
    ├── ShardingError                  the graph cannot be cut into logical shards
    └── ExecutionError                 a reading service failed while running
        ├── WorkerError                a worker raised, died or stopped answering
        └── RankError                  a distributed peer raised, died or stopped answering
"""

from __future__ import annotations

__all__ = [
    "CorruptSnapshotError",
    "EmptySnapshotError",
    "ExecutionError",
    "ForeignFileError",
    "GraphMismatchError",
    "LayoutError",
    "ManifestError",
    "PositionError",
    "RankError",
    "RestoreError",
    "SerializationError",
    "ShardingError",
    "SignatureError",
    "SnapshotError",
    "SnapshotFileError",
    "StorageError",
    "StrategyError",
    "TruncatedSnapshotError",
    "UntrustedStateError",
    "VerificationError",
    "VersionSkewError",
    "WorkerError",
]


class SnapshotError(Exception):
    """Root of every error raised on purpose by ``snapshot``."""


class SnapshotFileError(SnapshotError):
    """A snapshot file (or state dict) cannot be read.

    ``source`` names the file (or ``"<state_dict>"``), ``offset`` the byte where the problem
    was found when that is known.
    """

    def __init__(self, message: str, *, source: str | None = None, offset: int | None = None):
        where = ""
        if source is not None:
            where = f"{source}"
            if offset is not None:
                where += f" (at byte {offset})"
            where += ": "
        super().__init__(where + message)
        self.source = source
        self.offset = offset


class EmptySnapshotError(SnapshotFileError):
    """The file has no bytes at all (an interrupted copy, or the wrong path)."""


class TruncatedSnapshotError(SnapshotFileError):
    """The file ends before the size its header declares."""


class CorruptSnapshotError(SnapshotFileError):
    """A checksum does not match, or a part of the file does not decode."""


class ManifestError(CorruptSnapshotError):
    """A manifest (or a saved state) whose structure is wrong, though its checksum may match.

    ``field`` is the path of the offending field (``graph.nodes[3].path``), ``expected`` what
    it should hold and ``got`` (a short repr) what it holds. It was written by another tool or
    version, by a bug, or edited: checksums prove only that it was not damaged since.
    """

    def __init__(self, field: str, expected: str, got: str, *, source: str | None = None):
        super().__init__(f"{field or 'the manifest'}: expected {expected}, got {got}; the manifest was not "
                         "written this way by snapshot (another tool or version, or an edit)", source=source)
        self.field = field
        self.expected = expected
        self.got = got

    def at(self, source: str) -> ManifestError:
        """The same error, naming the file it was found in."""
        return ManifestError(self.field, self.expected, self.got, source=source)


class ForeignFileError(SnapshotFileError):
    """The file is not a snapshot (a torch checkpoint, a plain pickle, JSON, ...)."""


class VersionSkewError(SnapshotFileError):
    """The file was written in a format version this installation cannot read."""


class SignatureError(SnapshotFileError):
    """A key was given and the file is unsigned, signed with another key, or altered."""


class UntrustedStateError(SnapshotFileError):
    """Restoring would unpickle a value from the file (a format-1 payload, or a value that is not data),
    and neither a key the file is signed with nor ``allow_pickle=True`` vouches for it.

    ``where`` names the value when there is one (``state.service.shards[0].nodes['0/datapipe'].state[3]``).
    """

    def __init__(self, message: str, *, source: str | None = None, offset: int | None = None,
                 where: str | None = None):
        super().__init__(message, source=source, offset=offset)
        self.where = where


class StorageError(SnapshotFileError, OSError):
    """The storage failed a read or a write of a snapshot: a full disk (``ENOSPC``), a file-size limit
    (``EFBIG``), a permission (``EACCES``), a read-only filesystem (``EROFS``), an I/O error (``EIO``), a
    directory removed meanwhile, or an object store's error (an HTTP status) once its retries are spent.

    ``source`` names the path or URL, ``cause`` the errno's name (``"ENOSPC"``) or the HTTP status
    (``"HTTP 503 SlowDown"``), and ``intact`` what the failure left as it was ("the previous snapshot at
    ... is unchanged"). It is also an ``OSError`` whose ``errno`` is the original's (``None`` for an
    object store's status), so code that caught the raw ``OSError`` still catches it; the original is
    its ``__cause__``.
    """

    def __init__(self, message: str, *, source: str | None = None, cause: str = "", intact: str = "",
                 errno: int | None = None, strerror: str | None = None):
        super().__init__(message, source=source)
        self.cause = cause
        self.intact = intact
        self.errno = errno
        self.strerror = strerror
        self.filename = source

    def __str__(self) -> str:
        return str(self.args[0])  # the message, not OSError's "[Errno N] ..."


class GraphMismatchError(SnapshotError):
    """The DataPipe graph given for a restore is not the graph that was saved.

    ``differences`` lists one entry per node: ``(path, saved, current)``.
    """

    def __init__(self, message: str, differences: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.differences = list(differences or [])


class SerializationError(SnapshotError):
    """A DataPipe or a state could not be pickled; the message names the pipe."""


class RestoreError(SnapshotError):
    """A valid snapshot that cannot be applied to this loader."""


class PositionError(RestoreError):
    """A saved position (number of samples) is beyond what the data provides now."""


class StrategyError(RestoreError):
    """The requested restore strategy cannot be used for this graph."""


class LayoutError(RestoreError):
    """The saved logical shards cannot be mapped onto the requested workers or ranks."""


class VerificationError(RestoreError):
    """The restored stream differs from the samples recorded when the snapshot was saved."""


class ShardingError(SnapshotError):
    """The graph cannot be cut into logical shards as requested."""


class ExecutionError(SnapshotError):
    """A reading service failed while producing data."""


class WorkerError(ExecutionError):
    """A worker process raised, was killed, or stopped answering within the timeout."""


class RankError(ExecutionError):
    """A distributed peer raised, died, or stopped answering within the timeout."""
