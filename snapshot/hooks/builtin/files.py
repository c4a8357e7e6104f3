"""``FileLister``, ``FileOpener`` and ``StreamReader`` on real files.

``FileOpener`` marks each stream with its address (path, mode, size and modification time);
``StreamReader`` saves the address and byte offset of the stream it is reading, and a restore
reopens it there (see :mod:`._reader`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper, get_file_pathnames_from_root

from snapshot.hooks._base import Expanding, Stateless
from snapshot.hooks.builtin._reader import OffsetReading, reopenable
from snapshot.hooks.builtin._skip import advance
from snapshot.hooks.builtin._streams import file_address, mark

__all__ = ["FileListerIterator", "FileOpenerIterator", "StreamReaderIterator", "open_stream", "reopenable"]

CONSUMED = "consumed"


class FileListerIterator(Expanding):
    """Lists one root at a time; the names not yet yielded are the state."""


    def next(self) -> Any:
        dp = self.datapipe
        while not self._pending:
            root = next(self.inputs[0])
            self._pending.extend(get_file_pathnames_from_root(
                root, dp.masks, dp.recursive, dp.abspath, dp.non_deterministic))
        return self._pending.popleft()

def open_stream(pathname: Any, mode: str, encoding: str | None) -> Any:
    """Open ``pathname`` as ``FileOpener`` does (``"b"`` means ``"rb"``), marked with its address."""
    if mode in ("b", "t"):
        mode = "r" + mode
    if not isinstance(pathname, str):
        raise TypeError(f"Expected string type for pathname, but got {type(pathname)}")
    stream = StreamWrapper(open(pathname, mode, encoding=encoding))  # noqa: SIM115 (its reader closes it)
    return mark(stream, file_address(pathname, mode, encoding, stream))


class FileOpenerIterator(Stateless):
    """``(path, stream)`` for each path; a plain iterable input is restored by position."""

    streams = "opens"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src: Iterator[Any] | None = inputs[0] if inputs else None
        self._consumed = 0

    def next(self) -> Any:
        if self._src is None:
            names = self.datapipe.datapipe
            if isinstance(names, str) or not hasattr(names, "__iter__"):
                names = [names]
            self._src = advance(iter(names), self._consumed, source=names, what="FileOpener's paths")
        pathname = next(self._src)
        self._consumed += 1
        return pathname, open_stream(pathname, self.datapipe.mode, self.datapipe.encoding)

    def get_state(self) -> dict[str, Any]:
        return {CONSUMED: self._consumed} if not self.inputs else {}

    def set_state(self, state: dict[str, Any]) -> None:
        self._consumed = int(state.get(CONSUMED, 0))


class StreamReaderIterator(OffsetReading):
    """``(path, chunk)`` pieces of each stream; state: the open stream's address and offset."""

    def read(self, path: str, stream: Any) -> Iterator[Any]:
        chunk = self.datapipe.chunk
        while True:
            data = stream.read(chunk)
            if not data:
                stream.close()
                return
            yield path, data
