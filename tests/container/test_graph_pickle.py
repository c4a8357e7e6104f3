"""The graph's pickle keeps random generators compact (snapshot/container/_reducers.py): what it
unpickles is what the stock pickle gives, state for state, without seeding a generator from the OS;
a snapshot's graph still loads in another process and resumes exactly."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper, Shuffler

import snapshot
from snapshot.container import _reducers, _serialization


def _double(x: int) -> int:
    return 2 * x


def _used_shuffle() -> Any:
    """A shuffle whose generator has drawn (a ``gauss_next`` pending too) and whose pipe has run."""
    graph = IterableWrapper(range(50)).shuffle(buffer_size=7).map(_double)
    graph.datapipe._rng.random()
    graph.datapipe._rng.gauss(0.0, 1.0)
    return graph


def _same(copy: Any, stock: Any) -> None:
    """``copy`` is what the stock pickle made of the same graph: same attributes, generators in the same state."""
    assert type(copy) is type(stock)
    assert sorted(vars(copy)) == sorted(vars(stock))
    for name, value in vars(stock).items():
        if isinstance(value, IterDataPipe):
            _same(vars(copy)[name], value)
        elif isinstance(value, random.Random):
            assert type(vars(copy)[name]) is random.Random
            assert vars(copy)[name].getstate() == value.getstate()
        elif name != "fn":
            assert vars(copy)[name] == value, name


@pytest.mark.parametrize("forget", [False, True], ids=["same process", "unpacked again"])
def test_a_shuffle_unpickles_as_the_stock_pickle_gives_it(forget: bool) -> None:
    graph = _used_shuffle()
    data = _serialization.dumps_graph(graph)
    if forget:  # as in another process: the words come from the bytes
        _reducers._UNPACKED.clear()
    copy = _serialization.loads_graph(data)
    stock = pickle.loads(pickle.dumps(graph))
    _same(copy, stock)
    assert copy.datapipe._rng is not graph.datapipe._rng


def test_a_restored_shuffle_iterated_by_torch_draws_from_the_copied_generator() -> None:
    """torch skips the reseed of a pipe it restored itself: the copy's generator state is what it draws from."""
    from torch.utils.data.datapipes._hook_iterator import _SnapshotState

    graph = IterableWrapper(range(30)).shuffle(buffer_size=5)
    graph._rng.random()
    copy = _serialization.loads_graph(_serialization.dumps_graph(graph))
    stock = pickle.loads(pickle.dumps(graph))
    streams = []
    for pipe in (copy, stock):
        pipe._snapshot_state = _SnapshotState.Restored  # not pickled: torch sets it as it restores
        streams.append(list(pipe))
    assert streams[0] == streams[1] != list(range(30))


def test_the_generators_state_is_pickled_as_bytes_and_unpickled_without_seeding_from_the_os(monkeypatch) -> None:
    graph = _used_shuffle()
    data = _serialization.dumps_graph(graph)
    unshuffled = _serialization.dumps_graph(IterableWrapper(range(50)).map(_double))
    # 624 words of 32 bits and the index in 2,500 bytes (as ints, the stock pickle takes about 3,100 more)
    assert len(data) - len(unshuffled) < 2_500 + 400
    seeded: list[Any] = []
    original = random.Random.seed

    def seed(self: random.Random, *args: Any, **kwargs: Any) -> None:
        seeded.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(random.Random, "seed", seed)
    _serialization.loads_graph(data)
    assert seeded == []  # torch's __setstate__ makes random.Random(), seeded from the OS, then overwrites it


def test_a_generator_in_a_pipes_arguments_is_compact_too() -> None:
    rng = random.Random(5)
    rng.gauss(0.0, 1.0)
    graph = IterableWrapper([rng, random.Random(6)])
    data = _serialization.dumps_graph(graph)
    assert b"random_from_bytes" in data
    copy = _serialization.loads_graph(data)
    assert [r.getstate() for r in copy.iterable] == [rng.getstate(), random.Random(6).getstate()]


class _OwnShuffler(Shuffler):
    """A subclass with state of its own: it keeps the stock pickle."""

    def __init__(self, datapipe: Any) -> None:
        super().__init__(datapipe, buffer_size=3)
        self.extra = [1, 2]

    def __getstate__(self) -> Any:
        return (super().__getstate__(), self.extra)

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state[0])
        self.extra = state[1]


def test_subclasses_and_torchs_own_hooks_keep_the_stock_pickle() -> None:
    own = _OwnShuffler(IterableWrapper(range(9)))
    data = _serialization.dumps_graph(own)
    assert b"set_shuffler_state" not in data
    copy = _serialization.loads_graph(data)
    assert copy.extra == [1, 2] and copy._rng.getstate() == own._rng.getstate()

    graph = IterableWrapper(range(9)).shuffle()
    IterDataPipe.set_getstate_hook(lambda state: state)
    try:
        data = _serialization.dumps_graph(graph)
    finally:
        IterDataPipe.set_getstate_hook(None)
    assert b"set_shuffler_state" not in data
    assert _serialization.loads_graph(data)._rng.getstate() == graph._rng.getstate()


def test_a_graph_pickled_with_dill_keeps_its_generators_compact() -> None:
    graph = IterableWrapper(range(20)).shuffle(buffer_size=4).map(lambda x: x + 1)
    data = _serialization.dumps_graph(graph)
    assert data[:1] == b"D" and b"set_shuffler_state" in data
    copy = _serialization.loads_graph(data)
    assert copy.datapipe._rng.getstate() == graph.datapipe._rng.getstate()


_RESTORE = """
import sys, snapshot
dl = snapshot.DataLoader2.from_snapshot(sys.argv[1])
print(list(dl))
"""


def test_a_snapshots_graph_resumes_exactly_in_another_process(tmp_path: Path) -> None:
    def build() -> Any:
        return IterableWrapper(range(40)).shuffle(buffer_size=6).map(_double)

    uninterrupted = snapshot.DataLoader2(build())
    uninterrupted.seed(4)
    expected = list(uninterrupted)
    loader = snapshot.DataLoader2(build())
    loader.seed(4)
    it = iter(loader)
    head = [next(it) for _ in range(13)]
    loader.save_snapshot(tmp_path / "a.snap")
    loader.shutdown()
    out = subprocess.run([sys.executable, "-c", _RESTORE, str(tmp_path / "a.snap")], capture_output=True,
                         text=True, timeout=120, check=True, cwd=Path(__file__).parents[2])
    assert head + eval(out.stdout) == expected
