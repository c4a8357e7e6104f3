"""Restore plans: state wherever possible, replay only the smallest closed subgraph."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Forker, IterableWrapper, Shuffler, Zipper

import snapshot
import snapshot.hooks
from snapshot.graph import Graph
from snapshot.plan import RestoreStrategy, make_plan
from snapshot.testing import Cut, assert_resumes_exactly
from tests import graphs


def plan_of(datapipe, strategy=RestoreStrategy.AUTO, counts=None):
    graph = Graph(datapipe)
    return graph, make_plan(graph, counts or {n.path: 5 for n in graph}, strategy)


def test_all_builtin_graph_needs_no_replay() -> None:
    _, plan = plan_of(graphs.combining())
    assert plan.replay == frozenset() and plan.drivers == ()


def test_a_hookless_pipe_is_replayed_with_its_inputs_only() -> None:
    graph, plan = plan_of(graphs.with_generator_pipe())
    assert plan.drivers == (("0/datapipe", 5),)  # the user pipe, not the batch above it
    assert plan.replay == {"0/datapipe", "0/datapipe/datapipe", "0/datapipe/datapipe/datapipe"}
    assert plan.method("0") == "state"
    assert "no state hook" in plan.reasons["0/datapipe"]


def test_a_hookless_pipe_behind_a_fork_replays_up_to_the_join() -> None:
    a, b = Forker(IterableWrapper(range(20)), 2)
    dp = Batcher(Zipper(graphs.Squares(a), b), 2)
    graph, plan = plan_of(dp)
    # fork's other child feeds the zip, so the smallest closed subgraph ends at the zip
    assert plan.drivers == (("0/datapipe", 5),)
    assert "0" not in plan.replay


def test_fast_forward_replays_everything_from_the_sink() -> None:
    graph, plan = plan_of(graphs.linear(), RestoreStrategy.FAST_FORWARD)
    assert plan.drivers == (("0", 5),)
    assert plan.replay == {n.path for n in graph}


def test_state_is_refused_up_front_listing_every_hookless_node() -> None:
    dp = Zipper(graphs.Squares(IterableWrapper(range(3))), graphs.Squares(IterableWrapper(range(3))))
    with pytest.raises(snapshot.StrategyError) as info:
        plan_of(dp, RestoreStrategy.STATE)
    message = str(info.value)
    assert "2 node(s)" in message and "0/datapipes/0" in message and "0/datapipes/1" in message


def test_auto_restores_hookless_graphs_exactly() -> None:
    assert_resumes_exactly(graphs.with_generator_pipe, epochs=2, strategies=("auto", "fast_forward"))


def test_the_plan_is_recorded_in_the_manifest() -> None:
    dl = snapshot.DataLoader2(graphs.with_generator_pipe())
    it = iter(dl)
    for _ in range(4):
        next(it)
    manifest = dl.save_snapshot().manifest
    shard = manifest["shards"][0]
    assert shard["plan"]["drivers"] == [{"path": "0/datapipe", "replay": 12}]
    assert shard["nodes"]["0"]["restore"] == "state"
    assert shard["nodes"]["0/datapipe/datapipe"]["restore"] == "replay"
    assert shard["nodes"]["0/datapipe/datapipe"]["buffered"] == 6
    assert shard["nodes"]["0/datapipe/datapipe"]["state_bytes"] > 0


def test_state_restore_costs_the_state_not_the_position() -> None:
    """A state restore touches no sample before the cut; fast-forward recomputes them all."""
    calls = graphs.SPY_CALLS
    dl = snapshot.DataLoader2(graphs.spied())
    it = iter(dl)
    for _ in range(2000):
        next(it)
    snap = dl.save_snapshot()
    calls.clear()
    fresh = snapshot.DataLoader2(graphs.spied())
    fresh.restore_snapshot(snap, strategy="state")
    assert calls == []
    next(iter(fresh))
    assert len(calls) == 4
    calls.clear()
    slow = snapshot.DataLoader2(graphs.spied())
    slow.restore_snapshot(snap, strategy="fast_forward")
    assert len(calls) == 8000


def test_replay_that_does_not_reproduce_the_position_is_refused() -> None:
    """A replayed part that behaves differently is caught by comparing replayed counts."""
    dl = snapshot.DataLoader2(graphs.shifting_filter())
    it = iter(dl)
    for _ in range(5):
        next(it)
    snap = dl.save_snapshot()
    graphs.FILTER_SHIFT[0] = 1
    try:
        for strategy in ("auto", "fast_forward"):
            with pytest.raises(snapshot.RestoreError) as info:
                snapshot.DataLoader2(graphs.shifting_filter()).restore_snapshot(snap, strategy=strategy)
            message = str(info.value)
            assert "did not reproduce the saved position" in message
            assert "0/datapipe/datapipe/datapipe (IterableWrapperIterDataPipe" in message
            assert "saved 15, replayed 14" in message
    finally:
        graphs.FILTER_SHIFT[0] = 0


def test_cuts_twice_in_a_row_on_a_mixed_graph() -> None:
    assert_resumes_exactly(graphs.with_generator_pipe, epochs=1,
                           cuts=[Cut(0, 2, then=5), Cut(0, 6, then=13)], strategies=("auto",))


# -- file pipelines: nothing replayed; the plan says what a restore reads again ------------------

def test_file_pipelines_plan_no_replay_and_say_what_is_read_again(tmp_path) -> None:
    pytest.importorskip("torchdata.datapipes.iter")
    from tests import file_corpus

    root = str(tmp_path)
    for factory in (file_corpus.webdataset, file_corpus.gzip_lines, file_corpus.csv_rows, file_corpus.zip_members):
        graph, plan = plan_of(factory(root))
        assert plan.replay == frozenset() and plan.drivers == (), factory.__name__
    graph, plan = plan_of(file_corpus.gzip_lines(root))
    (reader,) = plan.rereads  # readlines, after decompress: re-inflates its current file
    assert type(graph[reader].datapipe).__name__ == "LineReaderIterDataPipe"
    assert "re-inflates its current file" in plan.rereads[reader] and "never the files before it" in str(plan)
    assert plan.describe()["rereads"] == dict(plan.rereads)
    _, plain = plan_of(file_corpus.csv_rows(root))
    assert plain.rereads == {}  # an uncompressed file is reopened at the offset: nothing read again


class Cubes(IterDataPipe):
    """A user pipe whose generator keeps nothing between samples, declared so with Itemwise."""

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        for x in self.datapipe:
            if x % 7:
                yield x**3


class CubesHook(snapshot.hooks.Itemwise):
    """Itemwise, as a user registers it (a subclass of their own keeps the registry's origin clear)."""


snapshot.register_state_hook(Cubes, CubesHook, replace=True)


def cubes(n: int = 40):
    return Batcher(Cubes(Shuffler(IterableWrapper(range(n)), buffer_size=6)), batch_size=3)


def test_a_pipe_declared_itemwise_restarts_over_its_restored_inputs() -> None:
    graph, plan = plan_of(cubes())
    assert plan.replay == frozenset() and plan.drivers == ()
    assert_resumes_exactly(cubes, epochs=2, strategies=("state", "auto"))


def test_the_manifest_and_inspect_say_what_a_restore_reads_again(tmp_path, capsys) -> None:
    """The plan's re-reads (a reader behind ``decompress`` re-inflates its current file) are in the
    manifest and in ``snapshot inspect``; a plain file's reader re-reads nothing and says nothing."""
    pytest.importorskip("torchdata.datapipes.iter")
    from snapshot.cli import main
    from tests import file_corpus

    root = str(tmp_path)
    for factory, rereads in ((file_corpus.gzip_lines, True), (file_corpus.csv_rows, False)):
        dl = snapshot.DataLoader2(factory(root))
        dl.seed(3)
        it = iter(dl)
        for _ in range(7):
            next(it)
        path = str(tmp_path / f"{factory.__name__}.snap")
        snap = dl.save_snapshot(path)
        dl.shutdown()
        recorded = snap.manifest["shards"][0]["plan"].get("rereads", {})
        assert main(["inspect", path]) == 0
        shown = capsys.readouterr().out
        if rereads:
            (reader,) = recorded
            assert "re-inflates its current file" in recorded[reader]
            assert f"{reader} is restored from its state, and re-inflates its current file" in shown
        else:
            assert recorded == {} and "re-inflates" not in shown


def test_each_save_of_an_epoch_plans_at_its_own_counts(tmp_path) -> None:
    """The saves of one epoch plan from the epoch's one layout, at each save's counts: a reader that had not
    started at the first save reads nothing again then, and re-inflates its current file at the next one;
    each recorded plan is the plan made afresh at that moment, and a restore onto a loader restored
    from the first save plans its own later saves the same way."""
    pytest.importorskip("torchdata.datapipes.iter")
    from tests import file_corpus

    root = str(tmp_path)

    def recorded(loader: snapshot.DataLoader2) -> Any:
        """The plan a save records now, and the plan made afresh at the same counts."""
        engine = loader.reading_service._executor.engine
        saved = engine.capture().shards[0].plan
        return saved, make_plan(engine._shard_graphs[0], engine._runs[0].counts(), RestoreStrategy.AUTO).record()

    dl = snapshot.DataLoader2(file_corpus.gzip_lines(root))
    dl.seed(3)
    it = iter(dl)
    first, expected = recorded(dl)
    assert first == expected and first.rereads == {}
    for _ in range(7):
        next(it)
    later, expected = recorded(dl)
    assert later == expected and len(later.rereads) == 1
    snap = dl.save_snapshot()
    dl.shutdown()
    again = snapshot.DataLoader2(file_corpus.gzip_lines(root))
    again.restore_snapshot(snap)
    it = iter(again)
    next(it)
    restored, expected = recorded(again)
    assert restored == expected and len(restored.rereads) == 1
    again.shutdown()
