"""A restore onto another number of ranks when each logical shard holds a buffer of its own.

The shuffle is below the sharding point, so each logical shard has its own 200-sample buffer,
saved full in the middle of the epoch. On another number of ranks the shards are split into
sub-shards (:mod:`snapshot.reading_service._shards.split`) and a buffer stays with its shard's rank, so
the ranks' shares of the rest of the epoch can differ by hundreds of samples. The equalizing
policy counts them as they are read: when a rank runs out, the ranks share what is left (see
:mod:`snapshot.reading_service._ranks.even`), so ``"drop"`` loses and ``"pad"`` repeats fewer than R'
samples, near the end of the epoch too, and ``even_batches=None`` yields every sample exactly
once. The next epoch is split afresh: rank by rank, in order, that of a run that always had R'
ranks and the saved logical shards.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest

import snapshot
from tests.dist import run_ranks
from tests.reading_service.test_distributed_even import train_epoch

AT = 95  # steps per rank before the save: each shard has read AT + 200 samples


def double(x: int) -> int:
    return 2 * x


def graph(samples: int) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(samples)).sharding_filter().shuffle(buffer_size=200).map(double)


def every(samples: int) -> Counter[int]:
    return Counter(double(x) for x in range(samples))


def service(policy: str | None = "drop", workers: int = 0) -> Any:
    ranks = snapshot.DistributedReadingService(timeout=60, even_batches=policy)
    if workers:
        return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(workers))
    return ranks


def first_run(rank: int, world: int, directory: str, samples: int, workers: int = 0) -> list[Any]:
    with snapshot.DataLoader2(graph(samples), reading_service=service(workers=workers)) as loader:
        loader.seed(7)
        return train_epoch(loader, (AT, directory))[:AT]


def resumed_run(rank: int, world: int, directory: str, samples: int, policy: str | None,
                workers: int = 0) -> dict[str, Any]:
    """The rest of the saved epoch and the next one (a collective per sample where a policy keeps ranks even)."""
    with snapshot.DataLoader2(graph(samples), reading_service=service(policy, workers)) as loader:
        loader.restore_snapshot(directory)
        rest = train_epoch(loader) if policy else list(loader)
        return {"rest": rest, "next": train_epoch(loader) if policy else list(loader)}


def _saved(tmp_path: Any, ranks: int, samples: int, workers: int = 0) -> tuple[str, Counter[int]]:
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(ranks, first_run, directory, samples, workers, pg_timeout=30)
    return directory, Counter(x for share in seen for x in share)


def fresh_epochs(rank: int, world: int, samples: int, shards: int) -> list[list[Any]]:
    """Two epochs of a run that always had ``world`` ranks and ``shards`` logical shards."""
    ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=shards, even_batches=None)
    with snapshot.DataLoader2(graph(samples), reading_service=ranks) as loader:
        loader.seed(7)
        return [list(loader) for _ in range(2)]


@functools.cache
def fresh_run(world: int, samples: int, shards: int) -> list[list[list[Any]]]:
    """Each rank's epochs on ``world`` ranks (read once per session)."""
    return run_ranks(world, fresh_epochs, samples, shards, pg_timeout=30, timeout=180)


def _check_next(resumed: list[dict[str, Any]], samples: int, shards: int) -> None:
    """The epoch after the restore: every sample once, as many on each rank, and rank by rank, in
    order, epoch 1 of a run that always had as many ranks and the saved ``shards`` logical shards."""
    shares = [r["next"] for r in resumed]
    assert Counter(x for share in shares for x in share) == every(samples)
    assert len({len(share) for share in shares}) == 1, [len(share) for share in shares]
    fresh = fresh_run(len(resumed), samples, shards)
    for rank, share in enumerate(shares):
        assert share == fresh[rank][1], f"rank {rank} of {len(shares)}"


# (saved on, resumed on, samples): 2 -> 3 and 3 -> 2 ranks, with 10 or 15 samples unread in the epoch: the
# rest is the buffers (200 per saved shard), which stay with their shards' ranks
NEAR_THE_END = [(2, 3, 600), (3, 2, 900)]


def _check_rest(resumed: list[dict[str, Any]], seen: Counter[int], samples: int, policy: str | None,
                ranks: int) -> None:
    shares = [r["rest"] for r in resumed]
    got = Counter(x for share in shares for x in share) + seen
    if policy is None:
        assert got == every(samples)
        return
    assert len({len(share) for share in shares}) == 1, [len(share) for share in shares]
    if policy == "drop":
        assert not [x for x, n in got.items() if n > 1] and not got - every(samples)
        assert sum((every(samples) - got).values()) < ranks, "drop lost R' samples or more"
    else:
        assert not every(samples) - got, "a sample was lost"
        assert sum((got - every(samples)).values()) < ranks, "pad repeated R' samples or more"


@pytest.mark.slow
@pytest.mark.parametrize("before, after, samples", NEAR_THE_END)
@pytest.mark.parametrize("policy", ["drop", "pad", None])
def test_full_buffers_near_the_end_of_the_epoch_are_shared_out(tmp_path, before: int, after: int, samples: int,
                                                               policy: str | None) -> None:
    # before the policies counted as they read, these restores were refused ("the ranks would have 200,
    # 200, 10 sample(s) left"): the shards' buffers stay with their ranks, and too few unread samples are
    # left to even the ranks out at the sharding point
    directory, seen = _saved(tmp_path, before, samples)
    resumed = run_ranks(after, resumed_run, directory, samples, policy, pg_timeout=30, timeout=180)
    _check_rest(resumed, seen, samples, policy, after)
    _check_next(resumed, samples, before)


@pytest.mark.slow
def test_with_a_worker_per_rank_the_samples_it_produced_ahead_count_too(tmp_path) -> None:
    # a worker per rank holds samples produced ahead of the loader besides its shard's buffer
    directory, seen = _saved(tmp_path, 2, 600, 1)
    for policy in ["drop", None]:
        resumed = run_ranks(3, resumed_run, directory, 600, policy, 1, pg_timeout=30)
        _check_rest(resumed, seen, 600, policy, 3)
        _check_next(resumed, 600, 2)


# the same, earlier in the epoch (so many unread samples are left that they even the buffers out)
EVENED = [(2, 3, 1800, "drop"), (2, 3, 1800, "pad"), (3, 2, 3000, "drop"), (3, 2, 3000, "pad")]


@pytest.mark.slow
@pytest.mark.parametrize("before, after, samples, policy", EVENED)
def test_unread_samples_even_out_the_buffers(tmp_path, before: int, after: int, samples: int,
                                             policy: str) -> None:
    directory, seen = _saved(tmp_path, before, samples)
    resumed = run_ranks(after, resumed_run, directory, samples, policy, pg_timeout=30, timeout=180)
    _check_rest(resumed, seen, samples, policy, after)
    _check_next(resumed, samples, before)


def keep(x: int) -> bool:
    return x >= 0


def unsized(samples: int) -> Any:
    """The same graph, with a filter above the sharding point: its input has no length."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(samples)).filter(keep).sharding_filter().shuffle(buffer_size=200).map(double)


def unsized_first(rank: int, world: int, directory: str, samples: int) -> list[Any]:
    with snapshot.DataLoader2(unsized(samples), reading_service=service()) as loader:
        loader.seed(7)
        return train_epoch(loader, (AT, directory))[:AT]


def unsized_resumed(rank: int, world: int, directory: str, samples: int) -> dict[str, Any]:
    with snapshot.DataLoader2(unsized(samples), reading_service=service()) as loader:
        loader.restore_snapshot(directory)
        return {"rest": train_epoch(loader)}


@pytest.mark.slow
def test_without_a_length_nothing_needs_predicting(tmp_path) -> None:
    # the sharding point's input has no __len__, so no one can tell beforehand how many samples are left
    # to even the buffers out: the policy counts them as they come (it used to warn, and drop 380)
    directory = str(tmp_path / "data.snap")
    seen = run_ranks(2, unsized_first, directory, 600, pg_timeout=30)
    resumed = run_ranks(3, unsized_resumed, directory, 600, pg_timeout=30)
    _check_rest(resumed, Counter(x for s in seen for x in s), 600, "drop", 3)


def refused_then_run(rank: int, world: int, directory: str, samples: int) -> dict[str, Any]:
    """A refused restore (the workers ask for 3 logical shards, the snapshot has 2), then the same loader's
    first epoch (it is unchanged: it starts from the beginning, with the 3 logical shards asked for)."""
    ranks = snapshot.DistributedReadingService(timeout=60)
    workers = snapshot.MultiProcessingReadingService(2, logical_shards=3)
    with snapshot.DataLoader2(graph(samples), reading_service=snapshot.SequentialReadingService(ranks, workers)) \
            as loader:
        loader.seed(7)
        try:
            loader.restore_snapshot(directory)
        except snapshot.LayoutError as exc:
            return {"refused": str(exc), "epoch": train_epoch(loader)}
        return {"refused": None, "epoch": []}


@pytest.mark.slow
def test_a_refused_restore_leaves_the_loader_as_it_was(tmp_path) -> None:
    directory, _ = _saved(tmp_path, 2, 600)
    after = run_ranks(2, refused_then_run, directory, 600, pg_timeout=30)
    assert all(r["refused"] and "this service asks for logical_shards=3" in r["refused"] for r in after)
    shares = [r["epoch"] for r in after]
    assert Counter(x for share in shares for x in share) == every(600)
    assert [len(share) for share in shares] == [300, 300]
