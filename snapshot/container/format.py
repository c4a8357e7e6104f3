"""The snapshot file format, versions 3, 2 and 1: container, manifest, checksums, signing.

A snapshot file (formats 3 and 2) is::

    offset  size  field
    0       13    magic  b"\\x89snapshot\\r\\n\\x1a\\n"  (catches text-mode and truncated copies)
    13      2     container version, little-endian (3)
    15      2     flags (bit 0: signed)
    17      4     manifest length M
    21      8     payload length P
    29      32    sha256 of the manifest bytes
    61      32    sha256 of the payload bytes
    93      P     payload: the state as data (see :mod:`snapshot.container._payload`), then any pickled section
    93+P    M     manifest: UTF-8 JSON object, readable without decoding the payload
    93+P+M  32    HMAC-SHA256 of bytes [0, 93) under the user's key, only when signed

The manifest comes after the payload so that a save can write the payload as it encodes it and
the manifest once it knows the payload's sizes and digest; the header, written last, says where
the manifest is (a save writes a temporary file and renames it, so a reader never sees a header
without its body). Format 2 (still read) differs from 3 only in the data section's encoding (see
:mod:`snapshot.container._payload`). Format 1 (still read) has the manifest before the payload, and its
payload is one pickle. The header carries both digests, so the HMAC over the header authenticates the whole
file. Readers check, in order: magic, container version, sizes against the real file size,
manifest digest, manifest JSON, manifest format version, the signature (with a key), every
field of the manifest against :mod:`snapshot.schema` (a ``ManifestError`` names the field),
then (only when the payload is needed) the payload digest, and only then decode it; or, reading a file
as it goes (:func:`open_payload`), decode the data section as it is read (no code from the file runs
there) and refuse it, before it is used, unless the digest of every byte read matches.

A snapshot can also travel as a plain dict (``DataLoader2.state_dict()``, :mod:`snapshot.container._dict_form`),
or as a directory of one file per rank (:mod:`snapshot.multipart`). Files are written atomically by
:mod:`snapshot.storage._atomic`.

Reading bytes from a path, a URL or a directory is :mod:`snapshot.storage._sources`. This module knows
nothing of graphs, loaders, storage or pickling.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Union

from snapshot import schema
from snapshot.container._header import FLAG_SIGNED, MAGIC, PREFIX, SIGNATURE_SIZE, check_header, header, offsets
from snapshot.errors import (
    CorruptSnapshotError,
    ManifestError,
    SignatureError,
)
from snapshot.schema._quick import Doubt
from snapshot.schema.manifest import native_manifest

__all__ = [
    "FORMAT_VERSION",
    "KEY_ENV",
    "MAGIC",
    "Container",
    "PathOrFile",
    "PayloadReader",
    "dumps_manifest",
    "pack",
    "open_payload",
    "pack_parts",
    "payload_record",
    "read_head",
    "resolve_key",
    "unpack",
    "Writer",
]

PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]

#: Version of the container and of the manifest schema this code writes and reads.
FORMAT_VERSION = schema.FORMAT_VERSION
#: Environment variable holding a signing key (used when no key is passed explicitly).
KEY_ENV = "SNAPSHOT_KEY"
STATE_DICT_MARKER = "snapshot_format"
#: The global manifest's file name in a distributed snapshot's directory.
DIRECTORY_MANIFEST = "manifest.snap"


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


#: The manifest's JSON, compact (made once: ``json.dumps`` with options makes an encoder at every call).
_JSON = json.JSONEncoder(separators=(",", ":"))
#: The same, for a manifest that ``Manifest.to_dict`` just made (a tree: no cycle to look for, 12 % sooner).
_TREE_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def _manifest_bytes(manifest: Mapping[str, Any], *, tree: bool = False) -> bytes:
    return (_TREE_JSON if tree else _JSON).encode(manifest).encode()


def pack_parts(manifest: Mapping[str, Any], payload: bytes, *, key: bytes | str | None = None) -> list[bytes]:
    """:func:`pack`'s pieces, in file order, for writing without joining them (no copy of the payload).

    The container's version is the manifest's ``format`` (a format-1 manifest keeps its layout, a format-2
    one its data encoding)."""
    manifest_bytes = _manifest_bytes(manifest)
    secret = resolve_key(key)
    version: int = manifest[FORMAT] if manifest.get(FORMAT) in (1, 2) else FORMAT_VERSION
    head = header(version, secret, manifest_bytes, len(payload), _sha256(payload))
    parts = [head, manifest_bytes, payload] if version == 1 else [head, payload, manifest_bytes]
    if secret is not None:
        parts.append(hmac.new(secret, head, hashlib.sha256).digest())
    return parts


class Writer:
    """Writes a container of this version into a seekable binary file as its payload is produced: ``write``
    takes it piece by piece (any buffer) and hashes it; :meth:`finish` appends the manifest (which may
    record :attr:`size` and :attr:`sha256`) and the signature, then writes the header at the start."""

    def __init__(self, f: IO[bytes], *, key: bytes | str | None = None, progress: Any = None):
        self._f = f
        self._progress = progress
        self._start = f.tell()
        self._secret = resolve_key(key)
        self._hash = hashlib.sha256()
        self.size = 0
        f.write(bytes(PREFIX))

    def write(self, data: Any) -> None:
        self._f.write(data)
        self._hash.update(data)
        size = memoryview(data).nbytes
        self.size += size
        if self._progress is not None:
            self._progress(size)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def finish(self, manifest: Mapping[str, Any]) -> int:
        """Write the manifest (as ``Manifest.to_dict`` makes it: a tree), the signature and the header; the
        container's size in bytes."""
        manifest_bytes = _manifest_bytes(manifest, tree=True)
        head = header(FORMAT_VERSION, self._secret, manifest_bytes, self.size, self._hash.digest())
        self._f.write(manifest_bytes)
        if self._secret is not None:
            self._f.write(hmac.new(self._secret, head, hashlib.sha256).digest())
        end = self._f.tell()
        self._f.seek(self._start)
        self._f.write(head)
        self._f.seek(end)
        return end - self._start


@dataclass(frozen=True)
class Container:
    """A parsed snapshot file: its manifest as JSON (``manifest``) and validated (``info``)."""

    #: The manifest's JSON object, or its bytes (read natively into ``info``: parsed again if it is asked for).
    json: dict[str, Any] | bytes
    payload: bytes | None
    signed: bool
    size: int
    info: schema.Manifest

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest's JSON object, as the file holds it."""
        if isinstance(self.json, bytes):
            object.__setattr__(self, "json", _parse_json(self.json, "<manifest>"))  # read once: it is valid
        assert isinstance(self.json, dict)
        return self.json


def _parse_json(data: bytes, source: str) -> dict[str, Any]:
    """The manifest's JSON object, whose format version this installation reads."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptSnapshotError(
            f"the manifest is not valid UTF-8 JSON ({exc})", source=source, offset=PREFIX,
        ) from exc
    except RecursionError as exc:
        raise CorruptSnapshotError(
            "the manifest's JSON is nested too deeply to be a snapshot manifest",
            source=source, offset=PREFIX,
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
            "the manifest is nested too deeply to be a snapshot manifest", source=source, offset=PREFIX,
        ) from exc


def _parse_manifest(data: bytes, source: str) -> tuple[dict[str, Any], schema.Manifest]:
    """The manifest's JSON, and the same validated into the schema's types."""
    manifest = _parse_json(data, source)
    return manifest, _validate(manifest, source)


def _open(read_at: Callable[[int, int], bytes], total: int, source: str,
          key: bytes | str | None) -> tuple[Container, int, int, bytes]:
    """The verified manifest of a container of ``total`` bytes (``read_at(offset, size)`` reads them), and
    where its payload starts, its size and its digest: every check but the payload's digest."""
    version, flags, mlen, plen, mdigest, pdigest = check_header(read_at(0, PREFIX), total, source)
    moffset, poffset = offsets(version, mlen, plen)
    manifest_bytes = read_at(moffset, mlen)
    if not hmac.compare_digest(_sha256(manifest_bytes), mdigest):
        raise CorruptSnapshotError(
            "the manifest checksum does not match: the file was altered or damaged on disk",
            source=source, offset=moffset,
        )
    try:  # msgspec's C reader of a well-formed manifest; anything else is read and judged below
        info: schema.Manifest | None = native_manifest(manifest_bytes)
    except Doubt:
        info = None
    manifest = _parse_json(manifest_bytes, source) if info is None else manifest_bytes
    signed = bool(flags & FLAG_SIGNED)
    secret = resolve_key(key)
    if secret is not None:
        if not signed:
            raise SignatureError(
                "a signing key was given but the file is not signed; refusing to unpickle it. "
                "Save it again with key=... or load it without a key if you trust its origin.",
                source=source,
            )
        signature = read_at(PREFIX + mlen + plen, SIGNATURE_SIZE)
        expected = hmac.new(secret, read_at(0, PREFIX), hashlib.sha256).digest()
        if not hmac.compare_digest(signature, expected):
            raise SignatureError(
                "the signature does not match this key: the file was signed with another key "
                "or altered after signing. Do not restore it.",
                source=source, offset=PREFIX + mlen + plen,
            )
    if info is None:
        assert isinstance(manifest, dict)
        info = _validate(manifest, source)  # after the signature: with a key, a forgery is named as one
    _check_version(info.format, version, source)
    return Container(manifest, None, signed, total, info), poffset, plen, pdigest


def _payload_mismatch(poffset: int, plen: int, source: str) -> CorruptSnapshotError:
    # a digest of the whole payload cannot say which byte changed: name the range it covers
    return CorruptSnapshotError(
        f"the payload checksum does not match: some byte in the payload (bytes {poffset:,} to "
        f"{poffset + plen - 1:,} of the file) was altered or damaged on disk; nothing was "
        "decoded. Use an earlier snapshot.",
        source=source,
    )


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
    container, poffset, plen, pdigest = _open(lambda offset, size: data[offset:offset + size], len(data), source, key)
    if not with_payload:
        return container
    payload = data[poffset:poffset + plen]
    if not hmac.compare_digest(_sha256(payload), pdigest):
        raise _payload_mismatch(poffset, plen, source)
    return Container(container.json, payload, container.signed, container.size, container.info)


class PayloadReader:
    """The payload of a container in a binary file, read once from its start and hashed as it is read
    (``read``, ``readinto``: never past its end); :meth:`verify` reads the rest and checks the digest that
    the header records. What was read is not to be used unless :meth:`verify` returns."""

    def __init__(self, f: IO[bytes], offset: int, size: int, digest: bytes, source: str) -> None:
        self._f, self._offset, self.size, self._digest, self._source = f, offset, size, digest, source
        self._hash = hashlib.sha256()
        self.position = 0
        f.seek(offset)

    def read(self, size: int) -> bytes:
        data = self._f.read(max(0, min(size, self.size - self.position)))
        self._hash.update(data)
        self.position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[:self.size - self.position]
        count = self._f.readinto(view) or 0  # type: ignore[attr-defined]
        self._hash.update(view[:count])
        self.position += count
        return count

    def verify(self) -> None:
        """Read what is left of the payload; a :class:`CorruptSnapshotError` unless its digest matches."""
        while self.position < self.size:
            if not self.read(1 << 20):
                break
        if self.position != self.size or not hmac.compare_digest(self._hash.digest(), self._digest):
            raise _payload_mismatch(self._offset, self.size, self._source)


def open_payload(f: IO[bytes], total: int, source: str, *,
                 key: bytes | str | None = None) -> tuple[Container, PayloadReader]:
    """The verified manifest of the container that ``f`` (at its start, ``total`` bytes long) holds, and a
    reader of its payload, whose digest is checked once it is read (:meth:`PayloadReader.verify`)."""
    start = f.tell()

    def read_at(offset: int, size: int) -> bytes:
        f.seek(start + offset)
        return f.read(size)

    container, poffset, plen, pdigest = _open(read_at, total, source, key)
    return container, PayloadReader(f, start + poffset, plen, pdigest, source)


def read_head(f: IO[bytes], total: int, source: str) -> dict[str, Any]:
    """The verified manifest of the container that ``f`` (at its start, ``total`` bytes long)
    holds, reading only the header and the manifest: the payload is never read."""
    start = f.tell()
    head = f.read(PREFIX)
    version, _, mlen, plen, mdigest, _ = check_header(head, total, source)
    moffset, _ = offsets(version, mlen, plen)
    f.seek(start + moffset)
    manifest_bytes = f.read(mlen)
    if not hmac.compare_digest(_sha256(manifest_bytes), mdigest):
        raise CorruptSnapshotError(
            "the manifest checksum does not match: the file was altered or damaged",
            source=source, offset=moffset,
        )
    manifest, _ = _parse_manifest(manifest_bytes, source)
    _check_version(manifest[FORMAT], version, source)
    return manifest


def _check_version(written: int, version: int, source: str) -> None:
    """The container's version and its manifest's ``format`` must agree (a spliced file does not)."""
    if written != version:
        raise CorruptSnapshotError(
            f"the container is format {version} but its manifest says format {written}: the file was "
            "altered or assembled from two files", source=source, offset=len(MAGIC))


def payload_record(payload: bytes) -> dict[str, Any]:
    """The manifest's ``payload`` entry for ``payload``."""
    return {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def dumps_manifest(manifest: Mapping[str, Any]) -> str:
    """Pretty JSON for humans (``snapshot inspect --json``)."""
    out = io.StringIO()
    json.dump(manifest, out, indent=2, sort_keys=False)
    return out.getvalue()
