"""``sharding_round_robin_dispatch`` and non-replicable pipes: the part above the dispatcher runs
once, its samples are dealt to the logical shards, every worker is used, and snapshots are exact."""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Mapper, ShardingFilter, Shuffler, Zipper
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

import snapshot
from snapshot import InProcessReadingService, ShardingError
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.testing import Cut, assert_resumes_exactly
from tests.graphs import Squares

torchdata_iter = pytest.importorskip("torchdata.datapipes.iter")
Dispatcher = torchdata_iter.ShardingRoundRobinDispatcher
MP = SHARDING_PRIORITIES.MULTIPROCESSING


def _with_pid(x: Any) -> tuple[Any, int]:
    return x, os.getpid()


def _times_ten(x: int) -> int:
    return x * 10


class NonReplicable(IterDataPipe):
    """A pipe that must not be copied (torchdata 0.9's ``is_replicable()`` protocol)."""

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe

    def is_replicable(self) -> bool:
        return False

    def __iter__(self):
        yield from self.datapipe


def traced(n: int = 23) -> Any:
    """Each sample says which process ran the part above the dispatcher and which ran the rest."""
    above = Mapper(NonReplicable(Shuffler(IterableWrapper(range(n)), buffer_size=8)), _with_pid)
    return Mapper(Dispatcher(above, MP), _with_pid)


def dispatched(n: int = 29) -> Any:
    """Shuffled above the dispatcher, a hookless pipe right below it, batched per shard."""
    return Batcher(Squares(Dispatcher(Shuffler(IterableWrapper(range(n)), buffer_size=7), MP)), batch_size=2)


def zipped(n: int = 20, m: int | None = None) -> Any:
    """A dispatched branch zipped with a branch sharded by ``sharding_filter``."""
    left = Mapper(Dispatcher(IterableWrapper(range(n)), MP), _times_ten)
    right = ShardingFilter(IterableWrapper(range(100, 100 + (n if m is None else m))))
    return Zipper(left, right)


def zipped_shuffled(n: int = 26) -> Any:
    left = Mapper(Dispatcher(Shuffler(IterableWrapper(range(n)), buffer_size=5), MP), _times_ten)
    right = ShardingFilter(Shuffler(IterableWrapper(range(100, 100 + n)), buffer_size=5))
    return Batcher(Zipper(left, right), batch_size=3)


def workers(n: int, shards: int | None = None) -> Any:
    return functools.partial(Workers, n, logical_shards=shards, timeout=60)


def in_process(shards: int) -> Any:
    return functools.partial(InProcessReadingService, logical_shards=shards)


def run(factory: Any, service: Any, seed: int = 3, epochs: int = 1) -> list[list[Any]]:
    with snapshot.DataLoader2(factory(), reading_service=service()) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(epochs)]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_the_dispatcher_uses_every_worker_and_each_sample_comes_once(num_workers: int) -> None:
    epochs = run(traced, workers(num_workers), epochs=2)
    for samples in epochs:
        values = sorted(x for (x, _), _ in samples)
        assert values == list(range(23))
        above = {pid for (_, pid), _ in samples}
        assert len(above) == 1  # run once (by the loader's process; by the worker when it is the only one)
        assert num_workers == 1 or above == {os.getpid()}
        below = {pid for _, pid in samples}
        assert len(below) == num_workers and os.getpid() not in below
    # the same stream as in-process with as many logical shards, and a new order each epoch
    reference = [[x for (x, _), _ in e] for e in run(traced, in_process(num_workers), epochs=2)]
    assert [[x for (x, _), _ in e] for e in epochs] == reference
    assert reference[0] != reference[1]


@pytest.mark.parametrize("n, m", [(20, None), (7, 20), (20, 7)])
def test_zipped_branches_stay_aligned(n: int, m: int | None) -> None:
    expected = [(10 * i, 100 + i) for i in range(min(n, n if m is None else m))]
    for num_workers in (1, 2, 3):
        (got,) = run(functools.partial(zipped, n, m), workers(num_workers))
        assert got == expected, num_workers


_TORCHDATA_RUN = """
import json, sys
from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService
from tests.reading_service.test_dispatch import zipped
streams = []
for case in json.loads(sys.argv[1]):
    loader = DataLoader2(zipped(*case), reading_service=MultiProcessingReadingService(2))
    streams.append(list(loader))
    loader.shutdown()
print(json.dumps(streams))
"""


def test_zipped_branches_match_torchdata_0_9() -> None:
    pytest.importorskip("torchdata.dataloader2")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cases = [(20, None), (7, 20)]
    # in a process of its own (one for both cases: a process imports torchdata in seconds): torchdata's
    # dispatching process outlives its loader's shutdown
    done = subprocess.run([sys.executable, "-c", _TORCHDATA_RUN, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    streams = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(streams) == len(cases)
    for (n, m), stream in zip(cases, streams):
        theirs = [tuple(pair) for pair in stream]
        (ours,) = run(functools.partial(zipped, n, m), workers(2))
        assert ours == theirs and len(ours) == min(n, n if m is None else m)


def test_shuffled_zip_is_the_same_stream_for_any_worker_count() -> None:
    reference = run(zipped_shuffled, in_process(3), epochs=2)
    for num_workers in (1, 3):
        assert run(zipped_shuffled, workers(num_workers, shards=3), epochs=2) == reference
    pairs = [pair for batch in reference[0] for pair in batch]
    assert sorted(a for a, _ in pairs) == [10 * i for i in range(26)]
    assert sorted(b for _, b in pairs) == list(range(100, 126))


@pytest.mark.parametrize("factory", [dispatched, zipped_shuffled], ids=lambda f: f.__name__)
def test_every_cut_restores_exactly_with_workers(factory: Any) -> None:
    assert_resumes_exactly(factory, reading_service=workers(2), epochs=2, strategies=("auto", "fast_forward"),
                           via_file=False)


@pytest.mark.parametrize("saved, restored", [(workers(2, 3), workers(3)), (workers(3), workers(1, 3)),
                                             (workers(2, 3), in_process(3)), (in_process(3), workers(2, 3))],
                         ids=["2-to-3", "3-to-1", "2-to-in-process", "in-process-to-2"])
def test_restore_onto_another_worker_count(saved: Any, restored: Any) -> None:
    for factory in (dispatched, zipped_shuffled):
        assert_resumes_exactly(factory, reading_service=saved, restore_service=restored, epochs=2,
                               strategies=("auto",), via_file=False,
                               cuts=[Cut(0, 0), Cut(0, 4, then=6), Cut(0, 8), Cut(0, 9), Cut(0, 9, finished=True),
                                     Cut(1, 2)])


def test_a_snapshot_counts_the_samples_dealt_but_not_read() -> None:
    """Cut while workers hold dealt samples they have not used yet, then restore in-process."""
    service = functools.partial(Workers, 2, prefetch_factor=4, timeout=60)
    (reference,) = run(dispatched, service)
    with snapshot.DataLoader2(dispatched(), reading_service=service()) as loader:
        loader.seed(3)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        snap = loader.save_snapshot()
        assert head + list(it) == reference  # saving changes nothing
    with snapshot.DataLoader2(dispatched(), reading_service=InProcessReadingService(logical_shards=2)) as loader:
        loader.restore_snapshot(snap)
        assert head + list(loader) == reference


def _jitter(x: int) -> tuple[int, float]:
    return x, random.random()


def jittered(n: int = 24) -> Any:
    """The part above the dispatcher draws from the global ``random`` generator."""
    return Batcher(Mapper(Dispatcher(Mapper(IterableWrapper(range(n)), _jitter), MP), _with_pid), batch_size=2)


def _values(epochs: list[list[Any]]) -> list[list[Any]]:
    return [[[x for x, _ in batch] for batch in epoch] for epoch in epochs]


def test_the_dispatching_part_has_its_own_generators_and_restores_them() -> None:
    state = random.getstate()
    reference = run(jittered, workers(2), epochs=2)
    assert random.getstate() == state  # the caller's generator is left alone
    assert _values(run(jittered, workers(2), epochs=2)) == _values(reference)
    with snapshot.DataLoader2(jittered(), reading_service=workers(2)()) as loader:
        loader.seed(3)
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        snap = loader.save_snapshot()
    with snapshot.DataLoader2(jittered(), reading_service=workers(2)()) as loader:
        loader.restore_snapshot(snap)
        rest = [list(loader), list(loader)]
    assert _values([head + rest[0], rest[1]]) == _values(reference)


def _fails_at_five(x: int) -> int:
    if x == 5:
        raise ValueError("bad sample 5")
    return x


@pytest.mark.parametrize("num_workers", [1, 2])
def test_an_error_above_the_dispatcher_is_raised_in_order(num_workers: int) -> None:
    graph = Mapper(Dispatcher(Mapper(IterableWrapper(range(20)), _fails_at_five), MP), _times_ten)
    with snapshot.DataLoader2(graph, reading_service=Workers(num_workers, timeout=60)) as loader:
        got = []
        with pytest.raises(ValueError, match="bad sample 5") as info:
            for x in loader:
                got.append(x)
    assert got == [0, 10, 20, 30, 40]
    text = str(info.value)  # torchdata 0.9's words, and where
    assert "Caught ValueError in dispatching process" in text and "Original Traceback" in text
    assert "bad sample 5" in text and "by the DataPipe at 0/datapipe/source_datapipe" in text


def _shared_source() -> Any:
    source = IterableWrapper(range(10))
    return Zipper(Dispatcher(source, MP), ShardingFilter(source))


def _non_replicable_above_the_filter() -> Any:  # below it, it runs once over the merged stream
    return ShardingFilter(NonReplicable(IterableWrapper(range(10))))


@pytest.mark.parametrize("factory, path, words", [
    (_shared_source, "0/datapipes/0/source_datapipe", "feeds both"),
    (_non_replicable_above_the_filter, "0/source_datapipe", "not replicable"),
])
def test_a_shape_that_cannot_be_honoured_is_refused_naming_the_pipe(factory: Any, path: str, words: str) -> None:
    loader = snapshot.DataLoader2(factory(), reading_service=Workers(2, timeout=60))
    with pytest.raises(ShardingError) as info:
        iter(loader)
    loader.shutdown()
    assert path in str(info.value) and words in str(info.value)
    with snapshot.DataLoader2(factory(), reading_service=InProcessReadingService()) as loader:
        list(loader)  # one logical shard: the graph runs whole, as it would on its own


# -- with ranks: SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(2)) --

def ranked(n: int = 40) -> Any:
    """torchdata 0.9's dispatching graph for ranks: a sharding_filter above the dispatcher."""
    above = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=9))
    return Mapper(Dispatcher(above, MP), _times_ten)


def _save_on_rank(rank: int, world: int, steps: int, directory: str) -> dict[str, Any]:
    service = snapshot.SequentialReadingService(snapshot.DistributedReadingService(60),
                                                Workers(2, timeout=60))
    with snapshot.DataLoader2(ranked(), reading_service=service) as loader:
        loader.seed(5)
        it = iter(loader)
        seen = [next(it) for _ in range(steps)]
        loader.save_snapshot(directory)
        return {"seen": seen, "rest": list(it)}


def test_ranks_with_workers_deal_each_sample_once_and_restore_in_one_process(tmp_path) -> None:
    from tests.dist import run_ranks

    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, _save_on_rank, 4, directory)  # L = 2 ranks x 2 workers; 40 samples: even ranks
    everything = sorted(x for rank in before for x in rank["seen"] + rank["rest"])
    assert everything == [10 * i for i in range(40)]
    with snapshot.DataLoader2(ranked(), reading_service=InProcessReadingService(logical_shards=4)) as loader:
        loader.seed(5)
        single = list(loader)
    for rank, result in enumerate(before):  # each rank reads its logical shards of the one stream
        assert result["seen"] + result["rest"] == [x for i, x in enumerate(single) if i % 4 in (rank, rank + 2)]
    with snapshot.DataLoader2(ranked(), reading_service=InProcessReadingService()) as loader:
        loader.restore_snapshot(directory)
        after = list(loader)
    seen = sorted(x for rank in before for x in rank["seen"])
    assert sorted(seen + after) == [10 * i for i in range(40)]
