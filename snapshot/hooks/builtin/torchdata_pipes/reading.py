"""The hook for torchdata 0.9's ``in_memory_cache`` (the readers are in :mod:`.parsers`)."""


from __future__ import annotations

import sys
from collections import deque
from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin.torchdata_pipes.counting import DONE

__all__ = ["InMemoryCacheIterator"]


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

    @classmethod
    def rewind(cls, datapipe: Any, state: dict[str, Any]) -> None:
        # saved in the epoch that filled the cache (it is on the pipe once that epoch ended): the
        # epoch began with none, so a replay of it fills it again from its input
        if not state["serving"]:
            datapipe.cache, datapipe.idx = deque(), 0

    def set_state(self, state: dict[str, Any]) -> None:
        self._serving = bool(state["serving"])
        self._cache = self.datapipe.cache if self._serving else deque(state["cache"])
        self._dropped = int(state["dropped"])
        self._position, self._prefix_read = int(state["position"]), int(state["prefix"])
        self._done = bool(state[DONE])
