"""A snapshot restored onto more workers than it has logical shards (W' > L), and back.

A job started with ``MultiProcessingReadingService(2)`` has L = 2 logical shards. Restored onto 3 or 8
workers, each saved unit is split into sub-shards from where it stood (the same plan as for ranks, see
:mod:`snapshot.reading_service.reshard`), so every worker has one; later epochs run as the sub-shards the
layout needs. The checks, on real worker processes:

- exactly once: over the rest of the interrupted epoch (after what the saving run had read) and every
  later epoch, each sample at the sharding point is read once (samples are compared as the multiset of
  what they hold: a batch holds its samples);
- the stream does not depend on where the units run: in worker processes or in one process planned for
  as many workers (:class:`AsIf`), the restored stream is the same;
- later epochs are the stream of a job started on the new layout with the saved L;
- a run that saves equals one that never saves.

The graphs have a filter, a flat_map, a shuffle buffer and a batch below the sharding point. Cuts are in
the middle of the epoch, after its last sample, and after its end (StopIteration).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

import snapshot

pytest.importorskip("torchdata.datapipes.iter")  # flat_map (torchdata 0.9)

SAMPLES = 48


def keep(x: int) -> bool:
    return x % 7 != 3


def explode(x: int) -> list[int]:
    return [x, 1000 + x] if x % 5 == 0 else [x]


def plain() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).sharding_filter()


def below() -> Any:
    """A filter, a flat_map and a shuffle buffer below the sharding point."""
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata.datapipes.iter import FlatMapper

    return FlatMapper(IterableWrapper(range(SAMPLES)).sharding_filter().filter(keep), explode).shuffle(buffer_size=6)


def batched() -> Any:
    return below().batch(4)


def leaves(samples: Iterable[Any]) -> Iterator[Any]:
    for sample in samples:
        if isinstance(sample, list):
            yield from leaves(sample)
        else:
            yield sample


EVERY = Counter(leaves(plain()))
ONCE = {plain: EVERY, below: Counter(leaves(below())), batched: Counter(leaves(below()))}


class AsIf(snapshot.InProcessReadingService):
    """In one process, the units a restore onto ``n`` workers runs: the stream must not depend on where
    they run."""

    def __init__(self, n: int, logical_shards: int | None = None):
        super().__init__(logical_shards=logical_shards)
        self.n = n

    @property
    def workers(self) -> int:
        return self.n


def service(workers: int, logical_shards: int | None = None) -> Any:
    if workers == 0:
        return snapshot.InProcessReadingService(logical_shards=logical_shards)
    return snapshot.MultiProcessingReadingService(workers, logical_shards=logical_shards, timeout=60)


def saving_run(factory: Any, workers: int, cut: str, path: str) -> tuple[list[list[Any]], int]:
    """Two epochs on ``workers`` workers, saved at ``cut`` of the first (``middle``; ``end``: after its last
    sample, before the iterator says it has ended; ``after``: after that): the stream, and how many samples
    of the first epoch the snapshot had yielded."""
    length = len(never_saving(factory, workers, epochs=1)[0])
    at = {"middle": 7, "end": length, "after": length}[cut]
    with snapshot.DataLoader2(factory(), reading_service=service(workers)) as loader:
        loader.seed(5)
        it = iter(loader)
        first = [next(it) for _ in range(at)]
        if cut == "after":
            first += list(it)
        loader.save_snapshot(path)
        first += list(it)
        return [first, list(loader)], at


def restored(factory: Any, path: str, rs: Any, epochs: int = 2) -> dict[str, Any]:
    """The rest of the saved epoch and ``epochs`` more, restored onto ``rs``."""
    with snapshot.DataLoader2(factory(), reading_service=rs) as loader:
        finished = loader.restore_snapshot(path).manifest["loader"]["epoch_finished"]
        rest = [] if finished else list(loader)
        return {"rest": rest, "later": [list(loader) for _ in range(epochs)]}


def never_saving(factory: Any, workers: int, logical_shards: int | None = None, epochs: int = 2) -> list[list[Any]]:
    with snapshot.DataLoader2(factory(), reading_service=service(workers, logical_shards)) as loader:
        loader.seed(5)
        return [list(loader) for _ in range(epochs)]


def check(factory: Any, head: list[Any], got: dict[str, Any]) -> None:
    once = ONCE[factory]
    assert Counter(leaves(head + got["rest"])) == once, "the interrupted epoch: a sample lost or read twice"
    for epoch in got["later"]:
        assert Counter(leaves(epoch)) == once, "a later epoch: a sample lost or read twice"


GRAPHS = [plain, below, batched]


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["middle", "end", "after"])
@pytest.mark.parametrize("factory", GRAPHS, ids=lambda f: f.__name__)
def test_two_workers_restore_onto_three(tmp_path, factory: Any, cut: str) -> None:
    path = str(tmp_path / "two.snap")
    stream, at = saving_run(factory, 2, cut, path)
    assert stream == never_saving(factory, 2)  # a run that saves equals one that never saves
    got = restored(factory, path, service(3))
    check(factory, stream[0][:at], got)
    assert got == restored(factory, path, AsIf(3))  # the same units in one process: the same stream
    # later epochs: the stream of a job started on 3 workers with the saved 2 logical shards (6 sub-shards)
    assert got["later"] == never_saving(factory, 3, logical_shards=2, epochs=3)[1:]


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 8), (1, 2), (0, 3)])
def test_fewer_logical_shards_than_workers_restore_mid_epoch(tmp_path, before: int, after: int) -> None:
    # L = 2 onto 8 workers (8 sub-shards); L = 1 (one logical shard, run whole: cut at its sharding point
    # by the restore) onto 2 workers and, from in-process, onto 3
    path = str(tmp_path / "data.snap")
    stream, at = saving_run(below, before, "middle", path)
    got = restored(below, path, service(after))
    check(below, stream[0][:at], got)
    assert got == restored(below, path, AsIf(after))
    assert snapshot.read_manifest(path)["service"]["logical_shards"] == max(before, 1)


def restore_of_restore(path: str, again: str, workers: tuple[int, int], steps: int) -> dict[str, Any]:
    """Restored onto ``workers[0]``, saved again after ``steps`` more samples, that restored onto ``workers[1]``."""
    with snapshot.DataLoader2(batched(), reading_service=service(workers[0])) as loader:
        loader.restore_snapshot(path)
        it = iter(loader)
        middle = [next(it) for _ in range(steps)]
        loader.save_snapshot(again)
    return {"middle": middle, **restored(batched, again, service(workers[1]))}


@pytest.mark.slow
def test_four_workers_restore_onto_one_then_four(tmp_path) -> None:
    first, second = str(tmp_path / "four.snap"), str(tmp_path / "one.snap")
    stream, at = saving_run(batched, 4, "middle", first)
    got = restore_of_restore(first, second, (1, 4), 2)
    check(batched, stream[0][:at] + got["middle"], got)
    # no layout split anything (4 units, 1 then 4 workers): the saved run's stream, every sample in place
    assert stream[0][at:] == got["middle"] + got["rest"] and got["later"][0] == stream[1]


@pytest.mark.slow
def test_a_split_epoch_saved_again_splits_again(tmp_path) -> None:
    # 2 logical shards -> 3 workers (6 sub-shards), saved again mid-way -> 8 workers (24 sub-shards)
    first, second = str(tmp_path / "two.snap"), str(tmp_path / "three.snap")
    stream, at = saving_run(batched, 2, "middle", first)
    got = restore_of_restore(first, second, (3, 8), 1)
    assert snapshot.read_manifest(second)["service"]["units"] == 6
    check(batched, stream[0][:at] + got["middle"], got)
    assert got["later"] == never_saving(batched, 8, logical_shards=2, epochs=3)[1:]


@pytest.mark.slow
def test_a_first_run_with_more_workers_than_logical_shards_splits_them(tmp_path) -> None:
    # logical_shards=2 on 3 workers used to be refused: it runs as 6 sub-shards, every sample once, the
    # same stream in one process planned for 3 workers, and restores onto 2 workers (6 units) exactly
    epochs = never_saving(below, 3, logical_shards=2)
    assert all(Counter(leaves(e)) == ONCE[below] for e in epochs)
    with snapshot.DataLoader2(below(), reading_service=AsIf(3, logical_shards=2)) as loader:
        loader.seed(5)
        assert [list(loader) for _ in range(2)] == epochs
    path = str(tmp_path / "data.snap")
    with snapshot.DataLoader2(below(), reading_service=service(3, logical_shards=2)) as loader:
        loader.seed(5)
        it = iter(loader)
        head = [next(it) for _ in range(9)]
        loader.save_snapshot(path)
    assert snapshot.read_manifest(path)["service"]["units"] == 6
    got = restored(below, path, service(2), epochs=1)
    assert head + got["rest"] == epochs[0]  # 2 workers keep the 6 units: the same stream
    assert Counter(leaves(got["later"][0])) == ONCE[below]


def test_the_plan_and_inspect_say_what_the_stream_is(tmp_path) -> None:
    from snapshot.reading_service.reshard import SavedLayout, plan_restore

    path = str(tmp_path / "two.snap")
    with snapshot.DataLoader2(below(), reading_service=service(0, logical_shards=2)) as loader:
        loader.seed(5)
        it = iter(loader)
        for _ in range(3):
            next(it)
        loader.save_snapshot(path)
    saved = SavedLayout.from_manifest(snapshot.schema.Manifest.from_dict(snapshot.read_manifest(path)))
    assert saved is not None
    text = plan_restore(saved, 1, 3).describe()
    assert "2 unit(s) of 2 logical shard(s) saved on 1 rank(s), in-process -> 1 rank(s) x 3 worker(s)" in text
    assert "the rest of the saved epoch runs as 6 unit(s): each saved unit u is split into 3 sub-shard(s)" in text
    assert "later epochs run as 6 sub-shard(s) of the 2 logical shard(s): the stream of a job started" in text
    kept = plan_restore(saved, 1, 2).describe()
    assert "the rest of the saved epoch runs as the saved 2 unit(s): the saved run's stream" in kept
    assert "as the saved run's did: the same stream" in kept


def test_a_graph_without_a_sharding_point_runs_whole_on_one_worker(tmp_path) -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    def graph() -> Any:
        return IterableWrapper(range(20)).shuffle(buffer_size=4)

    path = str(tmp_path / "data.snap")
    with snapshot.DataLoader2(graph(), reading_service=service(0)) as loader:
        loader.seed(1)
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        loader.save_snapshot(path)
        rest = list(it)
    with pytest.warns(UserWarning, match="no sharding point"):
        got = restored(graph, path, service(2), epochs=0)
    assert got["rest"] == rest and sorted(head + rest) == list(range(20))
