"""Each rank's restore reads the index and only the parts its re-shard plan names.

A counting opener (the part reader's ``open``, wrapped in each rank's process) records every part
file a rank reads; the counts are compared with the parts the plan names, computed here from the
deal's rule. The restored streams are compared with the uninterrupted run's, sample by sample on
the same ranks and as multisets on others, through the next epoch.
"""

from __future__ import annotations

import builtins
import os
from collections import Counter
from typing import Any

import snapshot
from snapshot.storage import multipart
from tests.dist import run_ranks

SAMPLES = 240
AT = 7


def graph() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).sharding_filter().shuffle(buffer_size=8)


def service() -> Any:
    return snapshot.DistributedReadingService(timeout=60, even_batches=None)


def uninterrupted(rank: int, world: int, directory: str) -> dict[str, Any]:
    with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
        loader.seed(3)
        epoch = []
        for step, x in enumerate(loader):
            epoch.append(x)
            if step + 1 == AT:
                loader.save_snapshot(directory)
        return {"epochs": [epoch, list(loader)]}


def counting_restore(rank: int, world: int, directory: str) -> dict[str, Any]:
    opened: list[str] = []

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.path.basename(os.fspath(path)))
        return builtins.open(path, *args, **kwargs)

    multipart.open = counting_open  # type: ignore[attr-defined]  # the part reader's opener, in this process
    try:
        with snapshot.DataLoader2(graph(), reading_service=service()) as loader:
            loader.restore_snapshot(directory)
            return {"opened": opened, "rest": list(loader), "next": list(loader)}
    finally:
        del multipart.open  # type: ignore[attr-defined]


def test_each_rank_reads_its_own_part_and_the_rest_is_exact(tmp_path: Any) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(4, uninterrupted, directory, pg_timeout=30)
    after = run_ranks(4, counting_restore, directory, pg_timeout=30)
    for rank in range(4):
        assert after[rank]["opened"] == [f"rank-{rank:05d}.snap"]
        assert after[rank]["rest"] == before[rank]["epochs"][0][AT:]
        assert after[rank]["next"] == before[rank]["epochs"][1]


def test_on_other_rank_counts_each_rank_reads_the_parts_of_its_units(tmp_path: Any) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(4, uninterrupted, directory, pg_timeout=30)  # 4 units, unit u saved on rank u
    seen = Counter(x for r in before for x in r["epochs"][0][:AT])
    for ranks in (2, 3, 6):
        after = run_ranks(ranks, counting_restore, directory, pg_timeout=30)
        units = 4 if 4 % ranks == 0 else 12  # lcm(4, 3) = lcm(4, 6) = 12 sub-shards
        for rank in range(ranks):
            parents = sorted({u % 4 for u in range(rank, units, ranks)})
            assert after[rank]["opened"] == [f"rank-{p:05d}.snap" for p in parents], (ranks, rank)
        rest = Counter(x for r in after for x in r["rest"])
        assert rest + seen == Counter(range(SAMPLES)), f"{ranks} ranks: not every sample exactly once"
        following = Counter(x for r in after for x in r["next"])
        assert following == Counter(range(SAMPLES))


def restore_or_error(rank: int, world: int, directory: str) -> str:
    ranks = snapshot.DistributedReadingService(timeout=300, even_batches=None)
    with snapshot.DataLoader2(graph(), reading_service=ranks) as loader:
        try:
            loader.restore_snapshot(directory)
        except snapshot.SnapshotError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "restored"


def test_a_missing_part_is_an_error_on_every_rank_at_once(tmp_path: Any) -> None:
    directory = str(tmp_path / "data.snap")
    run_ranks(4, uninterrupted, directory, pg_timeout=30)
    os.remove(os.path.join(directory, "rank-00002.snap"))
    # only rank 2 reads that part; the loader's group timeout is 300 s, the harness waits 150: nobody waits it out
    outcomes = run_ranks(4, restore_or_error, directory, pg_timeout=300, timeout=150)
    assert outcomes[2].startswith("SnapshotFileError") and "rank-00002.snap (rank 2), which is missing" in outcomes[2]
    for rank in (0, 1, 3):
        assert outcomes[rank].startswith("RankError: the snapshot could not be read on every rank"), outcomes[rank]
        assert "rank 2: SnapshotFileError" in outcomes[rank] and "rank-00002.snap" in outcomes[rank]
