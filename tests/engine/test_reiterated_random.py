"""Random pipes iterated again within an epoch (``cycle`` over ``shuffle`` and friends).

Each later pass of a random pipe gets a seed derived from its epoch seed and the pass (see
``snapshot/engine/_passes.py``), saved with the node, so a restore is exact at every cut, in every
pass and at the pass boundaries, and a run that saves yields (and leaves torch's generator)
exactly as a run that never saves.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.datapipes.map import SequenceWrapper
from torchdata.datapipes.iter import SampleMultiplexer

import snapshot
from snapshot.errors import SnapshotError
from snapshot.reading_service import MultiProcessingReadingService
from snapshot.testing import Cut, assert_resumes_exactly
from tests.graphs import Squares, double
from tests.helpers import HOOKED_STRATEGIES, assert_resumes_exactly_onto

SEED = 7


# -- graphs (module level, so that they pickle by reference) ------------------------------

def issue_case() -> Any:
    """The graph of issue 22: a shuffle above the sharding point, cycled below it."""
    return IterableWrapper(range(40)).shuffle(buffer_size=8).sharding_filter().cycle(3)


def shuffle_below_the_sharding_point() -> Any:
    return IterableWrapper(range(30)).sharding_filter().shuffle(buffer_size=5).cycle(3)


def hookless_between_the_sharding_point_and_the_cycle() -> Any:
    """A user pipe without a hook right below the sharding point, under the cycle: a restore
    replays it from the start of its pass, reading that pass of the sharding point again."""
    return Squares(IterableWrapper(range(30)).shuffle(buffer_size=5).sharding_filter()).cycle(3)


def cycled_above_the_sharding_point() -> Any:
    return IterableWrapper(range(30)).shuffle(buffer_size=6).cycle(3).sharding_filter().map(double)


def repeat_over_shuffle() -> Any:
    return IterableWrapper(range(20)).shuffle(buffer_size=5).repeat(2)


def cycle_over_repeat_over_shuffle() -> Any:
    return IterableWrapper(range(12)).shuffle(buffer_size=4).repeat(2).cycle(3)


def cycle_over_in_batch_shuffle() -> Any:
    return IterableWrapper(range(24)).batch(4).in_batch_shuffle().cycle(3)


def cycle_over_bucketbatch() -> Any:
    return IterableWrapper(range(30)).bucketbatch(batch_size=3, batch_num=2, bucket_num=2).cycle(3)


def nested_cycles() -> Any:
    inner = IterableWrapper(range(8)).shuffle(buffer_size=3).cycle(2)
    return inner.shuffle(buffer_size=4).cycle(3)


def hookless_inside_the_cycle() -> Any:
    """A user pipe without a hook between the shuffle and the cycle: replayed within its pass."""
    return Squares(IterableWrapper(range(16)).shuffle(buffer_size=4)).cycle(3)


def hookless_outside_the_cycle() -> Any:
    """A user pipe without a hook below the cycle: the cycle replays from the epoch's start."""
    return Squares(IterableWrapper(range(16)).shuffle(buffer_size=4).cycle(3))


def hookless_random_pipe_in_the_cycle() -> Any:
    """``shuffled_flatmap`` has no hook: it takes its pass's seed through its own reset()."""
    return IterableWrapper([[i, i + 100, i + 200] for i in range(10)]).shuffled_flatmap(buffer_size=3).cycle(3)


def map_shuffle_in_the_cycle() -> Any:
    """``MapDataPipe.shuffle()`` (an iterable pipe with ``set_seed``) under the cycle."""
    return SequenceWrapper(range(10)).shuffle().cycle(3)


def multiplexer_in_the_cycle() -> Any:
    weights = {IterableWrapper(range(10)).shuffle(buffer_size=3): 0.5, IterableWrapper(range(100, 110)): 0.5}
    return SampleMultiplexer(weights, seed=3).cycle(3)


def multiplexer_replayed_within_its_pass() -> Any:
    """A user pipe without a hook over the multiplexer: the multiplexer replays from the start of
    its current pass, so it rewinds its generator to that pass's first state."""
    weights = {IterableWrapper(range(10)).shuffle(buffer_size=3): 0.5, IterableWrapper(range(100, 110)): 0.5}
    return Squares(SampleMultiplexer(weights, seed=3)).cycle(3)


def cached_shuffle_in_the_cycle() -> Any:
    """``in_memory_cache`` under the cycle: later passes are served from the cache, as torchdata's are."""
    return IterableWrapper(range(12)).shuffle(buffer_size=4).in_memory_cache().cycle(3)


def cycle_over_zipped_fork_children() -> Any:
    first, second = IterableWrapper(range(8)).shuffle(buffer_size=3).fork(2)
    return first.zip(second).cycle(3)


def cycle_over_one_fork_child() -> Any:
    first, second = IterableWrapper(range(8)).shuffle(buffer_size=3).fork(2)
    return first.cycle(2).zip(second)


def cycle_below_a_dispatcher() -> Any:
    dp = IterableWrapper(range(20)).shuffle(buffer_size=4)
    return dp.sharding_round_robin_dispatch(SHARDING_PRIORITIES.MULTIPROCESSING).cycle(2)


class Twice(IterDataPipe):
    """A user pipe without a hook that iterates its input twice per epoch."""

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe

    def __iter__(self) -> Any:
        yield from self.datapipe
        for x in self.datapipe:
            yield x + 100


def hookless_reiterator_over_shuffle() -> Any:
    """The second ``iter()`` of the shuffle comes from a pipe the engine does not run: the engine
    still hands it a new pass of the shuffle, seeded for that pass."""
    return Twice(IterableWrapper(range(10)).shuffle(buffer_size=3)).map(double)


def random_split_over_shuffle() -> Any:
    """Each ``random_split`` child reads the shuffle again (a new pass each)."""
    first, second = IterableWrapper(range(10)).shuffle(buffer_size=3).random_split(
        total_length=10, weights={"a": 0.5, "b": 0.5}, seed=0)
    return first.concat(second)


def shuffle_cycled_in_each_shard() -> Any:
    """A random pipe below the sharding point, cycled in every logical shard (per-shard seeds)."""
    aux = IterableWrapper(range(5)).shuffle(buffer_size=3).cycle(6)
    return IterableWrapper(range(24)).sharding_filter().zip(aux)


def workers(n: int) -> Any:
    return MultiProcessingReadingService(num_workers=n)


def pass_cuts(pass_length: int, passes: int) -> list[Cut]:
    """Cuts in every pass and at every pass boundary (last sample of a pass, first of the next),
    the end of the epoch (before and after StopIteration), a later epoch, and a restore of a restore."""
    points = {0, 1}
    for k in range(passes):
        start = k * pass_length
        points |= {start + pass_length // 2, start + pass_length - 1, start + pass_length, start + pass_length + 1}
    total = pass_length * passes
    cuts = [Cut(0, p) for p in sorted(points) if p <= total]
    cuts += [Cut(0, total, finished=True), Cut(1, pass_length + 1),
             Cut(0, pass_length - 2, then=pass_length + 3)]
    return cuts


# -- the issue's case ---------------------------------------------------------------------

def _stream(factory: Any, *, save_at: tuple[int, ...] = (), service: Any = None,
            epochs: int = 2) -> tuple[list[list[Any]], list[snapshot.Snapshot]]:
    saved = []
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.seed(SEED)
        out = []
        for _ in range(epochs):
            epoch = []
            for x in loader:
                epoch.append(x)
                if len(out) == 0 and len(epoch) in save_at:
                    saved.append(loader.save_snapshot())
            out.append(epoch)
    return out, saved


def test_issue_case_restores_exactly_in_every_pass_and_at_the_boundaries() -> None:
    assert_resumes_exactly(issue_case, seed=SEED, cuts=pass_cuts(40, 3), strategies=HOOKED_STRATEGIES)


def test_issue_case_cut_after_51_continues_through_the_third_pass(tmp_path: Any) -> None:
    (reference,), _ = _stream(issue_case, epochs=1)
    assert len(reference) == 120
    passes = [reference[i:i + 40] for i in (0, 40, 80)]
    assert all(sorted(p) == list(range(40)) for p in passes)
    assert passes[0] != passes[1] != passes[2] != passes[0], "each pass is shuffled with its own seed"
    _, (snap,) = _stream(issue_case, save_at=(51,), epochs=1)
    path = tmp_path / "cut.snap"
    snapshot.save(snap, path)
    with snapshot.DataLoader2.from_snapshot(path) as loader:
        assert list(loader) == reference[51:]


def test_a_run_that_saves_equals_one_that_never_saves_and_leaves_torch_rng_alone() -> None:
    torch.manual_seed(1234)
    plain, _ = _stream(issue_case)
    after_plain = torch.get_rng_state()
    torch.manual_seed(1234)
    saving, snaps = _stream(issue_case, save_at=(1, 39, 40, 41, 51, 80, 81, 119, 120))
    assert len(snaps) == 9
    assert saving == plain
    assert torch.equal(torch.get_rng_state(), after_plain)


def test_the_stream_does_not_depend_on_torchs_global_generator() -> None:
    torch.manual_seed(1)
    first, _ = _stream(issue_case)
    torch.manual_seed(2)
    second, _ = _stream(issue_case)
    assert first == second


def test_from_snapshot_in_a_fresh_subprocess(tmp_path: Any) -> None:
    (reference,), snaps = _stream(issue_case, save_at=(40, 81), epochs=1)  # at a pass boundary, in the third pass
    paths = [str(tmp_path / f"cut{cut}.snap") for cut in (40, 81)]
    for snap, path in zip(snaps, paths):
        snapshot.save(snap, path)
    script = textwrap.dedent(f"""
        import json, snapshot
        for path in {paths!r}:  # one fresh process for both: each restore builds its own graph from its file
            with snapshot.DataLoader2.from_snapshot(path) as loader:
                print(json.dumps(list(loader)))
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.strip().splitlines()[-2:]] == [reference[40:], reference[81:]]


# -- every kind of re-iterated random pipe, in-process -----------------------------------

@pytest.mark.parametrize(("factory", "pass_length", "passes"), [
    (shuffle_below_the_sharding_point, 30, 3),
    (cycled_above_the_sharding_point, 30, 3),
    (repeat_over_shuffle, 20, 2),
    (cycle_over_repeat_over_shuffle, 24, 3),
    (cycle_over_in_batch_shuffle, 6, 3),
    (cycle_over_bucketbatch, 10, 3),
    (nested_cycles, 16, 3),
    (hookless_inside_the_cycle, 16, 3),
    (hookless_outside_the_cycle, 16, 3),
    (hookless_random_pipe_in_the_cycle, 30, 3),
    (multiplexer_in_the_cycle, 20, 3),
    (multiplexer_replayed_within_its_pass, 20, 3),
    (cached_shuffle_in_the_cycle, 12, 3),
    (cycle_over_zipped_fork_children, 8, 3),
    (hookless_reiterator_over_shuffle, 10, 2),
    (map_shuffle_in_the_cycle, 10, 3),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_reiterated_random_pipes_restore_exactly(factory: Any, pass_length: int, passes: int) -> None:
    (first, _), _ = _stream(factory)
    assert len(first) == pass_length * passes
    hookless = factory in (hookless_inside_the_cycle, hookless_outside_the_cycle, hookless_random_pipe_in_the_cycle,
                           multiplexer_replayed_within_its_pass, hookless_reiterator_over_shuffle,
                           map_shuffle_in_the_cycle)
    strategies = ("auto", "fast_forward") if hookless else HOOKED_STRATEGIES  # auto: state's plan (tests/helpers.py)
    assert_resumes_exactly(factory, seed=SEED, cuts=pass_cuts(pass_length, passes), strategies=strategies)


def test_the_cache_serves_the_later_passes() -> None:
    (epoch, _), _ = _stream(cached_shuffle_in_the_cycle)
    assert epoch[:12] == epoch[12:24] == epoch[24:]


def test_a_cycle_over_a_branch_that_others_read_is_refused() -> None:
    with snapshot.DataLoader2(cycle_over_one_fork_child()) as loader:
        loader.seed(SEED)
        with pytest.raises(SnapshotError, match="iterates its input again within the epoch.*also read by"):
            list(loader)


def test_random_split_over_a_shuffle_restores_exactly() -> None:
    (epoch, _), _ = _stream(random_split_over_shuffle)
    assert len(epoch) == 10
    assert_resumes_exactly(random_split_over_shuffle, seed=SEED, cuts=pass_cuts(5, 2), strategies=("auto",))


def test_later_passes_are_shuffled_again() -> None:
    (epoch, _), _ = _stream(nested_cycles)
    passes = [epoch[i:i + 16] for i in range(0, 48, 16)]
    assert len({tuple(p) for p in passes}) == 3
    assert all(sorted(p) == sorted(list(range(8)) * 2) for p in passes)


# -- with workers, onto other worker counts -----------------------------------------------

def in_process(logical_shards: int) -> Any:
    return snapshot.InProcessReadingService(logical_shards=logical_shards)


#: Where the snapshots of 2 workers are restored: the same count, fewer workers (both logical shards in one
#: worker) and in-process (both logical shards in the main process).
TARGETS = {"2 workers": functools.partial(workers, 2), "1 worker": functools.partial(workers, 1),
           "in-process": functools.partial(in_process, 2)}


def _worker_cuts() -> list[Cut]:
    return [Cut(0, 29), Cut(0, 30), Cut(0, 31), Cut(0, 61), Cut(0, 89), Cut(0, 90, finished=True)]


def test_cycle_above_the_sharding_point_with_workers() -> None:
    """Saved with 2 workers, each snapshot restored onto 2 workers, 1 worker and in-process (2 logical shards)."""
    assert_resumes_exactly_onto(cycled_above_the_sharding_point, functools.partial(workers, 2), TARGETS, seed=SEED,
                                cuts=_worker_cuts(), strategies=dict.fromkeys(TARGETS, ("auto",)))


def test_shuffle_cycled_in_each_shard_with_workers() -> None:
    cuts = [Cut(0, 4), Cut(0, 5), Cut(0, 11), Cut(0, 12), Cut(0, 23), Cut(0, 24, finished=True), Cut(1, 6)]
    assert_resumes_exactly(shuffle_cycled_in_each_shard, seed=SEED, reading_service=functools.partial(workers, 2),
                           restore_service=functools.partial(workers, 1), cuts=cuts, strategies=("state",),
                           via_file=False)


def test_stream_with_workers_equals_in_process_with_the_same_logical_shards() -> None:
    (with_workers,), _ = _stream(cycled_above_the_sharding_point, service=workers(2), epochs=1)
    service = snapshot.InProcessReadingService(logical_shards=2)
    (in_process,), _ = _stream(cycled_above_the_sharding_point, service=service, epochs=1)
    assert len(with_workers) == 90
    assert with_workers == in_process


def _below_cuts(total: int) -> list[Cut]:
    third = total // 3
    return [Cut(0, 1), Cut(0, third - 1), Cut(0, third), Cut(0, third + 1), Cut(0, third + third // 2),
            Cut(0, 2 * third), Cut(0, 2 * third + 1), Cut(0, total - 1), Cut(0, total, finished=True), Cut(1, third)]


@pytest.mark.parametrize(("factory", "n"), [(issue_case, 40), (shuffle_below_the_sharding_point, 30)])
def test_a_cycle_below_the_sharding_point_with_workers_keeps_every_pass_a_partition(factory: Any, n: int) -> None:
    (with_workers,), _ = _stream(factory, service=workers(2), epochs=1)
    (in_process_2,), _ = _stream(factory, service=in_process(2), epochs=1)
    assert with_workers == in_process_2
    items = sorted(with_workers)
    assert items == sorted(list(range(n)) * 3)


def test_with_workers_a_run_that_saves_equals_one_that_never_saves() -> None:
    plain, _ = _stream(issue_case, service=workers(2))
    saving, snaps = _stream(issue_case, service=workers(2), save_at=(39, 40, 41, 79, 80, 81, 100))
    assert len(snaps) == 7
    assert saving == plain


@pytest.mark.parametrize("factory", [issue_case, nested_cycles, cycle_over_bucketbatch])
def test_buffers_saved_by_position_restore_exactly(factory: Any) -> None:
    (epoch, _), _ = _stream(factory)
    assert_resumes_exactly(factory, seed=SEED, cuts=pass_cuts(len(epoch) // 3, 3), strategies=("state",),
                           buffer_state="positions")


# ``auto`` makes the plan of ``state`` for a graph whose every node has a state hook (tests/helpers.py's
# HOOKED_STRATEGIES), so the first two graphs are restored with ``state``; the third needs a replay, where
# ``auto`` differs.
@pytest.mark.parametrize(("factory", "strategies"), [
    (issue_case, ("state", "fast_forward")),  # a shuffle above the sharding point, cycled below it
    (shuffle_below_the_sharding_point, ("state",)),  # a shuffle inside each logical shard, cycled
    (hookless_between_the_sharding_point_and_the_cycle, ("auto", "fast_forward")),  # a replay of its pass
], ids=lambda v: getattr(v, "__name__", None) or "-".join(v))
def test_a_cycle_below_the_sharding_point_with_workers_restores_exactly(factory: Any, strategies: Any) -> None:
    """Every cut of ``_below_cuts`` (in each pass, at both pass boundaries, at the epoch's end, in the next
    epoch), saved once with 2 workers and restored onto every target."""
    (epoch,), _ = _stream(factory, service=workers(2), epochs=1)
    assert_resumes_exactly_onto(factory, functools.partial(workers, 2), TARGETS, seed=SEED,
                                cuts=_below_cuts(len(epoch)), strategies=dict.fromkeys(TARGETS, strategies))


def test_a_cycle_that_reads_a_dispatched_part_again_is_refused() -> None:
    with snapshot.DataLoader2(cycle_below_a_dispatcher(), reading_service=workers(2)) as loader:
        loader.seed(SEED)
        with pytest.raises(SnapshotError, match="sharding_round_robin_dispatch"):
            list(loader)


# -- ranks (real gloo process groups) -------------------------------------------------------

def _rank_epoch(rank: int, world: int) -> list[Any]:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        loader.seed(SEED)
        return list(loader)


def _rank_save(rank: int, world: int, directory: str, steps: int) -> list[Any]:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        loader.seed(SEED)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        loader.save_snapshot(directory)
        return list(it)


def _rank_restore(rank: int, world: int, directory: str) -> list[Any]:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        loader.restore_snapshot(directory)
        return list(loader)


def test_a_cycle_below_the_sharding_point_on_two_ranks(tmp_path: Any) -> None:
    from tests.dist import run_ranks

    (single,), _ = _stream(issue_case, service=in_process(2), epochs=1)
    ranks = run_ranks(2, _rank_epoch)
    assert ranks == [single[0::2], single[1::2]]
    directory = str(tmp_path / "data.snap")
    rests = run_ranks(2, _rank_save, directory, 45)  # each rank in its third pass
    assert rests == [single[0::2][45:], single[1::2][45:]]
    assert run_ranks(2, _rank_restore, directory) == rests
    with snapshot.DataLoader2(issue_case(), reading_service=in_process(2)) as loader:
        loader.restore_snapshot(directory)  # onto one process
        assert list(loader) == single[90:]


def _rank_seen_then_saved(rank: int, world: int, directory: str, steps: int) -> list[Any]:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(
            60, even_batches=None)) as loader:
        loader.seed(SEED)
        it = iter(loader)
        seen = [next(it) for _ in range(steps)]
        loader.save_snapshot(directory)
        return seen


def _rank_rest(rank: int, world: int, directory: str) -> dict[str, list[Any]]:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(
            60, even_batches=None)) as loader:
        loader.restore_snapshot(directory)
        return {"rest": list(loader), "next": list(loader)}


def _rank_fresh_next(rank: int, world: int) -> list[Any]:
    """Epoch 1 of a run that always had ``world`` ranks and 2 logical shards."""
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(
            60, logical_shards=2, even_batches=None)) as loader:
        loader.seed(SEED)
        list(loader)
        return list(loader)


@pytest.mark.parametrize(("saved", "resumed", "steps"), [(2, 3, 7), (2, 1, 25), (2, 1, 45)])
def test_a_cycle_below_the_sharding_point_restored_onto_another_number_of_ranks(
        tmp_path: Any, saved: int, resumed: int, steps: int) -> None:
    from collections import Counter

    from tests.dist import run_ranks

    directory = str(tmp_path / "data.snap")
    seen = run_ranks(saved, _rank_seen_then_saved, directory, steps)
    after = run_ranks(resumed, _rank_rest, directory)
    every_pass = Counter(list(range(40)) * 3)
    epoch = Counter(x for share in seen for x in share) + Counter(x for r in after for x in r["rest"])
    assert epoch == every_pass, "each sample once per pass in the interrupted epoch"
    assert Counter(x for r in after for x in r["next"]) == every_pass
    # the next epoch, rank by rank: that of a run that always had ``resumed`` ranks
    assert [r["next"] for r in after] == run_ranks(resumed, _rank_fresh_next)


def _rank_refused(rank: int, world: int, directory: str) -> str:
    with snapshot.DataLoader2(issue_case(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        try:
            loader.restore_snapshot(directory)
        except SnapshotError as exc:
            return str(exc)
        return "restored"


def test_a_split_of_units_in_a_later_pass_is_refused(tmp_path: Any) -> None:
    from tests.dist import run_ranks

    directory = str(tmp_path / "data.snap")
    run_ranks(2, _rank_seen_then_saved, directory, 25)  # each rank in its second pass
    for message in run_ranks(3, _rank_refused, directory):
        assert "was reading its sharding point 0/source_datapipe again" in message
        assert "Restore on a number of ranks that divides 2" in message
