"""What each rank of a :mod:`tests.nodes` job runs: a distributed loader saved to or restored from a URL.

``python -m tests.node_job save URL`` reads ``TAKEN`` samples on each rank, saves the snapshot to ``URL``
(a collective) and reads on: the rest of the epoch and the next ``EPOCHS``. ``restore URL...`` builds the
same graph in code for each URL in turn, restores it, reads the rest of the epoch and the next ``EPOCHS``,
and records every object of the store it read while restoring (each ``get_object`` of s3fs, by key):
which parts it read. A restore that fails records the error (its type and message) instead. Each rank
writes its results into its node's directory (:func:`tests.nodes.write`): ``save``, and ``restore<i>``
for the i-th URL.
"""

from __future__ import annotations

import sys
import time
from typing import Any

SAMPLES = 96
#: Logical shards: 2 x 2 ranks, one node of 3, 2 x 2 again all divide them.
SHARDS = 12
TAKEN = 5
EPOCHS = 2
#: A timeout far beyond the tests': a rank that waited out a collective fails the test.
TIMEOUT = 600

#: Keys of the objects this rank read from the store, in order.
READS: list[str] = []


def double(x: int) -> int:
    return 2 * x


def graph() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=8).sharding_filter().map(double)


def loader() -> Any:
    import snapshot

    service = snapshot.DistributedReadingService(TIMEOUT, logical_shards=SHARDS, even_batches="drop")
    return snapshot.DataLoader2(graph(), reading_service=service)


def count_reads() -> None:
    """Record the key of every object s3fs gets (a whole object or a range of it), whichever call gets it."""
    from s3fs.core import S3FileSystem

    original = S3FileSystem._call_s3

    async def counted(self: Any, method: str, *dicts: Any, **kwargs: Any) -> Any:
        if method == "get_object":
            merged: dict[str, Any] = {}
            for each in dicts:
                merged.update(each)
            merged.update(kwargs)
            READS.append(str(merged.get("Key")))
        return await original(self, method, *dicts, **kwargs)

    S3FileSystem._call_s3 = counted  # type: ignore[method-assign]


def save(url: str) -> dict[str, Any]:
    with loader() as dl:
        dl.seed(7)
        it = iter(dl)
        seen = [next(it) for _ in range(TAKEN)]
        dl.save_snapshot(url)
        rest = list(it)
        return {"seen": seen, "rest": rest, "following": [list(dl) for _ in range(EPOCHS)]}


def restore(url: str) -> dict[str, Any]:
    import snapshot

    READS.clear()
    with loader() as dl:
        start = time.monotonic()
        try:
            dl.restore_snapshot(url)
        except snapshot.SnapshotError as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start, "reads": READS}
        reads = list(READS)
        return {"reads": reads, "rest": list(dl), "following": [list(dl) for _ in range(EPOCHS)]}


def main() -> None:
    import torch.distributed as dist

    from tests.nodes import write

    mode, urls = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    try:
        if mode == "save":
            write(mode, save(urls[0]))
        else:
            count_reads()
            for index, url in enumerate(urls):
                write(f"restore{index}", restore(url))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
