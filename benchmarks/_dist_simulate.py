"""``python -m benchmarks distributed --simulate 1024``: the index of a large job, in one process.

No process group and no other process but the template's workers: rank 0 of a job of ``R`` ranks x 8
workers runs for real (its collective operations answered in this process, as if every rank did what
it does), reads a few samples of :mod:`benchmarks._dist_job`'s graph and has its part's manifest taken.
Every other rank's record (its positions, what it sends rank 0 in a save) is rank 0's, renumbered to the
logical shards the rank owns (shard ``u`` of rank 0 is ``u + r`` on rank ``r``). The index of the ``R``
parts is built as rank 0 of a save builds it (:func:`snapshot.container._parts.distributed_manifest`) and
packed as ``manifest.snap``; its size and the CPU time to build it are reported. Then the restore of
that index is planned onto 0.75 R and 1.25 R ranks of 8 workers each, as a rank plans it
(:mod:`snapshot.reading_service.reshard`): the index read (checked, decoded into the schema's types: an
index's records of every shard are checked for shape, each in full when used) and the plan made for its
rank, timed apart, with the time to parse the index's JSON alone (the floor of reading it); and the
parts each rank reads. Times are CPU seconds of this process, which a machine shared with other jobs
inflates less than wall time.
"""

from __future__ import annotations

import copy
import statistics
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

    def all_gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        return [list(values)] * self.world

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


def renumbered(record: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank 0's positions (:func:`snapshot.container._parts.positions`) as rank ``rank``'s: the same
    positions, in the logical shards ``rank`` owns."""
    out = copy.deepcopy(record)
    service = out["service"]
    service["rank"] = rank
    service["owners"] = {str(int(unit) + rank): owner for unit, owner in service["owners"].items()}
    out["shards"] = {str(int(unit) + rank): shard for unit, shard in out["shards"].items()}
    for upstream in out["upstream"]:
        upstream["shards"] = [unit + rank for unit in upstream["shards"]]
    return out


def build_index(ranks: int) -> tuple[bytes, float, float]:
    """The index of ``ranks`` x ``WORKERS`` packed as ``manifest.snap``, the seconds to take the template (real
    workers) and the CPU seconds to build the index from the ``ranks`` part records (as rank 0 of a save does:
    rank 0's manifest, every other rank's positions)."""
    from snapshot.container import _parts, format

    start = time.perf_counter()
    first = template(ranks)
    taken = time.perf_counter() - start
    record = _parts.positions(first)
    infos = [{"rank": rank, "file": f"rank-{rank:05d}.snap", "sha256": "0" * 64, "size": 4 * MiB,
              "manifest": first if rank == 0 else renumbered(record, rank)} for rank in range(ranks)]
    start = time.process_time()
    packed = format.pack(_parts.distributed_manifest(infos, save="0" * 12), b"")
    return packed, taken, time.process_time() - start


def plan(packed: bytes, ranks: int, workers: int) -> dict[str, Any]:
    """A restore of the index ``packed`` (``manifest.snap``'s bytes) planned onto ``ranks`` x ``workers``, as a
    rank does it: the index read (checked and decoded into the schema's types), the plan made, its rank's
    entry taken (and, apart, the index's JSON parsed alone: the floor of reading it); then every rank's entry,
    for the parts each reads. CPU seconds of each step (this process alone)."""
    import json

    from snapshot.container import _header, format
    from snapshot.reading_service.reshard import SavedLayout, plan_restore

    version, _, size, payload, _, _ = _header.check_header(packed[:_header.PREFIX], len(packed), "manifest.snap")
    offset = _header.offsets(version, size, payload)[0]
    start = time.process_time()
    json.loads(packed[offset:offset + size])  # the JSON alone: the floor of reading the index
    json_s = time.process_time() - start
    start = time.process_time()
    manifest = format.unpack(packed, source="manifest.snap").info
    read = time.process_time()
    layout = SavedLayout.from_manifest(manifest)
    assert layout is not None
    made = plan_restore(layout, ranks, workers)
    made.rank(ranks // 2)
    planned = time.process_time()
    parts = [len(made.rank(rank).reads) for rank in range(ranks)]
    return {"json_s": json_s, "read_s": read - start, "plan_s": planned - read,
            "all_ranks_s": time.process_time() - planned, "parts": parts}


def run(ranks: int, repeat: int = 3) -> dict[str, Any]:
    print(f"simulated job of {ranks} ranks x {WORKERS} workers (one process, no process group):")
    packed, taken, built = build_index(ranks)
    size = len(packed)
    print(f"  index (manifest.snap): {size / 1e6:.2f} MB for {ranks} parts ({size / ranks / 1024:.2f} KiB a rank); "
          f"built from the parts' records in {built:.2f} CPU s (rank 0's part taken from real workers in "
          f"{taken:.1f} s)")
    verdicts = [{"budget": "index size", "value": size, "pass": size < INDEX_BUDGET}]
    rows, plans = [], []
    for target in (ranks * 3 // 4, ranks * 5 // 4):
        runs = [plan(packed, target, WORKERS) for _ in range(repeat)]
        median = {key: statistics.median(r[key] for r in runs) for key in ("json_s", "read_s", "plan_s",
                                                                              "all_ranks_s")}
        parts = runs[0]["parts"]
        rows.append([f"{ranks} x {WORKERS} -> {target} x {WORKERS}", f"{median['read_s']:.3f}",
                     f"{median['json_s']:.3f}",
                     f"{median['plan_s']:.4f}", f"{median['read_s'] + median['plan_s']:.3f}",
                     f"{median['all_ranks_s']:.3f}", f"{min(parts)} .. {max(parts)}", f"{statistics.mean(parts):.2f}"])
        plans.append({"ranks": target, **median, "parts_per_rank": parts})
        if target < ranks:
            total = median["read_s"] + median["plan_s"]
            alone = median["plan_s"]
            verdicts.append({"budget": "plan time", "value": alone, "pass": alone < PLAN_BUDGET_S})
            verdicts.append({"budget": "index read and plan time", "value": total, "pass": total < PLAN_BUDGET_S})
    print(table(["restore (CPU seconds)", "read index s", "its JSON alone s", "plan s", "a rank's total s",
                 "every rank's entry s", "parts read a rank", "mean"], rows))
    verdict = {v["budget"]: "PASS" if v["pass"] else "FAIL" for v in verdicts}
    print(f"budgets: the index of {ranks} x {WORKERS} under {INDEX_BUDGET / 1e6:g} MB: {verdict['index size']}; "
          f"{ranks} -> {ranks * 3 // 4} under {PLAN_BUDGET_S:g} s: the plan {verdict['plan time']}, the index read "
          f"and the plan {verdict['index read and plan time']}")
    return {"ranks": ranks, "workers": WORKERS, "index_bytes": size, "index_build_s": built, "plans": plans,
            "budgets": verdicts}
