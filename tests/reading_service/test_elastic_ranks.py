"""A job resumed on another number of ranks: every sample once, equal ranks, every later epoch.

A run on R ranks saves (mid-epoch or at the end of an epoch) and is resumed on R' ranks,
whether or not R' divides the run's logical shards. Each rank runs a training step's collective
per sample and collectives after the loop (a rank with a longer share would hang them). Over the
rest of the interrupted epoch the ranks together yield every sample the run that saved had not
yielded exactly once, except a residue of fewer than R' samples that ``even_batches="drop"``
needs to keep the ranks equal (as ``DistributedSampler(drop_last=True)`` does). Each of the next
two epochs is, rank by rank and in order, that of a run that always had R' ranks and the saved
run's logical shards.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest

import snapshot
from tests.dist import run_ranks
from tests.reading_service.test_distributed_even import train_epoch

SAMPLES = 240


def double(x: int) -> int:
    return 2 * x


def graph() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=20).sharding_filter().map(double)


EVERY = Counter(double(x) for x in range(SAMPLES))


def service(workers: int = 0, policy: str | None = "drop") -> Any:
    ranks = snapshot.DistributedReadingService(timeout=60, even_batches=policy)
    if workers:
        return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(workers))
    return ranks


def first_run(rank: int, world: int, directory: str, at: int | None, workers: int) -> list[Any]:
    """Epoch 0 on ``world`` ranks, saved after ``at`` steps (``None``: after the loop)."""
    with snapshot.DataLoader2(graph(), reading_service=service(workers)) as loader:
        loader.seed(11)
        seen = train_epoch(loader, (at, directory) if at is not None else None)
        if at is None:
            loader.save_snapshot(directory)
            return seen
        return seen[:at]


def resumed_run(rank: int, world: int, directory: str, workers: int, policy: str | None = "drop") -> dict[str, Any]:
    """The rest of the saved epoch and the next two, on ``world`` ranks."""
    with snapshot.DataLoader2(graph(), reading_service=service(workers, policy)) as loader:
        ended = loader.restore_snapshot(directory).manifest["loader"]["epoch_finished"]
        rest = [] if ended else train_epoch(loader) if policy else list(loader)
        later = [train_epoch(loader) if policy else list(loader) for _ in range(2)]
        return {"rest": rest, "later": later}


def fresh_epochs(rank: int, world: int, shards: int, factory: Any) -> list[list[Any]]:
    """Three epochs of a run that always had ``world`` ranks and ``shards`` logical shards."""
    ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=shards, even_batches=None)
    with snapshot.DataLoader2(factory(), reading_service=ranks) as loader:
        loader.seed(11)
        return [list(loader) for _ in range(3)]


@functools.cache
def fresh_run(world: int, shards: int, factory: Any) -> list[list[list[Any]]]:
    """Each rank's epochs on ``world`` ranks with ``shards`` logical shards (read once per session)."""
    return run_ranks(world, fresh_epochs, shards, factory, pg_timeout=30, timeout=180)


def _check_later(resumed: list[dict[str, Any]], shards: int, factory: Any = None) -> None:
    """The epochs after the restore: rank by rank, epochs 1, 2, ... of a run that always had as many ranks."""
    fresh = fresh_run(len(resumed), shards, factory or graph)
    for rank, result in enumerate(resumed):
        for epoch, got in enumerate(result["later"], start=1):
            assert got == fresh[rank][epoch], f"rank {rank}, epoch {epoch}"


def _check_epoch(shares: list[list[Any]], already: Counter[Any], ranks: int) -> None:
    """One epoch's shares: nothing twice, at most ``ranks - 1`` samples missing, equal ranks."""
    got = Counter(x for share in shares for x in share) + already
    assert not [x for x, n in got.items() if n > 1], "a sample was yielded twice"
    assert not got - EVERY, "a sample that is not in the data"
    missing = EVERY - got
    assert sum(missing.values()) < ranks, f"{sum(missing.values())} samples lost on {ranks} ranks"
    assert len({len(share) for share in shares}) == 1


CASES = [  # (saved on, resumed on, step of the save or None for the end of the epoch, workers per rank)
    (4, 3, None, 0), (4, 3, 17, 0), (2, 3, None, 0), (2, 3, 40, 0), (3, 2, 25, 0), (3, 2, None, 0),
    (4, 1, 30, 0), (4, 1, None, 0), (4, 3, 17, 1), (2, 3, 40, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("before, after, at, workers", CASES)
def test_every_sample_once_on_another_number_of_ranks(tmp_path, before: int, after: int, at: int | None,
                                                      workers: int) -> None:
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(before, first_run, directory, at, workers, pg_timeout=30, timeout=180)
    resumed = run_ranks(after, resumed_run, directory, workers, pg_timeout=30, timeout=180)
    if at is not None:
        _check_epoch([r["rest"] for r in resumed], Counter(x for share in seen for x in share), after)
    for epoch in range(2):
        _check_epoch([r["later"][epoch] for r in resumed], Counter(), after)
    _check_later(resumed, before)


@pytest.mark.slow
def test_without_a_policy_every_sample_once_exactly(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(4, first_run, directory, 17, 0, pg_timeout=30)
    resumed = run_ranks(3, resumed_run, directory, 0, None, pg_timeout=30)
    assert Counter(x for r in resumed for x in r["rest"]) + Counter(x for s in seen for x in s) == EVERY
    _check_later(resumed, 4)


def resumed_and_saved(rank: int, world: int, directory: str, again: str, at: int) -> list[Any]:
    """The saved epoch resumed on ``world`` ranks, saved again after ``at`` more steps."""
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.restore_snapshot(directory)
        return train_epoch(loader, (at, again))[:at]


@pytest.mark.slow
@pytest.mark.parametrize("then", [2, 5])
def test_a_split_epoch_saved_again_restores_onto_a_third_number_of_ranks(tmp_path, then: int) -> None:
    # 4 ranks (4 logical shards) -> 3 ranks (12 sub-shards) -> 2 ranks (12) or 5 ranks (60)
    first, second = str(tmp_path / "first.snap"), str(tmp_path / "second.snap")
    seen = run_ranks(4, first_run, first, 11, 0, pg_timeout=30)
    middle = run_ranks(3, resumed_and_saved, first, second, 9, pg_timeout=30)
    assert snapshot.read_manifest(second)["service"]["units"] == 12
    resumed = run_ranks(then, resumed_run, second, 0, pg_timeout=30, timeout=180)
    already = Counter(x for share in seen + middle for x in share)
    _check_epoch([r["rest"] for r in resumed], already, then)
    _check_later(resumed, 4)  # the first run's 4 logical shards, whatever the layouts in between


@pytest.mark.slow
def test_pad_repeats_fewer_samples_than_ranks(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(4, first_run, directory, 17, 0, pg_timeout=30)
    resumed = run_ranks(3, resumed_run, directory, 0, "pad", pg_timeout=30)
    before = Counter(x for share in seen for x in share)
    for shares, already in [([r["rest"] for r in resumed], before)] + \
            [([r["later"][e] for r in resumed], Counter()) for e in range(2)]:
        got = Counter(x for share in shares for x in share) + already
        assert not EVERY - got, "a sample was lost"
        assert sum((got - EVERY).values()) < 3, "pad repeated more than the residue"
        assert len({len(share) for share in shares}) == 1
    _check_later(resumed, 4)


def batched() -> Any:
    return graph().batch(4)


def deep_prefetch() -> Any:
    ranks = snapshot.DistributedReadingService(timeout=60)
    return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(1, prefetch_factor=6))


def batched_first(rank: int, world: int, directory: str, at: int) -> list[Any]:
    with snapshot.DataLoader2(batched(), reading_service=deep_prefetch()) as loader:
        loader.seed(11)
        return train_epoch(loader, (at, directory))[:at]


def batched_resumed(rank: int, world: int, directory: str) -> dict[str, Any]:
    with snapshot.DataLoader2(batched(), reading_service=service(1)) as loader:
        loader.restore_snapshot(directory)
        return {"rest": train_epoch(loader), "later": [train_epoch(loader)]}


@pytest.mark.slow
def test_batches_in_flight_count_as_their_samples(tmp_path) -> None:
    # a worker per rank holds up to 6 batches of 4 ahead of the loader when the snapshot is taken: the
    # restore counts each as 4 samples when it evens out the new shares, so "drop" cuts fewer
    # than 3 batches
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(4, batched_first, directory, 5, pg_timeout=30)
    resumed = run_ranks(3, batched_resumed, directory, pg_timeout=30)
    for shares, already in [([r["rest"] for r in resumed], Counter(x for s in seen for b in s for x in b)),
                            ([r["later"][0] for r in resumed], Counter())]:
        got = Counter(x for share in shares for b in share for x in b) + already
        assert not got - EVERY, "a sample twice, or one not in the data"
        assert sum((EVERY - got).values()) < 3 * 4, f"{sum((EVERY - got).values())} samples lost"
        assert len({len(share) for share in shares}) == 1
    _check_later(resumed, 4, batched)


MARKERS = [[-1], [-2], [-3], [-4]]  # what 4 saved ranks' callers had to hand out first (fetched ahead)


def handed_out_then_saved(rank: int, world: int, directory: str, again: str) -> dict[str, Any]:
    """Resumed on ``world`` ranks with the saved ranks' markers handed out first; saved again after
    one step, while rank 0 still holds a marker; the rest of the epoch and the next."""
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.reading_service.hand_out_first(MARKERS)
        loader.restore_snapshot(directory)
        rest = train_epoch(loader, (1, again))
        return {"rest": rest, "later": [train_epoch(loader)]}


def resumed_twice(rank: int, world: int, again: str) -> dict[str, Any]:
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.restore_snapshot(again)
        return {"rest": train_epoch(loader), "later": [train_epoch(loader)]}


@pytest.mark.slow
def test_samples_handed_out_first_are_counted_and_saved_until_yielded(tmp_path) -> None:
    first, again = str(tmp_path / "first.snap"), str(tmp_path / "again.snap")
    seen = run_ranks(4, first_run, first, 17, 0, pg_timeout=30)
    resumed = run_ranks(3, handed_out_then_saved, first, again, pg_timeout=30)
    # the 4 markers are dealt 2, 1 and 1, yielded first, and counted: the ranks take equal steps
    assert [r["rest"][:2] for r in resumed][0] == [-1, -2]
    assert [r["rest"][0] for r in resumed[1:]] == [-3, -4]
    assert len({len(r["rest"]) for r in resumed}) == 1
    rest = Counter(x for r in resumed for x in r["rest"] if x >= 0)
    got = rest + Counter(x for share in seen for x in share)
    assert not [x for x, n in got.items() if n > 1] and not got - EVERY
    assert sum((EVERY - got).values()) < 3
    _check_epoch([r["later"][0] for r in resumed], Counter(), 3)
    _check_later(resumed, 4)
    # saved after one step, rank 0's second marker was still to come: the snapshot keeps it
    twice = run_ranks(3, resumed_twice, again, pg_timeout=30)
    for rank in range(3):
        assert twice[rank]["rest"] == resumed[rank]["rest"][1:]
        assert twice[rank]["later"] == resumed[rank]["later"]
