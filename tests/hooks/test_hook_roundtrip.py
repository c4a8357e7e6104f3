"""``snapshot.testing.assert_hook_roundtrip`` on users' hooks of each kind: it passes a good
hook and names the step where a bad one diverges."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

from snapshot.hooks import ResumableIterator, register_state_hook
from snapshot.testing import assert_hook_roundtrip


class Counter(IterDataPipe):
    """Keeps its position in an attribute (gets an object hook)."""

    def __init__(self, n: int):
        self.n, self.i = n, 0

    def reset(self) -> None:
        self.i = 0

    def __iter__(self) -> Any:
        while self.i < self.n:
            self.i += 1
            yield self.i


class StatefulCounter(Counter):
    """The torchdata ``Stateful`` protocol."""

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class Sums(IterDataPipe):
    """Running sums of its input: a generator (gets an iterator hook)."""

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe

    def __iter__(self) -> Any:
        total = 0
        for x in self.datapipe:
            total += x
            yield total


class SumsIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self.total = 0

    def next(self) -> Any:
        self.total += next(self.inputs[0])
        return self.total

    def get_state(self) -> dict[str, Any]:
        return {"total": self.total}

    def set_state(self, state: dict[str, Any]) -> None:
        self.total = state["total"]


class ForgetfulSums(Sums):
    pass


class ForgetfulSumsIterator(SumsIterator):
    """Loses its running total on restore: a wrong stream that the harness must catch."""

    def set_state(self, state: dict[str, Any]) -> None:
        self.total = 0


class Unhooked(Sums):
    def __iter__(self) -> Any:  # overrides the iteration: does not inherit Sums' hook
        yield from super().__iter__()


register_state_hook(Counter, state_dict=lambda dp: {"i": dp.i},
                    load_state_dict=lambda dp, state: setattr(dp, "i", state["i"]))
register_state_hook(Sums, SumsIterator)
register_state_hook(ForgetfulSums, ForgetfulSumsIterator)


def shuffled(n: int = 13) -> Any:
    return IterableWrapper(range(n)).shuffle(buffer_size=4)


@pytest.mark.parametrize("factory", [lambda: Counter(9), lambda: StatefulCounter(9), lambda: Sums(shuffled())],
                         ids=["object_hook", "stateful", "iterator_hook"])
def test_a_good_hook_passes_at_every_step(factory: Any) -> None:
    report = assert_hook_roundtrip(factory, epochs=2)
    assert report.epoch_lengths == [len(list(factory()))] * 2
    # every step of both epochs, and each epoch's end after StopIteration
    assert len(report.cuts) == 2 * (report.epoch_lengths[0] + 2)


def test_long_epochs_are_cut_at_most_max_steps_times() -> None:
    report = assert_hook_roundtrip(lambda: Sums(shuffled(200)), epochs=1, max_steps=10)
    steps = [c.samples for c in report.cuts if not c.finished]
    assert len(steps) <= 11 and steps[0] == 0 and steps[-1] == 200


def test_a_hook_that_loses_its_state_fails_naming_the_step() -> None:
    with pytest.raises(AssertionError, match=r"saved at \[epoch 0, after 1 samples\] and restored into a fresh "
                                             r"ForgetfulSums diverges in epoch 0 at sample 1"):
        assert_hook_roundtrip(lambda: ForgetfulSums(IterableWrapper(range(1, 6))))


def test_a_pipe_without_a_hook_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"Unhooked has no state hook: .*register_state_hook\(Unhooked"):
        assert_hook_roundtrip(lambda: Unhooked(IterableWrapper(range(3))))
