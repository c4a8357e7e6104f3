"""The base of every hook that reads ``(path, stream)`` pairs one stream at a time.

Its state is where it stands in the stream it is reading: the pathname its input gave, the
stream's address (see :mod:`._streams`) and a position of the subclass's own (a byte offset,
a member offset or index), never what it has read. A restore checks that the file did not
change, reopens the address and continues from the position; the input, restored on its own,
is already past that stream.

A stream that no opener made (an ``io.StringIO`` in an ``IterableWrapper``, a stream of your own
opener or an HTTP response) has no address. Then the state is the number of samples read from
it, and a restore replays the reader's input up to that stream (one item per stream before it:
see :meth:`~snapshot.hooks.ResumableIterator.replays_input`), which the reader reads again up to
where it stood. Nothing of the stream is saved.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from snapshot.errors import RestoreError
from snapshot.hooks._base import ResumableIterator
from snapshot.hooks._registry import hook_for
from snapshot.hooks.builtin._streams import (
    address_key,
    address_of,
    check_unchanged,
    place_of,
    reopen,
    reopen_many,
    seek,
)

__all__ = ["KeepsAddresses", "OffsetReading", "StreamReading", "inflated_by", "reopenable"]

PATH = "path"
ADDRESS = "address"
AT = "at"
#: Samples read from a stream that has no address (read again from its input's replay).
READ = "read"

#: How many pipes that pass samples on unchanged :func:`reopenable` looks through.
_MAX_DEPTH = 32


def _stream_chain(node: Any, graph: Any) -> Iterator[tuple[Any, Any]]:
    """The pipes the streams ``node`` reads come through, nearest first, with their iterator hooks
    (``None`` without one), up to the one that opened them or the first that does not pass them on."""
    for _ in range(_MAX_DEPTH):
        if len(node.inputs) != 1:
            return
        node = graph[node.inputs[0]]
        hook = hook_for(node.datapipe)
        iterator = hook.iterator if hook is not None else None
        yield node, iterator
        if getattr(iterator, "streams", None) not in ("unpacks", "passes"):
            return


def reopenable(node: Any, graph: Any) -> str | None:
    """``None`` when the streams ``node`` reads carry addresses (they come from an opener, possibly
    unpacked by archive loaders or ``decompress`` and passed through filters), else why not."""
    if any(getattr(it, "streams", None) == "opens" for _, it in _stream_chain(node, graph)):
        return None
    return ("reads streams that snapshot cannot reopen: they do not come from FileOpener, open_files_by_fsspec, "
            "load_from_tar, load_from_zip or decompress (through filters only)")


def inflated_by(node: Any, graph: Any) -> list[str]:
    """The paths of the pipes that inflate the streams ``node`` reads (``decompress``, ...)."""
    return [n.path for n, it in _stream_chain(node, graph) if getattr(it, "inflates", False)]


class KeepsAddresses:
    """Mixin for readers whose samples have addresses: once :meth:`addressing` is called, the
    reader sets ``_last`` to the address of each sample it yields; :meth:`fetch` reads one again."""

    _tracking = False
    _last: Any = None

    def addressing(self) -> Callable[[Any], Any] | None:
        self._tracking = True
        return self.fetch

    def last_address(self) -> Any:
        return self._last

    def fetch(self, address: Any) -> Any:
        """The sample at ``address`` (what :meth:`last_address` gave), read again."""
        raise NotImplementedError

    def fetch_many(self, addresses: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """The samples at ``addresses``, as ``(index in addresses, sample)`` pairs, each index once, in
        the order they are read (a reader of files overrides this to read each file once, forward);
        by default one :meth:`fetch` each, in order."""
        for index, address in enumerate(addresses):
            yield index, self.fetch(address)


class StreamReading(KeepsAddresses, ResumableIterator):
    """Reads each ``(path, stream)`` of its input through :meth:`start` and :meth:`resume`.

    Subclasses implement :meth:`start` (the samples of a stream from its beginning),
    :meth:`resume` (from a saved position) and :meth:`position` (where the current stream
    stands, between two samples).
    """

    always_restorable = False

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._path: str | None = None
        self._stream: Any = None
        self._samples: Iterator[Any] | None = None
        self._saved: dict[str, Any] | None = None
        self._read = 0  # samples read from the current stream
        self._replayed: Any = None  # the current (path, stream) again, from the input's replay

    def fetch(self, address: Any) -> Any:
        stream = reopen(address[ADDRESS], address[AT])
        try:
            return self._sample_at(stream, address)
        finally:
            stream.close()

    def fetch_many(self, addresses: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Each stream reopened once (the members of one archive from one opening of it), its samples
        read in offset order: a compressed stream is inflated once, up to its last sample; a sample
        whose offset is behind the stream's position (the same address twice) is read again from
        there."""
        groups: dict[str, list[int]] = {}
        for index, address in enumerate(addresses):
            groups.setdefault(address_key(address[ADDRESS]), []).append(index)
        indices = list(groups.values())
        for group, stream in reopen_many([addresses[g[0]][ADDRESS] for g in indices]):
            try:
                for index in sorted(indices[group], key=lambda i: addresses[i][AT]):
                    address = addresses[index]
                    if stream.tell() != address[AT]:
                        seek(stream, address[AT])
                    yield index, self._sample_at(stream, address)
            finally:
                stream.close()

    def _sample_at(self, stream: Any, address: dict[str, Any]) -> Any:
        for sample in self.parse(address[PATH], stream, address):
            return sample
        raise RestoreError(
            f"the DataPipe at {self.path} ({type(self.datapipe).__name__}) finds no sample at offset "
            f"{address[AT]} of {address[PATH]}, where the snapshot saw one; restore with the data the "
            "snapshot was taken on.")

    def parse(self, path: str, stream: Any, address: dict[str, Any]) -> Iterator[Any]:
        """The samples of ``stream`` from where it stands, for :meth:`fetch` (no effect on this
        iterator's own position; ``stream`` is left open)."""
        raise NotImplementedError

    def address_extra(self) -> dict[str, Any]:
        """What a sample's address needs beyond the stream and offset (a CSV file's header)."""
        return {}

    def addressed(self, stream: Any, samples: Iterator[Any]) -> Iterator[Any]:
        """``samples``, noting where each starts in ``stream`` while addresses are kept (the readers
        read nothing ahead, so the offset before a sample is where it starts)."""
        while True:
            where = stream.tell() if self._tracking else None
            try:
                sample = next(samples)
            except StopIteration:
                return
            if where is not None:
                address = address_of(stream)
                self._last = None if address is None else {PATH: self._path, ADDRESS: address, AT: where,
                                                           **self.address_extra()}
            yield sample


    @classmethod
    def rereads(cls, node: Any, graph: Any) -> str | None:
        if reopenable(node, graph) is not None:
            return "reads its current stream again, from its input's replay, up to where it stood"
        inflating = inflated_by(node, graph)
        if not inflating:
            return None
        return (f"re-inflates its current file from the start up to the saved offset (a compressed stream, "
                f"inflated by {', '.join(inflating)}, cannot seek); never the files before it")

    @classmethod
    def where(cls, state: Any) -> dict[str, Any] | None:
        """Where a saved ``state`` stands, as the manifest shows it (``schema.ReaderPosition``): the file,
        the member and the offset in the stream being read; ``None`` between two streams."""
        if not isinstance(state, dict) or not isinstance(state.get(ADDRESS), dict):
            return None
        at = state.get(AT)
        offset = at.get("offset") if isinstance(at, dict) else at
        return {**place_of(state[ADDRESS]), cls.position_name: offset if isinstance(offset, int) else None}

    #: What :meth:`position` counts, as :meth:`where` names it: ``offset`` (bytes) or ``entry`` (an index).
    position_name = "offset"

    @classmethod
    def replays_input(cls, node: Any, graph: Any) -> str | None:
        why = reopenable(node, graph)
        return None if why is None else f"{why}: its input is replayed up to the stream it was reading"

    def replayed_input(self, item: Any) -> None:
        self._replayed = item

    @abstractmethod
    def start(self, path: str, stream: Any) -> Iterator[Any]:
        """The samples of ``stream`` (named ``path``) from its beginning."""

    @abstractmethod
    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        """The samples from ``position`` on, in the stream reopened from ``address``."""

    @abstractmethod
    def position(self) -> Any:
        """Where the current stream stands (plain data), between two samples."""

    def next(self) -> Any:
        while True:
            if self._samples is None:
                saved = self._saved
                if saved is not None:
                    self._saved = None
                    self._path = saved[PATH]
                    self._samples = self._resumed(saved)
                else:
                    self._path, self._stream = next(self.inputs[0])
                    self._samples, self._read = self.start(self._path, self._stream), 0
            try:
                sample = next(self._samples)
            except StopIteration:
                self._samples = self._stream = None
                continue
            self._read += 1
            return sample

    def _resumed(self, saved: dict[str, Any]) -> Iterator[Any]:
        """The samples after the saved position: from the reopened address, or from the stream its input's
        replay gave again (read again up to where it stood)."""
        if saved[ADDRESS] is not None:
            return self.resume(saved[PATH], saved[ADDRESS], saved[AT])
        if self._replayed is None:
            raise RestoreError(
                f"the DataPipe at {self.path} ({type(self.datapipe).__name__}) was reading {saved[PATH]}, a stream "
                "that snapshot cannot reopen, and its input was not replayed up to it; restore this graph with "
                "strategy='auto' or 'fast_forward'.")
        path, self._stream = self._replayed
        self._replayed = None
        samples, self._read = self.start(path, self._stream), int(saved[READ])
        for _ in range(self._read):
            next(samples)
        return samples

    def reopen(self, address: dict[str, Any], offset: Any = None) -> Any:
        """The stream at ``address`` (at ``offset``), now the current one."""
        self._stream = reopen(address, offset)
        return self._stream

    def get_state(self) -> dict[str, Any]:
        if self._saved is not None:
            return dict(self._saved)
        if self._samples is None:
            return {PATH: None, ADDRESS: None, AT: None}
        address = address_of(self._stream)
        if address is None:  # read again from its input's replay
            return {PATH: self._path, ADDRESS: None, AT: None, READ: self._read}
        return {PATH: self._path, ADDRESS: address, AT: self.position()}

    def set_state(self, state: dict[str, Any]) -> None:
        if ADDRESS not in state and state.get(PATH) is not None:  # saved before streams had addresses
            raise RestoreError(
                f"the DataPipe at {self.path} ({type(self.datapipe).__name__}) was saved by an older version of "
                f"snapshot, as a path and a count, in the middle of {state[PATH]}; restore this snapshot with "
                "strategy='fast_forward'.")
        if state.get(ADDRESS) is None:
            if state.get(READ) is not None:  # a stream with no address: its input's replay gives it again
                self._saved = dict(state)
            return
        check_unchanged(state[ADDRESS])
        self._saved = dict(state)


class OffsetReading(StreamReading):
    """A reader whose position in the current stream is its byte offset (``tell()``)."""

    @abstractmethod
    def read(self, path: str, stream: Any) -> Iterator[Any]:
        """The samples of ``stream`` from where it stands."""

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        return self.addressed(stream, self.read(path, stream))

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        stream = self.reopen(address, position)
        return self.addressed(stream, self.read(path, stream))

    def parse(self, path: str, stream: Any, address: dict[str, Any]) -> Iterator[Any]:
        return self.read(path, stream)

    def position(self) -> Any:
        return self._stream.tell()
