"""The io benchmark's printout: the table of every measurement, the ratios, and the restore budgets.

The budgets are read here, from the figures of one run (a benchmark, not a timed test):

1. a restore at 90 % of the epoch takes at most 1.2 times a restore at 10 % (and reads no more);
2. at 90 %, ours (the ``jsonl.gz`` pipeline, in-process) is at least as fast as the fastest peer
   that ran on the same files;
3. the bytes a restore reads are at most the snapshot plus what its open files need: here the
   bound is the snapshot (read once by the main process and, with workers, once more for the
   states sent to them where the start method is not ``fork``) plus one whole file of the format
   per reader (one per logical shard), plus, with workers, the batches they send before the first
   one is yielded (two per worker);
4. at 90 % of a corpus of 1 GB or more, ours is at least 50 times faster than our fast-forward.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import table

__all__ = ["HEADERS", "budgets", "mb", "rows", "tables"]

HEADERS = ["pipeline", "workers", "at", "plain", "ff", "ours", "ours pos", "ff/ours", "read plain", "read ff",
           "read ours", "read pos", "snap values", "snap pos", "replayed", "exact"]


def ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms" if s >= 0.1 else f"{s * 1e3:.1f} ms"


def mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB" if n < 1e8 else f"{n / 1e6:,.0f} MB"


def x(a: float, b: float) -> str:
    return f"{a / b:,.1f}x" if b > 0 else "-"


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["pipeline"], str(r["workers"]), f"{r['at']:.0%}", ms(r["plain_s"]), ms(r["ff_s"]), ms(r["ours_s"]),
             ms(r["ours_positions_s"]), x(r["ff_s"], r["ours_s"]), mb(r["plain_read"]), mb(r["ff_read"]),
             mb(r["ours_read"]), mb(r["ours_positions_read"]), mb(r["snapshot_values"]), mb(r["snapshot_positions"]),
             str(r["replayed"]),
             "yes" if r["exact"] else "NO"] for r in results]


def _ends(results: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any], dict[str, Any]]]:
    """(pipeline, workers, the row at 10 %, the row at 90 %) for each pipeline and mode measured at both."""
    out = []
    for name, workers in dict.fromkeys((r["pipeline"], r["workers"]) for r in results):
        at = {r["at"]: r for r in results if r["pipeline"] == name and r["workers"] == workers}
        if 0.1 in at and 0.9 in at:
            out.append((name, workers, at[0.1], at[0.9]))
    return out


def tables(results: list[dict[str, Any]], size: str) -> None:
    print(f"\nrestore to the first batch, corpus {size}, batch 16, shuffle buffer 500; "
          "read = rchar of the process and its workers")
    print(table(HEADERS, rows(results)))
    ratios = [[name, str(workers), x(hi["ours_s"], lo["ours_s"]), x(hi["ours_read"], lo["ours_read"]),
               x(hi["ff_s"], hi["ours_s"]), x(hi["plain_s"], hi["ours_s"]),
               x(hi["snapshot_values"], hi["snapshot_positions"])] for name, workers, lo, hi in _ends(results)]
    if ratios:  # (measured at 10 % and 90 %)
        print("\nratios: ours at 90 % / at 10 % (time, bytes read); at 90 %: ff / ours, plain / ours, "
              "snapshot values / positions")
        print(table(["pipeline", "workers", "ours 90/10", "read 90/10", "ff/ours", "plain/ours", "values/pos"],
                    ratios))


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def budgets(results: list[dict[str, Any]], peers: list[dict[str, Any]], corpus: Any, size: int) -> None:
    """Print each restore budget with the figures it is read from, and whether it holds."""
    from benchmarks._io_pipelines import PIPELINES

    print("\nbudgets:")
    ends = _ends(results)
    print("1. restore at 90 % within 1.2x of 10 %: " + ", ".join(
        f"{name}/{workers} {x(hi['ours_s'], lo['ours_s'])} {_verdict(hi['ours_s'] <= 1.2 * lo['ours_s'])}"
        for name, workers, lo, hi in ends))
    ours = {r["at"]: r["ours_s"] for r in results if r["pipeline"] == "jsonl.gz" and r["workers"] == 0}
    measured = [(p["peer"], r["restore_s"]) for p in peers for r in p.get("results", []) if r["at"] == 0.9]
    if measured and 0.9 in ours:
        peer, fastest = min(measured, key=lambda m: m[1])
        print(f"2. at 90 %, ours (jsonl.gz, in-process) {ms(ours[0.9])} vs the fastest peer ({peer}) {ms(fastest)}: "
              f"{_verdict(ours[0.9] <= fastest)}")
    else:
        print("2. at 90 %, ours vs the fastest peer: no peer measured")
    print("3. bytes read <= snapshot (x2 with workers) + one file per reader + 2 batches per worker:")
    lines: dict[tuple[str, int], list[str]] = {}
    for r in results:
        fmt = PIPELINES[r["pipeline"]].format
        per_sample = corpus.nbytes[fmt] / max(1, corpus.samples[fmt])
        bound = (r["snapshot_values"] * (1 + (r["workers"] > 0)) + corpus.largest[fmt] * max(1, r["workers"])
                 + 2 * r["workers"] * 16 * per_sample)
        lines.setdefault((r["pipeline"], r["workers"]), []).append(
            f"{r['at']:.0%} {mb(r['ours_read'])} <= {mb(bound)} {_verdict(r['ours_read'] <= bound)}")
    for (name, workers), checks in lines.items():
        print(f"   {name}/{workers}: " + "; ".join(checks))
    note = "" if size >= 1 << 30 else " (the budget is for a 1 GB corpus; this one is smaller)"
    print(f"4. at 90 %, ours >= 50x faster than fast-forward{note}: "
          + ", ".join(f"{r['pipeline']}/{r['workers']} {x(r['ff_s'], r['ours_s'])} "
                      f"{_verdict(r['ff_s'] >= 50 * r['ours_s'])}" for r in results if r["at"] == 0.9))
