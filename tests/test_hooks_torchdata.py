"""torchdata 0.9's most used pipes: same stream as the originals, exact resume."""

from __future__ import annotations

import functools

import pytest

td = pytest.importorskip("torchdata.datapipes.iter")

from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Shuffler  # noqa: E402
from torch.utils.data.datapipes.map import SequenceWrapper  # noqa: E402

import snapshot  # noqa: E402
from snapshot.graph import Graph  # noqa: E402
from snapshot.hooks import hook_for  # noqa: E402
from snapshot.testing import assert_resumes_exactly, first_difference  # noqa: E402
from tests import graphs  # noqa: E402
from tests.native import hooked_epochs, native_epochs  # noqa: E402

STRATEGIES = ("state", "auto", "fast_forward")


def explode(x):
    return [x] * (x % 3)


def batch_fn(batch):
    return [sum(batch), len(batch)]


def row(x):
    return {"v": x}


def triple(x):
    return (x, -x, 10 * x)


def _unzip():
    a, b, c = td.UnZipper(td.Mapper(Shuffler(IterableWrapper(range(9)), buffer_size=3), triple), 3, buffer_size=-1)
    return td.Zipper(c, a, b)


def _round_robin_demux():
    first, second = td.RoundRobinDemultiplexer(IterableWrapper(range(11)), 2, buffer_size=-1)
    return td.Concater(second, first)


def _sample_multiplexer():
    pipes = {IterableWrapper(range(8)): 0.5, IterableWrapper(range(100, 104)): 0.3, IterableWrapper("xyz"): 0.2}
    return td.SampleMultiplexer(pipes, seed=9)


CASES = {
    "header": lambda: td.Header(Shuffler(IterableWrapper(range(30)), buffer_size=5), limit=11),
    "header_longer_than_source": lambda: td.Header(IterableWrapper(range(4)), limit=10),
    "cycler": lambda: td.Cycler(IterableWrapper(range(5)), count=3),
    "repeater": lambda: td.Repeater(IterableWrapper(range(6)), times=3),
    "enumerator": lambda: td.Enumerator(Shuffler(IterableWrapper(range(9)), buffer_size=3), starting_index=5),
    "index_adder": lambda: td.IndexAdder(td.Mapper(IterableWrapper(range(7)), row), index_name="i"),
    "map_to_iter": lambda: SequenceWrapper(list(range(10, 20))).to_iter_datapipe(),
    "flatmap": lambda: td.FlatMapper(IterableWrapper(range(10)), explode),
    "batch_mapper": lambda: td.BatchMapper(IterableWrapper(range(11)), batch_fn, batch_size=4),
    "in_batch_shuffle": lambda: td.InBatchShuffler(Batcher(IterableWrapper(range(20)), 5)),
    "prefetch": lambda: td.Prefetcher(Batcher(IterableWrapper(range(20)), 3), buffer_size=4),
    "mux_longest": lambda: td.MultiplexerLongest(IterableWrapper(range(3)), IterableWrapper(range(10, 16))),
    "zip_longest": lambda: td.ZipperLongest(IterableWrapper(range(3)), IterableWrapper(range(5)), fill_value=-1),
    "unzip": _unzip,
    "round_robin_demux": _round_robin_demux,
    "bucketbatch": lambda: td.BucketBatcher(IterableWrapper(range(23)), batch_size=3, batch_num=2, bucket_num=2),
    "bucketbatch_sorted": lambda: td.BucketBatcher(IterableWrapper(range(23)), batch_size=3, batch_num=2,
                                                   bucket_num=2, use_in_batch_shuffle=False, sort_key=sorted),
    "sample_multiplexer": _sample_multiplexer,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_stream_as_torchdata(name: str) -> None:
    factory = CASES[name]
    for want, have in zip(native_epochs(factory, seed=5), hooked_epochs(factory, seed=5)):
        assert first_difference(want, have) is None, (want, have)


@pytest.mark.parametrize("name", sorted(CASES))
def test_resumes_exactly(name: str) -> None:
    assert_resumes_exactly(CASES[name], epochs=2, strategies=STRATEGIES, via_file=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_restored_from_state(name: str) -> None:
    for node in Graph(CASES[name]()):
        if isinstance(node.datapipe, snapshot.DataLoader2.__mro__[0]):
            continue
        if hasattr(node.datapipe, "__getitem__") and not hasattr(node.datapipe, "__iter__"):
            continue  # map-style source
        if type(node.datapipe).__name__.endswith("MapDataPipe"):
            continue
        assert hook_for(node.datapipe) is not None, node.signature


def cached(n: int = 12):
    return td.InMemoryCacheHolder(Shuffler(IterableWrapper(range(n)), buffer_size=4))


def test_in_memory_cache_serves_later_epochs_from_its_cache() -> None:
    expected = native_epochs(cached, seed=1, epochs=3)
    assert expected[1] == expected[0] == expected[2]  # the cache freezes the first epoch's order
    assert hooked_epochs(cached, seed=1, epochs=3) == expected
    assert_resumes_exactly(cached, epochs=3, strategies=STRATEGIES, via_file=False)


def write_lines(root: str) -> str:
    for i in range(4):
        with open(f"{root}/f{i}.txt", "w") as f:
            f.write("".join(f"file {i} line {j}\n" for j in range(i + 2)))
    return root


def read_lines(root: str):
    return td.LineReader(td.FileOpener(td.FileLister(root, "*.txt"), mode="b"), decode=True)


def test_line_reader(tmp_path) -> None:
    factory = functools.partial(read_lines, write_lines(str(tmp_path)))
    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=2, strategies=STRATEGIES)


def test_cycler_over_a_generator_pipe_is_replayed() -> None:
    factory = functools.partial(lambda: td.Cycler(graphs.Squares(IterableWrapper(range(6))), count=2))
    assert_resumes_exactly(factory, epochs=1, strategies=("auto", "fast_forward"), via_file=False)
