"""The rest of torchdata 0.9's DataLoader2 surface, with 0.9's behaviour.

Graph utilities (``snapshot.graph``), a reading service that implements only ``initialize``,
``DataLoader2Iterator.limit()`` / ``resume()`` and attribute forwarding, the private
``_pause`` / ``_resume`` / ``_limit``, ``SeedGenerator()`` without a seed, the 0.9 attributes
and arguments of ``MultiProcessingReadingService``, and the text of a worker's exception.
Pausing and limiting must not change the stream, and a snapshot taken while stopped must
restore exactly.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import (
    Demultiplexer,
    IterableWrapper,
    Mapper,
    ShardingFilter,
    Shuffler,
    UnBatcher,
    Zipper,
)

import snapshot
from snapshot.graph import (
    find_dps,
    list_dps,
    remove_dp,
    replace_dp,
    set_datapipes_seed,
    set_graph_random_seed,
    traverse_dps,
)
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.testing import first_difference
from tests import graphs

# -- graph utilities --------------------------------------------------------------------------


def _pair(x: int) -> list[int]:
    return [x, x + 100]


def _odd(x: int) -> int:
    return x % 2


def _triple(x: int) -> int:
    return 3 * x


class Wrap(IterDataPipe):
    def __init__(self, datapipe: Any) -> None:
        self.datapipe = datapipe

    def __iter__(self) -> Any:
        yield from self.datapipe


def diamond() -> dict[str, Any]:
    """source -> map -> unbatch -> demux(2) -> (map on the first child) zip (second child)."""
    source = IterableWrapper(range(6))
    pairs = Mapper(source, _pair)
    flat = UnBatcher(pairs)
    first, second = Demultiplexer(flat, 2, _odd)
    tripled = Mapper(first, _triple)
    sink = Zipper(tripled, second)
    return {"source": source, "pairs": pairs, "flat": flat, "container": first.main_datapipe,
            "first": first, "second": second, "tripled": tripled, "sink": sink}


def shape(datapipe: Any) -> list[Any]:
    """The graph as nested ``[pipe, [inputs...]]`` lists, comparable by identity."""
    def walk(graph: dict[int, Any]) -> list[Any]:
        return [(dp, walk(inputs)) for dp, inputs in graph.values()]
    return walk(traverse_dps(datapipe))


def test_snapshot_graph_has_every_name_of_torchdata_0_9_graph_module() -> None:
    import snapshot.graph

    names = {"DataPipe", "DataPipeGraph", "find_dps", "list_dps", "remove_dp", "replace_dp",
             "set_datapipes_seed", "set_graph_random_seed", "traverse_dps"}
    assert names <= set(snapshot.graph.__all__)
    assert all(hasattr(snapshot.graph, name) for name in names)


def test_list_dps_is_breadth_first_and_excludes_whole_branches() -> None:
    d = diamond()
    graph = traverse_dps(d["sink"])
    order = [d[k] for k in ("sink", "tripled", "second", "first", "container", "flat", "pairs", "source")]
    assert list_dps(graph) == order
    assert list_dps(graph, exclude_dps=d["pairs"]) == order[:-2]
    assert list_dps(graph, exclude_dps=d["tripled"]) == [d["sink"], d["second"]]
    assert list_dps(graph, exclude_dps=[d["pairs"], d["tripled"]]) == [d["sink"], d["second"]]


def test_find_dps_matches_the_exact_type_only() -> None:
    d = diamond()
    found = find_dps(traverse_dps(d["sink"]), Mapper)
    assert found == [d["tripled"], d["pairs"]]
    assert find_dps(traverse_dps(d["sink"]), IterDataPipe) == []


def test_replace_dp_rewires_every_consumer_and_can_wrap_the_old_pipe() -> None:
    d = diamond()
    expected = list(diamond()["sink"])
    wrapper = Wrap(d["pairs"])
    graph = replace_dp(traverse_dps(d["sink"]), d["pairs"], wrapper)
    assert d["flat"].datapipe is wrapper and wrapper.datapipe is d["pairs"]
    assert list(graph) == [id(d["sink"])]
    assert list(d["sink"]) == expected  # runs through the wrapper, same items

    replacement = IterableWrapper([7, 8])
    graph = replace_dp(graph, d["pairs"], replacement)
    assert wrapper.datapipe is replacement
    sink_wrapper = Wrap(d["sink"])
    graph = replace_dp(graph, d["sink"], sink_wrapper)  # replacing the sink: the new one is the sink
    assert list(graph) == [id(sink_wrapper)] and sink_wrapper.datapipe is d["sink"]


def test_replace_dp_reaches_pipes_held_in_lists_and_tuples() -> None:
    d = diamond()
    new = IterableWrapper(range(3))
    replace_dp(traverse_dps(d["sink"]), d["second"], new)
    assert d["sink"].datapipes == (d["tripled"], new)


def test_remove_dp_links_consumers_to_its_input_and_refuses_sources_and_joins() -> None:
    d = diamond()
    graph = remove_dp(traverse_dps(d["sink"]), d["pairs"])
    assert d["flat"].datapipe is d["source"]
    graph = remove_dp(graph, d["tripled"])
    assert d["sink"].datapipes[0] is d["first"]
    assert shape(d["sink"])[0][0] is d["sink"]
    with pytest.raises(RuntimeError, match="Cannot remove the source DataPipe"):
        remove_dp(graph, d["source"])
    with pytest.raises(RuntimeError, match="Cannot remove the receiving DataPipe"):
        remove_dp(graph, d["sink"])


def _seeded_graph(worker: int, seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    top = Shuffler(IterableWrapper(range(50)))
    a, b, c = top.fork(3)
    b = Shuffler(b)
    c = Shuffler(c)
    sink = Shuffler(Zipper(ShardingFilter(a), b, ShardingFilter(c)))
    set_graph_random_seed(sink, snapshot.SeedGenerator(seed).spawn(worker))
    return (top._seed, c._seed), (b._seed, sink._seed)


def test_set_graph_random_seed_shares_seeds_above_the_sharding_filter_only() -> None:
    shared0, own0 = _seeded_graph(0, 123)
    shared1, own1 = _seeded_graph(1, 123)
    assert shared0 == shared1 and own0 != own1
    assert _seeded_graph(0, 123) == (shared0, own0)
    shared_other, own_other = _seeded_graph(0, 321)
    assert shared_other != shared0 and own_other != own0


def test_set_datapipes_seed_draws_from_the_stream_asked_for() -> None:
    pipes = [Shuffler(IterableWrapper(range(5))), IterableWrapper(range(3)), Shuffler(IterableWrapper(range(5)))]
    set_datapipes_seed(pipes, snapshot.SeedGenerator(9), distributed_shared=True)
    reference = snapshot.SeedGenerator(9)
    assert [pipes[0]._seed, pipes[2]._seed] == [reference.generate_shared_seed(), reference.generate_shared_seed()]
    set_datapipes_seed(pipes, snapshot.SeedGenerator(9), distributed_shared=False)
    reference = snapshot.SeedGenerator(9)
    assert [pipes[0]._seed, pipes[2]._seed] == [reference.generate_seed(), reference.generate_seed()]


# -- a reading service written for 0.9 ---------------------------------------------------------


class _Iterating:
    def __init__(self, datapipe: Any) -> None:
        self.datapipe = datapipe

    def __iter__(self) -> Any:
        self.it = iter(self.datapipe)
        return self

    def __next__(self) -> Any:
        return next(self.it)

    def answer(self) -> int:
        return 42


class InitializeOnly(snapshot.ReadingServiceInterface):
    def initialize(self, datapipe: Any) -> Any:
        return _Iterating(datapipe)


def test_a_service_implementing_only_initialize_runs_and_forwards_attributes() -> None:
    loader = snapshot.DataLoader2(IterableWrapper(range(5)), reading_service=InitializeOnly())
    assert list(loader) == list(range(5)) and list(loader) == list(range(5))
    it = iter(loader)
    assert it.answer() == 42  # looked up on the service's iterator, as in 0.9
    with pytest.raises(AttributeError, match="no_such_name"):
        it.no_such_name  # noqa: B018


def test_a_service_without_checkpoint_refuses_a_snapshot_clearly() -> None:
    loader = snapshot.DataLoader2(IterableWrapper(range(5)), reading_service=InitializeOnly())
    loader.save_snapshot()  # before the first epoch there is nothing to ask the service
    next(iter(loader))
    with pytest.raises(snapshot.SnapshotError, match=r"InitializeOnly: it does not implement checkpoint\(\)"):
        loader.state_dict()
    with pytest.raises(snapshot.SnapshotError, match="restore"):
        InitializeOnly().restore(IterableWrapper([]), {})


# -- limit, resume, pause ----------------------------------------------------------------------

SERVICES = {
    "in_process": lambda: snapshot.InProcessReadingService(),
    "workers_2": lambda: Workers(2),
}


def _uninterrupted(service: str, seed: int = 5) -> list[list[Any]]:
    with snapshot.DataLoader2(graphs.sharded(), reading_service=SERVICES[service]()) as loader:
        loader.seed(seed)
        return [list(loader), list(loader)]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_limit_stops_after_n_samples_without_changing_the_stream(service: str) -> None:
    reference = _uninterrupted(service)
    with snapshot.DataLoader2(graphs.sharded(), reading_service=SERVICES[service]()) as loader:
        loader.seed(5)
        it = iter(loader)
        it.limit(4)
        chunks = [list(it)]
        with pytest.raises(StopIteration):
            next(it)  # stays stopped until resume()
        it.resume()
        chunks.append(list(it))  # the limit persists
        it.limit(None)
        it.resume()
        chunks.append(list(it))
        next_epoch = list(loader)
    assert [len(c) for c in chunks[:2]] == [4, 4]
    assert sum(chunks, []) == reference[0]
    assert next_epoch == reference[1]


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("cut", [0, 3, 16, 17])  # start, middle, the epoch's last sample, its end
def test_a_snapshot_taken_while_limited_restores_exactly(service: str, cut: int) -> None:
    reference = _uninterrupted(service)
    assert len(reference[0]) == 17
    with snapshot.DataLoader2(graphs.sharded(), reading_service=SERVICES[service]()) as loader:
        loader.seed(5)
        it = iter(loader)
        it.limit(cut)
        before = list(it) if cut else [next(it)]
        if not cut:  # limit(0) stops after every sample, as in 0.9
            assert list(it) == []
        snap = loader.save_snapshot()
        it.limit(None)
        it.resume()
        after = list(it) + list(loader)  # a run that saved yields the same stream as one that did not
    assert before + after == reference[0] + reference[1]
    for other in {service, "in_process"}:  # onto the same service, and in-process
        with snapshot.DataLoader2.from_snapshot(snap, reading_service=SERVICES[other]()) as restored:
            got = list(restored) + list(restored)
        assert first_difference(got, after) is None, other


def test_pause_stops_the_iteration_and_resume_continues_it() -> None:
    reference = _uninterrupted("workers_2")
    with snapshot.DataLoader2(graphs.sharded(), reading_service=Workers(2)) as loader:
        loader.seed(5)
        got = []
        for i, batch in enumerate(loader):
            got.append(batch)
            if i == 2:
                loader._pause()
        assert len(got) == 3
        snap = loader.save_snapshot()
        loader._resume()
        it = iter(loader)  # 0.9: a new iter() after a stop starts the next epoch
        assert list(it) == reference[1]
    with snapshot.DataLoader2.from_snapshot(snap) as restored:
        assert list(restored) == reference[0][3:]


def test_pause_then_resume_at_once_changes_nothing_and_resume_warns_when_not_paused() -> None:
    reference = _uninterrupted("in_process")
    with snapshot.DataLoader2(graphs.sharded(), reading_service=snapshot.InProcessReadingService()) as loader:
        loader.seed(5)
        got = []
        for i, batch in enumerate(loader):
            got.append(batch)
            if i in (2, 15):
                loader._pause()
                loader._resume()
        assert got == reference[0]
        with pytest.warns(UserWarning, match="not paused"):
            loader._resume()
        loader._limit(2)
        it = iter(loader)
        assert len(list(it)) == 2 and it.limit_threshold == 2 and it.limit_counter == 0


# -- SeedGenerator -----------------------------------------------------------------------------


def test_seed_generator_works_without_a_seed_and_reseeds() -> None:
    unseeded = snapshot.SeedGenerator()
    assert 0 <= unseeded.generate_seed() < 2**64
    sg = snapshot.SeedGenerator(123)
    first = [sg.generate_seed() for _ in range(4)]
    sg.seed(123)
    assert [sg.generate_seed() for _ in range(4)] == first
    sg.seed(321)
    assert [sg.generate_seed() for _ in range(4)] != first
    with pytest.raises(ValueError, match="uint64"):
        sg.seed(2**64)


def test_seed_generator_spawn_shares_the_shared_stream_only() -> None:
    sg = snapshot.SeedGenerator(123)
    one, two = sg.spawn(1), sg.spawn(2)
    for _ in range(5):
        assert one.generate_seed() != two.generate_seed()
        assert one.generate_shared_seed() == two.generate_shared_seed()
    assert sg.spawn(1).generate_seed() == sg.spawn(1).generate_seed()
    expected = sg.spawn(3).generate_seed()
    assert sg.spawn(3, inplace=True) is sg and sg.generate_seed() == expected
    with pytest.raises(ValueError, match="worker_id"):
        sg.spawn(-1)


# -- MultiProcessingReadingService: 0.9's arguments and error text --------------------------


def test_prefetch_counts_are_attributes_as_in_0_9() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0 is 0.9's "no main-process prefetch": nothing to warn about
        service = Workers(2, worker_prefetch_cnt=5, main_prefetch_cnt=0)
    assert (service.worker_prefetch_cnt, service.main_prefetch_cnt, service.prefetch_factor) == (5, 0, 5)
    with pytest.warns(UserWarning, match="main_prefetch_cnt is ignored"):
        assert Workers(1, main_prefetch_cnt=10).main_prefetch_cnt == 10


def _reset(datapipe: Any, worker_info: Any, seed_generator: Any) -> Any:
    return datapipe


def test_worker_reset_fn_is_taken_and_kept_as_in_0_9() -> None:
    assert Workers(2, worker_reset_fn=_reset).worker_reset_fn is _reset  # behaviour: test_worker_reset_fn.py


class Oops(Exception):
    pass


def _fail_at_11(x: int) -> int:
    if x == 11:
        raise Oops("oops at 11")
    return x


@pytest.mark.parametrize("num_workers", [1, 3])
def test_a_worker_exception_says_caught_in_worker_process_with_the_original_traceback(num_workers: int) -> None:
    graph = Mapper(ShardingFilter(IterableWrapper(range(30))), _fail_at_11)
    loader = snapshot.DataLoader2(graph, reading_service=Workers(num_workers))
    it = iter(loader)
    assert [next(it) for _ in range(11)] == list(range(11))  # every sample before the failing one
    with pytest.raises(Oops) as info:
        next(it)
    text = str(info.value)
    worker = 11 % 3 if num_workers == 3 else 0
    assert f"Caught Oops in worker process {worker} (pid " in text
    assert "by the DataPipe at 0" in text
    assert "\nOriginal Traceback (most recent call last):" in text and "_fail_at_11" in text
    assert "Oops: oops at 11" in text


class NeedsTwo(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


def _fail_with_two_args(x: int) -> int:
    if x == 2:
        raise NeedsTwo(7, "two arguments")
    return x


def test_an_exception_that_cannot_take_one_message_keeps_its_args_and_gets_a_note() -> None:
    loader = snapshot.DataLoader2(Mapper(ShardingFilter(IterableWrapper(range(6))), _fail_with_two_args),
                                  reading_service=Workers(2))
    with pytest.raises(NeedsTwo) as info:
        list(loader)
    assert info.value.args == (7, "two arguments")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Caught NeedsTwo in worker process 0" in notes and "Original Traceback" in notes



def test_forkserver_workers_survive_a_pause_longer_than_their_poll() -> None:
    """A worker started by the fork server has the server as its parent: it must keep serving
    (it once took the server for a dead loader and left after a second without requests)."""
    import time

    graph = ShardingFilter(IterableWrapper(range(12)))
    with snapshot.DataLoader2(graph, reading_service=Workers(2, multiprocessing_context="forkserver")) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        time.sleep(2.5)  # idle: no requests reach the workers
        assert head + list(it) == list(range(12))
