"""torchdata's ``StatefulDataLoader`` runs a graph with this library's state; DataLoader2 parity with 0.9.

Runs in both test environments: the main one (torchdata 0.9, where ``DataLoader2`` parity is
checked against the original) and ``.venv-torchdata`` (torchdata >= 0.10, see
``tests/torchdata_new``), where the 0.9-only tests skip.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot

pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata (>= 0.8) is not installed")

from torchdata.stateful_dataloader import StatefulDataLoader

from snapshot.integrations.torchdata import SnapshotDataset

SAMPLES, BATCH = 40, 4  # 10 batches per epoch
CALLS: Counter[str] = Counter()


def counted(x: int) -> int:
    """The map function: counts how many samples the graph computes."""
    CALLS["map"] += 1
    return x * 10


def make_graph() -> Any:
    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).map(counted)


def sdl(seed: int = 3, **options: Any) -> tuple[StatefulDataLoader, SnapshotDataset]:
    dataset = SnapshotDataset(make_graph(), seed=seed, **options)
    return StatefulDataLoader(dataset, batch_size=BATCH), dataset


def batches(loader: Any, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if count is not None and len(out) == count:
            break
    return out


def uninterrupted(epochs: int = 3) -> list[list[list[int]]]:
    loader, dataset = sdl()
    with dataset:
        return [batches(loader) for _ in range(epochs)]


def fast_forward_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "fast-forward" in r.getMessage()]


@pytest.mark.parametrize("epoch, taken", [(0, 0), (0, 1), (0, 5), (0, 9), (0, 10), (0, None), (1, 3)],
                         ids=["start", "first", "middle", "last", "all", "exhausted", "epoch1"])
def test_stateful_dataloader_resumes_exactly_from_the_engines_state(epoch: int, taken: int | None,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """``taken=None``: saved after the epoch's ``StopIteration``; the next iteration is the next epoch."""
    expected = uninterrupted()
    loader, dataset = sdl()
    with dataset:
        for _ in range(epoch):
            batches(loader)
        if taken is None:
            batches(loader)
            epoch, taken = epoch + 1, 0
        else:
            it = iter(loader)
            for _ in range(taken):
                next(it)
        state = loader.state_dict()
    assert sorted(state["dataset_state"]) == ["manifest", "payload", "snapshot_format"]  # the engine's own state
    caplog.set_level(logging.WARNING)
    resumed, dataset = sdl(seed=999)  # the seed comes from the state
    with dataset:
        resumed.load_state_dict(state)
        CALLS.clear()
        rest = batches(resumed)
        computed = CALLS["map"]
        later = [batches(resumed) for _ in range(2 - epoch)]
    assert fast_forward_warnings(caplog) == []
    assert rest == expected[epoch][taken:]
    assert computed == SAMPLES - BATCH * taken  # the restore computed none of the samples before the cut
    assert later == expected[epoch + 1:]


def test_restore_twice_in_a_row() -> None:
    expected = uninterrupted(epochs=1)[0]
    loader, dataset = sdl()
    with dataset:
        head = batches(loader, 3)
        state = loader.state_dict()
    second, dataset = sdl()
    with dataset:
        second.load_state_dict(state)
        middle = batches(second, 4)
        state = second.state_dict()
    third, dataset = sdl()
    with dataset:
        third.load_state_dict(state)
        assert head + middle + batches(third) == expected


def test_a_dataset_without_state_is_fast_forwarded(caplog: pytest.LogCaptureFixture) -> None:
    """The control: the warning looked for above is what StatefulDataLoader says when it replays."""

    class Plain(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(SAMPLES))

    loader = StatefulDataLoader(Plain(), batch_size=BATCH)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    caplog.set_level(logging.WARNING)
    resumed = StatefulDataLoader(Plain(), batch_size=BATCH)
    resumed.load_state_dict(state)
    assert next(iter(resumed)).tolist() == [8, 9, 10, 11]
    assert fast_forward_warnings(caplog), "StatefulDataLoader no longer warns when it fast-forwards"


def test_workers_of_the_engine_instead_of_stateful_dataloaders() -> None:
    def workers() -> snapshot.ReadingServiceInterface:
        return snapshot.MultiProcessingReadingService(2, logical_shards=2)

    def graph() -> Any:
        return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).sharding_filter().map(counted)

    with SnapshotDataset(graph(), seed=3, reading_service=workers()) as dataset:
        loader = StatefulDataLoader(dataset, batch_size=BATCH)
        expected = batches(loader)
    with SnapshotDataset(graph(), seed=3, reading_service=workers()) as dataset:
        loader = StatefulDataLoader(dataset, batch_size=BATCH)
        head = batches(loader, 4)
        state = loader.state_dict()
    in_process = snapshot.InProcessReadingService(logical_shards=2)  # onto another layout
    with SnapshotDataset(graph(), reading_service=in_process) as dataset:
        loader = StatefulDataLoader(dataset, batch_size=BATCH)
        loader.load_state_dict(state)
        assert head + batches(loader) == expected
    assert sorted(x for b in expected for x in b) == [x * 10 for x in range(SAMPLES)]


def test_stateful_dataloader_workers_are_refused_with_the_alternative() -> None:
    import gc

    with SnapshotDataset(make_graph(), seed=3) as dataset:
        loader = StatefulDataLoader(dataset, batch_size=BATCH, num_workers=1, multiprocessing_context="fork")
        message = ""
        try:
            next(iter(loader))  # the worker fails as it starts
        except RuntimeError as exc:
            message = str(exc)
        del loader
        gc.collect()  # the half-made iterator goes, and stops its worker
    assert "SnapshotDataset runs in a DataLoader worker" in message
    assert "num_workers=0" in message and "MultiProcessingReadingService" in message


# -- torchdata 0.9: DataLoader2 parity -------------------------------------------------------------

def dataloader2_0_9() -> Any:
    if importlib.util.find_spec("torchdata.dataloader2") is None:
        pytest.skip("torchdata 0.9 is not installed here (torchdata >= 0.10 has no DataLoader2)")
    import torchdata.dataloader2 as td

    return td


def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_dataloader2_has_torchdata_0_9s_constructor_and_methods() -> None:
    td = dataloader2_0_9()
    # 0.9's parameters, in order, with their defaults; beyond them only keyword-only options
    # (DESIGN.md: buffer_state=; issue 25: code_changes=), so that no 0.9 call changes meaning
    ours, theirs = parameters(snapshot.DataLoader2.__init__), parameters(td.DataLoader2.__init__)
    assert ours[:len(theirs)] == theirs
    assert [p[0] for p in ours[len(theirs):]] == ["buffer_state", "code_changes"]
    assert all(p[1] is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])
    # from_state: the same parameters; reading_service may be left out here (the saved one is used)
    assert [p[:2] for p in parameters(snapshot.DataLoader2.from_state)] == \
        [p[:2] for p in parameters(td.DataLoader2.from_state)]
    for method in ("__iter__", "seed", "shutdown", "__enter__", "__exit__", "state_dict", "load_state_dict"):
        assert parameters(getattr(snapshot.DataLoader2, method)) == parameters(getattr(td.DataLoader2, method)), \
            method


def test_reading_services_keep_torchdata_0_9s_names() -> None:
    td = dataloader2_0_9()
    for name in ("ReadingServiceInterface", "InProcessReadingService", "MultiProcessingReadingService",
                 "DistributedReadingService", "SequentialReadingService"):
        assert hasattr(td, name) and hasattr(snapshot, name), name
    # the arguments that keep their meaning keep their names and defaults (the rest: docs/how-to/migrate.md)
    assert parameters(snapshot.InProcessReadingService.__init__)[:4] == \
        parameters(td.InProcessReadingService.__init__)[:4]
    assert parameters(snapshot.DistributedReadingService.__init__)[:2] == \
        parameters(td.DistributedReadingService.__init__)[:2]
    assert parameters(snapshot.MultiProcessingReadingService.__init__)[:2] == \
        parameters(td.MultiProcessingReadingService.__init__)[:2]


def test_same_stream_as_torchdata_0_9_with_context_manager_and_seed() -> None:
    td = dataloader2_0_9()

    def graph() -> Any:
        return IterableWrapper(range(50)).shuffle(buffer_size=10).batch(3)

    with snapshot.DataLoader2(graph(), reading_service=snapshot.InProcessReadingService()) as ours, \
            td.DataLoader2(graph(), reading_service=td.InProcessReadingService()) as theirs:
        ours.seed(77)
        theirs.seed(77)
        assert [list(ours) for _ in range(3)] == [list(theirs) for _ in range(3)]


def test_same_stream_as_torchdata_0_9_with_workers_on_a_deterministic_graph() -> None:
    td = dataloader2_0_9()

    def graph() -> Any:
        return IterableWrapper(range(30)).sharding_filter().map(counted)

    ours = snapshot.DataLoader2(graph(), reading_service=snapshot.MultiProcessingReadingService(2))
    theirs = td.DataLoader2(graph(), reading_service=td.MultiProcessingReadingService(num_workers=2))
    try:
        assert list(ours) == list(theirs) == [x * 10 for x in range(30)]
    finally:
        ours.shutdown()
        theirs.shutdown()


def test_from_state_gives_a_positioned_loader_as_in_0_9() -> None:
    td = dataloader2_0_9()
    with snapshot.DataLoader2(make_graph()) as ours, td.DataLoader2(make_graph()) as theirs:
        ours.seed(1)
        theirs.seed(1)
        it = iter(ours)
        next(it)
        restored = snapshot.DataLoader2.from_state(ours.state_dict(), snapshot.InProcessReadingService())
        with restored:
            assert list(restored) == list(it)  # 0.9 restarted the epoch here; we continue it
        assert isinstance(td.DataLoader2.from_state(theirs.state_dict(), None), td.DataLoader2)


def test_the_state_survives_torch_save_and_a_weights_only_load() -> None:
    # the state dict is plain data that torch.save / torch.load(weights_only=True) keep
    import io

    loader, dataset = sdl()
    with dataset:
        batches(loader, 2)
        buffer = io.BytesIO()
        torch.save(loader.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed, dataset = sdl()
    with dataset:
        resumed.load_state_dict(state)
        assert batches(resumed) == uninterrupted(1)[0][2:]
