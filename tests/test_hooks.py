"""Every built-in hook yields exactly what torch's own pipe yields, and resumes exactly."""

from __future__ import annotations

import copy
import functools
import os

import pytest
from torch.utils.data.datapipes.datapipe import DataChunk
from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
    Grouper,
    IterableWrapper,
    Mapper,
    Multiplexer,
    RoutedDecoder,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)

import snapshot
from snapshot.graph import Graph
from snapshot.hooks import ResumableIterator, hook_for
from snapshot.testing import assert_resumes_exactly, first_difference
from tests import graphs
from tests.native import hooked_epochs, native_epochs

STRATEGIES = ("state", "auto", "fast_forward")


def add(a, b):
    return a + b


def first_even(a, b):
    return a % 2 == 0


def to_pair(x):
    return (x, -x)


def to_dict(x):
    return {"x": x, "y": x * 10}


def nested(x):
    return [[x, x + 1], [x + 2]]


def key_mod4(x):
    return x % 4


def route3(x):
    return x % 3


def route_or_drop(x):
    return None if x % 5 == 0 else x % 2


class Box(DataChunk):
    pass


# Each factory exercises one pipe with non-default arguments (module-level: picklable).
CASES = {
    "mapper_input_output_col": lambda: Mapper(Mapper(IterableWrapper(range(15)), to_pair), add,
                                              input_col=[0, 1], output_col=-1),
    "mapper_dict_col": lambda: Mapper(Mapper(IterableWrapper(range(9)), to_dict), graphs.double,
                                      input_col="y", output_col="z"),
    "collator_default": lambda: Collator(Batcher(IterableWrapper(range(13)), 4)),
    "filter_input_col": lambda: Filter(Mapper(IterableWrapper(range(20)), to_pair), first_even,
                                       input_col=[0, 1]),
    "shuffler_disabled": lambda: Shuffler(IterableWrapper(range(12)), buffer_size=3).set_shuffle(False),
    "shuffler_big_buffer": lambda: Shuffler(IterableWrapper(range(25)), buffer_size=100),
    "batcher_drop_last_wrapper": lambda: Batcher(IterableWrapper(range(17)), 4, drop_last=True,
                                                 wrapper_class=Box),
    "unbatcher_all_levels": lambda: UnBatcher(Mapper(IterableWrapper(range(8)), nested), unbatch_level=-1),
    "unbatcher_level_2": lambda: UnBatcher(Batcher(Mapper(IterableWrapper(range(8)), nested), 2),
                                           unbatch_level=2),
    "grouper_keep_key": lambda: Grouper(Shuffler(IterableWrapper(range(40)), buffer_size=9), key_mod4,
                                        keep_key=True, buffer_size=6, group_size=3,
                                        guaranteed_group_size=1),
    "grouper_drop_remaining": lambda: Grouper(IterableWrapper(range(33)), key_mod4, buffer_size=5,
                                              group_size=4, guaranteed_group_size=2, drop_remaining=True),
    "grouper_unbounded": lambda: Grouper(IterableWrapper(range(21)), route3),
    "sampler": lambda: Sampler(IterableWrapper(range(11))),
    "sharding_filter_2_of_3": lambda: _sharded(3, 2),
    "concater_three": lambda: Concater(IterableWrapper(range(3)), IterableWrapper([]), IterableWrapper(range(5))),
    "zipper_uneven": lambda: Zipper(IterableWrapper(range(7)), Shuffler(IterableWrapper(range(10)),
                                                                        buffer_size=4)),
    "multiplexer_uneven": lambda: Multiplexer(IterableWrapper(range(4)), IterableWrapper(range(10, 20)),
                                              IterableWrapper(range(20, 25))),
    "forker_deep_copy": lambda: Zipper(*Forker(Mapper(IterableWrapper(range(9)), to_dict), 2, copy="deep")),
    "forker_read_unevenly": lambda: _uneven_fork(),
    "demux_drop_none": lambda: Concater(*Demultiplexer(IterableWrapper(range(30)), 2, route_or_drop,
                                                       drop_none=True, buffer_size=-1)),
    "demux_three_mux": lambda: Multiplexer(*Demultiplexer(IterableWrapper(range(30)), 3, route3,
                                                          buffer_size=-1)),
}


def _sharded(count: int, me: int):
    dp = ShardingFilter(IterableWrapper(range(20)))
    dp.apply_sharding(count, me)
    return dp


def _uneven_fork():
    a, b = Forker(IterableWrapper(range(12)), 2, buffer_size=-1)
    return Zipper(a, Batcher(b, 2))


def _overflowing_fork():
    a, b = Forker(IterableWrapper(range(10)), 2, buffer_size=2)
    return Zipper(Batcher(a, 4), b)


def _ids(name):
    return name


@pytest.mark.parametrize("name", sorted(CASES), ids=_ids)
def test_hook_yields_what_torch_yields(name: str) -> None:
    factory = CASES[name]
    expected = native_epochs(factory, seed=3, epochs=2)
    got = hooked_epochs(factory, seed=3, epochs=2)
    for epoch, (want, have) in enumerate(zip(expected, got)):
        assert first_difference(want, have) is None, f"epoch {epoch}: {want} != {have}"
        assert [type(x) for x in want] == [type(x) for x in have]


@pytest.mark.parametrize("name", sorted(CASES), ids=_ids)
def test_hook_resumes_exactly(name: str) -> None:
    assert_resumes_exactly(CASES[name], epochs=2, strategies=STRATEGIES, via_file=False)


def test_every_builtin_node_is_restored_from_state(data_dir: str) -> None:
    factories = [*CASES.values(), graphs.linear, graphs.combining, graphs.grouped, graphs.collate_unbatch,
                 graphs.sampled, graphs.sharded, functools.partial(graphs.files, data_dir)]
    for factory in factories:
        for node in Graph(factory()):
            hook = hook_for(node.datapipe)
            assert hook is not None and hook.iterator is not None, node.signature


def files_graph(root: str, chunk: int | None):
    return StreamReader(FileOpener(FileLister(root, "*.txt", recursive=True), mode="b"), chunk=chunk)


@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_file_pipes_yield_what_torch_yields(data_dir: str, chunk) -> None:
    os.makedirs(os.path.join(data_dir, "sub"))
    with open(os.path.join(data_dir, "sub", "z.txt"), "w") as f:
        f.write("nested file\n")
    factory = functools.partial(files_graph, data_dir, chunk)
    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=2, strategies=STRATEGIES)


def test_text_mode_stream_reader_resumes(data_dir: str) -> None:
    def factory():
        return StreamReader(FileOpener(FileLister(data_dir, "*.txt"), mode="t"), chunk=3)

    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=1, strategies=STRATEGIES)


def test_routed_decoder(data_dir: str) -> None:
    factory = functools.partial(graphs.files, data_dir)
    assert first_difference(native_epochs(factory)[1], hooked_epochs(factory)[1]) is None
    decoded = lambda: RoutedDecoder(FileOpener(FileLister(data_dir, "*.json"), mode="b"))  # noqa: E731
    assert native_epochs(decoded, epochs=1) == hooked_epochs(decoded, epochs=1)


def test_stream_reader_without_a_file_opener_is_replayed(data_dir: str) -> None:
    from snapshot.restore import RestoreStrategy, make_plan

    graph = Graph(StreamReader(Mapper(FileOpener(FileLister(data_dir, "*.txt"), mode="b"), graphs._identity)))
    plan = make_plan(graph, {"0": 3}, RestoreStrategy.AUTO)
    assert "FileOpener" in plan.reasons["0"]
    assert plan.drivers == (("0", 3),)


@pytest.mark.parametrize("exc_case", ["forker_overflow", "demux_bad_class", "unbatch_too_deep", "grouper_fails"])
def test_errors_are_raised_at_the_same_sample(exc_case: str) -> None:
    factory = {
        "forker_overflow": lambda: _overflowing_fork(),
        "demux_bad_class": lambda: Demultiplexer(IterableWrapper(range(10)), 2, route3, buffer_size=-1)[0],
        "unbatch_too_deep": lambda: UnBatcher(Batcher(IterableWrapper(range(5)), 2), unbatch_level=3),
        "grouper_fails": lambda: Grouper(IterableWrapper(range(20)), key_mod4, buffer_size=3, group_size=3),
    }[exc_case]

    def collect(it):
        got = []
        try:
            for x in it:
                got.append(x)
        except Exception as exc:  # noqa: BLE001
            return got, type(exc)
        return got, None

    native = collect(factory())
    dl = snapshot.DataLoader2(factory())
    ours = collect(dl)
    assert native[1] is not None
    assert ours == native


def test_errors_name_the_node() -> None:
    def boom(x):
        if x == 3:
            raise KeyError("bad sample")
        return x

    dl = snapshot.DataLoader2(Batcher(Mapper(IterableWrapper(range(10)), boom), 2))
    with pytest.raises(KeyError) as info:
        list(dl)
    assert "raised by the DataPipe at 0/datapipe (MapperIterDataPipe)" in "\n".join(info.value.__notes__)


def test_subclass_that_keeps_the_iteration_inherits_the_hook() -> None:
    class Tagged(Mapper):
        pass

    class Custom(Mapper):
        def __iter__(self):
            for x in self.datapipe:
                yield self.fn(x) + 1

    assert hook_for(Tagged(IterableWrapper([1]), graphs.double)) is not None
    assert hook_for(Custom(IterableWrapper([1]), graphs.double)) is None


def test_hook_objects_are_fresh_per_epoch_and_do_not_touch_the_graph() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    before = copy.copy(vars(dl.datapipe))
    list(dl)
    list(dl)
    after = vars(dl.datapipe)
    assert set(before) == set(after)
    for node in Graph(dl.datapipe):
        assert not isinstance(getattr(node.datapipe, "_fast_forward_iterator", None), ResumableIterator) \
            or node.path != "0"
