"""Resume equivalence: every cut point of every graph restores to the uninterrupted stream."""

from __future__ import annotations

import functools

import pytest
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
