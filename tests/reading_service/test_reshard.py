"""The re-shard plan as a table: saved layouts and target layouts in, who runs and reads what out.

The plan is pure (no process group, no parts): every row here is computed from a layout written by
hand, and the last tests read the layout from a real snapshot's index. What each row asserts is
counted from the deal's rule (unit ``u`` of ``M'`` runs on rank ``u % R'``; sub-shard ``u`` continues
its parent unit ``u % M``), not copied from the plan's output.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import pytest

from snapshot import schema
from snapshot.reading_service.reshard import SavedLayout, Slice, epoch_units, plan_restore, restore_units


def layout(units: int, ranks: int, workers: int = 0, *, logical_shards: int | None = None, finished: bool = False,
           first: tuple[int, ...] = (), spare: tuple[int, ...] = ()) -> SavedLayout:
    """Units dealt to ranks as a run deals them (unit u on rank u % R)."""
    first = first or (0,) * ranks
    spare = spare or (0,) * ranks
    return SavedLayout(
        logical_shards=logical_shards or units, units=units, ranks=ranks, workers=workers,
        owners=tuple(u % ranks for u in range(units)), finished=finished,
        handouts=tuple(schema.Handout(first=f, spare=s, sharing=bool(s)) for f, s in zip(first, spare)),
        in_flight=(1,) * units, buffered=(10,) * units)


# (saved units, saved ranks, target ranks): the units the rest of the epoch runs as
UNITS = [(4, 2, 2, 4), (4, 2, 4, 4), (4, 2, 1, 4), (4, 2, 3, 12), (6, 3, 4, 12), (8, 8, 6, 24), (1, 1, 3, 3)]


@pytest.mark.parametrize("saved_units, saved_ranks, ranks, units", UNITS)
def test_units_and_who_runs_them(saved_units: int, saved_ranks: int, ranks: int, units: int) -> None:
    plan = plan_restore(layout(saved_units, saved_ranks), ranks)
    assert plan.units == units == restore_units(saved_units, ranks)
    assert plan.splits == (units != saved_units)
    every = []
    for rank in range(ranks):
        mine = plan.rank(rank)
        assert mine.units == tuple(u for u in range(units) if u % ranks == rank)
        assert mine.continues == tuple(u for u in mine.units if u < saved_units)
        assert mine.splits == tuple(u for u in mine.units if u >= saved_units)
        # the parts it reads: the saved ranks that ran its units' parents, nothing else (no first samples)
        assert mine.reads == tuple(sorted({(u % saved_units) % saved_ranks for u in mine.units}))
        every += mine.units
    assert sorted(every) == list(range(units))  # every unit runs once


def test_the_same_layout_reads_its_own_part_only() -> None:
    plan = plan_restore(layout(16, 16), 16)
    assert all(plan.rank(r).reads == (r,) for r in range(16))


def test_workers_get_the_units_of_their_rank_in_turn() -> None:
    plan = plan_restore(layout(8, 2, 2), 2, 2)
    assert plan.rank(1).units == (1, 3, 5, 7)
    assert plan.rank(1).workers == ((1, 5), (3, 7))
    assert plan_restore(layout(8, 2, 2), 2, 0).rank(1).workers == ((1, 3, 5, 7),)


# (saved units, target ranks, target workers per rank): the units, every worker with one at least. The rule:
# the saved units if the ranks share them equally and every worker has one; else lcm(M, R') if that does;
# else lcm(M, R' x W'), where every worker has as many
WORKERS = [(2, 1, 3, 6), (2, 1, 8, 8), (2, 1, 2, 2), (4, 1, 3, 4), (4, 2, 4, 8), (4, 3, 3, 12), (2, 4, 3, 12),
           (1, 1, 2, 2), (6, 1, 4, 6), (6, 2, 4, 24)]


@pytest.mark.parametrize("saved_units, ranks, workers, units", WORKERS)
def test_more_workers_than_units_split_them_until_every_worker_has_one(saved_units: int, ranks: int, workers: int,
                                                                       units: int) -> None:
    plan = plan_restore(layout(saved_units, 1, 2), ranks, workers)
    assert plan.units == units
    assert units % saved_units == 0 and units % ranks == 0 and units // ranks >= workers
    if units > math.lcm(saved_units, ranks):
        assert units % (ranks * workers) == 0  # as many units for every worker
    for rank in range(ranks):
        assert len(plan.rank(rank).workers) == workers and all(plan.rank(rank).workers)
        assert sorted(u for w in plan.rank(rank).workers for u in w) == list(plan.rank(rank).units)


def test_later_epochs_run_as_the_units_the_layout_needs() -> None:
    # saved on 2 workers (2 logical shards), at the end of the epoch: the next epochs on 3 workers run as
    # 6 sub-shards; on 1 or 2 workers as the 2 logical shards, the saved run's stream
    assert plan_restore(layout(2, 1, 2, finished=True), 1, 3).later_units == 6
    assert not plan_restore(layout(2, 1, 2, finished=True), 1, 3).same_stream_later
    one = plan_restore(layout(2, 1, 2), 1, 1)
    assert one.later_units == 2 and one.same_stream_later
    # a split epoch saved again: 6 units of 2 logical shards; 2 workers run the rest as the 6, later epochs as 2
    again = plan_restore(layout(6, 1, 3, logical_shards=2), 1, 2)
    assert (again.units, again.later_units) == (6, 2)


def test_units_that_cannot_be_split_mid_epoch_run_the_rest_of_it_as_saved() -> None:
    saved = replace(layout(2, 1, 2), no_split="1/datapipe shards its own data")
    plan = plan_restore(saved, 1, 3)
    assert plan.units == 2 and plan.rank(0).workers == ((0,), (1,)) and plan.later_units == 6
    assert "not split (1/datapipe shards its own data)" in plan.describe()
    assert plan_restore(replace(saved, finished=True), 1, 3).units == 6  # the next epoch splits from its start


def test_the_epoch_units_of_a_fresh_epoch_with_workers() -> None:
    assert [epoch_units(2, 1, w) for w in (0, 1, 2, 3, 4, 8)] == [2, 2, 2, 6, 4, 8]
    assert [epoch_units(4, r, 2) for r in (1, 2, 3, 4)] == [4, 4, 12, 8]


def test_first_samples_on_the_same_ranks_stay_with_their_rank() -> None:
    plan = plan_restore(layout(4, 2, first=(3, 1), spare=(2, 0)), 2)
    assert plan.rank(0).first == (Slice(0, 0, 3),) and plan.rank(1).first == (Slice(1, 0, 1),)
    assert plan.rank(0).reads == (0,)


def test_first_samples_on_other_ranks_are_dealt_in_runs_and_their_parts_read() -> None:
    # saved rank 0 holds 2 spare + 3 first = 5, rank 1 holds 4: 9 samples onto 4 ranks as 3, 2, 2, 2
    plan = plan_restore(layout(4, 2, first=(3, 4), spare=(2, 0)), 4)
    assert [plan.rank(r).handed_out for r in range(4)] == [3, 2, 2, 2]
    assert plan.rank(0).first == (Slice(0, 0, 3),)
    assert plan.rank(1).first == (Slice(0, 3, 5),)
    assert plan.rank(2).first == (Slice(1, 0, 2),)
    assert plan.rank(3).first == (Slice(1, 2, 4),)
    # rank 1 runs unit 1 (saved on rank 1) and takes saved rank 0's last two: it reads both parts
    assert plan.rank(1).reads == (0, 1)
    assert plan.rank(2).reads == (0, 1)  # unit 2 ran on saved rank 0, its first samples are rank 1's


def test_counts_come_from_the_saving_run() -> None:
    plan = plan_restore(layout(4, 2), 3)  # 12 units: rank 0 continues units 0 and 3
    assert plan.rank(0).continues == (0, 3)
    assert (plan.rank(0).in_flight, plan.rank(0).buffered) == (2, 20)


def test_the_epoch_units_of_a_fresh_epoch() -> None:
    assert [epoch_units(4, r) for r in (1, 2, 3, 4, 6)] == [4, 4, 12, 4, 12]


def test_a_plan_for_1024_ranks_of_8_workers_onto_768_is_quick_and_reads_few_parts() -> None:
    saved = layout(8192, 1024, 8)
    start = time.perf_counter()
    plan = plan_restore(saved, 768, 8)
    reads = [len(plan.rank(r).reads) for r in range(768)]
    took = time.perf_counter() - start
    assert plan.units == 24576
    assert max(reads) == 4  # 32 units a rank, 11 of them saved ones: (r + 768 k) % 1024 takes 4 values
    assert took < 30  # generous: the budget (under 1 s) is checked by `python -m benchmarks distributed`


def test_describe_says_who_runs_and_reads_what() -> None:
    text = plan_restore(layout(4, 2, first=(0, 2)), 3).describe()
    assert "4 unit(s) of 4 logical shard(s) saved on 2 rank(s), in-process -> 3 rank(s), in-process" in text
    assert "runs as 12 unit(s)" in text and "parts read per rank: at most 2 of 2" in text
    assert "fewer than 3 sample(s) are dropped or repeated per epoch" in text
    lines = [line for line in text.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert len(lines) == 3
    assert "later epochs run as 12 sub-shard(s) of the 4 logical shard(s): the stream of a job started" in text
    more = plan_restore(layout(2, 2, 1), 2, 2).describe()
    assert "the rest of the saved epoch runs as 4 unit(s): each saved unit u is split into 2 sub-shard(s)" in more


# -- from real snapshots ------------------------------------------------------------------------

def save_on_ranks(rank: int, world: int, directory: str) -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    import snapshot

    service = snapshot.DistributedReadingService(timeout=30, logical_shards=4)
    with snapshot.DataLoader2(IterableWrapper(range(40)).sharding_filter(), reading_service=service) as loader:
        loader.seed(1)
        it = iter(loader)
        for _ in range(3):
            next(it)
        loader.save_snapshot(directory)


def test_a_real_index_plans_without_reading_parts(tmp_path: Any) -> None:
    from tests.dist import run_ranks

    directory = str(tmp_path / "data.snap")
    run_ranks(2, save_on_ranks, directory, pg_timeout=30)
    index = schema.Manifest.from_dict(json.loads(json.dumps(_manifest(directory))))
    saved = SavedLayout.from_manifest(index)
    assert saved is not None
    assert (saved.units, saved.ranks, saved.owners) == (4, 2, (0, 1, 0, 1))
    assert [h.sharing for h in saved.handouts] == [False, False]
    plan = plan_restore(saved, 3)
    assert [plan.rank(r).reads for r in range(3)] == [(0, 1), (0, 1), (0, 1)]
    # the command line prints the same plan, without torch
    out = subprocess.run([sys.executable, "-m", "snapshot", "inspect", directory, "--plan-for", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "-> 3 rank(s), in-process" in out.stdout and "parts read per rank" in out.stdout


def _manifest(directory: str) -> dict[str, Any]:
    import snapshot

    return snapshot.read_manifest(directory)
