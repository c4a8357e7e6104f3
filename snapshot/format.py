"""The snapshot file format, version 1: container, manifest, checksums, signing.

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
manifest digest, manifest JSON, manifest format version, the signature (with a key), every
field of the manifest against :mod:`snapshot.schema` (a ``ManifestError`` names the field),
then (only when the payload is needed) the payload digest, and only then unpickle.

A snapshot can also travel as a plain dict (``DataLoader2.state_dict()``)::

    {"snapshot_format": 1, "manifest": "<the manifest as JSON text>", "payload": b"..."}

whose payload digest is the one recorded in the manifest's ``payload.sha256``. A distributed
snapshot is a directory (``manifest.snap`` plus one file per rank), or the same three keys
with the ranks' files joined in the payload: see :mod:`snapshot.multipart`. Files are
written atomically by :mod:`snapshot._atomic`.

Reading bytes from a path, a URL or a directory is :mod:`snapshot._sources`. This module knows
nothing of graphs, loaders, storage or pickling.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, Union

from snapshot import schema
from snapshot.errors import (
    CorruptSnapshotError,
    EmptySnapshotError,
    ForeignFileError,
    ManifestError,
    SignatureError,
    TruncatedSnapshotError,
)

__all__ = [
    "FORMAT_VERSION",
    "KEY_ENV",
    "MAGIC",
    "Container",
    "PathOrFile",
    "dumps_manifest",
    "from_state_dict",
    "pack",
    "pack_parts",
    "payload_record",
    "read_head",
    "resolve_key",
    "to_state_dict",
    "unpack",
]

PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]

#: Version of the container and of the manifest schema this code writes and reads.
FORMAT_VERSION = schema.FORMAT_VERSION
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
    return b"".join(pack_parts(manifest, payload, key=key))


def pack_parts(manifest: Mapping[str, Any], payload: bytes, *, key: bytes | str | None = None) -> list[bytes]:
    """:func:`pack`'s pieces, in file order, for writing without joining them (no copy of the payload)."""
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
    return parts


@dataclass(frozen=True)
class Container:
    """A parsed snapshot file: its manifest as JSON (``manifest``) and validated (``info``)."""

    manifest: dict[str, Any]
    payload: bytes | None
    signed: bool
    size: int
    info: schema.Manifest


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
    schema.check_format(version, source)
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


def _parse_json(data: bytes, source: str) -> dict[str, Any]:
    """The manifest's JSON object, whose format version this installation reads."""
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
    if not isinstance(manifest, dict):
        raise ManifestError("", "a JSON object", type(manifest).__name__, source=source)
    if FORMAT not in manifest:
        raise ManifestError("format", "the format version, an int (the field is missing)", "nothing",
                            source=source)
    schema.check_format(manifest[FORMAT], source)
    return manifest


def _validate(manifest: dict[str, Any], source: str) -> schema.Manifest:
    """``manifest`` decoded into the schema's types (or a :class:`ManifestError` naming the field)."""
    try:
        return schema.Manifest.from_dict(manifest, source=source)
    except RecursionError as exc:
        raise CorruptSnapshotError(
            "the manifest is nested too deeply to be a snapshot manifest", source=source, offset=_PREFIX,
        ) from exc


def _parse_manifest(data: bytes, source: str) -> tuple[dict[str, Any], schema.Manifest]:
    """The manifest's JSON, and the same validated into the schema's types."""
    manifest = _parse_json(data, source)
    return manifest, _validate(manifest, source)


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
    manifest = _parse_json(manifest_bytes, source)
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
    info = _validate(manifest, source)  # after the signature: with a key, a forgery is named as one
    payload = None
    if with_payload:
        payload = data[_PREFIX + mlen:_PREFIX + mlen + plen]
        if not hmac.compare_digest(_sha256(payload), pdigest):
            # a digest of the whole payload cannot say which byte changed: name the range it covers
            raise CorruptSnapshotError(
                f"the payload checksum does not match: some byte in the payload (bytes {_PREFIX + mlen:,} to "
                f"{_PREFIX + mlen + plen - 1:,} of the file) was altered or damaged on disk; nothing was "
                "unpickled. Use an earlier snapshot.",
                source=source,
            )
    return Container(manifest, payload, signed, len(data), info)


def read_head(f: IO[bytes], total: int, source: str) -> dict[str, Any]:
    """The verified manifest of the container that ``f`` (at its start, ``total`` bytes long)
    holds, reading only the header and the manifest: the payload is never read."""
    head = f.read(_PREFIX)
    _, mlen, _, mdigest, _ = _check_header(head, total, source)
    manifest_bytes = f.read(mlen)
    if not hmac.compare_digest(_sha256(manifest_bytes), mdigest):
        raise CorruptSnapshotError(
            "the manifest checksum does not match: the file was altered or damaged",
            source=source, offset=_PREFIX,
        )
    manifest, _ = _parse_manifest(manifest_bytes, source)
    return manifest


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
    schema.check_format(state[STATE_DICT_MARKER], source)
    manifest_text = state.get("manifest")
    payload = state.get("payload")
    if not isinstance(manifest_text, str) or not isinstance(payload, (bytes, bytearray)):
        raise CorruptSnapshotError(
            "the state dict lacks its 'manifest' JSON text or its 'payload' bytes", source=source,
        )
    try:
        manifest_bytes = manifest_text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CorruptSnapshotError("the state dict's manifest is not valid text", source=source) from exc
    manifest = _parse_json(manifest_bytes, source)
    secret = resolve_key(key)
    signed = isinstance(manifest.get(SIGNATURE), str)
    if secret is not None:
        if not signed:
            raise SignatureError(
                "a signing key was given but the state dict is not signed; refusing to unpickle it. Save "
                "it with $SNAPSHOT_KEY set (or key=...), or load it without a key if you trust its origin.",
                source=source)
        if not hmac.compare_digest(manifest[SIGNATURE].encode(), _state_dict_mac(secret, manifest).encode()):
            raise SignatureError(
                "the signature does not match this key: the state dict was signed with another key or "
                "altered after signing. Do not restore it.", source=source)
    info = _validate(manifest, source)
    recorded = info.payload.sha256 if info.payload is not None else None
    if recorded != hashlib.sha256(payload).hexdigest():
        raise CorruptSnapshotError(
            "the payload checksum does not match the manifest: the state dict was altered; "
            "nothing was unpickled", source=source,
        )
    return Container(manifest, bytes(payload), signed, len(payload), info)


def payload_record(payload: bytes) -> dict[str, Any]:
    """The manifest's ``payload`` entry for ``payload``."""
    return {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def dumps_manifest(manifest: Mapping[str, Any]) -> str:
    """Pretty JSON for humans (``snapshot inspect --json``)."""
    out = io.StringIO()
    json.dump(manifest, out, indent=2, sort_keys=False)
    return out.getvalue()
