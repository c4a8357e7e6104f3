"""``FileLister``, ``FileOpener`` and ``StreamReader`` on real files.

``StreamReader`` saves the path and byte offset of the stream it is reading; restoring it
reopens the file with the mode of the ``FileOpener`` that feeds it, so it can be restored
from state only when a ``FileOpener`` is its direct input (otherwise it is replayed).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data.datapipes.iter.fileopener import FileOpenerIterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper, get_file_pathnames_from_root

from snapshot.hooks._base import Expanding, ResumableIterator, Stateless
from snapshot.hooks.builtin._skip import advance

PATH = "path"
OFFSET = "offset"
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

def reopenable(node: Any, graph: Any) -> str | None:
    """``None`` when ``node`` reads from a ``FileOpener`` directly (its streams can be reopened
    at an offset), else why it cannot be restored from its state."""
    inputs = [graph[p].datapipe for p in node.inputs]
    if len(inputs) == 1 and type(inputs[0]) is FileOpenerIterDataPipe:
        return None
    return "it reads streams that only a FileOpener directly before it can reopen"


def open_stream(pathname: Any, mode: str, encoding: str | None) -> Any:
    """Open ``pathname`` as ``FileOpener`` does (``"b"`` means ``"rb"``)."""
    if mode in ("b", "t"):
        mode = "r" + mode
    if not isinstance(pathname, str):
        raise TypeError(f"Expected string type for pathname, but got {type(pathname)}")
    return StreamWrapper(open(pathname, mode, encoding=encoding))


class FileOpenerIterator(Stateless):
    """``(path, stream)`` for each path; a plain iterable input is restored by position."""

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


class StreamReaderIterator(ResumableIterator):
    """``(path, chunk)`` pieces of each stream; state: the open stream's path and offset."""

    always_restorable = False

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._path: str | None = None
        self._stream: Any = None  # the StreamWrapper being read
        self._reopen_at: int | None = None

    @classmethod
    def can_restore(cls, node: Any, graph: Any) -> str | None:
        return reopenable(node, graph)

    def _reopen(self) -> None:
        opener = self.inputs[0].datapipe
        self._stream = open_stream(self._path, opener.mode, opener.encoding)
        self._stream.seek(self._reopen_at)
        self._reopen_at = None

    def next(self) -> Any:
        while True:
            if self._stream is None:
                if self._reopen_at is not None:
                    self._reopen()
                else:
                    self._path, self._stream = next(self._src)
            stream: Any = self._stream
            data = stream.read(self.datapipe.chunk)
            if data:
                return self._path, data
            stream.close()
            self._stream = None

    def get_state(self) -> dict[str, Any]:
        if self._stream is None:
            return {PATH: None, OFFSET: None}
        return {PATH: self._path, OFFSET: self._stream.tell()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._path = state[PATH]
        self._reopen_at = state[OFFSET]
