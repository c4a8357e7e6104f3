"""Hooks for torchdata 0.9's pipes that join or split streams: ``mux_longest``, ``zip_longest``
and ``unzip``."""


from __future__ import annotations

from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin.combining import ForkerContainer
from snapshot.hooks.builtin.torchdata_pipes.counting import DONE

__all__ = ["MultiplexerLongestIterator", "UnZipperContainer", "ZipperLongestIterator"]


class MultiplexerLongestIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._finished: set[int] = set()
        self._turn = 0

    def next(self) -> Any:
        count = len(self.inputs)
        while len(self._finished) < count:
            i = self._turn
            self._turn = (i + 1) % count
            if i in self._finished:
                continue
            try:
                return next(self.inputs[i])
            except StopIteration:
                self._finished.add(i)
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished), "turn": self._turn}

    def set_state(self, state: dict[str, Any]) -> None:
        self._finished, self._turn = set(state["finished"]), int(state["turn"])


class ZipperLongestIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._finished: set[int] = set()
        self._done = not inputs

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        values = []
        for i, it in enumerate(self.inputs):
            value = self.datapipe.fill_value
            if i not in self._finished:
                try:
                    value = next(it)
                except StopIteration:
                    self._finished.add(i)
                    if len(self._finished) == len(self.inputs):
                        self._done = True
                        raise
            values.append(value)
        return tuple(values)

    def get_state(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._finished, self._done = set(state["finished"]), bool(state[DONE])


class UnZipperContainer(ForkerContainer):
    """``unzip``: a fork whose child ``i`` takes element ``instance_ids[i]`` of each sample."""

    def next_for(self, instance: int) -> Any:
        return super().next_for(instance)[self.datapipe.instance_ids[instance]]
