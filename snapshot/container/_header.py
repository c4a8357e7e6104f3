"""The container's fixed header (see :mod:`snapshot.container.format` for the layout): its fields, the
checks of a header against the file's real size, and where the manifest and the payload start."""

from __future__ import annotations

import hashlib
import struct

from snapshot import schema
from snapshot.errors import CorruptSnapshotError, EmptySnapshotError, ForeignFileError, TruncatedSnapshotError

__all__ = ["FLAG_SIGNED", "HEADER", "MAGIC", "MAX_MANIFEST", "PREFIX", "SIGNATURE_SIZE", "check_header",
           "describe_foreign", "header", "offsets"]

MAGIC = b"\x89snapshot\r\n\x1a\n"
#: version, flags, manifest length, payload length, manifest sha256, payload sha256
HEADER = struct.Struct("<HHIQ32s32s")
PREFIX = len(MAGIC) + HEADER.size
SIGNATURE_SIZE = 32
FLAG_SIGNED = 1
#: A manifest is metadata; anything this large is not one of ours.
MAX_MANIFEST = 64 * 1024 * 1024


def describe_foreign(head: bytes) -> str:
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


def check_header(head: bytes, total: int, source: str) -> tuple[int, int, int, int, bytes, bytes]:
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
            f"this is not a snapshot file: it looks like {describe_foreign(head)}. "
            "Pass a file written by save_snapshot() or snapshot.save().",
            source=source, offset=0,
        )
    if total < PREFIX:
        raise TruncatedSnapshotError(
            f"the file ends after {total} bytes, inside the {PREFIX}-byte header; "
            "it was cut short (an interrupted copy?). Use an earlier snapshot.",
            source=source, offset=total,
        )
    version, flags, mlen, plen, mdigest, pdigest = HEADER.unpack_from(head, len(MAGIC))
    schema.check_format(version, source)
    if flags & ~FLAG_SIGNED:
        raise CorruptSnapshotError(
            f"unknown header flags 0x{flags:04x}; the header is damaged",
            source=source, offset=len(MAGIC) + 2,
        )
    if mlen > MAX_MANIFEST:
        raise CorruptSnapshotError(
            f"the header declares a {mlen}-byte manifest, which no snapshot has; "
            "the header is damaged", source=source, offset=len(MAGIC) + 4,
        )
    expected = PREFIX + mlen + plen + (SIGNATURE_SIZE if flags & FLAG_SIGNED else 0)
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
    return version, flags, mlen, plen, mdigest, pdigest


def offsets(version: int, mlen: int, plen: int) -> tuple[int, int]:
    """Where the manifest and the payload start in a container of ``version``."""
    if version == 1:
        return PREFIX, PREFIX + mlen
    return PREFIX + plen, PREFIX


def header(version: int, secret: bytes | None, manifest_bytes: bytes, size: int, digest: bytes) -> bytes:
    flags = FLAG_SIGNED if secret is not None else 0
    return MAGIC + HEADER.pack(version, flags, len(manifest_bytes), size, hashlib.sha256(manifest_bytes).digest(),
                               digest)
