"""A non-replicable pipe below the sharding point: the part from it down to the sink runs once, in
the loader's process, over the merged stream of the logical shards (as torchdata 0.9 ran it in
the main process), and snapshots restore it exactly, in-process and with workers, onto other
worker counts."""

from __future__ import annotations

import functools
import os
import random
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Mapper, ShardingFilter, Shuffler, Zipper
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

import snapshot
from snapshot import InProcessReadingService, ShardingError
from snapshot.graph import Graph
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.sharding import analyze
from snapshot.testing import Cut, assert_resumes_exactly, first_difference
from tests.helpers import HOOKED_STRATEGIES
from tests.reading_service.test_dispatch import NonReplicable

L = 2
MP = SHARDING_PRIORITIES.MULTIPROCESSING


class RunningSum(IterDataPipe):
    """Non-replicable, with torchdata's ``Stateful`` protocol: pairs each sample with the sum so far."""

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe
        self.total = 0

    def is_replicable(self) -> bool:
        return False

    def reset(self) -> None:
        self.total = 0

    def __iter__(self):
        for x in self.datapipe:
            self.total += x
            yield x, self.total

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total = state["total"]


def _double(x: int) -> int:
    return 2 * x


def _with_pid(x: Any) -> tuple[Any, int]:
    return x, os.getpid()


def _shards(n: int) -> Any:
    """Shuffled above and below the sharding point: the part each logical shard runs."""
    return Mapper(Shuffler(ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=5)), buffer_size=3), _double)


def stateful_tail(n: int = 31) -> Any:
    """A tail restored from its states: a stateful non-replicable pipe, a shuffle, a batch."""
    return Batcher(Shuffler(RunningSum(_shards(n)), buffer_size=4), batch_size=3)


def hookless_tail(n: int = 29) -> Any:
    """A tail with a pipe that has no state hook (its restore replays the epoch through the shards)."""
    return Batcher(NonReplicable(_shards(n)), batch_size=2)


def traced(n: int = 12) -> Any:
    return Mapper(NonReplicable(Mapper(ShardingFilter(IterableWrapper(range(n))), _with_pid)), _with_pid)


def in_process() -> Any:
    return InProcessReadingService(logical_shards=L)


def workers(n: int) -> Any:
    return functools.partial(Workers, n, logical_shards=L, timeout=60)


SERVICES = {"in_process": in_process, "workers_0": workers(0), "workers_1": workers(1), "workers_2": workers(2)}
CUTS = [Cut(0, 0), Cut(0, 1), Cut(0, 2), Cut(0, 4, then=7), Cut(0, 6), Cut(0, 9), Cut(0, 10),
        Cut(0, 11), Cut(0, 11, finished=True), Cut(1, 0), Cut(1, 1), Cut(1, 5)]


def epochs(factory: Any, service: Any, seed: int = 5, count: int = 2) -> list[list[Any]]:
    with snapshot.DataLoader2(factory(), reading_service=service()) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(count)]


def test_the_tail_is_found_below_the_sharding_point() -> None:
    topology = analyze(Graph(stateful_tail()))
    assert topology.problems == ()
    assert topology.tail == {"0", "0/datapipe", "0/datapipe/datapipe"}  # batch, shuffle, the running sum
    assert topology.merge_point == "0/datapipe/datapipe/datapipe"
    assert topology.downstream(Graph(stateful_tail())).isdisjoint(topology.tail)


def test_it_runs_once_in_the_loaders_process_over_the_merged_stream() -> None:
    with snapshot.DataLoader2(traced(), reading_service=Workers(2, timeout=60)) as loader:
        got = list(loader)
    assert [x for ((x, _), _) in got] == list(range(12))  # shard 0, shard 1, shard 0, ...
    assert {tail for _, tail in got} == {os.getpid()}
    assert os.getpid() not in {worker for ((_, worker), _) in got} and len({w for ((_, w), _) in got}) == 2


@pytest.mark.parametrize("factory", [stateful_tail, hookless_tail], ids=lambda f: f.__name__)
def test_the_stream_does_not_depend_on_the_number_of_workers(factory: Any) -> None:
    reference = epochs(factory, in_process)
    for name, service in SERVICES.items():
        assert epochs(factory, service) == reference, name
    assert first_difference(reference[0], reference[1]) is not None  # epochs reshuffle
    if factory is stateful_tail:  # every sample once an epoch, and the running sum over the merged stream
        for epoch in reference:
            pairs = [pair for batch in epoch for pair in batch]
            assert sorted(x for x, _ in pairs) == [2 * i for i in range(31)]
            assert max(total for _, total in pairs) == sum(2 * i for i in range(31))


@pytest.mark.parametrize("service", ["workers_0", "workers_2"])
@pytest.mark.parametrize("factory", [stateful_tail, hookless_tail], ids=lambda f: f.__name__)
def test_every_cut_restores_exactly(factory: Any, service: str) -> None:
    # every node of stateful_tail has a hook: auto would make state's plan (tests/helpers.py)
    strategies = HOOKED_STRATEGIES if factory is stateful_tail else ("auto", "fast_forward")
    assert_resumes_exactly(factory, reading_service=SERVICES[service], epochs=2, cuts=CUTS, strategies=strategies)


@pytest.mark.parametrize("saved, restored", [("workers_2", "workers_1"), ("workers_0", "workers_2"),
                                             ("workers_2", "in_process"), ("in_process", "workers_1")])
@pytest.mark.parametrize("factory", [stateful_tail, hookless_tail], ids=lambda f: f.__name__)
def test_restores_exactly_onto_another_worker_count(factory: Any, saved: str, restored: str) -> None:
    assert_resumes_exactly(factory, reading_service=SERVICES[saved], restore_service=SERVICES[restored], epochs=2,
                           cuts=[Cut(0, 1), Cut(0, 5, then=8), Cut(0, 11, finished=True), Cut(1, 3)],
                           strategies=("auto",), via_file=False)


def test_a_hookless_tail_cannot_restore_from_state_alone() -> None:
    with snapshot.DataLoader2(hookless_tail(), reading_service=Workers(2, timeout=60)) as loader:
        loader.seed(1)
        it = iter(loader)
        next(it)
        snap = loader.save_snapshot(None)
    loader = snapshot.DataLoader2(hookless_tail(), reading_service=Workers(2, timeout=60))
    with loader, pytest.raises(snapshot.StrategyError, match="NonReplicable"):
        loader.restore_snapshot(snap, strategy="state")


def _two_feeds() -> Any:
    return NonReplicable(Zipper(ShardingFilter(IterableWrapper(range(10))), ShardingFilter(IterableWrapper(range(10)))))


def _tail_reads_two_nodes() -> Any:
    return Zipper(NonReplicable(ShardingFilter(IterableWrapper(range(10)))), ShardingFilter(IterableWrapper(range(9))))


def _above_the_filter() -> Any:
    return ShardingFilter(NonReplicable(IterableWrapper(range(10))))


@pytest.mark.parametrize("factory, words", [
    (_tail_reads_two_nodes, "it reads 0/datapipes/0/datapipe, 0/datapipes/1"),
    (_above_the_filter, "0/source_datapipe: NonReplicable() is not replicable"),
])
def test_a_tail_that_cannot_run_once_is_refused_naming_it(factory: Any, words: str) -> None:
    loader = snapshot.DataLoader2(factory(), reading_service=Workers(2, timeout=60))
    with loader, pytest.raises(ShardingError, match="replicable") as info:
        iter(loader)
    assert words in str(info.value)
    with snapshot.DataLoader2(factory(), reading_service=InProcessReadingService()) as one:
        list(one)  # one logical shard: the graph runs whole, as it would on its own


def test_a_tail_below_the_join_of_two_sharded_branches_runs() -> None:
    got = epochs(_two_feeds, workers(2), count=1)[0]
    assert sorted(got) == [(i, i) for i in range(10)]


def _after(loader: Any, steps: int) -> Any:
    it = iter(loader)
    for _ in range(steps):
        next(it)
    return loader.save_snapshot(None)


def test_the_snapshot_counts_what_the_tail_read_from_the_merge() -> None:
    with snapshot.DataLoader2(stateful_tail(), reading_service=Workers(2, timeout=60)) as loader:
        loader.seed(2)
        first = _after(loader, 3)
    with snapshot.DataLoader2(stateful_tail(), reading_service=Workers(1, timeout=60)) as loader:
        loader.restore_snapshot(first)
        state = _after(loader, 2).state["service"]
    merged = state["tail"]["nodes"]["0/datapipe/datapipe/datapipe"]["yielded"]
    assert merged == sum(int(n) for n in state["merge"]["consumed"].values()) > 0


def dispatched_tail(n: int = 27) -> Any:
    """Dispatched (above the split: once), a map per shard, then a stateful tail (once, over the merge)."""
    above = Shuffler(IterableWrapper(range(n)), buffer_size=6).sharding_round_robin_dispatch(MP)
    return Batcher(RunningSum(Mapper(above, _double)), batch_size=2)


def test_a_tail_below_a_dispatcher_restores_exactly_onto_another_worker_count() -> None:
    assert_resumes_exactly(dispatched_tail, reading_service=workers(2), restore_service=workers(1), epochs=2,
                           cuts=[Cut(0, 2), Cut(0, 7, then=9), Cut(1, 4)], strategies=("auto", "fast_forward"),
                           via_file=False)


def _noisy(x: Any) -> tuple[Any, int]:
    return x, random.randint(0, 10**6)


def random_tail(n: int = 23) -> Any:
    """A tail that draws from the global ``random`` generator (isolated and saved with workers)."""
    return Mapper(RunningSum(_shards(n)), _noisy)


def hookless_random_tail(n: int = 23) -> Any:
    return Mapper(NonReplicable(_shards(n)), _noisy)


@pytest.mark.parametrize("factory", [random_tail, hookless_random_tail], ids=lambda f: f.__name__)
def test_a_tail_drawing_from_the_global_generators_restores_exactly(factory: Any) -> None:
    assert_resumes_exactly(factory, reading_service=workers(2), restore_service=workers(0), epochs=2,
                           cuts=[Cut(0, 3), Cut(0, 10, then=15), Cut(1, 6)], via_file=False)


@pytest.mark.slow
@pytest.mark.parametrize("factory", [stateful_tail, hookless_tail], ids=lambda f: f.__name__)
def test_restores_in_a_fresh_process(factory: Any) -> None:
    assert_resumes_exactly(factory, reading_service=workers(2), restore_service=workers(1), epochs=2,
                           fresh_process=True, cuts=[Cut(0, 4), Cut(1, 2)])
