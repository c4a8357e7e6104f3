"""A snapshot of R ranks x W workers restored onto R' x W', more workers per rank than units included.

Real gloo ranks and real worker processes: 2 x 2 -> 3 x 3, 4 x 1 -> 2 x 4, 1 x 2 -> 4 x 3, cut in the
middle of an epoch, after its last sample and after its end. Each saved unit is split into as many
sub-shards as the ranks and their workers need (the one re-shard plan, :mod:`snapshot.reading_service.reshard`).
With ``even_batches=None`` every rank yields its whole share, so over the ranks the rest of the interrupted
epoch and each later epoch hold every sample exactly once; with ``"drop"`` the ranks stay equal and fewer
than R' samples an epoch are dropped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import snapshot
from tests.dist import run_ranks
from tests.reading_service.test_distributed_even import train_epoch
from tests.reading_service.test_elastic_workers import ONCE, batched, below, leaves

pytest.importorskip("torchdata.datapipes.iter")  # flat_map (torchdata 0.9)

FACTORIES = {"below": below, "batched": batched}


def service(workers: int, policy: str | None = None, logical_shards: int | None = None) -> Any:
    ranks = snapshot.DistributedReadingService(timeout=60, even_batches=policy, logical_shards=logical_shards)
    if workers:
        return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(workers, timeout=60))
    return ranks


def read(loader: Any, policy: str | None) -> list[Any]:
    return train_epoch(loader) if policy else list(loader)


def saving_run(rank: int, world: int, graph: str, workers: int, cut: str, path: str) -> dict[str, Any]:
    """Epoch 0 on ``world`` x ``workers``, saved at ``cut`` (see test_elastic_workers.saving_run)."""
    at = 3
    if cut == "end":  # after this rank's last sample, before its iterator says the epoch has ended
        with snapshot.DataLoader2(FACTORIES[graph](), reading_service=service(workers)) as loader:
            loader.seed(5)
            at = len(list(loader))
    with snapshot.DataLoader2(FACTORIES[graph](), reading_service=service(workers)) as loader:
        loader.seed(5)
        it = iter(loader)
        head = list(it) if cut == "after" else [next(it) for _ in range(at)]
        loader.save_snapshot(path)
        return {"head": head, "rest": list(it)}


def resumed(rank: int, world: int, graph: str, workers: int, path: str, policy: str | None,
            epochs: int = 2) -> dict[str, Any]:
    with snapshot.DataLoader2(FACTORIES[graph](), reading_service=service(workers, policy)) as loader:
        finished = loader.restore_snapshot(path).manifest["loader"]["epoch_finished"]
        rest = [] if finished else read(loader, policy)
        return {"rest": rest, "later": [read(loader, policy) for _ in range(epochs)]}


def fresh(rank: int, world: int, graph: str, workers: int, logical_shards: int) -> list[list[Any]]:
    """Epochs 0 to 2 of a job started on this layout with ``logical_shards``."""
    with snapshot.DataLoader2(FACTORIES[graph](), reading_service=service(workers, None, logical_shards)) as loader:
        loader.seed(5)
        return [list(loader) for _ in range(3)]


def _union(shares: list[list[Any]]) -> Counter[Any]:
    return Counter(leaves(x for share in shares for x in share))


CASES = [  # (graph, saved ranks x workers, restored ranks x workers, cut)
    ("batched", (2, 2), (3, 3), "middle"),
    ("below", (4, 1), (2, 4), "end"),
    ("below", (1, 2), (4, 3), "after"),
    ("batched", (1, 2), (4, 3), "middle"),
]


@pytest.mark.slow
@pytest.mark.parametrize("graph, before, after, cut", CASES)
def test_every_sample_once_on_more_workers_per_rank(tmp_path, graph: str, before: tuple[int, int],
                                                   after: tuple[int, int], cut: str) -> None:
    path = str(tmp_path / "data.snap")
    saved = run_ranks(before[0], saving_run, graph, before[1], cut, path, pg_timeout=60, timeout=240)
    got = run_ranks(after[0], resumed, graph, after[1], path, None, pg_timeout=60, timeout=240)
    once = ONCE[FACTORIES[graph]]
    head = [s["head"] for s in saved]
    assert _union(head + [r["rest"] for r in got]) == once, "the interrupted epoch: a sample lost or read twice"
    for epoch in range(2):
        assert _union([r["later"][epoch] for r in got]) == once, f"later epoch {epoch}"
    if cut == "middle":  # the saving run went on: its rest was the same samples, in its own order
        assert _union(head + [s["rest"] for s in saved]) == once


@pytest.mark.slow
def test_later_epochs_are_those_of_a_job_started_on_the_new_layout(tmp_path) -> None:
    path = str(tmp_path / "data.snap")
    run_ranks(1, saving_run, "below", 2, "middle", path, pg_timeout=60)
    got = run_ranks(4, resumed, "below", 3, path, None, pg_timeout=60, timeout=240)
    started = run_ranks(4, fresh, "below", 3, 2, pg_timeout=60, timeout=240)
    assert [r["later"] for r in got] == [s[1:] for s in started]


@pytest.mark.slow
def test_ranks_stay_equal_under_drop(tmp_path) -> None:
    path = str(tmp_path / "data.snap")
    saved = run_ranks(2, saving_run, "below", 2, "middle", path, pg_timeout=60)
    got = run_ranks(3, resumed, "below", 3, path, "drop", 1, pg_timeout=60, timeout=240)
    once = ONCE[below]
    for shares in ([s["head"] for s in saved] + [r["rest"] for r in got], [r["later"][0] for r in got]):
        union = _union(shares)
        assert not union - once and sum((once - union).values()) < 3
    assert len({len(r["rest"]) for r in got}) == 1 and len({len(r["later"][0]) for r in got}) == 1
