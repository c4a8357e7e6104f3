"""``Shuffler``: the reservoir buffer and its random generator, saved by value."""

from __future__ import annotations

import random
from typing import Any

import torch

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin._rng import rng_state, set_rng_state

ENABLED = "enabled"
RNG = "rng"
BUFFER = "buffer"
DRAINING = "draining"


def consume_seed(datapipe: Any, rng: random.Random) -> None:
    """Seed ``rng`` with the pipe's seed and clear it, as the pipe's own ``reset()`` does
    (without a seed, one is drawn from torch's global generator)."""
    seed = datapipe._seed
    if seed is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
    rng.seed(seed)
    datapipe._seed = None


class ShufflerIterator(ResumableIterator):
    """Fills a buffer of ``buffer_size``, then swaps each new sample with a random one.

    Consumes the pipe's seed at the start of the epoch, exactly like ``Shuffler.reset()``.
    """

    replay_checked = (RNG, DRAINING)

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._size = datapipe.buffer_size
        self._enabled = datapipe._enabled
        self._buffer: list[Any] = []
        self._draining = False
        self._rng = random.Random()
        if self._enabled:
            consume_seed(datapipe, self._rng)

    def next(self) -> Any:
        if not self._enabled:
            return next(self._src)
        buffer = self._buffer
        randint = self._rng.randint
        if not self._draining:
            size = self._size
            for x in self._src:
                if len(buffer) == size:
                    index = randint(0, size - 1)
                    value = buffer[index]
                    buffer[index] = x
                    return value
                buffer.append(x)
            self._draining = True
        if buffer:
            return buffer.pop(randint(0, len(buffer) - 1))
        raise StopIteration

    def buffered(self) -> int:
        return len(self._buffer)

    def get_state(self) -> dict[str, Any]:
        # a disabled shuffler never draws: its (unseeded) generator is not part of the position
        return {ENABLED: self._enabled, RNG: rng_state(self._rng) if self._enabled else None,
                BUFFER: list(self._buffer), DRAINING: self._draining}

    def set_state(self, state: dict[str, Any]) -> None:
        self._enabled = bool(state[ENABLED])
        if state[RNG] is not None:
            set_rng_state(self._rng, state[RNG])
        self._buffer = list(state[BUFFER])
        self._draining = bool(state[DRAINING])
