"""``Shuffler``: the reservoir buffer and its random generator, saved by value or by position."""

from __future__ import annotations

import functools
import logging
import operator
import random
from typing import Any

import torch

from snapshot.errors import RestoreError
from snapshot.hooks._base import ResumableIterator
from snapshot.hooks._fresh import fresh, later
from snapshot.hooks._positions import BufferState, Reproducer, reproducer_for
from snapshot.hooks.builtin._rng import rng_state, set_rng_state

logger = logging.getLogger(__name__)

ENABLED = "enabled"
RNG = "rng"
BUFFER = "buffer"
DRAINING = "draining"
#: With ``buffer_state="positions"``: per buffered sample, its position in the input's
#: stream (``None`` where only the value is known; that value is then in ``BUFFER``).
POSITIONS = "positions"

_UNDECIDED = object()


def take_seed(datapipe: Any) -> int:
    """The pipe's seed, cleared, as the pipe's own ``reset()`` takes it (without a seed, one is drawn
    from torch's global generator)."""
    seed = datapipe._seed
    if seed is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
    datapipe._seed = None
    return int(seed)


def consume_seed(datapipe: Any, rng: random.Random) -> None:
    """Seed ``rng`` with the pipe's seed and clear it, as the pipe's own ``reset()`` does."""
    rng.seed(take_seed(datapipe))


class ShufflerIterator(ResumableIterator):
    """Fills a buffer of ``buffer_size``, then swaps each new sample with a random one.

    Consumes the pipe's seed at the start of the epoch, exactly like ``Shuffler.reset()``.
    With ``buffer_state="positions"`` and an input that can re-produce its samples (see
    :mod:`snapshot.hooks._positions`), it also keeps each buffered sample's input position,
    and saves those instead of the samples.
    """

    replay_checked = (RNG, DRAINING)

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._size = datapipe.buffer_size
        self._enabled = datapipe._enabled
        self._buffer: list[Any] = []
        self._draining = False
        # Unseeded (no draw from the OS): seeded with the pipe's seed, taken now as reset() takes it, when
        # first used; a restore sets its state instead (seeding it first would cost as much again).
        self._rng = random.Random.__new__(random.Random)
        self._seed: int | None = take_seed(datapipe) if self._enabled else None
        #: Keys (input positions or addresses) parallel to ``_buffer`` (``None``: saved by value).
        self._positions: list[Any] | None = None
        self._reproducer: Any = _UNDECIDED
        #: Whether ``_positions`` may hold a ``None``: samples buffered before it was decided, restored by
        #: value, or from a reader whose samples may have no address (see :meth:`_unkeyed`).
        self._maybe_unkeyed = True

    def _seeded(self) -> random.Random:
        """The generator, seeded with the pipe's seed on first use (unless a restore set its state)."""
        if self._seed is not None:
            self._rng.seed(self._seed)
            self._seed = None
        return self._rng

    def _by_position(self) -> Reproducer | str:
        """Decide once whether this buffer can be saved by position."""
        if self._reproducer is _UNDECIDED:
            self._reproducer = reproducer_for(self._src)
            if isinstance(self._reproducer, Reproducer):
                self._positions = [None] * len(self._buffer)
                self._maybe_unkeyed = bool(self._buffer) or not self._reproducer.always_keyed
            else:
                logger.warning("shuffle buffer at %s keeps its samples by value: %s", self.path, self._reproducer)
        result: Reproducer | str = self._reproducer
        return result

    def next(self) -> Any:
        if not self._enabled:
            return next(self._src)
        if self.buffer_state == BufferState.POSITIONS and self._reproducer is _UNDECIDED:
            self._by_position()
        if self._seed is not None:
            self._seeded()
        if self._positions is not None:
            return self._next_tracked(self._positions)
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

    def _next_tracked(self, positions: list[Any]) -> Any:
        """:meth:`next`, keeping each buffered sample's input position (the same draws)."""
        buffer, src = self._buffer, self._src
        key = self._reproducer.key
        randint = self._rng.randint
        if not self._draining:
            size = self._size
            for x in src:
                if len(buffer) == size:
                    index = randint(0, size - 1)
                    value = buffer[index]
                    buffer[index] = x
                    positions[index] = key()
                    return value
                buffer.append(x)
                positions.append(key())
            self._draining = True
        if buffer:
            index = randint(0, len(buffer) - 1)
            positions.pop(index)
            return buffer.pop(index)
        raise StopIteration

    def buffered(self) -> int:
        return len(self._buffer)

    def buffer_note(self) -> str | None:
        if self.buffer_state != BufferState.POSITIONS:
            return BufferState.VALUES.value
        reproducer = self._by_position() if self._enabled else "shuffling is disabled"
        if isinstance(reproducer, str):
            return f"{BufferState.VALUES.value}: {reproducer}"
        unknown = self._unkeyed(self._positions or [])
        if unknown:
            return f"{BufferState.POSITIONS.value} ({unknown} samples restored by value still buffered)"
        return BufferState.POSITIONS.value

    def get_state(self) -> dict[str, Any]:
        # a disabled shuffler never draws: its (unseeded) generator is not part of the position
        state = {ENABLED: self._enabled, RNG: fresh(rng_state(self._seeded())) if self._enabled else None,
                 DRAINING: self._draining}
        by_position = (self.buffer_state == BufferState.POSITIONS and self._enabled
                       and isinstance(self._by_position(), Reproducer))
        if by_position and self._positions is not None:
            positions = self._positions
            # a new list (as the generator's state) of keys, never changed (only replaced): a background save
            # takes it as it is, and makes the list of None in its thread (see snapshot.hooks._fresh)
            state[POSITIONS] = fresh(list(positions))
            # the samples restored by value and still buffered (None elsewhere); usually none (one pass in C)
            state[BUFFER] = ([x if p is None else None for x, p in zip(self._buffer, positions)]
                             if self._unkeyed(positions) else later(functools.partial(operator.mul, [None],
                                                                                      len(positions))))
        else:
            state[BUFFER] = list(self._buffer)
        return state

    def _unkeyed(self, positions: list[Any]) -> int:
        """How many buffered samples have no key (kept by value: restored so, or a reader's without an
        address); counted only while there may be some."""
        if not self._maybe_unkeyed:
            return 0
        unknown = positions.count(None)
        if not unknown and isinstance(self._reproducer, Reproducer) and self._reproducer.always_keyed:
            self._maybe_unkeyed = False  # each sample that comes in has a key: no None comes back
        return unknown

    def set_state(self, state: dict[str, Any]) -> None:
        self._maybe_unkeyed = True
        self._enabled = bool(state[ENABLED])
        if state[RNG] is not None:
            set_rng_state(self._rng, state[RNG])
            self._seed = None
        self._draining = bool(state[DRAINING])
        positions = state.get(POSITIONS)
        if positions is None:
            self._buffer = list(state[BUFFER])
            return
        reproducer = reproducer_for(self._src)
        if isinstance(reproducer, str):
            raise RestoreError(
                f"the shuffle buffer at {self.path} was saved by position, but {reproducer}. Restore "
                "with the graph the snapshot was taken on.")
        buffer = list(state[BUFFER])  # the samples kept by value; None where a position stands
        keyed = [i for i, p in enumerate(positions) if p is not None]
        for i, item in zip(keyed, reproducer.many([positions[i] for i in keyed])):
            buffer[i] = item
        self._buffer = buffer
        if self.buffer_state == BufferState.POSITIONS:
            self._positions = list(positions)
            self._reproducer = reproducer
            self._maybe_unkeyed = len(keyed) < len(positions) or not reproducer.always_keyed
