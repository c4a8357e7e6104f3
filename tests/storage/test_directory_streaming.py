"""A distributed directory save streams each rank's part into its file, as a single-process save does:
a rank holds no copy of its state while it saves, and the files it wrote restore exactly (real gloo ranks)."""

from __future__ import annotations

import os
import time
import tracemalloc
from collections import Counter

from torch.utils.data.datapipes.iter import IterableWrapper, Mapper, ShardingFilter, Shuffler

import snapshot
from snapshot import DistributedReadingService
from tests.dist import run_ranks

#: Each sample: 256 KiB of bytes, its index in the first eight.
SAMPLE = 256 << 10
#: The shuffle buffer of each rank holds this many samples by value when the save runs (50 MiB).
BUFFER = 200
#: Samples read on each rank before the save (the buffer is full after the first).
STEPS = 5
#: Samples in an epoch, over two ranks: each rank's buffer fills and holds BUFFER at the save.
TOTAL = 2 * (BUFFER + 2 * STEPS)


def blob(index: int) -> bytes:
    return index.to_bytes(8, "little") + bytes([index % 251]) * (SAMPLE - 8)


def index_of(sample: bytes) -> int:
    index = int.from_bytes(sample[:8], "little")
    assert sample == blob(index), f"sample {index} is not the bytes it was made as"
    return index


def big_buffers():
    """Each rank's shuffle buffer (below the sharding point) holds BUFFER samples of 256 KiB."""
    return Shuffler(Mapper(ShardingFilter(IterableWrapper(range(TOTAL))), blob), buffer_size=BUFFER)


def loader():
    """``even_batches=None``: each rank reads its whole share, so that every sample can be counted."""
    return snapshot.DataLoader2(big_buffers(), reading_service=DistributedReadingService(60, even_batches=None),
                                buffer_state="values")


def save_traced(rank, world, directory):
    """Read STEPS samples, save the directory under tracemalloc; the rest of the epoch and the next one."""
    with loader() as dl:
        dl.seed(5)
        it = iter(dl)
        seen = [index_of(next(it)) for _ in range(STEPS)]
        tracemalloc.start()
        start = time.perf_counter()
        try:
            snap = dl.save_snapshot(directory)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        seconds = time.perf_counter() - start
        rest = [index_of(sample) for sample in it]
        following = [index_of(sample) for sample in dl]
    part = os.path.join(directory, f"rank-{rank:05d}.snap")
    with open(part, "rb") as f:
        returned = snap.to_bytes() == f.read()  # the snapshot returned is the part, read back when asked
    return {"seen": seen, "rest": rest, "following": following, "peak": peak, "seconds": seconds,
            "part": os.path.getsize(part), "returned": returned, "save": snap.manifest["save"]}


def restore(rank, world, directory):
    with loader() as dl:
        dl.restore_snapshot(directory)
        return {"rest": [index_of(sample) for sample in dl], "following": [index_of(sample) for sample in dl]}


def test_a_rank_saves_its_part_holding_no_copy_of_its_state_and_the_files_restore_exactly(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_traced, directory, timeout=240)
    state = BUFFER * SAMPLE
    for rank, result in enumerate(before):
        assert result["part"] > state  # the buffer was saved by value
        assert result["returned"] and result["save"] == snapshot.read_manifest(directory)["save"]
        assert result["peak"] < state // 10, (
            f"rank {rank} traced {result['peak'] / 2**20:.1f} MiB at its peak while saving a "
            f"{result['part'] / 2**20:.1f} MiB part")
    same = run_ranks(2, restore, directory, timeout=240)
    for rank in range(2):  # the same layout: each rank continues its own stream exactly
        assert same[rank]["rest"] == before[rank]["rest"]
        assert same[rank]["following"] == before[rank]["following"]
    other = run_ranks(3, restore, directory, timeout=240)
    seen = Counter(i for rank in before for i in rank["seen"]) + Counter(i for rank in other for i in rank["rest"])
    assert seen == Counter(range(TOTAL)), "another number of ranks loses or repeats samples"
    assert Counter(i for rank in other for i in rank["following"]) == Counter(range(TOTAL))


class Refused:
    """A sample whose pickling fails once ``refuse`` is set in its process: a rank that cannot write its part,
    found mid-write (the part is encoded as it is written)."""

    refuse = False

    def __init__(self, value: int):
        self.value = value

    def __reduce__(self):
        if Refused.refuse:
            raise TypeError("this sample refuses to be pickled")
        return (Refused, (self.value,))


def save_twice(rank, world, directory):
    """A first snapshot, then a second one that rank 1 cannot write."""
    graph = Shuffler(Mapper(ShardingFilter(IterableWrapper(range(40))), Refused), buffer_size=4)
    with snapshot.DataLoader2(graph, reading_service=DistributedReadingService(60)) as dl:
        dl.seed(1)
        it = iter(dl)
        next(it)
        dl.save_snapshot(directory)
        first = os.path.realpath(directory)
        next(it)
        Refused.refuse = rank == 1
        start = time.monotonic()
        try:
            dl.save_snapshot(directory)
        except snapshot.RankError as exc:
            return {"first": first, "error": str(exc), "cause": type(exc.__cause__).__name__,
                    "seconds": time.monotonic() - start}
        return {"first": first, "error": None}


def test_a_rank_that_cannot_write_its_part_publishes_nothing(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    results = run_ranks(2, save_twice, directory, timeout=120)
    first = results[0]["first"]
    for rank, result in enumerate(results):
        assert result["error"] is not None and result["error"].startswith(
            f"{directory}: the snapshot was not saved: rank 1 could not write its part: "
            "SerializationError: cannot pickle"), result["error"]
        assert result["error"].endswith(f"The previous snapshot at {directory} is unchanged.")
        assert "the DataPipe at 0 (logical shard 1)" in result["error"]
        assert "TypeError: this sample refuses to be pickled" in result["error"]
        assert result["cause"] == ("SerializationError" if rank == 1 else "NoneType")
        assert result["seconds"] < 10  # told at once, not after a timeout
    assert os.path.realpath(directory) == first  # the previous snapshot is still the one published
    assert sorted(os.listdir(tmp_path)) == sorted(["data.snap", os.path.basename(first)])  # no staging left
    assert sorted(os.listdir(first)) == ["manifest.snap", "rank-00000.snap", "rank-00001.snap"]
    assert snapshot.read_manifest(directory)["loader"]["yielded"] == 2
    snapshot.load(directory, allow_pickle=True)  # every part still matches its index
