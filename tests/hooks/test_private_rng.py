"""Pipes with a generator of their own: torchdata 0.9's ``SampleMultiplexer`` resumes exactly
(in-process, with workers, onto other worker counts, at and just after the end of an epoch);
pipes whose generator cannot be put back are refused; a replay that ends elsewhere is refused."""

from __future__ import annotations

import functools
import io
from typing import Any

import pytest

td = pytest.importorskip("torchdata.datapipes.iter")

from torch.utils.data import RandomSampler  # noqa: E402
from torch.utils.data.datapipes.iter import IterableWrapper, Sampler, ShardingFilter, Shuffler  # noqa: E402

import snapshot  # noqa: E402
from snapshot.errors import RestoreError  # noqa: E402
from snapshot.testing import Cut, assert_resumes_exactly  # noqa: E402
from tests import graphs  # noqa: E402
from tests.native import hooked_epochs, native_epochs  # noqa: E402


def mux(seed: int | None = 11, n: int = 12) -> Any:
    """Three inputs of different lengths: the weights are renormalized twice per epoch."""
    a = IterableWrapper(range(n))
    b = graphs.Squares(IterableWrapper(range(100, 100 + n // 2)))  # hookless: replayed by "auto"
    c = Shuffler(IterableWrapper(range(200, 203)), buffer_size=2)
    return td.SampleMultiplexer({a: 0.5, b: 0.3, c: 0.2}, seed=seed)


def sharded_mux(n: int = 16, seeded: bool = True) -> Any:
    """A multiplexer below the sharding point (one copy per logical shard) and one above it."""
    above = td.SampleMultiplexer({IterableWrapper(range(n)): 0.7, IterableWrapper(range(50, 56)): 0.3},
                                 seed=3 if seeded else None)
    below = ShardingFilter(Shuffler(above, buffer_size=4))
    return td.SampleMultiplexer({below: 0.6, IterableWrapper(range(900, 905)): 0.4}, seed=5 if seeded else None)


def workers(n: int, shards: int | None = None) -> Any:
    return snapshot.MultiProcessingReadingService(num_workers=n, logical_shards=shards)


def every_cut(length: int) -> list[Cut]:
    """Every position of the first epoch, its end before and after StopIteration, and the next."""
    return [*(Cut(0, i) for i in range(length + 1)), Cut(0, length, finished=True),
            Cut(1, 0), Cut(1, 1), Cut(1, length // 2)]


def test_same_stream_as_torchdata_across_epochs() -> None:
    expected = native_epochs(mux, epochs=3)
    assert expected[0] != expected[1]  # the pipe's generator carries over from epoch to epoch
    assert hooked_epochs(mux, epochs=3) == expected


def test_resumes_exactly_at_every_cut_in_process() -> None:
    length = len(hooked_epochs(mux, epochs=1)[0])
    assert_resumes_exactly(mux, epochs=3, cuts=every_cut(length), strategies=("auto", "fast_forward"),
                           via_file=False)


def test_resumes_exactly_with_workers_and_onto_other_worker_counts() -> None:
    two = functools.partial(workers, 2)
    length = len(hooked_epochs(sharded_mux, epochs=1)[0])
    cuts = [Cut(0, 3), Cut(0, length - 1), Cut(0, length), Cut(0, length, finished=True), Cut(1, 2)]
    assert_resumes_exactly(sharded_mux, reading_service=two, epochs=2, cuts=cuts, strategies=("auto", "fast_forward"))
    for target in (None, functools.partial(workers, 1)):
        in_process = snapshot.InProcessReadingService
        assert_resumes_exactly(sharded_mux, reading_service=two, restore_service=target or in_process,
                               epochs=2, cuts=cuts[1:4])
    # four logical shards on 2 workers, restored onto 4 workers and onto 3
    for count in (4, 3):
        assert_resumes_exactly(sharded_mux, reading_service=functools.partial(workers, 2, 4),
                               restore_service=functools.partial(workers, count), epochs=2, cuts=cuts[1:4])


def _continuation(loader: Any, epochs: int) -> list[list[Any]]:
    return [list(loader) for _ in range(epochs)]


@pytest.mark.parametrize("strategy", ["auto", "fast_forward"])
def test_unseeded_multiplexer_restores_the_saved_run(strategy: str) -> None:
    """Without seed= the run is random (as in 0.9); its snapshot still restores that run."""
    for cut in (5, 10):
        with snapshot.DataLoader2(mux(seed=None)) as loader:
            loader.seed(1)
            it = iter(loader)
            head = [next(it) for _ in range(cut)]
            data = loader.save_snapshot().to_bytes()
            expected = [list(it), list(loader)]
        with snapshot.DataLoader2(mux(seed=None)) as fresh:  # another generator, from the OS
            fresh.restore_snapshot(io.BytesIO(data), strategy=strategy)
            assert _continuation(fresh, 2) == expected, head


@pytest.mark.parametrize("service", [None, 2], ids=["in_process", "2_workers"])
def test_unseeded_multiplexers_after_the_end_of_an_epoch(service: int | None) -> None:
    def loader_of() -> Any:
        reading = workers(service) if service else None
        return snapshot.DataLoader2(sharded_mux(seeded=False), reading_service=reading)

    for cut in (7, None):  # inside the epoch, and after its StopIteration
        with loader_of() as loader:
            loader.seed(1)
            it = iter(loader)
            for _ in range(cut or 10**9):
                if next(it, None) is None:
                    break
            data = loader.save_snapshot().to_bytes()
            expected = ([list(it)] if cut else []) + _continuation(loader, 2)
        with loader_of() as fresh:
            fresh.restore_snapshot(io.BytesIO(data))
            assert _continuation(fresh, 3 if cut else 2) == expected


def shuffled_flatmap() -> Any:
    return td.ShuffledFlatMapper(IterableWrapper(range(12)), _spread, buffer_size=3)


def _spread(x: int) -> list[int]:
    return [x, x + 100]


def test_a_hookless_pipe_seeded_by_the_loader_is_replayed_exactly() -> None:
    """torchdata 0.9's shuffled_flatmap takes its seed from the loader each epoch (set_seed)."""
    assert native_epochs(shuffled_flatmap) == hooked_epochs(shuffled_flatmap)
    assert_resumes_exactly(shuffled_flatmap, epochs=2, strategies=("auto",), via_file=False)


def unseeded_split() -> Any:
    train, _ = IterableWrapper(range(10)).random_split(weights={"a": 0.5, "b": 0.5}, seed=None, total_length=10)
    return train


def seeded_split() -> Any:
    train, _ = IterableWrapper(range(10)).random_split(weights={"a": 0.5, "b": 0.5}, seed=4, total_length=10)
    return train


def random_sampler() -> Any:
    return Sampler(IterableWrapper(range(10)), sampler=RandomSampler)


@pytest.mark.parametrize("factory", [unseeded_split, random_sampler], ids=["random_split", "random_sampler"])
def test_pipes_that_cannot_be_put_back_are_refused(factory: Any) -> None:
    with snapshot.DataLoader2(factory()) as loader:
        next(iter(loader))
        with pytest.raises(RestoreError, match="cannot be snapshotted exactly") as info:
            loader.save_snapshot()
    assert "0" in str(info.value) and ("seed=" in str(info.value) or "sampler" in str(info.value))


def test_seeded_random_split_is_replayed_exactly() -> None:
    assert_resumes_exactly(seeded_split, epochs=2, strategies=("auto",), via_file=False)


def _tampered(factory: Any, edit: Any, cut: int = 4) -> snapshot.Snapshot:
    with snapshot.DataLoader2(factory()) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(cut):
            next(it)
        snap = loader.save_snapshot()
    edit(snap.state["service"]["shards"][0]["nodes"])  # the decoded state the restore takes
    return snap


def _restore(factory: Any, snap: snapshot.Snapshot, strategy: str) -> None:
    with snapshot.DataLoader2(factory()) as loader:
        loader.restore_snapshot(snap, strategy=strategy)


def test_a_replay_whose_generator_ends_elsewhere_is_refused() -> None:
    def other_rng(nodes: dict[str, Any]) -> None:
        nodes["0"]["state"]["rng"][1][5] ^= 1  # as if the saved run had drawn differently

    snap = _tampered(mux, other_rng)
    with pytest.raises(RestoreError, match=r"(?s)did not reproduce.*0 \(SampleMultiplexer.*rng differ"):
        _restore(mux, snap, "fast_forward")


def test_a_replay_that_ends_its_epoch_elsewhere_is_refused() -> None:
    def ended(nodes: dict[str, Any]) -> None:
        nodes["0/pipes_and_weights/1/0/datapipe"]["exhausted"] = True  # the source the Squares pipe reads

    snap = _tampered(mux, ended, cut=3)
    with pytest.raises(RestoreError, match="end of its epoch"):
        _restore(mux, snap, "auto")
