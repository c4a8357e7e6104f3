"""One rank of ``python -m benchmarks distributed --ranks ...``, started by torchrun (gloo on 127.0.0.1).

``python -m benchmarks._dist_job save DIR OUT`` reads ``TAKEN`` samples on each rank, then times the
collective ``save_snapshot(DIR/data.snap)``, ``loader.state_dict()`` and ``dcp.save`` of the loader;
``python -m benchmarks._dist_job restore DIR OUT`` (or ``dcp-load``) builds the graph in code on a fresh job
and restores it from the directory (or from the DCP checkpoint) up to the first sample. Each rank writes
its figures to ``OUT/<mode>.rank<r>.json``, measured around the one call (after the process group is up):

- bytes read: ``/proc/self/io`` rchar (every ``read()`` of the process, the snapshot's files included);
- peak RSS growth: ``ru_maxrss`` after the call minus before it;
- the time, after a barrier, and the CPU time of the rank's process (``getrusage``: user and system),
  which does not grow when more ranks than cores share the machine.

The graph is the one of issue 31: ``range(N) -> sharding_filter -> map(8 KiB bytes) ->
shuffle(buffer_size=512) -> map``, so a rank's part is about 4 MiB whatever the number of ranks.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from typing import Any

#: Samples read on each rank before the save (the shuffle buffer is full from the 512th on).
TAKEN = 300
BUFFER = 512
SAMPLE = 8 * 1024
#: Samples per rank in the epoch: enough that no rank runs out before the save, on up to 32 ranks.
PER_RANK = 2048
SEED = 31


def sample(i: int) -> bytes:
    """8 KiB of bytes that differ per sample (so that no two compress alike)."""
    return i.to_bytes(8, "little") * (SAMPLE // 8)


def head(x: bytes) -> int:
    return int.from_bytes(x[:8], "little")


def build(samples: int) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(samples)).sharding_filter().map(sample).shuffle(buffer_size=BUFFER).map(head)


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def maxrss() -> int:
    """The process's peak resident set so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu() -> float:
    """CPU seconds this process has used (user and system): unlike wall time, not inflated when the ranks
    share fewer cores than there are ranks."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Measure:
    """Time, CPU time, bytes read and peak RSS growth of what runs inside ``with``."""

    def __enter__(self) -> Measure:
        self.rss, self.read, self.cpu, self.start = maxrss(), rchar(), cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start
        self.cpu = cpu() - self.cpu
        self.read = rchar() - self.read
        self.rss = maxrss() - self.rss

    def figures(self, name: str) -> dict[str, Any]:
        return {f"{name}_s": self.seconds, f"{name}_cpu": self.cpu, f"{name}_read": self.read,
                f"{name}_rss": self.rss}


def state_size(state: Any) -> int:
    """Bytes of a state dict: every bytes and str value, nested dicts included."""
    if isinstance(state, dict):
        return sum(state_size(v) for v in state.values())
    if isinstance(state, (bytes, bytearray, str)):
        return len(state)
    return 0


def service() -> Any:
    import snapshot

    return snapshot.DistributedReadingService(timeout=300)


def save(directory: str, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import snapshot

    loader: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build(world * PER_RANK), reading_service=service())
    loader.seed(SEED)
    it = iter(loader)
    seen = [next(it) for _ in range(TAKEN)]
    figures: dict[str, Any] = {"seen": seen}
    dist.barrier()
    with Measure() as m:
        loader.save_snapshot(os.path.join(directory, "data.snap"))
    figures.update(m.figures("save"))
    dist.barrier()
    with Measure() as m:
        state = loader.state_dict()
    figures.update(m.figures("state_dict"))
    figures["state_dict_size"] = state_size(state)
    del state
    dist.barrier()
    with Measure() as m:
        dcp.save({"data": loader}, checkpoint_id=os.path.join(directory, "dcp"))
    figures.update(m.figures("dcp_save"))
    figures["rest"] = [next(it) for _ in range(8)]  # the first samples after the cut, to check restores
    loader.shutdown()
    return figures


def restore(directory: str, world: int, saved_world: int, how: str) -> dict[str, Any]:
    import torch.distributed as dist

    import snapshot

    loader: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build(saved_world * PER_RANK),
                                                             reading_service=service())
    dist.barrier()
    with Measure() as m:
        if how == "restore":
            loader.restore_snapshot(os.path.join(directory, "data.snap"))
        else:
            _dcp_load(loader, os.path.join(directory, "dcp"))
        first = next(iter(loader))
    figures = m.figures("restore")
    figures["first"] = first
    loader.shutdown()
    return figures


def _dcp_load(loader: Any, checkpoint: str) -> None:
    try:
        from snapshot.integrations import dcp as snapshot_dcp
    except ImportError:  # before the helper existed: DCP's own load
        import torch.distributed.checkpoint as snapshot_dcp  # type: ignore[no-redef]
    snapshot_dcp.load({"data": loader}, checkpoint_id=checkpoint)


def main() -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint  # imported before anything is measured

    import snapshot.integrations  # noqa: F401

    torch.set_num_threads(1)
    mode, directory, out = sys.argv[1:4]
    saved_world = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        figures = save(directory, world) if mode == "save" else restore(directory, world, saved_world, mode)
        figures.update(rank=rank, world=world)
        with open(os.path.join(out, f"{mode}.rank{rank}.json"), "w") as f:
            json.dump(figures, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
