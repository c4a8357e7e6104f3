"""``python -m benchmarks io`` runs at a tiny size and prints its tables; every restore it measured is exact.

No timing is asserted: the budgets are read from the benchmark's printout (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_io_benchmark_prints_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "io.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "io", "--size", "1MB", "--repeat", "1", "--pipelines", "tar,jsonl.gz",
         "--modes", "0,2", "--positions", "0.1,0.9", "--json", str(out),
         "--peer-python", "nosuch=/nonexistent/bin/python"],
        cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "restore to the first batch" in text and "ratios: ours at 90 % / at 10 %" in text
    assert "peer nosuch skipped: no Python at /nonexistent/bin/python" in text
    assert "budgets:" in text and "1. restore at 90 % within 1.2x of 10 %: tar/0 " in text
    table = text[text.index("restore to the first batch"):text.index("ratios:")]
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["tar"], ["jsonl.gz"])]
    # a row per pipeline, mode and position, each restore checked against the uninterrupted run
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted(
        (p, w, at) for p in ("tar", "jsonl.gz") for w in ("0", "2") for at in ("10%", "90%"))
    assert all(r[-1] == "yes" for r in rows), table
    results = json.loads(out.read_text())["io"]["results"]
    assert len(results) == 8 and all(r["exact"] for r in results)
    assert all(r["snapshot_values"] > 0 and r["snapshot_positions"] > 0 and r["ours_read"] > 0 for r in results)
