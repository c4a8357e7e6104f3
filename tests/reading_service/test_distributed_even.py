"""Ranks end each epoch together: ``DistributedReadingService(even_batches=...)`` on uneven data.

41 samples do not divide among 2 or 3 ranks. Every rank function below runs the training
step's collective (an all-reduce, as DDP's gradient sync) once per sample and a collective
after the loop, on the default group with a short timeout: with ranks that end an epoch after
different numbers of samples, their collectives stop matching, and one fails or waits until the
timeout (the control test shows it).

When a rank runs out, the ranks share what is left (one sample per rank per step, sent from the ranks
that have more), so ``"drop"`` loses and ``"pad"`` repeats fewer samples than there are ranks.
Snapshots stay exact under each policy: at the end of an epoch in which ``"drop"`` dropped a
sample (the next epoch is the uninterrupted run's, on the same ranks and on others), mid-epoch
onto another number of ranks, and while the ranks share (each rank's samples read for sharing are
saved by value).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest

import snapshot
from tests.dist import RankFailure, free_port, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = 41
DEFAULT = "default"  # build DistributedReadingService without even_batches


def graph(n: int = SAMPLES) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter()


def keep(x: int) -> bool:
    return x % 4 != 3


def lopsided(samples: int = 24) -> Any:
    """24 samples, 2 logical shards of 12 and 6 after the filter: the second runs out early."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(samples)).sharding_filter().filter(keep)


def service(policy: Any = DEFAULT, logical_shards: int | None = None, workers: int = 0) -> Any:
    if policy == DEFAULT:
        ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=logical_shards)
    else:
        ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=logical_shards, even_batches=policy)
    if workers:
        return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(workers))
    return ranks


def train_epoch(loader: Any, save: Any = None) -> list[Any]:
    """One epoch with a collective per sample and two after the loop (as a DDP job has)."""
    import torch
    import torch.distributed as dist

    seen = []
    for step, sample in enumerate(loader):
        dist.all_reduce(torch.ones(1))  # the training step's gradient sync
        seen.append(sample)
        if save is not None and step + 1 == save[0]:
            loader.save_snapshot(save[1])
    total = torch.tensor([len(seen)])
    dist.all_reduce(total)  # e.g. averaging a metric over the ranks
    dist.barrier()
    assert int(total) == len(seen) * dist.get_world_size(), "ranks took different numbers of steps"
    return seen


def one_stream(shards: int, epochs: int) -> list[list[int]]:
    """The run's stream in one process, with the same logical shards."""
    with snapshot.DataLoader2(graph(), reading_service=snapshot.InProcessReadingService(logical_shards=shards)) \
            as loader:
        loader.seed(7)
        return [list(loader) for _ in range(epochs)]


# -- rank functions -----------------------------------------------------------------------------

def epochs_with_collectives(rank: int, world: int, policy: Any, epochs: int, workers: int = 0) -> list[list[int]]:
    with snapshot.DataLoader2(graph(), reading_service=service(policy, workers=workers)) as loader:
        loader.seed(7)
        return [train_epoch(loader) for _ in range(epochs)]


def mismatched_collectives(rank: int, world: int) -> list[list[int]]:
    """One epoch with no policy: the ranks' collectives stop matching. gloo may abort the
    process; the harness reports that as a failed rank, so no Python stack dump is wanted."""
    faulthandler.disable()
    return epochs_with_collectives(rank, world, None, 1)


def save_in_epoch_0(rank: int, world: int, directory: str, at: int | None, shards: int | None,
                    policy: Any = DEFAULT, factory: Any = graph) -> dict[str, Any]:
    """Epoch 0 with a snapshot after ``at`` samples (``None``: after the loop), then epoch 1."""
    with snapshot.DataLoader2(factory(), reading_service=service(policy, shards)) as loader:
        loader.seed(7)
        first = train_epoch(loader, (at, directory) if at is not None else None)
        if at is None:
            loader.save_snapshot(directory)
        return {"epochs": [first, train_epoch(loader)]}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def resume(rank: int, world: int, directory: str, policy: Any = DEFAULT, factory: Any = graph) -> dict[str, Any]:
    """The rest of the snapshot's epoch (none if it had ended), then the next epoch, and the
    warnings the restore logged."""
    records = _Records()
    logger = logging.getLogger("snapshot")
    logger.addHandler(records)
    try:
        with snapshot.DataLoader2(factory(), reading_service=service(policy)) as loader:
            ended = loader.restore_snapshot(directory).manifest["loader"]["epoch_finished"]
            return {"rest": [] if ended else train_epoch(loader), "next": train_epoch(loader),
                    "warnings": records.messages}
    finally:
        logger.removeHandler(records)


# -- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("world, workers", [(2, 0), (3, 0), (2, 1)])
def test_by_default_ranks_end_each_epoch_together(world: int, workers: int) -> None:
    # with a worker per rank, rank 0 leaves its worker's last sample unread: the next epoch is right
    results = run_ranks(world, epochs_with_collectives, DEFAULT, 2, workers, pg_timeout=20)
    single = one_stream(world, 2)
    for epoch in range(2):
        # torchdata 0.9: every rank stops when the first runs out; each keeps its share's head
        length = SAMPLES // world
        for rank in range(world):
            assert results[rank][epoch] == single[epoch][rank::world][:length]
        dropped = Counter(single[epoch]) - Counter(x for r in results for x in r[epoch])
        assert sum(dropped.values()) == SAMPLES % world
    assert results[0][0] != results[0][1]


def test_without_a_policy_the_collective_after_the_loop_fails() -> None:
    # the control: 21 and 20 samples, so rank 0's last step waits for a peer that left the loop
    try:
        results = run_ranks(2, mismatched_collectives, pg_timeout=5, timeout=40, allow_errors=True)
    except AssertionError as exc:  # a rank stuck beyond the harness's limit: a hang too
        assert "did not finish" in str(exc)
        return
    assert any(isinstance(r, RankFailure) for r in results), results


@pytest.mark.parametrize("at", [None, 20])
def test_a_snapshot_where_drop_ends_the_epoch_restores_the_next_epoch(tmp_path, at: int | None) -> None:
    # saved after the loop (rank 0 had read a sample that "drop" threw away), or inside it at the
    # last step (before the drop): the same ranks end epoch 0 where they did and read the same epoch 1
    directory = str(tmp_path / "data.snap")
    full = run_ranks(2, save_in_epoch_0, directory, at, None, pg_timeout=20)
    again = run_ranks(2, resume, directory, pg_timeout=20)
    for rank in range(2):
        assert again[rank]["rest"] == full[rank]["epochs"][0][20:] == []
        assert again[rank]["next"] == full[rank]["epochs"][1]
    # in one process there is nothing to even out: the rest is what the ranks had not read, and
    # the next epoch is the one stream of the seed and 2 logical shards
    with snapshot.DataLoader2(graph(), reading_service=snapshot.InProcessReadingService()) as loader:
        loader.restore_snapshot(directory)
        rest = list(loader) if at is not None else []
        following = list(loader)
    seen = full[0]["epochs"][0] + full[1]["epochs"][0]
    single = one_stream(2, 2)
    if at is not None:
        assert rest == [x for x in single[0] if x not in seen] and len(rest) == 1
    else:
        assert sorted(seen) != list(range(SAMPLES))  # "drop" did drop one (rank 0's 21st)
    assert following == single[1]


def test_after_the_epoch_onto_more_ranks_the_next_epoch_is_theirs(tmp_path) -> None:
    # 6 logical shards: saved on 2 ranks after a dropped sample, resumed on 3; the 3 ranks read the
    # epoch that 3 ranks of the same run read (same seeds, same shards)
    directory = str(tmp_path / "data.snap")
    run_ranks(2, save_in_epoch_0, directory, None, 6, pg_timeout=20)
    three = run_ranks(3, save_in_epoch_0, str(tmp_path / "other.snap"), None, 6, pg_timeout=20)
    resumed = run_ranks(3, resume, directory, pg_timeout=20)
    for rank in range(3):
        assert resumed[rank]["rest"] == []
        assert resumed[rank]["next"] == three[rank]["epochs"][1]
        assert resumed[rank]["warnings"] == []  # an ended epoch: the policy has nothing to cut


def test_mid_epoch_onto_more_ranks_drop_cuts_fewer_samples_than_ranks(tmp_path) -> None:
    # 6 logical shards of 7, 7, 7, 7, 7 and 6 samples; saved on 2 ranks after 5 steps, resumed on 3
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_in_epoch_0, directory, 5, 6, pg_timeout=20)
    seen = [x for rank in before for x in rank["epochs"][0][:5]]
    shares = run_ranks(3, restore_shares, directory, pg_timeout=20)  # each new rank's whole share
    assert Counter(seen + [x for share in shares for x in share]) == Counter(range(SAMPLES))
    # the restore evens the new ranks' shares out: 31 samples left, so 11, 10 and 10
    assert sorted(len(share) for share in shares) == [10, 10, 11]
    even = run_ranks(3, resume, directory, pg_timeout=20)
    length = min(len(share) for share in shares)
    for rank in range(3):
        assert even[rank]["rest"] == shares[rank][:length]  # nothing repeated, only the residue cut
        assert even[rank]["warnings"] == []
    # the next epoch, rank by rank, is that of a run that always had 3 ranks (and 6 logical shards)
    three = run_ranks(3, save_in_epoch_0, str(tmp_path / "other.snap"), None, 6, pg_timeout=20)
    for rank in range(3):
        assert even[rank]["next"] == three[rank]["epochs"][1]


def restore_shares(rank: int, world: int, directory: str) -> list[int]:
    """The rest of the epoch with no policy and no collectives in the loop: each rank's whole share."""
    with snapshot.DataLoader2(graph(), reading_service=service(None)) as loader:
        loader.restore_snapshot(directory)
        return list(loader)


def next_shares(rank: int, world: int, directory: str) -> list[int]:
    with snapshot.DataLoader2(graph(), reading_service=service(None)) as loader:
        loader.restore_snapshot(directory)
        list(loader)
        return list(loader)


@pytest.mark.parametrize("samples", [24, 22])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_a_rank_that_runs_out_gets_a_share_of_the_rest(samples: int, policy: str) -> None:
    # shares of 12 and 6 (or 11 and 6): torchdata 0.9 stopped (drop) or padded (pad) for 6 steps; the ranks
    # now share the rest, so drop loses and pad repeats at most one sample (fewer than the 2 ranks)
    results = run_ranks(2, epochs_with_collectives_of, policy, lopsided, samples, pg_timeout=20)
    shares = [r[0] for r in results]
    got, wanted = Counter(shares[0] + shares[1]), Counter(x for x in range(samples) if keep(x))
    total = sum(wanted.values())
    assert len(shares[0]) == len(shares[1]) == (total // 2 if policy == "drop" else (total + 1) // 2)
    if policy == "drop":
        assert not got - wanted and sum((wanted - got).values()) == sum(wanted.values()) % 2
    else:
        assert not wanted - got and sum((got - wanted).values()) == sum(wanted.values()) % 2
    # each rank's own share while both have one (6 steps); then rank 0's rest is dealt one by one: rank 0
    # keeps the first of each pair, rank 1 receives the second; an odd one out is dropped, or rank 1 pads
    own = [x for x in range(samples) if keep(x) and x % 2 == 0]
    rest = own[6:]
    assert shares[0] == own[:6] + rest[0::2][:len(shares[0]) - 6]
    padding = [rest[1::2][-1]] if policy == "pad" and len(rest) % 2 else []
    assert shares[1] == [x for x in range(samples) if keep(x) and x % 2 == 1] + rest[1::2] + padding


def epochs_with_collectives_of(rank: int, world: int, policy: Any, factory: Any, samples: int) -> list[list[int]]:
    with snapshot.DataLoader2(factory(samples), reading_service=service(policy)) as loader:
        loader.seed(7)
        return [train_epoch(loader) for _ in range(2)]


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_a_snapshot_taken_while_the_ranks_share_resumes_exactly(tmp_path, policy: str) -> None:
    # rank 1's share ends after 6 steps; saved at step 8, while rank 0 hands it samples
    directory = str(tmp_path / "data.snap")
    full = run_ranks(2, save_in_epoch_0, directory, 8, None, policy, lopsided, pg_timeout=20)
    assert [len(r["epochs"][0]) for r in full] == [9, 9]
    again = run_ranks(2, resume, directory, policy, lopsided, pg_timeout=20)
    for rank in range(2):
        assert again[rank]["rest"] == full[rank]["epochs"][0][8:]
        assert again[rank]["next"] == full[rank]["epochs"][1]
    manifest = snapshot.read_manifest(directory)
    assert manifest["service"]["even_batches"] == policy
    assert [r["handout"]["sharing"] for r in manifest["ranks"]] == [True, True]
    # onto 3 ranks: the rest of the epoch exactly once (rank 0's spare samples are handed out first)
    three = run_ranks(3, resume, directory, policy, lopsided, pg_timeout=20)
    seen = Counter(x for r in full for x in r["epochs"][0][:8]) + Counter(x for r in three for x in r["rest"])
    wanted = Counter(x for x in range(24) if keep(x))
    assert len({len(r["rest"]) for r in three}) == 1
    assert not seen - wanted if policy == "drop" else not wanted - seen
    assert sum(((wanted - seen) if policy == "drop" else (seen - wanted)).values()) < 3


# 3 ranks: two of them hold a sample more than the third (41 samples); the same code evens out 2 ranks (one
# ahead), which test_by_default_ranks_end_each_epoch_together checks on real gloo groups of 2 and 3
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [3])
def test_under_torchrun_a_collective_after_the_loop_returns(tmp_path, ranks: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import datetime, sys
        sys.path.insert(0, {ROOT!r})
        import torch.distributed as dist
        import snapshot
        from tests.reading_service.test_distributed_even import SAMPLES, graph, train_epoch
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        rank, world = dist.get_rank(), dist.get_world_size()
        with snapshot.DataLoader2(graph(), reading_service=snapshot.DistributedReadingService(timeout=30)) as loader:
            loader.seed(7)
            first = train_epoch(loader)                 # hangs here without equal shares
            loader.save_snapshot({str(tmp_path / 'snap')!r})
            second = train_epoch(loader)
        with snapshot.DataLoader2(graph(), reading_service=snapshot.DistributedReadingService(timeout=30)) as again:
            again.restore_snapshot({str(tmp_path / 'snap')!r})
            assert train_epoch(again) == second
        print(f"rank {{rank}} OK {{len(first)}} {{len(second)}}", flush=True)
        dist.destroy_process_group()
    """))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
                           f"--master_port={free_port()}", str(script)],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    length = SAMPLES // ranks
    for rank in range(ranks):
        assert f"rank {rank} OK {length} {length}" in proc.stdout, proc.stdout


def with_lock(x: int) -> Any:
    import threading

    return x, threading.Lock()


def unpicklable_epoch(rank: int, world: int) -> int:
    service = snapshot.DistributedReadingService(timeout=300)
    with snapshot.DataLoader2(lopsided().map(with_lock), reading_service=service) as loader:
        return len(list(loader))


def test_a_sample_that_cannot_be_sent_is_refused_on_both_ranks_at_once() -> None:
    # rank 1 runs out after 6 samples; rank 0 must send it one of its own, which cannot be pickled.
    # The loader's group timeout is 300 s: both ranks fail within the harness's 120 s, naming the cause
    results = run_ranks(2, unpicklable_epoch, pg_timeout=300, timeout=120, allow_errors=True)
    assert isinstance(results[0], RankFailure) and isinstance(results[1], RankFailure)
    assert results[0].message.startswith("SerializationError: rank 0 could not send a sample")
    assert results[1].message.startswith("RankError: rank 0 could not send a sample")
    for failure in results:
        assert "cannot be pickled" in failure.message and "even_batches=None" in failure.message
