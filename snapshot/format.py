"""The snapshot file format, version 1: container, manifest, checksums, signing, atomic writes.

A snapshot file is::

    offset  size  field
    0       13    magic  b"\\x89snapshot\\r\\n\\x1a\\n"  (catches text-mode and truncated copies)
    13      2     container version, little-endian (1)
    15      2     flags (bit 0: signed)
    17      4     manifest length M
    21      8     payload length P
    29      32    sha256 of the manifest bytes
    61      32    sha256 of the payload bytes
    93      M     manifest: UTF-8 JSON object, readable without unpickling anything
    93+M    P     payload: pickled objects (the graph, node states, buffered items)
    93+M+P  32    HMAC-SHA256 of bytes [0, 93) under the user's key, only when signed

The header carries both digests, so the HMAC over the header authenticates the whole file.
Readers check, in order: magic, container version, sizes against the real file size,
manifest digest, manifest JSON, manifest format version, then (only when the payload is
needed) the payload digest and the signature, and only then unpickle.

A snapshot can also travel as a plain dict (``DataLoader2.state_dict()``)::

    {"snapshot_format": 1, "manifest": "<the manifest as JSON text>", "payload": b"..."}

whose payload digest is the one recorded in the manifest's ``payload.sha256``. A distributed
snapshot is a directory (``manifest.snap`` plus one file per rank, see ``_directory``), or
the same three keys with the ranks' files joined in the payload.

This module knows nothing of graphs, loaders or pickling.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Union

from snapshot._version import DISTRIBUTION, __version__
from snapshot.errors import (
    CorruptSnapshotError,
    EmptySnapshotError,
    ForeignFileError,
    SignatureError,
    SnapshotFileError,
    TruncatedSnapshotError,
    VersionSkewError,
)

__all__ = [
    "FORMAT_VERSION",
    "KEY_ENV",
    "MAGIC",
    "Container",
    "PathOrFile",
    "atomic_write",
    "dumps_manifest",
    "from_state_dict",
    "join_parts",
    "pack",
    "payload_record",
    "read_container",
    "read_manifest",
    "resolve_key",
    "split_parts",
    "to_state_dict",
    "unpack",
]

PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]

#: Version of the container and of the manifest schema this code writes and reads.
FORMAT_VERSION = 1
MAGIC = b"\x89snapshot\r\n\x1a\n"
#: Environment variable holding a signing key (used when no key is passed explicitly).
KEY_ENV = "SNAPSHOT_KEY"
STATE_DICT_MARKER = "snapshot_format"
#: The global manifest's file name in a distributed snapshot's directory.
DIRECTORY_MANIFEST = "manifest.snap"

_HEADER = struct.Struct("<HHIQ32s32s")
_PREFIX = len(MAGIC) + _HEADER.size
_SIGNATURE_SIZE = 32
_FLAG_SIGNED = 1
#: A manifest is metadata; anything this large is not one of ours.
_MAX_MANIFEST = 64 * 1024 * 1024

# Top-level manifest keys.
SIGNATURE = "signature"  # in a state dict's manifest only (files carry theirs after the payload)
FORMAT = "format"
CREATED = "created"
VERSIONS = "versions"
PAYLOAD = "payload"


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def resolve_key(key: bytes | str | None) -> bytes | None:
    """The signing key: ``key`` if given, else ``$SNAPSHOT_KEY``, else ``None``."""
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    if key is None:
        return None
    return key.encode() if isinstance(key, str) else bytes(key)


def pack(manifest: Mapping[str, Any], payload: bytes, *, key: bytes | str | None = None) -> bytes:
    """Assemble a snapshot file from its manifest and payload (signed if a key is given)."""
    manifest_bytes = json.dumps(manifest, sort_keys=False, separators=(",", ":")).encode()
    secret = resolve_key(key)
    flags = _FLAG_SIGNED if secret is not None else 0
    header = MAGIC + _HEADER.pack(
        FORMAT_VERSION, flags, len(manifest_bytes), len(payload),
        _sha256(manifest_bytes), _sha256(payload),
    )
    parts = [header, manifest_bytes, payload]
    if secret is not None:
        parts.append(hmac.new(secret, header, hashlib.sha256).digest())
    return b"".join(parts)


@dataclass(frozen=True)
class Container:
    """A parsed snapshot file."""

    manifest: dict[str, Any]
    payload: bytes | None
    signed: bool
    size: int


def _describe_foreign(head: bytes) -> str:
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (a torch.save checkpoint?)"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return "a raw pickle"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON text"
    if head.startswith(b"\x89PNG"):
        return "a PNG image"
    if head[:2] == b"\x1f\x8b":
        return "a gzip stream"
    return f"a file starting with {head[:8]!r}"


def _check_header(head: bytes, total: int, source: str) -> tuple[int, int, int, bytes, bytes]:
    if total == 0:
        raise EmptySnapshotError(
            "the file is empty (0 bytes): the copy or the save that made it did not finish. "
            "Use the previous snapshot; saves are atomic, so an older file is intact.",
            source=source,
        )
    if len(head) < len(MAGIC) and MAGIC.startswith(head):
        raise TruncatedSnapshotError(
            f"the file ends after {total} bytes, inside the file signature; it was cut short",
            source=source, offset=total,
        )
    if not head.startswith(MAGIC):
        raise ForeignFileError(
            f"this is not a snapshot file: it looks like {_describe_foreign(head)}. "
            "Pass a file written by save_snapshot() or snapshot.save().",
            source=source, offset=0,
        )
    if total < _PREFIX:
        raise TruncatedSnapshotError(
            f"the file ends after {total} bytes, inside the {_PREFIX}-byte header; "
            "it was cut short (an interrupted copy?). Use an earlier snapshot.",
            source=source, offset=total,
        )
    version, flags, mlen, plen, mdigest, pdigest = _HEADER.unpack_from(head, len(MAGIC))
    if version != FORMAT_VERSION:
        _version_skew(version, source)
    if flags & ~_FLAG_SIGNED:
        raise CorruptSnapshotError(
            f"unknown header flags 0x{flags:04x}; the header is damaged",
            source=source, offset=len(MAGIC) + 2,
        )
    if mlen > _MAX_MANIFEST:
        raise CorruptSnapshotError(
            f"the header declares a {mlen}-byte manifest, which no snapshot has; "
            "the header is damaged", source=source, offset=len(MAGIC) + 4,
        )
    expected = _PREFIX + mlen + plen + (_SIGNATURE_SIZE if flags & _FLAG_SIGNED else 0)
    if total < expected:
        raise TruncatedSnapshotError(
            f"the file has {total} bytes but its header declares {expected} "
            f"(manifest {mlen}, payload {plen}); it was cut short. Use an earlier snapshot.",
            source=source, offset=total,
        )
    if total > expected:
        raise CorruptSnapshotError(
            f"the file has {total - expected} unexpected bytes after its end at byte "
            f"{expected}; it was altered or two files were concatenated",
            source=source, offset=expected,
        )
    return flags, mlen, plen, mdigest, pdigest


def _version_skew(version: int, source: str) -> None:
    if version > FORMAT_VERSION:
        raise VersionSkewError(
            f"written in snapshot format {version}, but this installation (snapshot "
            f"{__version__}) reads format {FORMAT_VERSION} only. Upgrade with "
            f"`pip install -U {DISTRIBUTION}` on this machine.",
            source=source,
        )
    raise VersionSkewError(
        f"written in snapshot format {version}, which this installation (snapshot "
        f"{__version__}, format {FORMAT_VERSION}) does not read.",
        source=source,
    )


def _parse_manifest(data: bytes, source: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptSnapshotError(
            f"the manifest is not valid UTF-8 JSON ({exc})", source=source, offset=_PREFIX,
        ) from exc
    except RecursionError as exc:
        raise CorruptSnapshotError(
            "the manifest's JSON is nested too deeply to be a snapshot manifest",
            source=source, offset=_PREFIX,
        ) from exc
    version = manifest.get(FORMAT) if isinstance(manifest, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptSnapshotError(
            "the manifest has no integer 'format' field", source=source, offset=_PREFIX,
        )
    if manifest[FORMAT] != FORMAT_VERSION:
        _version_skew(manifest[FORMAT], source)
    return manifest


def _source_name(src: PathOrFile) -> str:
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return str(getattr(src, "name", "<stream>"))


def _read_all(src: PathOrFile) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if isinstance(src, (str, os.PathLike)):
        try:
            with open(src, "rb") as f:
                return f.read()
        except FileNotFoundError as exc:
            raise SnapshotFileError(
                "no such file; check the path (a distributed snapshot is a directory)",
                source=os.fspath(src),
            ) from exc
        except IsADirectoryError as exc:
            raise SnapshotFileError(
                "this is a directory; pass the snapshot file inside it",
                source=os.fspath(src),
            ) from exc
    return src.read()


def unpack(
    data: bytes,
    *,
    source: str = "<bytes>",
    key: bytes | str | None = None,
    with_payload: bool = True,
) -> Container:
    """Parse and verify a snapshot file held in memory.

    With ``key`` (or ``$SNAPSHOT_KEY``) the file must carry a valid signature; without one,
    a signed file is still accepted (its checksums are verified).
    """
    flags, mlen, plen, mdigest, pdigest = _check_header(data[:_PREFIX], len(data), source)
    manifest_bytes = data[_PREFIX:_PREFIX + mlen]
    if not hmac.compare_digest(_sha256(manifest_bytes), mdigest):
        raise CorruptSnapshotError(
            "the manifest checksum does not match: the file was altered or damaged on disk",
            source=source, offset=_PREFIX,
        )
    manifest = _parse_manifest(manifest_bytes, source)
    signed = bool(flags & _FLAG_SIGNED)
    secret = resolve_key(key)
    if secret is not None:
        if not signed:
            raise SignatureError(
                "a signing key was given but the file is not signed; refusing to unpickle it. "
                "Save it again with key=... or load it without a key if you trust its origin.",
                source=source,
            )
        signature = data[_PREFIX + mlen + plen:]
        expected = hmac.new(secret, data[:_PREFIX], hashlib.sha256).digest()
        if not hmac.compare_digest(signature, expected):
            raise SignatureError(
                "the signature does not match this key: the file was signed with another key "
                "or altered after signing. Do not restore it.",
                source=source, offset=_PREFIX + mlen + plen,
            )
    payload = None
    if with_payload:
        payload = data[_PREFIX + mlen:_PREFIX + mlen + plen]
        if not hmac.compare_digest(_sha256(payload), pdigest):
            raise CorruptSnapshotError(
                "the payload checksum does not match: the file was altered or damaged on disk; "
                "nothing was unpickled. Use an earlier snapshot.",
                source=source, offset=_PREFIX + mlen,
            )
    return Container(manifest, payload, signed, len(data))


def read_container(src: PathOrFile, *, key: bytes | str | None = None) -> Container:
    """Read and verify a snapshot file (path or binary file object)."""
    return unpack(_read_all(src), source=_source_name(src), key=key)


def read_manifest(src: PathOrFile) -> dict[str, Any]:
    """The manifest of a snapshot file, verified, without reading or unpickling the payload.

    ``src`` is a path or a binary file object. The header and the manifest's checksum are
    checked (a damaged or foreign file raises a :class:`~snapshot.SnapshotFileError`); the
    payload is never read, so this is safe on a file of any origin.

    Examples:
        >>> import io
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> import snapshot
        >>> dl = snapshot.DataLoader2(IterableWrapper(range(10)).batch(2))
        >>> _ = next(iter(dl))
        >>> f = io.BytesIO()
        >>> snapshot.save(dl.save_snapshot(), f)
        >>> _ = f.seek(0)
        >>> manifest = snapshot.read_manifest(f)
        >>> manifest["loader"]["epoch"], manifest["loader"]["yielded"]
        (0, 1)
        >>> [node["path"] for node in manifest["graph"]["nodes"]]
        ['0', '0/datapipe']
    """
    source = _source_name(src)
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(src) \
            and os.path.exists(os.path.join(src, DIRECTORY_MANIFEST)):
        src = os.path.join(src, DIRECTORY_MANIFEST)  # a distributed snapshot: its global manifest
        source = _source_name(src)
    if isinstance(src, (str, os.PathLike)):
        try:
            with open(src, "rb") as f:
                head = f.read(_PREFIX)
                total = os.fstat(f.fileno()).st_size
                _, mlen, _, mdigest, _ = _check_header(head, total, source)
                manifest_bytes = f.read(mlen)
        except FileNotFoundError as exc:
            raise SnapshotFileError("no such file; check the path", source=source) from exc
        except IsADirectoryError as exc:
            raise SnapshotFileError(
                "this is a directory; pass the snapshot file inside it", source=source,
            ) from exc
        if not hmac.compare_digest(_sha256(manifest_bytes), mdigest):
            raise CorruptSnapshotError(
                "the manifest checksum does not match: the file was altered or damaged",
                source=source, offset=_PREFIX,
            )
        manifest = _parse_manifest(manifest_bytes, source)
        manifest.setdefault("_file", {})["size"] = total
        return manifest
    container = unpack(_read_all(src), source=source, with_payload=False)
    manifest = dict(container.manifest)
    manifest.setdefault("_file", {})["size"] = container.size
    return manifest


#: Bytes per write when a save reports its progress.
_CHUNK = 8 << 20


def atomic_write(dest: PathOrFile, data: bytes, *, progress: Callable[[int], None] | None = None) -> None:
    """Write ``data`` so that ``dest`` holds either its old content or all of ``data``.

    Paths are written to a temporary file in the same directory, flushed and fsync'ed,
    then renamed over ``dest``; the directory is fsync'ed so the rename survives a crash.
    A binary file object is simply written to. ``progress(n)`` is told of every chunk written.
    """
    if not isinstance(dest, (str, os.PathLike)):
        dest.write(data)
        flush = getattr(dest, "flush", None)
        if flush is not None:
            flush()
        return
    path = os.path.abspath(os.fspath(dest))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if progress is None:
                f.write(data)
            else:
                view = memoryview(data)
                for start in range(0, len(view), _CHUNK):
                    progress(f.write(view[start:start + _CHUNK]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _state_dict_mac(secret: bytes, manifest: Mapping[str, Any]) -> str:
    """HMAC of a state dict's manifest (canonical JSON; it records the payload's digest)."""
    canonical = json.dumps({k: v for k, v in manifest.items() if k != SIGNATURE}, sort_keys=True,
                           separators=(",", ":"))
    return hmac.new(secret, canonical.encode(), hashlib.sha256).hexdigest()


def to_state_dict(manifest: Mapping[str, Any], payload: bytes, *, key: bytes | str | None = None) -> dict[str, Any]:
    """The plain-dict form of a snapshot (survives ``torch.save``/``torch.load``).

    Always the same three keys, whatever the graph, position or number of ranks: frameworks
    that flatten nested dicts into keys (``torch.distributed.checkpoint``) need a loader's
    state to have the same keys when saved and when loaded. The manifest is JSON text. With a
    key (or ``$SNAPSHOT_KEY``) the manifest carries an HMAC of itself, which covers the
    payload through the digest it records.
    """
    manifest = dict(manifest)
    secret = resolve_key(key)
    if secret is not None:
        manifest[SIGNATURE] = _state_dict_mac(secret, manifest)
    return {STATE_DICT_MARKER: FORMAT_VERSION, "manifest": json.dumps(manifest), "payload": payload}


def from_state_dict(state: Any, *, source: str = "<state_dict>", key: bytes | str | None = None) -> Container:
    """Verify a dict made by :func:`to_state_dict` (the payload digest is in the manifest).

    With a key (or ``$SNAPSHOT_KEY``) an unsigned or altered state dict is refused before
    anything is unpickled.
    """
    if not isinstance(state, Mapping) or STATE_DICT_MARKER not in state:
        keys = sorted(map(str, state.keys()))[:6] if isinstance(state, Mapping) else None
        hint = ""
        if isinstance(state, Mapping) and "serialized_datapipe" in state:
            hint = (" It looks like a torchdata 0.9 DataLoader2 state dict; those only restart "
                    "the epoch and cannot be converted. Save a new one with snapshot.DataLoader2.")
        raise ForeignFileError(
            f"this is not a snapshot state dict (keys: {keys}).{hint}", source=source,
        )
    version = state[STATE_DICT_MARKER]
    if version != FORMAT_VERSION:
        _version_skew(int(version) if isinstance(version, int) else -1, source)
    manifest_text = state.get("manifest")
    payload = state.get("payload")
    if not isinstance(manifest_text, str) or not isinstance(payload, (bytes, bytearray)):
        raise CorruptSnapshotError(
            "the state dict lacks its 'manifest' JSON text or its 'payload' bytes", source=source,
        )
    manifest = _parse_manifest(manifest_text.encode("utf-8", "surrogatepass"), source)
    secret = resolve_key(key)
    signed = isinstance(manifest.get(SIGNATURE), str)
    if secret is not None:
        if not signed:
            raise SignatureError(
                "a signing key was given but the state dict is not signed; refusing to unpickle it. Save "
                "it with $SNAPSHOT_KEY set (or key=...), or load it without a key if you trust its origin.",
                source=source)
        if not hmac.compare_digest(manifest[SIGNATURE], _state_dict_mac(secret, manifest)):
            raise SignatureError(
                "the signature does not match this key: the state dict was signed with another key or "
                "altered after signing. Do not restore it.", source=source)
    record = manifest.get(PAYLOAD)
    recorded = record.get("sha256") if isinstance(record, dict) else None
    if recorded != hashlib.sha256(payload).hexdigest():
        raise CorruptSnapshotError(
            "the payload checksum does not match the manifest: the state dict was altered; "
            "nothing was unpickled", source=source,
        )
    return Container(manifest, bytes(payload), signed, len(payload))


_PART_SIZE = struct.Struct("<Q")


def join_parts(parts: list[bytes]) -> bytes:
    """Several snapshot files as one payload (a distributed snapshot's state dict)."""
    return b"".join(_PART_SIZE.pack(len(p)) + p for p in parts)


def split_parts(payload: bytes, *, source: str = "<state_dict>") -> list[bytes]:
    """Inverse of :func:`join_parts`."""
    parts, offset = [], 0
    while offset < len(payload):
        if offset + _PART_SIZE.size > len(payload):
            raise TruncatedSnapshotError("a part's length is cut short", source=source, offset=offset)
        (size,) = _PART_SIZE.unpack_from(payload, offset)
        offset += _PART_SIZE.size
        if offset + size > len(payload):
            raise TruncatedSnapshotError(f"a part declares {size} bytes past the end", source=source, offset=offset)
        parts.append(payload[offset:offset + size])
        offset += size
    return parts


def payload_record(payload: bytes) -> dict[str, Any]:
    """The manifest's ``payload`` entry for ``payload``."""
    return {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def dumps_manifest(manifest: Mapping[str, Any]) -> str:
    """Pretty JSON for humans (``snapshot inspect --json``)."""
    out = io.StringIO()
    json.dump(manifest, out, indent=2, sort_keys=False)
    return out.getvalue()
