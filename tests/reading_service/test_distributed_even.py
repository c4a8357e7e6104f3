"""Ranks end each epoch together: ``DistributedReadingService(even_batches=...)`` on uneven data.

41 samples do not divide among 2 or 3 ranks. Every rank function below runs the training
step's collective (an all-reduce, as DDP's gradient sync) once per sample and a collective
after the loop, on the default group with a short timeout: with ranks that end an epoch after
different numbers of samples, their collectives stop matching, and one fails or waits until the
timeout (the control test shows it).

Snapshots stay exact under each policy: at the end of an epoch in which ``"drop"`` dropped a
sample (the next epoch is the uninterrupted run's, on the same ranks and on others), mid-epoch
onto another number of ranks (the policy evens out the new ranks' shares: it only cuts their
tails), and in the middle of ``"pad"``'s padding (the saved last sample is repeated).
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


def lopsided() -> Any:
    """24 samples, 2 logical shards of 12 and 6 after the filter: the second runs out early."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(24)).sharding_filter().filter(keep)


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


def test_pad_resumes_in_the_middle_of_its_padding(tmp_path) -> None:
    # rank 1's share has 6 samples and rank 0's 12: saved at step 8, rank 1 is repeating its last
    directory = str(tmp_path / "data.snap")
    full = run_ranks(2, save_in_epoch_0, directory, 8, None, "pad", lopsided, pg_timeout=20)
    assert [len(r["epochs"][0]) for r in full] == [12, 12]
    assert full[1]["epochs"][0][6:] == [full[1]["epochs"][0][5]] * 6
    again = run_ranks(2, resume, directory, "pad", lopsided, pg_timeout=20)
    for rank in range(2):
        assert again[rank]["rest"] == full[rank]["epochs"][0][8:]
        assert again[rank]["next"] == full[rank]["epochs"][1]
    manifest = snapshot.read_manifest(directory)
    assert manifest["service"]["even_batches"] == "pad"


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
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
