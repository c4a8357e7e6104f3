"""``python -m benchmarks distributed --simulate 1024``: the index of a large job, in one process.

No process group and no other process but the template's workers: rank 0 of a job of ``R`` ranks x 8
workers runs for real (its collective operations answered in this process, as if every rank did what
it does), reads a few samples of :mod:`benchmarks._dist_job`'s graph and has its part's manifest taken.
Every other rank's is that one, renumbered to the logical shards the rank owns (shard ``u`` of rank 0
is ``u + r`` on rank ``r``). The index of the ``R`` parts is built as a save builds it
(:func:`snapshot.container._parts.distributed_manifest`) and packed as ``manifest.snap``; its size and
the time to build it are reported. Then the restore of that index is planned onto 0.75 R and 1.25 R
ranks of 8 workers each: the plan's time and the parts each rank reads.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from benchmarks.common import table

WORKERS = 8
#: Samples the template rank reads before its state is taken (its shuffle buffers fill).
TAKEN = 64
MiB = 1 << 20
#: Budgets of issue 31.
PLAN_BUDGET_S = 1.0
INDEX_BUDGET = 10_000_000


class LocalCollective:
    """Rank ``rank`` of ``world``, answering every collective in this process as if each rank did the same."""

    def __init__(self, rank: int, world: int, timeout: float = 60.0) -> None:
        self.group, self.rank, self.world, self.timeout = None, rank, world, timeout

    def all_gather(self, value: Any, what: str) -> list[Any]:
        return [value] * self.world

    def gather(self, value: Any, what: str) -> list[Any] | None:
        return [value] * self.world if self.rank == 0 else None

    def broadcast(self, value: Any, what: str) -> Any:
        return value

    def all_reduce_min(self, value: int, what: str) -> int:
        return value

    def all_reduce_max(self, value: int, what: str) -> int:
        return value

    def barrier(self, what: str) -> None:
        pass


def template(ranks: int) -> dict[str, Any]:
    """Rank 0's part manifest, taken from a real loader of ``WORKERS`` workers on a job of ``ranks`` ranks."""
    import snapshot
    from benchmarks._dist_job import build
    from snapshot.container.capture import snapshot_of

    reading = snapshot.SequentialReadingService(snapshot.DistributedReadingService(timeout=60),
                                                snapshot.MultiProcessingReadingService(WORKERS))
    with snapshot.DataLoader2(build(ranks * WORKERS * 256), reading_service=reading) as loader:
        loader.reading_service.inner._collective = LocalCollective(0, ranks)  # type: ignore[attr-defined]
        loader.seed(31)
        it = iter(loader)
        for _ in range(TAKEN):
            next(it)
        return snapshot_of(loader._saver.source(include_graph=True)).manifest


_SHARD = re.compile(r"@shard(\d+)$")


def renumbered(manifest: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank 0's part manifest as rank ``rank``'s: the same positions, in the logical shards ``rank`` owns."""
    out = copy.deepcopy(manifest)
    service = out["service"]
    service["rank"] = rank
    service["owners"] = {str(int(unit) + rank): owner for unit, owner in service["owners"].items()}
    shards = out["shards"]
    moved: list[Any] = [None] * len(shards)
    for unit, shard in enumerate(shards):
        if shard is not None:
            moved[unit + rank] = shard
    out["shards"] = moved
    for upstream in out["upstream"]:
        upstream["shards"] = [unit + rank for unit in upstream["shards"]]
    seeds = out["randomness"]["node_seeds"]
    out["randomness"]["node_seeds"] = {_SHARD.sub(lambda m: f"@shard{int(m.group(1)) + rank}", key): value
                                       for key, value in seeds.items()}
    return out


def build_index(ranks: int) -> tuple[dict[str, Any], int, float, float]:
    """The index of ``ranks`` x ``WORKERS``, its packed size, the seconds to take the template (real workers)
    and to build the index from the ``ranks`` part records."""
    from snapshot.container import _parts, format

    start = time.perf_counter()
    first = template(ranks)
    taken = time.perf_counter() - start
    start = time.perf_counter()
    infos = [{"rank": rank, "file": f"rank-{rank:05d}.snap", "sha256": "0" * 64, "size": 4 * MiB,
              "manifest": renumbered(first, rank)} for rank in range(ranks)]
    index = _parts.distributed_manifest(infos, save="0" * 12)
    packed = len(format.pack(index, b""))
    return index, packed, taken, time.perf_counter() - start


def plan(index: dict[str, Any], ranks: int, workers: int) -> tuple[float, list[int]] | None:
    """The seconds to plan a restore of ``index`` onto ``ranks`` x ``workers``, and the parts each rank reads;
    ``None`` where this version has no re-shard plan to ask."""
    try:
        from snapshot.reading_service import _plan  # type: ignore[attr-defined]
    except ImportError:
        return None
    from snapshot import schema

    manifest = schema.Manifest.from_dict(index)
    start = time.perf_counter()
    made = _plan.make(manifest, ranks=ranks, workers=workers)
    seconds = time.perf_counter() - start
    return seconds, [len(made.parts_for(rank)) for rank in range(ranks)]


def run(ranks: int, repeat: int = 3) -> dict[str, Any]:
    print(f"simulated job of {ranks} ranks x {WORKERS} workers (one process, no process group):")
    index, packed, taken, built = build_index(ranks)
    print(f"  index (manifest.snap): {packed / 1e6:.2f} MB for {ranks} parts "
          f"({packed / ranks / 1024:.2f} KiB a rank); built in {built:.3f} s "
          f"(rank 0's part taken from real workers in {taken:.1f} s)")
    verdicts = [{"budget": "index size", "value": packed, "pass": packed < INDEX_BUDGET}]
    rows, plans = [], []
    for target in (ranks * 3 // 4, ranks * 5 // 4):
        times, parts = [], None
        for _ in range(repeat):
            result = plan(index, target, WORKERS)
            if result is None:
                break
            times.append(result[0])
            parts = result[1]
        if not times or parts is None:
            rows.append([f"{ranks} -> {target}", "no re-shard plan in this version", "", ""])
            continue
        median = sorted(times)[len(times) // 2]
        rows.append([f"{ranks} -> {target}", f"{median:.3f}", f"{min(parts)} .. {max(parts)}",
                     f"{sum(parts) / len(parts):.2f}"])
        plans.append({"ranks": target, "plan_s": median, "parts_per_rank": parts})
        if target < ranks:
            verdicts.append({"budget": "plan time", "value": median, "pass": median < PLAN_BUDGET_S})
    print(table(["restore", "plan s (median)", "parts read a rank (min .. max)", "mean"], rows))
    print(f"budgets: index of {ranks} x {WORKERS} under {INDEX_BUDGET / 1e6:g} MB: "
          f"{'PASS' if verdicts[0]['pass'] else 'FAIL'}" +
          "".join(f"; plan time {ranks} -> {ranks * 3 // 4} under {PLAN_BUDGET_S:g} s: "
                  f"{'PASS' if v['pass'] else 'FAIL'}" for v in verdicts[1:]))
    return {"ranks": ranks, "workers": WORKERS, "index_bytes": packed, "index_build_s": built, "plans": plans,
            "budgets": verdicts}
