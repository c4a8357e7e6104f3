"""Hooks for torchdata 0.9's pipes that read or hold data: ``readlines`` and ``in_memory_cache``."""


from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator
from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin._skip import advance
from snapshot.hooks.builtin.files import open_stream, reopenable
from snapshot.hooks.builtin.torchdata_pipes.counting import DONE

__all__ = ["InMemoryCacheIterator", "LineReaderIterator"]


class LineReaderIterator(ResumableIterator):
    """``readlines``: the lines of each stream; state: the path and lines already read.

    Restoring reopens the file through the ``FileOpener`` that feeds it and skips the lines
    already read, so it is restored from state only when a ``FileOpener`` is its input.
    """

    always_restorable = False

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._path: str | None = None
        self._lines: Iterator[Any] | None = None
        self._read = 0
        self._reopen = False

    @classmethod
    def can_restore(cls, node: Any, graph: Any) -> str | None:
        return reopenable(node, graph)

    def _lines_of(self, path: str, stream: Any) -> Iterator[Any]:
        helper = self.datapipe._helper
        lines = helper.skip_lines(stream)
        lines = helper.strip_newline(lines)
        lines = helper.decode(lines)
        return iter(helper.return_path(lines, path=path))

    def next(self) -> Any:
        while True:
            if self._lines is None:
                if self._reopen and self._path is not None:
                    opener = self.inputs[0].datapipe
                    stream = open_stream(self._path, opener.mode, opener.encoding)
                    lines = self._lines_of(self._path, stream)
                    self._lines = advance(lines, self._read, what=f"lines of {self._path}")
                    self._reopen = False
                else:
                    path, stream = next(self.inputs[0])
                    self._path, self._lines, self._read = path, self._lines_of(path, stream), 0
            try:
                line = next(self._lines)
            except StopIteration:
                self._lines = None
                continue
            self._read += 1
            return line

    def get_state(self) -> dict[str, Any]:
        if self._lines is None and not self._reopen:
            return {"path": None, "read": 0}
        return {"path": self._path, "read": self._read}

    def set_state(self, state: dict[str, Any]) -> None:
        self._path, self._read = state["path"], int(state["read"])
        self._reopen = self._path is not None


class InMemoryCacheIterator(ResumableIterator):
    """``in_memory_cache``: the first epoch fills the pipe's cache, later epochs read it.

    The cache lives on the pipe across epochs: it is persistent state, saved by value with
    every snapshot (``snapshot inspect`` shows its size).
    """

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._serving = bool(datapipe.cache)
        self._cache: deque[Any] = datapipe.cache if self._serving else deque()
        self._dropped = 0
        self._position = 0
        self._prefix_read = 0
        self._done = False

    @classmethod
    def persistent_state(cls, datapipe: Any) -> Any:
        return {"cache": list(datapipe.cache), "idx": datapipe.idx} if datapipe.cache else None

    @classmethod
    def load_persistent_state(cls, datapipe: Any, state: Any) -> None:
        datapipe.cache, datapipe.idx = deque(state["cache"]), int(state["idx"])

    def next(self) -> Any:
        dp = self.datapipe
        if self._done:
            raise StopIteration
        if not self._serving:
            try:
                data = next(self.inputs[0])
            except StopIteration:
                dp.cache, dp.idx = self._cache, self._dropped
                self._done = True
                raise
            self._cache.append(data)
            if dp.size is not None and sys.getsizeof(self._cache) > dp.size:
                self._cache.popleft()
                self._dropped += 1
            return data
        if dp.idx > 0 and self._prefix_read <= dp.idx:
            # the original re-reads the first ``idx`` samples from its input (and one more)
            try:
                data = next(self.inputs[0])
            except StopIteration:
                self._prefix_read = dp.idx + 1
            else:
                self._prefix_read += 1
                if self._prefix_read <= dp.idx:
                    return data
        if self._position < len(self._cache):
            self._position += 1
            return self._cache[self._position - 1]
        self._done = True
        raise StopIteration

    def buffered(self) -> int:
        return 0 if self._serving else len(self._cache)

    def get_state(self) -> dict[str, Any]:
        return {"serving": self._serving, "cache": None if self._serving else list(self._cache),
                "dropped": self._dropped, "position": self._position, "prefix": self._prefix_read,
                DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._serving = bool(state["serving"])
        self._cache = self.datapipe.cache if self._serving else deque(state["cache"])
        self._dropped = int(state["dropped"])
        self._position, self._prefix_read = int(state["position"]), int(state["prefix"])
        self._done = bool(state[DONE])
