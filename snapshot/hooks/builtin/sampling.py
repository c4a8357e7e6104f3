"""torchdata 0.9's ``SampleMultiplexer``: inputs drawn by weight from the pipe's own generator.

The pipe builds its ``random.Random`` once, in its constructor (from ``seed=``, or from the
operating system without one), and never reseeds it: every epoch continues the previous
epoch's draws. That generator is therefore part of the position, kept by value:

- in the iterator's state, as it is at the cut and as it was when the epoch began (a replay
  from the start of the epoch rewinds to the latter);
- as persistent state of the pipe, so a snapshot taken between epochs, or in a logical shard
  that has finished its epoch, starts the next epoch from the right draws.

So a restore continues the saved run's stream exactly, whether the pipe was seeded or not.
Started again within an epoch (under a ``cycle``), the pipe goes on drawing from the same
generator, as torchdata's does; a replay from the start of the epoch rewinds to the epoch's
first state. A replay of the pipe alone from the start of a later pass rewinds to that pass's first
state, which the state keeps too (``at_pass_start``).
A run of an unseeded pipe is not reproducible from the loader's seed, as in torchdata 0.9:
pass ``seed=`` for that.
"""

from __future__ import annotations

from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin._rng import AT_PASS_START, rng_state, set_rng_state

RNG = "rng"
START = "rng_at_epoch_start"
ACTIVE = "active"
WEIGHTS = "weights"


class SampleMultiplexerIterator(ResumableIterator):
    """Draws an input for each sample, with the weights renormalized as inputs run out."""

    replay_checked = (RNG, ACTIVE)

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        by_pipe = {id(cell.datapipe): index for index, cell in enumerate(inputs)}
        # input indices in the pipe's own order, with the weights it normalized them to
        self._active = [by_pipe[id(pipe)] for pipe, _ in datapipe.pipes_and_weights]
        self._weights = [float(weight) for _, weight in datapipe.pipes_and_weights]
        self._start = rng_state(datapipe.random)
        self._pass_start = self._start

    def follow(self, previous: SampleMultiplexerIterator) -> None:
        """Started again within the epoch (by a ``cycle``): the generator continues, and the
        state at the start of the epoch is still the one a replay rewinds to."""
        self._start = previous._start

    def next(self) -> Any:
        rng = self.datapipe.random
        while len(self._active) > 1:
            r = rng.random()
            s = 0.0
            for position, (index, weight) in enumerate(zip(self._active, self._weights)):
                s += weight
                if r < s:
                    try:
                        return next(self.inputs[index])
                    except StopIteration:
                        total = 1 - weight
                        del self._active[position], self._weights[position]
                        self._weights = [w / total for w in self._weights]
                    break
        return next(self.inputs[self._active[0]])

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {RNG: rng_state(self.datapipe.random), START: self._start,
                                 ACTIVE: list(self._active), WEIGHTS: list(self._weights)}
        if self._pass_start is not self._start:
            state[AT_PASS_START] = {START: self._pass_start}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        set_rng_state(self.datapipe.random, state[RNG])
        self._start = state[START]
        self._pass_start = state.get(AT_PASS_START, {}).get(START, self._start)
        self._active = [int(i) for i in state[ACTIVE]]
        self._weights = [float(w) for w in state[WEIGHTS]]

    @classmethod
    def rewind(cls, datapipe: Any, state: dict[str, Any]) -> None:
        set_rng_state(datapipe.random, state[START])

    @classmethod
    def persistent_state(cls, datapipe: Any) -> Any:
        return {RNG: rng_state(datapipe.random)}

    @classmethod
    def load_persistent_state(cls, datapipe: Any, state: Any) -> None:
        set_rng_state(datapipe.random, state[RNG])
