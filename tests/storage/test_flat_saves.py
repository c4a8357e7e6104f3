"""A distributed save stays flat: no rank receives the other ranks' records but rank 0, and each record is
the rank's positions, whose size does not grow with the job's logical shards (a part's own manifest lists
a seed and a place for every logical shard: rank 0's index has those once).

Real gloo groups (``tests/dist.py``); the save's own collective, ``multipart.write_part``, on every rank.
"""

from __future__ import annotations

from typing import Any

import snapshot
from snapshot.storage import multipart
from tests.dist import run_ranks
from tests.reading_service.test_distributed import read, service, unique_graph


def records(rank: int, world: int, directory: str) -> Any:
    with snapshot.DataLoader2(unique_graph(), reading_service=service(logical_shards=SHARDS)) as loader:
        loader.seed(5)
        read(loader, 4)
        source = loader._saver.source(include_graph=True)
        manifest, infos = multipart.write_part(loader.reading_service.collective, source,
                                               f"{directory}/rank-{rank}.snap", "0" * 12, None)
        if infos is None:
            return None
        return [{"keys": sorted(i["manifest"]), "shards": sorted(map(int, i["manifest"]["shards"]))}
                for i in infos[1:]]


SHARDS = 24


def test_only_rank_zero_gets_the_records_each_the_rank_s_positions(tmp_path) -> None:
    got = run_ranks(3, records, str(tmp_path))
    assert got[1] is None and got[2] is None  # nothing of the others' parts travels to ranks 1 and 2
    for rank, record in enumerate(got[0], start=1):  # no graph, no seeds, no place for the others' shards
        assert record == {"keys": ["loader", "service", "shards", "upstream"],
                          "shards": list(range(rank, SHARDS, 3))}, f"rank {rank}"
