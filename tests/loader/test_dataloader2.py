"""DataLoader2 keeps torchdata 0.9's behaviour (and its stream), and resumes mid-epoch."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper

import snapshot
from tests import graphs

PARITY_GRAPHS = [graphs.linear, graphs.collate_unbatch, graphs.grouped, graphs.combining,
                 graphs.sampled, graphs.sharded, graphs.linear_lambdas]


@pytest.mark.parametrize("factory", PARITY_GRAPHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", [0, 123])
def test_same_stream_as_torchdata_0_9_in_process(factory, seed: int) -> None:
    td = pytest.importorskip("torchdata.dataloader2")
    original = td.DataLoader2(factory(), reading_service=td.InProcessReadingService())
    ours = snapshot.DataLoader2(factory(), reading_service=snapshot.InProcessReadingService())
    original.seed(seed)
    ours.seed(seed)
    from snapshot.testing import first_difference

    for epoch in range(3):
        expected, got = list(original), list(ours)
        assert first_difference(expected, got) is None, f"epoch {epoch}"
    original.shutdown()
    ours.shutdown()


def test_same_seed_same_stream_different_seed_different_stream() -> None:
    def epochs(seed: int) -> list:
        dl = snapshot.DataLoader2(graphs.linear())
        dl.seed(seed)
        return [list(dl) for _ in range(2)]

    assert epochs(5) == epochs(5)
    assert epochs(5) != epochs(6)
    first, second = epochs(5)
    assert first != second  # each epoch reshuffles


def test_iter_twice_without_next_is_the_same_epoch() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    dl.seed(0)
    iter(dl)
    it = iter(dl)
    reference = snapshot.DataLoader2(graphs.linear())
    reference.seed(0)
    assert list(it) == list(reference)


def test_a_new_iterator_invalidates_the_old_one() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    it1 = iter(dl)
    next(it1)
    it2 = iter(dl)
    next(it2)
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it1)


def test_shutdown_and_context_manager() -> None:
    with snapshot.DataLoader2(graphs.linear()) as dl:
        next(iter(dl))
    with pytest.raises(RuntimeError, match="shut down"):
        iter(dl)
    dl.shutdown()  # idempotent


def test_repr_shows_the_graph_the_service_and_the_position() -> None:
    dl = snapshot.DataLoader2(graphs.sharded(), reading_service=snapshot.MultiProcessingReadingService(2))
    assert repr(dl) == ("DataLoader2(BatcherIterDataPipe, 6 nodes; MultiProcessingReadingService(num_workers=2); "
                        "not started)")
    it = iter(dl)
    next(it), next(it)
    assert repr(dl).endswith("; epoch 0, 2 yielded)")
    list(it)
    assert repr(dl).endswith("; epoch 0, finished)")
    dl.shutdown()
    assert repr(dl).endswith("; epoch 0, finished; shut down)")
    assert repr(snapshot.DataLoader2(None)) == "DataLoader2(no graph; InProcessReadingService; not started)"


def test_seed_must_be_uint64() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="uint64"):
            dl.seed(bad)


def test_map_datapipe_is_converted() -> None:
    dl = snapshot.DataLoader2(SequenceWrapper(range(5)))
    assert list(dl) == [0, 1, 2, 3, 4]


def test_adapters_are_applied_and_saved() -> None:
    def take_three(dp):
        return dp.batch(3)

    dl = snapshot.DataLoader2(IterableWrapper(range(7)), datapipe_adapter_fn=take_three)
    assert list(dl) == [[0, 1, 2], [3, 4, 5], [6]]
    restored = snapshot.DataLoader2.from_snapshot(dl.save_snapshot())
    assert list(restored) == [[0, 1, 2], [3, 4, 5], [6]]


def test_the_loader_works_on_a_copy_of_the_graph() -> None:
    graph = graphs.linear()
    dl = snapshot.DataLoader2(graph)
    assert dl.datapipe is not graph
    assert list(dl)


def test_from_snapshot_runs_the_snapshots_graph_without_copying_it(monkeypatch) -> None:
    from snapshot.container import _serialization

    dl = snapshot.DataLoader2(graphs.linear())
    dl.seed(2)
    it = iter(dl)
    next(it)
    snap = dl.save_snapshot()
    rest = list(it)

    def refuse(datapipe: object) -> None:
        raise AssertionError("from_snapshot copied a graph")

    monkeypatch.setattr(_serialization, "clone", refuse)
    assert list(snapshot.DataLoader2.from_snapshot(snap)) == rest


def test_reading_services_from_torchdata_are_refused_clearly() -> None:
    td = pytest.importorskip("torchdata.dataloader2")
    with pytest.raises(TypeError, match="snapshot.ReadingServiceInterface"):
        snapshot.DataLoader2(graphs.linear(), reading_service=td.InProcessReadingService())


def test_a_loader_does_not_pickle() -> None:
    with pytest.raises(pickle.PicklingError, match="state_dict"):
        pickle.dumps(snapshot.DataLoader2(graphs.linear()))


def loader_at(samples: int, seed: int = 9, factory=graphs.linear):
    dl = snapshot.DataLoader2(factory())
    dl.seed(seed)
    it = iter(dl)
    taken = [next(it) for _ in range(samples)]
    return dl, it, taken


def test_state_dict_resumes_mid_epoch_through_torch_save(tmp_path) -> None:
    dl, it, _ = loader_at(4)
    path = tmp_path / "ckpt.pt"
    torch.save({"data": dl.state_dict()}, path)
    rest = list(it)
    later = list(dl)
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.load_state_dict(torch.load(path, weights_only=True)["data"])
    assert list(fresh) == rest
    assert list(fresh) == later


def test_state_dict_is_plain_data() -> None:
    dl, _, _ = loader_at(2)
    state = dl.state_dict()
    assert set(state) == {"snapshot_format", "manifest", "payload"}
    assert isinstance(state["payload"], bytes)


def test_from_state_uses_the_pickled_graph() -> None:
    dl, it, _ = loader_at(3, factory=graphs.linear_lambdas)
    state = dl.state_dict()
    rest = list(it)
    restored = snapshot.DataLoader2.from_state(state, snapshot.InProcessReadingService())
    assert list(restored) == rest


def test_save_restore_through_files_and_streams(tmp_path) -> None:
    dl, it, _ = loader_at(5)
    path = tmp_path / "ckpt" / "data.snap"
    snap = dl.save_snapshot(path)
    buffer = io.BytesIO()
    dl.save_snapshot(buffer)
    rest = list(it)
    for src in (path, str(path), io.BytesIO(buffer.getvalue()), buffer.getvalue(), snap):
        fresh = snapshot.DataLoader2(graphs.linear())
        fresh.restore_snapshot(src)
        assert list(fresh) == rest


def test_restore_into_a_used_loader_rewinds_it() -> None:
    dl, it, _ = loader_at(3)
    snap = dl.save_snapshot()
    rest = list(it)
    for _ in dl:  # a whole other epoch
        pass
    dl.restore_snapshot(snap)
    assert list(dl) == rest


def test_snapshot_before_the_first_epoch_keeps_the_seed() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    dl.seed(77)
    snap = dl.save_snapshot()
    expected = [list(dl) for _ in range(2)]
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.restore_snapshot(snap)
    assert [list(fresh) for _ in range(2)] == expected


def test_a_seed_set_before_the_snapshot_applies_to_the_next_epoch() -> None:
    dl, it, _ = loader_at(2)
    dl.seed(1234)  # takes effect at the next epoch
    snap = dl.save_snapshot()
    rest = list(it)
    later = list(dl)
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.restore_snapshot(snap)
    assert list(fresh) == rest
    assert list(fresh) == later


def test_unseeded_loader_records_the_drawn_seed() -> None:
    torch.manual_seed(0)
    dl = snapshot.DataLoader2(graphs.linear())
    it = iter(dl)
    next(it)
    snap = dl.save_snapshot()
    assert snap.manifest["randomness"]["seed_source"] == "drawn"
    rest = list(it)
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.restore_snapshot(snap)
    assert list(fresh) == rest


def test_strategy_names_are_checked() -> None:
    dl, _, _ = loader_at(1)
    snap = dl.save_snapshot()
    with pytest.raises(ValueError, match="unknown restore strategy 'fastest'"):
        snapshot.DataLoader2(graphs.linear()).restore_snapshot(snap, strategy="fastest")


def test_pipes_defined_in_a_script_or_notebook(tmp_path) -> None:
    """Classes in ``__main__`` are pickled by value; their copies must keep working."""
    import subprocess
    import sys
    import textwrap

    snap = tmp_path / "main.snap"
    script = textwrap.dedent(f"""
        import snapshot
        from torch.utils.data import IterDataPipe
        from torch.utils.data.datapipes.iter import IterableWrapper

        class Doubler(IterDataPipe):
            def __init__(self, dp):
                self.dp = dp
            def __iter__(self):
                for x in self.dp:
                    yield 2 * x

        loader = snapshot.DataLoader2(Doubler(IterableWrapper(range(9)).shuffle()).batch(2))
        loader.seed(5)
        it = iter(loader)
        print(next(it))
        loader.save_snapshot({str(snap)!r})
        print(list(it))
        print(list(snapshot.DataLoader2.from_snapshot({str(snap)!r})))
    """)
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    head, rest, restored_here = first.stdout.splitlines()
    assert rest == restored_here
    elsewhere = subprocess.run(
        [sys.executable, "-c", f"import snapshot; print(list(snapshot.DataLoader2.from_snapshot({str(snap)!r})))"],
        capture_output=True, text=True, timeout=120)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout.strip() == rest


def test_a_service_builds_and_analyzes_the_graph_once(monkeypatch) -> None:
    """``initialize`` decides the number of logical shards from the graph's analysis and hands
    the same graph and analysis to ``configure``: the graph is walked and analyzed once."""
    from snapshot.reading_service._shards import service as _sharded

    analyzed = []
    real = _sharded.analyze
    monkeypatch.setattr(_sharded, "analyze", lambda graph: analyzed.append(graph) or real(graph))
    service = snapshot.InProcessReadingService(logical_shards=2)
    with snapshot.DataLoader2(IterableWrapper(range(8)).sharding_filter(), reading_service=service) as dl:
        assert sorted(dl) == list(range(8))
    assert len(analyzed) == 1


def _add_100(datapipe, worker_info):
    return datapipe.map(_plus_100)


def _plus_100(x):
    return x + 100


def test_a_restore_runs_the_graph_that_init_fn_returns() -> None:
    """A restore hands the service the loader's analysis of its graph; a service whose ``init_fn`` returns
    another graph runs (and analyzes) that one, as an uninterrupted run does."""
    def make() -> snapshot.DataLoader2:
        service = snapshot.InProcessReadingService(init_fn=_add_100)
        return snapshot.DataLoader2(IterableWrapper(range(12)).shuffle(buffer_size=4), reading_service=service)

    with make() as dl:
        dl.seed(3)
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        snap = dl.save_snapshot()
        rest = list(it)
    assert sorted(head + rest) == list(range(100, 112))
    with make() as restored:
        restored.restore_snapshot(snap)
        assert list(restored) == rest
