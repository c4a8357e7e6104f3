"""Hooks for torchdata 0.9's pipes that reshape the stream: ``flatmap``, ``map_batches``,
``in_batch_shuffle`` and ``prefetch`` (run synchronously: same samples, no thread)."""


from __future__ import annotations

import random
from typing import Any

from torch.utils.data.datapipes.datapipe import DataChunk

from snapshot.hooks._base import PENDING, Expanding, ResumableIterator, Stateless
from snapshot.hooks.builtin._rng import rng_state, set_rng_state
from snapshot.hooks.builtin.shuffle import consume_seed
from snapshot.hooks.builtin.torchdata_pipes.counting import DONE

__all__ = ["BatchMapperIterator", "FlatMapperIterator", "InBatchShufflerIterator", "PrefetcherIterator"]


class FlatMapperIterator(Expanding):
    def next(self) -> Any:
        while not self._pending:
            self._pending.extend(self.datapipe._apply_fn(next(self.inputs[0])))
        return self._pending.popleft()


class BatchMapperIterator(Expanding):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._batch: list[Any] = []
        self._done = False

    def next(self) -> Any:
        size = self.datapipe.batch_size
        while not self._pending:
            if self._done:
                raise StopIteration
            try:
                self._batch.append(next(self.inputs[0]))
            except StopIteration:
                self._done = True
                if self._batch:
                    batch, self._batch = self._batch, []
                    self._pending.extend(self.datapipe._apply_fn(batch))
                continue
            if len(self._batch) == size:
                batch, self._batch = self._batch, []
                self._pending.extend(self.datapipe._apply_fn(batch))
        return self._pending.popleft()

    def buffered(self) -> int:
        return len(self._pending) + len(self._batch)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._pending), "batch": list(self._batch), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self._batch, self._done = list(state["batch"]), bool(state[DONE])


class InBatchShufflerIterator(ResumableIterator):
    """``in_batch_shuffle``: each batch sampled by a seeded generator (saved by value)."""

    replay_checked = ("rng",)

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._enabled = datapipe._enabled
        self._rng = random.Random()
        if self._enabled:
            consume_seed(datapipe, self._rng)

    def next(self) -> Any:
        batch = next(self.inputs[0])
        if not self._enabled:
            return batch
        return DataChunk(self._rng.sample(batch, len(batch)))

    def get_state(self) -> dict[str, Any]:
        return {"enabled": self._enabled, "rng": rng_state(self._rng) if self._enabled else None}

    def set_state(self, state: dict[str, Any]) -> None:
        self._enabled = bool(state["enabled"])
        if state["rng"] is not None:
            set_rng_state(self._rng, state["rng"])


class PrefetcherIterator(Stateless):
    """``prefetch``: the same samples, read synchronously (no thread: nothing in flight)."""

    def next(self) -> Any:
        return next(self.inputs[0])
