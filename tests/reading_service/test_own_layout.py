"""A restore onto the layout it was saved in: one process runs the saved units, all of them.

Then the re-shard plan has nothing to decide, so the service makes none, and a graph run as one unit is
not cut at its sharding points until something asks (a save). Everywhere else (units to split for the
workers, a snapshot of several ranks) the plan decides as before. The streams are the uninterrupted
run's, and so is what a save after the restore records.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import schema
from snapshot.reading_service._shards import service as sharded
from snapshot.reading_service.reshard import SavedLayout, plan_restore
from tests import graphs


def shuffled() -> Any:
    return IterableWrapper(range(40)).shuffle(buffer_size=8).map(graphs.double)


def filtered() -> Any:
    return IterableWrapper(range(40)).shuffle(buffer_size=8).sharding_filter().map(graphs.double)


def run(factory: Any, service: Any, at: int, path: str) -> list[Any]:
    """The rest of the epoch after ``at`` samples, saved there to ``path``."""
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.seed(5)
        it = iter(loader)
        for _ in range(at):
            next(it)
        loader.save_snapshot(path)
        return list(it)


@pytest.fixture
def no_plan(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Refuses the re-shard plan; counts the graphs cut at their sharding points."""
    cut: list[Any] = []

    def plan(self: Any, state: Any) -> Any:
        raise AssertionError("the re-shard plan was made for a restore onto the saved layout")

    def analyze(graph: Any) -> Any:
        cut.append(graph)
        return real(graph)

    real = sharded.analyze
    monkeypatch.setattr(sharded.ShardedService, "plan", plan)
    monkeypatch.setattr(sharded, "analyze", analyze)
    return cut


@pytest.mark.parametrize("factory, shards", [(shuffled, None), (filtered, None), (filtered, 3)])
def test_a_restore_onto_the_saved_units_makes_no_plan(tmp_path, no_plan, factory, shards) -> None:
    path = str(tmp_path / "at7.snap")
    rest = run(factory, snapshot.InProcessReadingService(logical_shards=shards), 7, path)
    no_plan.clear()
    with snapshot.DataLoader2(factory(), reading_service=snapshot.InProcessReadingService()) as loader:
        loader.restore_snapshot(path)
        assert (no_plan == []) == (shards is None)  # one unit, whole: not cut; three: cut once
        assert list(loader) == rest


def test_a_save_after_a_one_unit_restore_records_what_the_uninterrupted_run_records(tmp_path) -> None:
    # a source that shards itself: its units cannot be split mid-epoch, which the save says (no_split)
    first, second, again = (str(tmp_path / name) for name in ("at3.snap", "at5.snap", "again.snap"))
    with snapshot.DataLoader2(graphs.replicated_source()) as loader:
        loader.seed(5)
        it = iter(loader)
        [next(it) for _ in range(3)]
        loader.save_snapshot(first)
        [next(it) for _ in range(2)]
        loader.save_snapshot(second)
        rest = list(it)
    with snapshot.DataLoader2(graphs.replicated_source()) as loader:
        loader.restore_snapshot(first)
        assert loader.reading_service._analysis is None  # found when the save asks
        it = iter(loader)
        [next(it) for _ in range(2)]
        loader.save_snapshot(again)
        assert list(it) == rest
    saved, resaved = snapshot.read_manifest(second)["service"], snapshot.read_manifest(again)["service"]
    assert "shards its own data" in saved["no_split"] and resaved == saved


@pytest.mark.slow
def test_the_plan_decides_where_the_workers_split_the_saved_units(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "at7.snap")
    rest = run(filtered, snapshot.InProcessReadingService(), 7, path)  # one unit
    planned = []
    real = sharded.ShardedService.plan
    monkeypatch.setattr(sharded.ShardedService, "plan", lambda self, state: planned.append(state) or real(self, state))
    service = snapshot.MultiProcessingReadingService(num_workers=2, timeout=60)
    with snapshot.DataLoader2(filtered(), reading_service=service) as loader:
        loader.restore_snapshot(path)
        got = list(loader)
    assert planned and sorted(got) == sorted(rest)  # split into 2 sub-shards: every sample once


def state(units: int, workers: int = 0, *, logical_shards: int | None = None, ranks: int = 1,
          handout: bool = False) -> schema.ServiceState:
    layout: dict[str, Any] = {"logical_shards": logical_shards or units, "workers": workers, "ranks": ranks,
                              "owners": {str(u): {"rank": u % ranks, "worker": 0} for u in range(units)}}
    if units != (logical_shards or units):
        layout["units"] = units
    if handout:
        layout[schema.HANDOUT] = {"first": 2}
    return schema.ServiceState(service="MultiProcessingReadingService", layout=layout, shards=[None] * units)


LAYOUTS = [dict(units=u, workers=w) for u in (1, 2, 3, 4, 6) for w in (0, 1, 2, 3, 4, 8)] + [
    dict(units=4, logical_shards=2), dict(units=4, logical_shards=2, workers=8), dict(units=2, handout=True),
    dict(units=4, ranks=2), dict(units=4, ranks=2, workers=4)]


@pytest.mark.parametrize("saved", LAYOUTS, ids=str)
def test_the_own_units_are_the_plans_whenever_they_are_given(saved: dict[str, Any]) -> None:
    workers = saved.get("workers", 0)
    record = state(**saved)
    plan = plan_restore(SavedLayout.from_state(record), 1, workers)
    own = sharded._own_units(record, workers)
    if own is not None:
        assert own == (plan.units, list(plan.rank(0).units))
    # declined only where the plan has something to decide (the units split for the workers), or the
    # layout holds what only a plan for ranks reads (a rank's samples to hand out first)
    assert (own is None) == (plan.units != record.units or bool(saved.get("handout")))
