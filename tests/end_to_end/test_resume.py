"""Resume equivalence: every cut point of every graph restores to the uninterrupted stream."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.graph import Graph
from snapshot.testing import Cut, assert_resumes_exactly
from tests import graphs

FACTORIES = [graphs.linear, graphs.linear_lambdas, graphs.collate_unbatch, graphs.grouped,
             graphs.combining, graphs.sampled, graphs.sharded]


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.__name__)
def test_every_cut_restores_exactly(factory) -> None:
    report = assert_resumes_exactly(factory, epochs=2, strategies=("auto", "fast_forward"))
    assert len(report.cuts) >= 7


def test_file_pipes_restore_exactly(data_dir: str) -> None:
    assert_resumes_exactly(functools.partial(graphs.files, data_dir), epochs=2)


def test_the_graphs_cover_every_builtin_iter_datapipe(data_dir: str) -> None:
    import torch.utils.data.datapipes.iter as builtin

    covered = set()
    for factory in [*FACTORIES, functools.partial(graphs.files, data_dir)]:
        for node in Graph(factory()):
            covered.add(type(node.datapipe))
    names = {name for name in builtin.__all__ if getattr(builtin, name) in covered}
    # fork and demux appear as their container and child classes
    names |= {"Forker", "Demultiplexer"} & {n for n in builtin.__all__}
    assert names == graphs.ALL_ITER_DATAPIPES
    containers = {type(n.datapipe).__name__ for f in FACTORIES for n in Graph(f())}
    assert {"_ForkerIterDataPipe", "_DemultiplexerIterDataPipe", "_ChildDataPipe"} <= containers


def test_many_cut_points_across_three_epochs() -> None:
    lengths = [len(list(snapshot.DataLoader2(graphs.combining()))) for _ in range(1)]
    n = lengths[0]
    cuts = [Cut(e, k) for e in range(3) for k in range(0, n + 1, 3)]
    assert_resumes_exactly(graphs.combining, epochs=3, cuts=cuts)


@pytest.mark.slow
@pytest.mark.parametrize("factory", [graphs.linear_lambdas, graphs.combining], ids=lambda f: f.__name__)
def test_restore_in_a_fresh_process(factory) -> None:
    assert_resumes_exactly(factory, epochs=2, fresh_process=True,
                           cuts=[Cut(0, 3), Cut(0, 2, then=5), Cut(1, 1)])


def test_the_harness_catches_a_pipe_that_does_not_reproduce() -> None:
    with pytest.raises(AssertionError, match=r"diverges in epoch 0 at sample \d+"):
        assert_resumes_exactly(graphs.noisy, epochs=1, cuts=[Cut(0, 5)])


def test_the_harness_catches_an_off_by_one_restore(monkeypatch) -> None:
    """If a hook restored one sample too far, the harness must say where."""
    from snapshot.hooks.builtin.sources import IterableWrapperIterator

    restore = IterableWrapperIterator.set_state
    monkeypatch.setattr(IterableWrapperIterator, "set_state",
                        lambda self, state: restore(self, {"position": state["position"] + 1}))
    with pytest.raises(AssertionError, match=r"diverges in epoch 0 at sample 4"):
        assert_resumes_exactly(lambda: IterableWrapper(range(10)), epochs=1, cuts=[Cut(0, 4)],
                               strategies=("state",))


class Position(IterDataPipe):
    """``range(n)`` whose state is its position (the ``Stateful`` protocol): it restores exactly.

    ``skip_on_save``: ``state_dict()`` also moves the live iterator one sample on, a side effect
    of saving that a restore never shows. ``wrong_until_saved``: a restored pipe yields wrong
    samples until it is saved again, which a restore of that second snapshot never shows.
    """

    def __init__(self, n: int, *, skip_on_save: bool = False, wrong_until_saved: bool = False) -> None:
        self.n, self.skip_on_save, self.wrong_until_saved = n, skip_on_save, wrong_until_saved
        self.position, self.wrong, self.saved_again = 0, False, False

    def reset(self) -> None:
        self.position = 0

    def __iter__(self) -> Iterator[int]:
        while self.position < self.n:
            value = self.position
            self.position += 1
            yield value + (100 if self.wrong else 0)

    def state_dict(self) -> dict[str, Any]:
        state = {"position": self.position, "saved_again": self.wrong or self.saved_again}
        self.wrong = False
        if self.skip_on_save and self.position < self.n:
            self.position += 1
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.saved_again = state["position"], state["saved_again"]
        self.wrong = self.wrong_until_saved and not self.saved_again


def skips_on_save() -> Any:
    return Position(12, skip_on_save=True).batch(2)


def wrong_until_saved() -> Any:
    return Position(12, wrong_until_saved=True).batch(2)


def well_behaved() -> Any:
    return Position(12).batch(2)


def test_the_harness_catches_a_save_that_changes_the_live_stream() -> None:
    # each restore alone is exact (the state is the position before the skip): only the run that
    # saved and went on shows the sample the save skipped
    with pytest.raises(AssertionError, match=r"the run that saved at \[epoch 0, after 1 samples\] \(a run must "
                                             r"not change when it saves.* diverges in epoch 0 at sample 1: expected "
                                             r"\[2, 3\], got \[3, 4\]"):
        assert_resumes_exactly(skips_on_save, epochs=2, strategies=("state",))


def test_the_harness_compares_what_a_restore_reads_before_it_is_saved_again() -> None:
    # restored, the pipe is wrong until its next save; the snapshot of that save restores exactly
    with pytest.raises(AssertionError, match=r"the restore at \[epoch 0, after 1 samples, restored, then cut again "
                                             r"after 4\] with strategy='state', saved again at its second cut and "
                                             r"read on, diverges in epoch 0 at sample 1: expected \[2, 3\], got "
                                             r"\[102, 103\]"):
        assert_resumes_exactly(wrong_until_saved, epochs=2, strategies=("state",), cuts=[Cut(0, 1, then=4)])


def test_the_harness_passes_the_same_pipe_without_side_effects() -> None:
    # the control: the same pipe and cuts, saving has no effect and a restore is right at once
    report = assert_resumes_exactly(well_behaved, epochs=2, strategies=("state", "fast_forward"))
    assert len(report.cuts) >= 7
    assert_resumes_exactly(well_behaved, epochs=2, strategies=("state",), cuts=[Cut(0, 1, then=4)])
