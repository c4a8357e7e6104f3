"""``MultiProcessingReadingService(worker_reset_fn=...)``: called in each worker at the start of
each epoch (torchdata 0.9's hook); snapshots restore exactly onto the same layout, and are
refused, saying why, onto another one."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Mapper, ShardingFilter, Shuffler

import snapshot
from snapshot import InProcessReadingService, LayoutError
from snapshot.graph import Graph
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.testing import Cut, assert_resumes_exactly


class Tag:
    """A map function a reset function reconfigures: adds ``offset`` and says which worker ran it."""

    def __init__(self) -> None:
        self.offset = 0
        self.worker = -1

    def __call__(self, x: int) -> tuple[int, int]:
        return x + self.offset, self.worker


def graph(n: int = 47) -> Any:
    """Shuffled above and below the sharding point, then tagged and batched."""
    above = Shuffler(IterableWrapper(range(n)), buffer_size=6)
    below = Shuffler(ShardingFilter(above), buffer_size=5)
    return Batcher(Mapper(below, Tag()), batch_size=3)


def reseed(datapipe: Any, worker_info: Any, seed_generator: Any) -> Any:
    """The typical use: reseed the random pipes and reconfigure a pipe per worker and epoch (the
    shared stream is the same in every worker, so the part above the sharding point agrees)."""
    for node in Graph(datapipe):
        if isinstance(node.datapipe, Shuffler):
            node.datapipe.set_seed(seed_generator.generate_shared_seed())
        if isinstance(node.datapipe, Mapper) and isinstance(node.datapipe.fn, Tag):
            node.datapipe.fn.offset = 1000 * (seed_generator.generate_seed() % 7)
            node.datapipe.fn.worker = worker_info.worker_id
    return datapipe


def fixed(datapipe: Any, worker_info: Any, seed_generator: Any) -> Any:
    """torchdata 0.9's test: the same seed every epoch, so every epoch repeats."""
    seed_generator.seed(123)
    for node in Graph(datapipe):
        if isinstance(node.datapipe, Shuffler):
            node.datapipe.set_seed(seed_generator.generate_shared_seed())
    return datapipe


def replaces(datapipe: Any, worker_info: Any, seed_generator: Any) -> Any:
    return Mapper(datapipe, Tag())


def workers(n: int, reset: Any = reseed, **kwargs: Any) -> Any:
    return functools.partial(Workers, n, worker_reset_fn=reset, timeout=60, **kwargs)


def epochs(service: Any, count: int = 2, seed: int = 3) -> list[list[Any]]:
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(count)]


def _flat(epoch: list[Any]) -> list[tuple[int, int]]:
    return [sample for batch in epoch for sample in batch]


def test_it_runs_in_each_worker_at_the_start_of_each_epoch() -> None:
    first, second = epochs(workers(2))
    for epoch in (first, second):
        samples = _flat(epoch)
        assert {worker for _, worker in samples} == {0, 1}  # set in each worker
        offsets = {value // 1000 for value, _ in samples}
        assert sorted(value % 1000 for value, _ in samples) == list(range(47))
        assert len(offsets) <= 2
    assert first != second  # a new generator each epoch
    assert epochs(workers(2)) == [first, second]  # and the same ones for the same loader seed


def test_what_it_sets_wins_over_the_loader_seeds() -> None:
    first, second = epochs(workers(2, fixed))
    assert first == second  # as in torchdata 0.9's own test: the function's seed every epoch
    assert epochs(workers(2, fixed), seed=99)[0] == first


@pytest.mark.parametrize("count", [1, 2])
def test_restores_exactly_onto_the_same_layout(count: int) -> None:
    cuts = [Cut(0, 0), Cut(0, 1), Cut(0, 4), Cut(0, 9, then=13), Cut(0, 16), Cut(0, 16, finished=True),
            Cut(1, 0), Cut(1, 7)]
    assert_resumes_exactly(graph, reading_service=workers(count), epochs=2, cuts=cuts,
                           strategies=("state", "fast_forward"))


def test_restores_exactly_with_more_shards_than_workers() -> None:
    assert_resumes_exactly(graph, reading_service=workers(2, logical_shards=3), epochs=2,
                           cuts=[Cut(0, 5), Cut(0, 11), Cut(1, 2)], strategies=("auto", "fast_forward"))


def _saved_with(service: Any, steps: int = 5) -> Any:
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.seed(3)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        return loader.save_snapshot(None)


@pytest.mark.parametrize("restore, words", [
    (workers(1, logical_shards=2), "this service has num_workers=1"),
    (workers(2, replaces), "this service calls worker_reset_fn=tests.reading_service.test_worker_reset_fn.replaces"),
    (functools.partial(Workers, 2, timeout=60), "this service calls no worker_reset_fn"),
    (functools.partial(InProcessReadingService, logical_shards=2), "this service calls no worker_reset_fn"),
])
def test_another_layout_is_refused_saying_why(restore: Any, words: str) -> None:
    snap = _saved_with(workers(2))
    loader = snapshot.DataLoader2(graph(), reading_service=restore())
    with loader, pytest.raises(LayoutError) as info:
        loader.restore_snapshot(snap)
    text = str(info.value)
    assert "worker_reset_fn=tests.reading_service.test_worker_reset_fn.reseed in 2 worker(s)" in text
    assert "restores only onto the same one" in text and words in text
    assert ("MultiProcessingReadingService(num_workers=2, "
            "worker_reset_fn=tests.reading_service.test_worker_reset_fn.reseed)") in text


def test_a_snapshot_without_it_is_refused_by_a_service_that_calls_it() -> None:
    snap = _saved_with(functools.partial(Workers, 2, timeout=60))
    loader = snapshot.DataLoader2(graph(), reading_service=workers(2)())
    with loader, pytest.raises(LayoutError, match="the snapshot was taken without one"):
        loader.restore_snapshot(snap)


def test_the_layout_is_in_the_manifest() -> None:
    snap = _saved_with(workers(2))
    layout = snap.state["service"]["layout"]
    assert layout["worker_reset_fn"] == {"function": "tests.reading_service.test_worker_reset_fn.reseed",
                                         "num_workers": 2}


def test_a_function_that_returns_another_pipe_is_refused() -> None:
    loader = snapshot.DataLoader2(graph(), reading_service=workers(2, replaces)())
    with loader, pytest.raises(snapshot.ExecutionError, match="worker_reset_fn returned another DataPipe"):
        list(loader)


def test_with_no_workers_it_is_not_called_as_in_0_9() -> None:
    with pytest.warns(UserWarning, match="worker_reset_fn is not called with num_workers=0"):
        service = Workers(0, worker_reset_fn=reseed)
    with snapshot.DataLoader2(graph(), reading_service=service) as loader:
        assert {worker for batch in loader for _, worker in batch} == {-1}


def test_another_number_of_ranks_is_refused_too() -> None:
    from snapshot.reading_service.reshard import same_layout_problems

    saved = {"ranks": 2, "worker_reset_fn": {"function": "m.f", "num_workers": 2}}
    current = {"function": "m.f", "num_workers": 2}
    assert same_layout_problems(saved, current, ranks=2) == []
    [problem] = same_layout_problems(saved, current, ranks=3)
    assert "taken on 2 rank(s), this restore runs on 3" in problem and "restores only onto the same one" in problem


@pytest.mark.slow
def test_restores_in_a_fresh_process() -> None:
    assert_resumes_exactly(graph, reading_service=workers(2), epochs=2, fresh_process=True, cuts=[Cut(0, 4), Cut(1, 2)])
