"""Hooks for torchdata 0.9's archive pipes: ``load_from_tar``, ``load_from_zip``, ``decompress``
and ``webdataset``.

Each member stream they yield is marked with its address (the archive's address and the
member's header offset in a tar, its index in a zip), so that a pipe holding it can save it
as such. The archive loaders save the address of the archive they are reading and where the
next member starts; a restore reopens the archive and seeks there (a compressed tar is
re-inflated up to it, never the archives before it). ``decompress`` has no position of its
own. ``webdataset`` saves the sample it is grouping, its member streams by address.
"""

from __future__ import annotations

import os
import tarfile
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper
from torchdata.datapipes.iter.util.webdataset import pathsplit

from snapshot.hooks._base import ResumableIterator, Stateless
from snapshot.hooks.builtin._reader import KeepsAddresses, StreamReading
from snapshot.hooks.builtin._streams import (
    KIND,
    address_of,
    mark,
    reopen,
    reopen_many,
    stream_value,
    tar_after,
    value_of,
)

__all__ = ["DecompressorIterator", "TarArchiveLoaderIterator", "WebDatasetIterator", "ZipArchiveLoaderIterator"]


def _member_address(archive: Any, kind: str, **where: Any) -> dict[str, Any] | None:
    outer = address_of(archive)
    return None if outer is None else {KIND: kind, "archive": outer, **where}


def _marked(stream: Any, address: dict[str, Any] | None) -> Any:
    return stream if address is None else mark(stream, address)


@contextmanager
def _extracting(kind: str, path: str, stream: Any) -> Iterator[None]:
    """As the archive loaders do around one archive: warn on an error, close the archive after."""
    try:
        yield
    except Exception as e:
        warnings.warn(f"Unable to extract files from corrupted {kind} stream {path} due to: {e}, abort!",
                      stacklevel=3)
        raise
    finally:
        if isinstance(stream, StreamWrapper):
            stream.autoclose()


class _MemberLoading(StreamReading):
    """An archive loader: a sample's address is its member's (a member stream is reopened)."""

    streams = "unpacks"

    def fetch(self, address: Any) -> Any:
        inner, member = address
        return inner, reopen(member)

    def fetch_many(self, addresses: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for index, member in reopen_many([member for _, member in addresses]):
            yield index, (addresses[index][0], member)


class TarArchiveLoaderIterator(_MemberLoading):
    """``load_from_tar``: the file members of each archive; state: the archive's address and the
    offset of the next member's header."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._tar: tarfile.TarFile | None = None

    @classmethod
    def rereads(cls, node: Any, graph: Any) -> str | None:
        mode = node.datapipe.mode
        compression = mode.replace("|", ":").partition(":")[2]
        if compression == "":
            return super().rereads(node, graph)
        when = "if it is compressed" if compression == "*" else f"({compression})"
        return super().rereads(node, graph) or (
            f"re-inflates its current archive up to the next member {when}; never the archives before it")

    def _members(self, path: str, stream: Any, offset: int | None) -> Iterator[Any]:
        with _extracting("tarfile", path, stream):
            tar = self._tar = tar_after(stream, self.datapipe.mode, offset)
            while (info := tar.next()) is not None:
                if not info.isfile():
                    continue
                extracted = tar.extractfile(info)
                if extracted is None:
                    warnings.warn(f"failed to extract file {info.name} from source tarfile {path}", stacklevel=2)
                    raise tarfile.ExtractError
                inner = os.path.normpath(os.path.join(path, info.name))
                member = StreamWrapper(extracted, stream, name=inner)
                where = _member_address(stream, "tar-member", offset=info.offset, mode=self.datapipe.mode, name=inner)
                self._last = [inner, where] if where is not None else None
                yield inner, _marked(member, where)

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        return self._members(path, stream, None)

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        return self._members(path, self.reopen(address), int(position))

    def position(self) -> Any:
        assert self._tar is not None
        return self._tar.offset


class ZipArchiveLoaderIterator(_MemberLoading):
    """``load_from_zip``: the file members of each archive; state: the archive's address and the
    index of the next entry in its central directory."""

    position_name = "entry"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._index = 0

    def _members(self, path: str, stream: Any, first: int) -> Iterator[Any]:
        with _extracting("zipfile", path, stream):
            zips = zipfile.ZipFile(stream)
            entries = zips.infolist()
            for index in range(first, len(entries)):
                info = entries[index]
                self._index = index + 1
                if info.is_dir():
                    continue
                inner = os.path.normpath(os.path.join(path, info.filename))
                member = StreamWrapper(zips.open(info), stream, name=inner)
                where = _member_address(stream, "zip-member", index=index, name=inner)
                self._last = [inner, where] if where is not None else None
                yield inner, _marked(member, where)

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        return self._members(path, stream, 0)

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        return self._members(path, self.reopen(address), int(position))

    def position(self) -> Any:
        return self._index


class DecompressorIterator(Stateless):
    """``decompress``: ``(path, decompressed stream)`` per input; no position of its own (a reader
    after it saves the decompressed stream's address and offset)."""

    streams = "unpacks"
    inflates = True

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._previous: Any = None

    def next(self) -> Any:
        if isinstance(self._previous, StreamWrapper):
            self._previous.autoclose()  # as the original does when it moves on
        self._previous = None
        path, file = next(self.inputs[0])
        self._previous = file
        kind = self.datapipe._detect_compression_type(path)
        stream = StreamWrapper(self.datapipe._DECOMPRESSORS[kind](file), file, name=path)
        inner = address_of(file)
        address = None if inner is None else {KIND: "decompress", "type": kind.value, "inner": inner, "name": path}
        return path, _marked(stream, address)

    def close(self) -> None:
        self._previous = None


KEY = "key"
ITEMS = "items"


class WebDatasetIterator(KeepsAddresses, ResumableIterator):
    """``webdataset``: consecutive members with one prefix grouped into a dict; state: the prefix and
    the members of the sample being grouped (member streams by address)."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._sample: dict[str, Any] = {}
        self._current = ""
        self._ended = False

    def fetch(self, address: Any) -> Any:
        sample = {"__key__": address[KEY]}
        for suffix, member in address[ITEMS]:
            sample[suffix] = reopen(member)
        return sample

    def fetch_many(self, addresses: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """All the members reopened together (one opening per archive), each sample given once its
        last member is there."""
        samples = [{"__key__": a[KEY], **dict.fromkeys(suffix for suffix, _ in a[ITEMS])} for a in addresses]
        missing = [len(a[ITEMS]) for a in addresses]
        yield from ((index, samples[index]) for index, count in enumerate(missing) if count == 0)
        members = [(index, suffix, member) for index, a in enumerate(addresses) for suffix, member in a[ITEMS]]
        for flat, stream in reopen_many([member for _, _, member in members]):
            index, suffix, _ = members[flat]
            samples[index][suffix] = stream
            missing[index] -= 1
            if missing[index] == 0:
                yield index, samples[index]

    def _yield(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self._tracking:  # the sample's address: its members' (None if one is not a reopenable stream)
            members = [[k, address_of(v)] for k, v in sample.items() if k != "__key__"]
            complete = all(a is not None for _, a in members)
            self._last = {KEY: sample["__key__"], ITEMS: members} if complete else None
        return sample

    def next(self) -> Any:
        if self._ended:
            raise StopIteration
        for path, data in self.inputs[0]:
            assert isinstance(path, str), path
            prefix, suffix = pathsplit(path)
            if suffix == "":
                continue
            if prefix != self._current:
                done, had = self._sample, self._current != ""
                self._sample, self._current = {"__key__": prefix}, prefix
                self._sample[suffix] = data
                if had:
                    return self._yield(done)
                continue
            self._sample[suffix] = data
        self._ended = True
        if self._sample != {}:
            done, self._sample = self._sample, {}
            return self._yield(done)
        raise StopIteration

    def buffered(self) -> int:
        return max(len(self._sample) - 1, 0)

    def get_state(self) -> dict[str, Any]:
        where = f"the DataPipe at {self.path} (WebDataset)"
        return {KEY: self._current, "ended": self._ended,
                ITEMS: [[k, stream_value(v, where)] for k, v in self._sample.items()]}

    def set_state(self, state: dict[str, Any]) -> None:
        self._current, self._ended = state[KEY], bool(state["ended"])
        self._sample = {k: value_of(v) for k, v in state[ITEMS]}
