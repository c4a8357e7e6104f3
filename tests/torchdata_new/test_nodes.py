"""torchdata >= 0.10: a graph as a ``torchdata.nodes`` node whose state comes from this library.

Collected only where torchdata >= 0.10 is installed: ``make test`` runs it in the second
environment, ``.venv-torchdata`` (torchdata 0.10 removed ``DataLoader2``, so it cannot share
the main environment, which has torchdata 0.9 to compare against). Elsewhere it is skipped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

nodes = pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 "
                            "(make test runs this file in .venv-torchdata)")

import snapshot  # noqa: E402
from snapshot.integrations.torchdata import as_node  # noqa: E402

SAMPLES, BATCH = 30, 4  # 8 batches per epoch, the last one of 2
CALLS: Counter[str] = Counter()


def counted(x: int) -> int:
    CALLS["map"] += 1
    return x * 10


def make_graph() -> Any:
    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).map(counted)


def make_loader(seed: int = 3, **options: Any) -> Any:
    return nodes.Loader(nodes.Batcher(as_node(make_graph(), seed=seed, **options), batch_size=BATCH,
                                      drop_last=False))


def uninterrupted(epochs: int = 3) -> list[list[list[int]]]:
    loader = make_loader()
    return [list(loader) for _ in range(epochs)]


def test_this_environment_has_torchdata_0_10_or_later() -> None:
    import torchdata

    major, minor = (int(part) for part in torchdata.__version__.split(".")[:2])
    assert (major, minor) >= (0, 10), torchdata.__version__


def test_the_node_is_a_base_node_whose_state_is_the_loaders() -> None:
    node = as_node(make_graph(), seed=1)
    assert isinstance(node, nodes.BaseNode)
    next(node)
    state = node.state_dict()
    assert sorted(state) == ["finished", "loader"]
    assert sorted(state["loader"]) == ["manifest", "payload", "snapshot_format"]


@pytest.mark.parametrize("epoch, taken", [(0, 0), (0, 1), (0, 4), (0, 7), (0, 8), (0, None), (1, 5)],
                         ids=["start", "first", "middle", "last", "all", "exhausted", "epoch1"])
def test_loader_resumes_exactly_and_recomputes_nothing(epoch: int, taken: int | None) -> None:
    """``taken=None``: saved after the epoch's ``StopIteration``."""
    expected = uninterrupted()
    loader = make_loader()
    for _ in range(epoch):
        list(loader)
    if taken is None:
        list(loader)
        epoch, taken = epoch + 1, 0
    else:
        it = iter(loader)
        for _ in range(taken):
            next(it)
    state = loader.state_dict()
    resumed = make_loader(seed=999)  # the seed comes from the state
    resumed.load_state_dict(state)
    CALLS.clear()
    rest = list(resumed)
    computed = CALLS["map"]
    later = [list(resumed) for _ in range(2 - epoch)]
    if taken < 8:
        assert rest == expected[epoch][taken:]
        assert computed == SAMPLES - BATCH * taken  # nothing before the cut was computed again
        assert later == expected[epoch + 1:]
    else:  # every batch taken (no StopIteration yet): torchdata's Loader goes on with the next epoch
        assert [rest, *later][:2 - epoch] == expected[epoch + 1:]


def test_restore_twice_in_a_row() -> None:
    expected = uninterrupted(1)[0]
    first = make_loader()
    it = iter(first)
    head = [next(it) for _ in range(2)]
    second = make_loader()
    second.load_state_dict(first.state_dict())
    it = iter(second)
    middle = [next(it) for _ in range(3)]
    third = make_loader()
    third.load_state_dict(second.state_dict())
    assert head + middle + list(third) == expected


def test_engine_workers_behind_a_node() -> None:
    def graph() -> Any:
        return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).sharding_filter().map(counted)

    def loader_with(service: snapshot.ReadingServiceInterface) -> tuple[Any, Any]:
        node = as_node(graph(), seed=5, reading_service=service)
        return nodes.Loader(nodes.Batcher(node, batch_size=BATCH, drop_last=False)), node

    loader, node = loader_with(snapshot.MultiProcessingReadingService(2))
    try:
        expected = list(loader)
    finally:
        node.close()
    loader, node = loader_with(snapshot.MultiProcessingReadingService(2))
    try:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
    finally:
        node.close()
    resumed, node = loader_with(snapshot.InProcessReadingService(logical_shards=2))
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    node.close()


def test_the_how_to_example_runs() -> None:
    from tests.integration_jobs import ROOT, page_script

    code = page_script(ROOT / "docs/how-to/migrate.md", "tests/torchdata_new/test_nodes.py")
    exec(compile(code, "docs/how-to/migrate.md", "exec"), {"__name__": "how_to_nodes"})  # its asserts hold
