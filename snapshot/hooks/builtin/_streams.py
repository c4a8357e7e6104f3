"""Streams with an address: where a stream came from, as plain data, so it can be reopened.

A file reader's state is where it stands, never what it has read: the stream it is reading is
saved as its *address* (a dict of plain values) plus an offset, and a restore reopens the
address and seeks. The pipes that open or unpack streams (``FileOpener``, the fsspec opener,
``load_from_tar``, ``load_from_zip``, ``decompress``) mark each stream they yield with its
address; a hook that must save a stream (a reader in the middle of a file, ``webdataset``'s
pending group) saves the address instead.

Kinds of address (the ``kind`` key):

- ``file``: a local file (``path``, ``mode``, ``encoding``), with its ``size`` and ``mtime_ns``
  when it was opened;
- ``fsspec``: a file of an fsspec file system (``path``, ``mode``, ``opener``), with the
  ``size`` and version fields fsspec reported when it was opened;
- ``tar-member`` / ``zip-member``: a member of an archive (``archive``: the archive stream's
  address; ``offset`` of the member's header in a tar, ``index`` in a zip's list);
- ``decompress``: the decompressed view (``type``: gzip, lzma, bz2, tar, zip) of ``inner``.

A file that changed since it was opened (another size or modification time) is refused
with a :class:`~snapshot.errors.RestoreError` naming it, never read at a stale offset.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot.errors import RestoreError, SerializationError

__all__ = ["address_key", "address_of", "changed", "check_unchanged", "file_address", "mark", "place_of",
           "register_kind", "reopen", "reopen_many", "seek", "stream_value", "tar_after", "value_of"]

KIND = "kind"
#: Kinds of address that stand on another stream's address (``archive`` or ``inner``).
_DERIVED = ("tar-member", "zip-member", "decompress")
_ATTRIBUTE = "_snapshot_address"
#: fsspec ``info()`` fields that change when a file is rewritten.
_VERSION_FIELDS = ("size", "mtime", "LastModified", "last_modified", "ETag", "etag", "generation", "created")


def mark(stream: Any, address: dict[str, Any]) -> Any:
    """Attach ``address`` to ``stream`` (a ``StreamWrapper``); returns the stream."""
    stream.__dict__[_ATTRIBUTE] = address
    return stream


def address_of(stream: Any) -> dict[str, Any] | None:
    """The address attached to ``stream``, or ``None``."""
    found = getattr(stream, "__dict__", {}).get(_ATTRIBUTE)
    return found if isinstance(found, dict) else None


def file_address(path: str, mode: str, encoding: str | None, fileobj: Any) -> dict[str, Any]:
    """The address of a local file just opened as ``fileobj``."""
    st = os.fstat(fileobj.fileno())
    return {KIND: "file", "path": path, "mode": mode, "encoding": encoding,
            "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def fsspec_version(fs: Any, path: str) -> dict[str, Any]:
    """What fsspec says about ``path`` that changes when the file is rewritten."""
    info = fs.info(path)
    return {k: _plain(info[k]) for k in _VERSION_FIELDS if k in info}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _root(address: dict[str, Any]) -> dict[str, Any]:
    while address[KIND] in _DERIVED:
        address = address.get("archive") or address["inner"]
    return address


def place_of(address: dict[str, Any]) -> dict[str, Any]:
    """Where ``address`` is, for people: the file (or URL) under it, the innermost archive member's name,
    and whether the stream is ``decompress``'s view of it (``inflated``: offsets count decompressed bytes)."""
    member = next((a.get("name") for a in _chain(address) if a[KIND] in ("tar-member", "zip-member")), None)
    inflated = any(a[KIND] == "decompress" for a in _chain(address))
    return {"file": str(_root(address).get("path")), "member": member, "inflated": inflated}


def _chain(address: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``address`` and the addresses it stands on, innermost first."""
    yield address
    while address[KIND] in _DERIVED:
        address = address.get("archive") or address["inner"]
        yield address


def changed(path: str, saved: Any, now: Any) -> RestoreError:
    return RestoreError(
        f"the file {path} changed since the snapshot was saved (then {saved}, now {now}); the "
        "snapshot stands at an offset inside it, which would now read other bytes. Restore with "
        "the data the snapshot was taken on, or start the epoch again.")


def check_unchanged(address: dict[str, Any]) -> None:
    """Raise :class:`RestoreError` naming the file if the file under ``address`` changed."""
    root = _root(address)
    path = root["path"]
    if root[KIND] != "file":
        _CHECKERS[root[KIND]](root)
        return
    try:
        st = os.stat(path)
    except OSError as exc:
        raise RestoreError(f"the file {path} that the snapshot was reading is gone ({exc}); restore "
                           "with the data the snapshot was taken on.") from exc
    saved = {"size": root["size"], "mtime_ns": root["mtime_ns"]}
    now = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if saved != now:
        raise changed(path, saved, now)


def _open_file(address: dict[str, Any]) -> Any:
    mode = address["mode"]
    if mode in ("b", "t"):
        mode = "r" + mode
    stream = StreamWrapper(open(address["path"], mode, encoding=address["encoding"]))  # noqa: SIM115 (a reader closes it)
    st = os.fstat(stream.fileno())
    if (st.st_size, st.st_mtime_ns) != (address["size"], address["mtime_ns"]):
        stream.close()
        raise changed(address["path"], {"size": address["size"], "mtime_ns": address["mtime_ns"]},
                       {"size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return stream


def tar_after(stream: Any, mode: str, offset: int | None) -> tarfile.TarFile:
    """The ``TarFile`` that ``load_from_tar`` reads from ``stream``; with ``offset``, placed so
    that its next member is the one whose header starts there (a compressed archive is
    decompressed up to it)."""
    if isinstance(stream, StreamWrapper) and isinstance(stream.file_obj, tarfile.TarFile):
        tar = stream.file_obj
    else:
        seekable = hasattr(stream, "seekable") and stream.seekable()
        tar = tarfile.open(fileobj=stream, mode=mode if seekable else mode.replace(":", "|"))  # type: ignore[call-overload]  # noqa: SIM115
    if offset:  # (at 0, the fresh TarFile's first member is already the one)
        tar.offset = offset
        tar.firstmember = None  # type: ignore[attr-defined]
    return tar


def _tar_member(tar: tarfile.TarFile, archive: Any, address: dict[str, Any]) -> Any:
    """The member of ``tar`` (read from ``archive``) whose header starts at ``address["offset"]``."""
    offset = address["offset"]
    if offset or getattr(tar, "firstmember", None) is None:  # (else: a fresh TarFile, at its first member)
        tar.offset = offset
        tar.firstmember = None  # type: ignore[attr-defined]
        if offset == 0:  # TarFile.next() reads nothing back at 0: stand there
            tar.fileobj.seek(0)
    info = tar.next()
    extracted = tar.extractfile(info) if info is not None else None
    if extracted is None:
        raise RestoreError(f"the archive {address['archive'].get('path')} has no file member at offset "
                           f"{offset} any more; restore with the data the snapshot was taken on.")
    return mark(StreamWrapper(extracted, archive, name=address.get("name")), address)


def _zip_member(zips: zipfile.ZipFile, archive: Any, address: dict[str, Any]) -> Any:
    """The member of ``zips`` (read from ``archive``) at ``address["index"]`` in its list."""
    return mark(StreamWrapper(zips.open(zips.infolist()[address["index"]]), archive, name=address.get("name")),
                address)


def _open_tar_member(address: dict[str, Any]) -> Any:
    archive = reopen(address["archive"])
    try:
        return _tar_member(tar_after(archive, address["mode"], None), archive, address)
    finally:
        archive.autoclose()


def _open_zip_member(address: dict[str, Any]) -> Any:
    archive = reopen(address["archive"])
    try:
        return _zip_member(zipfile.ZipFile(archive), archive, address)
    finally:
        archive.autoclose()


def _open_decompressed(address: dict[str, Any]) -> Any:
    from torchdata.datapipes.iter import Decompressor

    inner = reopen(address["inner"])
    kind = Decompressor.types(address["type"])
    stream = StreamWrapper(Decompressor._DECOMPRESSORS[kind](inner), inner, name=address.get("name"))
    return mark(stream, address)


_OPENERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "file": _open_file, "tar-member": _open_tar_member, "zip-member": _open_zip_member,
    "decompress": _open_decompressed,
}
#: Per kind of root address other than ``file``: raises if the file changed since it was opened.
_CHECKERS: dict[str, Callable[[dict[str, Any]], None]] = {}


def register_kind(kind: str, opener: Callable[[dict[str, Any]], Any], check: Callable[[dict[str, Any]], None]) -> None:
    """Teach :func:`reopen` and :func:`check_unchanged` a kind of root address (``fsspec``)."""
    _OPENERS[kind] = opener
    _CHECKERS[kind] = check


def reopen(address: dict[str, Any], offset: Any = None) -> Any:
    """A fresh stream for ``address``, at ``offset`` (a ``tell()`` value) if given, marked with
    ``address``; :class:`RestoreError` if the file under it changed."""
    if address[KIND] in _CHECKERS:
        _CHECKERS[address[KIND]](address)
    stream = _OPENERS[address[KIND]](address)
    if address[KIND] not in _DERIVED:
        mark(stream, address)
    if offset:
        seek(stream, offset)
    return stream


#: The decompressed views of the standard library (module, class): their ``seek`` forward
#: decompresses into reads of 8 KiB, each a few Python calls.
_DECOMPRESSED = (("gzip", "GzipFile"), ("bz2", "BZ2File"), ("lzma", "LZMAFile"))
#: How far a decompressed view is read ahead per call when it moves forward (the bytes read are dropped).
_AHEAD = 1 << 20


def seek(stream: Any, offset: Any) -> None:
    """``stream.seek(offset)``; a decompressed view moves forward by reads of 1 MiB instead, which
    inflate the same bytes in fewer calls (a gzip file, to 0.72 MB of its 0.8 MB: 3.2 -> 2.6 ms)."""
    inner = getattr(stream, "file_obj", stream)
    kinds = tuple(getattr(sys.modules[m], c) for m, c in _DECOMPRESSED if m in sys.modules)
    if isinstance(inner, kinds) and type(offset) is int:
        ahead = offset - inner.tell()
        while ahead > 0:
            got = len(inner.read(min(ahead, _AHEAD)))
            if not got:
                break
            ahead -= got
        if ahead == 0:
            return
    stream.seek(offset)


def address_key(address: Any) -> str:
    """``address`` as a string that is equal for equal addresses (to group samples by stream)."""
    return json.dumps(address, sort_keys=True, default=repr)


def _seekable(stream: Any) -> bool:
    inner = getattr(stream, "file_obj", stream)
    if isinstance(inner, tarfile.TarFile):
        inner = inner.fileobj
    seekable = getattr(inner, "seekable", None)
    return bool(seekable()) if seekable is not None else False


def _unbuffered(archive: Any) -> Any:
    """The raw file under a local archive's buffered reader, else ``archive``: the members made
    together (a webdataset sample's) are read after all their headers, and a buffer would read
    their bytes twice (filled past them by the headers, then again from the first member back)."""
    inner = getattr(archive, "file_obj", None)
    return inner.raw if isinstance(inner, io.BufferedReader) and isinstance(inner.raw, io.FileIO) else archive


def _members(addresses: Sequence[dict[str, Any]], indices: list[int]) -> Iterator[tuple[int, Any]]:
    """The members at ``addresses[i]`` for ``i`` in ``indices`` (of one archive), from one opening of
    it, in the order they lie in it (one opening per member if the archive cannot seek)."""
    first = addresses[indices[0]]
    archive = reopen(first["archive"])
    if not _seekable(archive):
        archive.close()
        for index in indices:
            yield index, reopen(addresses[index])
        return
    try:
        if first[KIND] == "tar-member":
            tar = tar_after(_unbuffered(archive), first["mode"], None)
            for index in sorted(indices, key=lambda i: addresses[i]["offset"]):
                yield index, _tar_member(tar, archive, addresses[index])
        else:
            zips = zipfile.ZipFile(archive)
            for index in sorted(indices, key=lambda i: addresses[i]["index"]):
                yield index, _zip_member(zips, archive, addresses[index])
    finally:
        archive.autoclose()  # closed with the last member


def reopen_many(addresses: Sequence[dict[str, Any]]) -> Iterator[tuple[int, Any]]:
    """Fresh streams for ``addresses``, as ``(index in addresses, stream)`` pairs, each index once:
    the members of one archive come from one opening of it, in the order they lie in it, and share
    it (each reads at its own place); any other address is reopened on its own. A stream is made
    when the pair is taken, so its reader can use it before the next is made. The same checks as
    :func:`reopen` (a file that changed is refused)."""
    groups: dict[str, list[int]] = {}
    for index, address in enumerate(addresses):
        shared = address[KIND] in ("tar-member", "zip-member")
        key = address_key([address[KIND], address.get("mode"), address["archive"]]) if shared else f"#{index}"
        groups.setdefault(key, []).append(index)
    for indices in groups.values():
        if addresses[indices[0]][KIND] in ("tar-member", "zip-member"):
            yield from _members(addresses, indices)
        else:
            yield indices[0], reopen(addresses[indices[0]])


# -- streams held as values (webdataset's pending group, items in flight) -----------------------

STREAM = "__stream__"


def stream_value(value: Any, where: str) -> Any:
    """``value`` as plain data for a state: a stream becomes its address and offset."""
    if isinstance(value, StreamWrapper):
        address = address_of(value)
        if address is None:
            raise SerializationError(
                f"{where} holds a stream ({value!r}) that snapshot cannot reopen: it was not opened by "
                "FileOpener, open_files_by_fsspec, load_from_tar, load_from_zip or decompress (or it went "
                "through a pipe that replaced it). Read the stream into bytes before this pipe (a map), "
                "or restore this graph with strategy='fast_forward'.")
        return {STREAM: address, "at": value.tell() if not value.closed else 0}
    return value


def value_of(saved: Any) -> Any:
    """The value :func:`stream_value` saved (a stream is reopened where it stood)."""
    if isinstance(saved, dict) and STREAM in saved:
        check_unchanged(saved[STREAM])
        return reopen(saved[STREAM], saved["at"])
    return saved
