"""Units that cannot be split into sub-shards before their epoch ends, restored onto more workers or ranks.

A source that shards itself (no ``sharding_filter`` to split at) and a unit in a later pass of a ``cycle``
below the sharding point cannot be split mid-epoch. Such a restore used to be refused; now the rest of
the epoch runs as the saved units (on the workers they keep busy; dealt to the ranks as they are, which
even out as they read) and the next epoch is split from its start: every sample once. One restore is
still refused, and says why: a later pass of a ``cycle``, onto a number of ranks that does not divide the
units.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import snapshot
from tests import graphs
from tests.dist import RankFailure, run_ranks

torchdata = pytest.importorskip("torchdata.datapipes.iter")  # cycle (torchdata 0.9)


def flat(batches: Any) -> list[Any]:
    return [x for batch in batches for x in batch]


ONCE = Counter(flat(graphs.replicated_source()))


def cycled() -> Any:
    return torchdata.IterableWrapper(range(20)).shuffle(buffer_size=4).sharding_filter().cycle(3)


def workers(n: int) -> Any:
    return snapshot.MultiProcessingReadingService(n, timeout=60)


def saved(factory: Any, rs: Any, at: int, path: str) -> tuple[list[Any], list[Any], list[Any]]:
    with snapshot.DataLoader2(factory(), reading_service=rs) as loader:
        loader.seed(2)
        it = iter(loader)
        head = [next(it) for _ in range(at)]
        loader.save_snapshot(path)
        return head, list(it), list(loader)


def restored(factory: Any, rs: Any, path: str) -> tuple[list[Any], list[Any]]:
    with snapshot.DataLoader2(factory(), reading_service=rs) as loader:
        loader.restore_snapshot(path)
        return list(loader), list(loader)


@pytest.mark.slow
def test_a_source_that_shards_itself_restores_mid_epoch_onto_more_workers(tmp_path) -> None:
    path = str(tmp_path / "data.snap")
    head, rest, following = saved(graphs.replicated_source, workers(2), 3, path)
    assert snapshot.read_manifest(path)["service"]["no_split"].endswith("shards its own data (there is no "
                                                                        "sharding_filter to split its units at)")
    got_rest, got_next = restored(graphs.replicated_source, workers(3), path)
    assert got_rest == rest  # the saved units, not split: the saved run's stream
    assert Counter(flat(head + got_rest)) == ONCE and Counter(flat(got_next)) == ONCE  # 6 units from its start


@pytest.mark.slow
def test_a_later_pass_of_a_cycle_restores_onto_more_workers(tmp_path) -> None:
    every = Counter(list(range(20)) * 3)
    for at in (30, 5):  # in the second pass of each unit; in the first (split from there)
        path = str(tmp_path / f"at{at}.snap")
        head, rest, _ = saved(cycled, workers(2), at, path)
        got_rest, got_next = restored(cycled, workers(3), path)
        assert Counter(head + got_rest) == every and Counter(got_next) == every
        assert (got_rest == rest) == (at == 30)


def on_ranks(rank: int, world: int, factory: str, path: str, at: int | None, policy: str | None) -> Any:
    """Saved after ``at`` samples (``at`` None: restored), on ``world`` ranks."""
    build = {"replicated": graphs.replicated_source, "cycled": cycled}[factory]
    service = snapshot.DistributedReadingService(timeout=60, even_batches=policy)
    with snapshot.DataLoader2(build(), reading_service=service) as loader:
        if at is None:
            loader.restore_snapshot(path)
            return {"rest": list(loader), "next": list(loader)}
        loader.seed(2)
        it = iter(loader)
        head = [next(it) for _ in range(at)]
        loader.save_snapshot(path)
        return head


@pytest.mark.slow
def test_a_source_that_shards_itself_restores_mid_epoch_onto_more_ranks(tmp_path) -> None:
    # 2 units on 3 ranks: rank 2 has none for the rest of the epoch (it reads one part, for the seeds)
    path = str(tmp_path / "data.snap")
    heads = run_ranks(2, on_ranks, "replicated", path, 3, None, pg_timeout=60)
    got = run_ranks(3, on_ranks, "replicated", path, None, None, pg_timeout=60)
    assert got[2]["rest"] == []
    assert Counter(flat(x for h in heads for x in h)) + Counter(flat(x for r in got for x in r["rest"])) == ONCE
    assert Counter(flat(x for r in got for x in r["next"])) == ONCE
    even = run_ranks(3, on_ranks, "replicated", path, None, "drop", pg_timeout=60)
    assert len({len(r["rest"]) for r in even}) == 1 and len(even[2]["rest"]) > 0  # shared out as read


@pytest.mark.slow
def test_a_later_pass_of_a_cycle_onto_ranks_that_do_not_divide_its_units_is_refused(tmp_path) -> None:
    path = str(tmp_path / "data.snap")
    run_ranks(2, on_ranks, "cycled", path, 15, None, pg_timeout=60)
    results = run_ranks(3, on_ranks, "cycled", path, None, None, pg_timeout=60, allow_errors=True)
    refused = [r for r in results if isinstance(r, RankFailure)]
    assert refused and all("LayoutError" in r.message for r in refused)
    assert any("was reading its sharding point" in r.message and "a later pass of a cycle" in r.message
               and "Restore on a number of ranks that divides 2" in r.message for r in refused)
