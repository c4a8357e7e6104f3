"""Hooks for torchdata 0.9's pipes whose position is a count or an index: ``header``, ``cycle``,
``repeat``, ``enumerate``, ``add_index`` and ``to_iter_datapipe``."""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapshot.hooks._base import DONE, PENDING, ResumableIterator, Stateless
from snapshot.hooks.builtin.sources import PositionedSource

__all__ = ["COUNT", "DONE", "PENDING", "CyclerIterator", "EnumeratorIterator", "HeaderIterator", "IndexAdderIterator",
           "MapToIterIterator", "RepeaterIterator"]


COUNT = "count"


class HeaderIterator(ResumableIterator):
    """``header(limit)``: like the original, reads one sample past the limit before stopping."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._read = 0
        self._done = False

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            value = next(self.inputs[0])
        except StopIteration:
            self._done = True
            raise
        self._read += 1
        limit = self.datapipe.limit
        if limit is None or self._read <= limit:
            return value
        self._done = True
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {COUNT: self._read, DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._read, self._done = int(state[COUNT]), bool(state[DONE])


class CyclerIterator(ResumableIterator):
    """``cycle(count)``: iterates its input again from the start, ``count`` times. Below a
    ``sharding_filter``, a snapshot taken in a later pass cannot split its logical shards into
    sub-shards before the epoch ends (a sub-shard starts in the first pass): onto more workers the
    rest of that epoch runs on the saved units; onto a number of ranks that does not divide them,
    the restore is refused with a ``LayoutError`` (only a rank's own part says which of its units
    is in a later pass, and the ranks must agree on the plan before they read); from the end of
    the epoch, any layout."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._cycle = 0
        self._fresh = True

    def next(self) -> Any:
        count = self.datapipe.count
        while count is None or self._cycle < count:
            if not self._fresh:
                self.restart_input(0)
                self._fresh = True
            try:
                return next(self.inputs[0])
            except StopIteration:
                self._cycle += 1
                self._fresh = False
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"cycle": self._cycle, "fresh": self._fresh}

    def set_state(self, state: dict[str, Any]) -> None:
        self._cycle, self._fresh = int(state["cycle"]), bool(state["fresh"])


class RepeaterIterator(ResumableIterator):
    """``repeat(times)``: each input sample ``times`` times in a row."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._element: Any = None
        self._left = 0

    def next(self) -> Any:
        if self._left == 0:
            self._element = next(self.inputs[0])
            self._left = self.datapipe.times
        self._left -= 1
        return self._element

    def get_state(self) -> dict[str, Any]:
        return {"element": self._element, "left": self._left}

    def set_state(self, state: dict[str, Any]) -> None:
        self._element, self._left = state["element"], int(state["left"])


class EnumeratorIterator(Stateless):
    """``enumerate(starting_index)``: the index is the count of samples yielded."""

    def next(self) -> Any:
        return self.datapipe.starting_index + self.yielded, next(self.inputs[0])


class IndexAdderIterator(Stateless):
    """``add_index(index_name)`` on dict samples."""

    def next(self) -> Any:
        row = next(self.inputs[0])
        if not isinstance(row, dict):
            raise NotImplementedError("We only support adding index to row or batch in dict type")
        row[self.datapipe.index_name] = self.yielded
        return row


class MapToIterIterator(PositionedSource):
    """``to_iter_datapipe``: ``datapipe[i]`` for each index, restored by position."""

    what = "indices"

    def source(self) -> Any:
        return self.datapipe.indices

    def next(self) -> Any:
        return self.datapipe.datapipe[super().next()]

    def lookup(self) -> Callable[[int], Any] | None:
        indices = super().lookup()
        if indices is None:
            return None
        datapipe = self.datapipe.datapipe
        return lambda position: datapipe[indices(position)]
