"""The base of every hook that reads ``(path, stream)`` pairs one stream at a time.

Its state is where it stands in the stream it is reading: the pathname its input gave, the
stream's address (see :mod:`._streams`) and a position of the subclass's own (a byte offset,
a member offset or index), never what it has read. A restore checks that the file did not
change, reopens the address and continues from the position; the input, restored on its own,
is already past that stream.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from snapshot.errors import SerializationError
from snapshot.hooks._base import ResumableIterator
from snapshot.hooks._registry import hook_for
from snapshot.hooks.builtin._streams import address_of, check_unchanged, reopen

__all__ = ["OffsetReading", "StreamReading", "reopenable"]

PATH = "path"
ADDRESS = "address"
AT = "at"

#: How many pipes that pass samples on unchanged :func:`reopenable` looks through.
_MAX_DEPTH = 32


def reopenable(node: Any, graph: Any) -> str | None:
    """``None`` when the streams ``node`` reads carry addresses (they come from an opener, possibly
    unpacked by archive loaders or ``decompress`` and passed through filters), else why not."""
    for _ in range(_MAX_DEPTH):
        if len(node.inputs) != 1:
            break
        node = graph[node.inputs[0]]
        hook = hook_for(node.datapipe)
        kind = getattr(hook.iterator, "streams", None) if hook is not None else None
        if kind == "opens":
            return None
        if kind not in ("unpacks", "passes"):
            break
    return ("it reads streams that snapshot cannot reopen: they do not come from FileOpener, open_files_by_fsspec, "
            "load_from_tar, load_from_zip or decompress (through filters only)")


class StreamReading(ResumableIterator):
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

    @classmethod
    def can_restore(cls, node: Any, graph: Any) -> str | None:
        return reopenable(node, graph)

    @abstractmethod
    def start(self, path: str, stream: Any) -> Iterator[Any]:
        """The samples of ``stream`` (named ``path``) from its beginning."""

    @abstractmethod
    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        """The samples from ``position`` on, in the stream reopened from ``address``."""

    @abstractmethod
    def position(self) -> Any:
        """Where the current stream stands (plain data), between two samples."""

    def finish(self) -> None:
        """Called when the current stream has no more samples."""

    def next(self) -> Any:
        while True:
            if self._samples is None:
                saved = self._saved
                if saved is not None:
                    self._saved = None
                    self._path = saved[PATH]
                    self._samples = self.resume(saved[PATH], saved[ADDRESS], saved[AT])
                else:
                    self._path, self._stream = next(self.inputs[0])
                    self._samples = self.start(self._path, self._stream)
            try:
                return next(self._samples)
            except StopIteration:
                self.finish()
                self._samples = self._stream = None

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
        if address is None:
            raise SerializationError(
                f"the DataPipe at {self.path} ({type(self.datapipe).__name__}) is reading {self._path} from a "
                "stream that snapshot cannot reopen (not opened by FileOpener, open_files_by_fsspec, "
                "load_from_tar, load_from_zip or decompress); restore this graph with strategy='fast_forward'.")
        return {PATH: self._path, ADDRESS: address, AT: self.position()}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get(ADDRESS) is None:
            return
        check_unchanged(state[ADDRESS])
        self._saved = dict(state)


class OffsetReading(StreamReading):
    """A reader whose position in the current stream is its byte offset (``tell()``)."""

    @abstractmethod
    def read(self, path: str, stream: Any) -> Iterator[Any]:
        """The samples of ``stream`` from where it stands."""

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        return self.read(path, stream)

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        return self.read(path, self.reopen(address, position))

    def position(self) -> Any:
        return self._stream.tell()
