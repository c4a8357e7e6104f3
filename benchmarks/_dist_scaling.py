"""``python -m benchmarks distributed --ranks 2,4,8,16``: per-rank costs against the number of ranks.

For each R of ``--ranks``, a torchrun job of R ranks (gloo on 127.0.0.1, one machine) runs
:mod:`benchmarks._dist_job`'s ``save``: the directory snapshot, ``state_dict()`` and ``dcp.save`` of the
loader after 300 samples a rank; then fresh torchrun jobs restore it on R ranks and on the neighbouring
counts of ``--ranks`` (down and up), from the directory (``restore_snapshot``) and from the DCP
checkpoint. Every figure is per rank, measured around the one call; the tables give the median over the
ranks and the largest (``max``). The budgets of issue 31 are read from the figures: bytes read and peak
RSS growth per rank at the largest R within 1.2x of the smallest.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import table

ROOT = Path(__file__).resolve().parent.parent
#: The budget of issue 31: per-rank bytes read and memory at the largest R within this ratio of the smallest.
FLAT = 1.2
MiB = 1 << 20


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(ranks: int, args: list[str], *, timeout: float = 900) -> None:
    """``torchrun --nproc_per_node=ranks -m benchmarks._dist_job *args`` on 127.0.0.1; raises if it fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", "-m", "benchmarks._dist_job", *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        raise RuntimeError(f"torchrun {args} on {ranks} ranks did not finish in {timeout:g} s:\n"
                           f"{output[-3000:]}") from None
    if process.returncode != 0:
        raise RuntimeError(f"torchrun {args} on {ranks} ranks failed:\n{output[-5000:]}")


def _results(out: Path, mode: str) -> list[dict[str, Any]]:
    files = sorted(out.glob(f"{mode}.rank*.json"), key=lambda p: int(p.stem.rsplit("rank", 1)[1]))
    results = [json.loads(p.read_text()) for p in files]
    for p in files:
        p.unlink()
    return results


def targets(ranks: list[int], saved: int) -> list[int]:
    """The rank counts a snapshot of ``saved`` ranks is restored onto: the same, and the neighbours in
    ``ranks`` (one fewer step down, one step up)."""
    index = ranks.index(saved)
    return [saved] + ranks[max(index - 1, 0):index] + ranks[index + 1:index + 2]


def measure(ranks: list[int]) -> list[dict[str, Any]]:
    """Every run's per-rank figures: one record per (saved R, restored R', how)."""
    rows: list[dict[str, Any]] = []
    for saved in ranks:
        with tempfile.TemporaryDirectory(prefix="snapshot-dist-bench-") as tmp:
            directory, out = Path(tmp) / "ckpt", Path(tmp) / "out"
            directory.mkdir()
            out.mkdir()
            torchrun(saved, ["save", str(directory), str(out)])
            saves = _results(out, "save")
            rows.append({"saved": saved, "ranks": saved, "how": "save", "per_rank": saves})
            for target in targets(ranks, saved):
                for how in ("restore", "dcp-load"):
                    torchrun(target, [how, str(directory), str(out), str(saved)])
                    restored = _results(out, how)
                    check(saves, restored, how)
                    rows.append({"saved": saved, "ranks": target, "how": how, "per_rank": restored})
    return rows


def check(saves: list[dict[str, Any]], restored: list[dict[str, Any]], how: str) -> None:
    """Same ranks: each rank's first sample is the one it would have read next; other ranks: the first
    samples are distinct and none was read before the save."""
    if len(saves) == len(restored):
        got = [r["first"] for r in restored]
        expected = [s["rest"][0] for s in saves]
        if got != expected:
            raise AssertionError(f"{how} on {len(saves)} ranks: first samples {got}, expected {expected}")
        return
    seen = {x for s in saves for x in s["seen"]}
    firsts = [r["first"] for r in restored]
    if len(set(firsts)) != len(firsts) or seen & set(firsts):
        raise AssertionError(f"{how} {len(saves)} -> {len(restored)} ranks: first samples {firsts} repeat")


def _med(values: list[float]) -> float:
    return statistics.median(values)


def summary(row: dict[str, Any], key: str) -> tuple[float, float]:
    """The median over the ranks of a figure, and its largest value."""
    values = [r[key] for r in row["per_rank"]]
    return _med(values), max(values)


def _mib(value: float) -> str:
    return f"{value / MiB:.2f}"


def report(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print the tables and the budgets; the budget verdicts."""
    saves = [r for r in rows if r["how"] == "save"]
    print("saves (after 300 samples a rank; per rank: median over the ranks / largest):")
    print(table(["ranks", "save s (max)", "save CPU s", "save RSS MiB", "state_dict() MiB", "state_dict() RSS MiB",
                 "state_dict() s (max)", "dcp.save s (max)", "dcp.save RSS MiB"],
                [[r["ranks"], f"{summary(r, 'save_s')[1]:.3f}",
                  f"{summary(r, 'save_cpu')[0]:.3f} / {summary(r, 'save_cpu')[1]:.3f}", _mib(summary(r, "save_rss")[0]),
                  f"{_mib(summary(r, 'state_dict_size')[0])} / {_mib(summary(r, 'state_dict_size')[1])}",
                  f"{_mib(summary(r, 'state_dict_rss')[0])} / {_mib(summary(r, 'state_dict_rss')[1])}",
                  f"{summary(r, 'state_dict_s')[1]:.3f}", f"{summary(r, 'dcp_save_s')[1]:.3f}",
                  f"{_mib(summary(r, 'dcp_save_rss')[0])} / {_mib(summary(r, 'dcp_save_rss')[1])}"]
                 for r in saves]))
    print()
    print("restores to the first sample (per rank: median over the ranks / largest):")
    restores = [r for r in rows if r["how"] != "save"]
    print(table(["saved -> ranks", "from", "bytes read MiB", "peak RSS growth MiB", "time s", "CPU s"],
                [[f"{r['saved']} -> {r['ranks']}", "directory" if r["how"] == "restore" else "DCP",
                  f"{_mib(summary(r, 'restore_read')[0])} / {_mib(summary(r, 'restore_read')[1])}",
                  f"{_mib(summary(r, 'restore_rss')[0])} / {_mib(summary(r, 'restore_rss')[1])}",
                  f"{summary(r, 'restore_s')[0]:.3f} / {summary(r, 'restore_s')[1]:.3f}",
                  f"{summary(r, 'restore_cpu')[0]:.3f} / {summary(r, 'restore_cpu')[1]:.3f}"] for r in restores]))
    return budgets(rows)


def budgets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bytes read and peak RSS growth per rank (the largest rank's), R -> R at the largest R against the
    smallest, from the directory and from DCP."""
    verdicts = []
    same = {(r["how"], r["ranks"]): r for r in rows if r["how"] != "save" and r["saved"] == r["ranks"]}
    counts = sorted({ranks for _, ranks in same})
    if len(counts) < 2:
        return verdicts
    low, high = counts[0], counts[-1]
    print()
    print(f"budgets (each read from this run: R -> R restores, the largest rank's figure, {high} against {low} "
          f"ranks, within {FLAT}x):")
    for how in ("restore", "dcp-load"):
        for key, what in (("restore_read", "bytes read"), ("restore_rss", "peak RSS growth")):
            small, large = summary(same[(how, low)], key)[1], summary(same[(how, high)], key)[1]
            ratio = large / small if small else float("inf")
            ok = ratio <= FLAT
            source = "directory" if how == "restore" else "DCP"
            print(f"  {what}, {source}: {_mib(large)} MiB at {high} ranks, {_mib(small)} MiB at {low}: "
                  f"{ratio:.2f}x  {'PASS' if ok else 'FAIL'}")
            verdicts.append({"budget": f"{what}, {source}", "ratio": ratio, "pass": ok})
    return verdicts


def run(ranks: list[int]) -> dict[str, Any]:
    ranks = sorted(set(ranks))
    if not ranks or ranks[0] < 1:
        raise ValueError(f"--ranks takes positive rank counts, got {ranks}")
    rows = measure(ranks)
    verdicts = report(rows)
    return {"runs": rows, "budgets": verdicts}
