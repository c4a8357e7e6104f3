"""``python -m benchmarks distributed --ranks 2 --simulate 4`` runs and measures every figure.

One torchrun job of 2 ranks saves; two fresh ones restore, from the directory and from DCP (each rank's
first sample is checked against the one it would have read next); the simulation builds the index of
4 ranks x 8 workers and plans its restore onto 3 and 5. No timing or memory figure is asserted: the
budgets are read from the benchmark's printout (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_distributed_benchmark_measures_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "distributed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "distributed", "--ranks", "2", "--simulate", "4", "--repeat", "1",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=590)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "restores to the first sample" in proc.stdout and "simulated job of 4 ranks x 8 workers" in proc.stdout
    result = json.loads(out.read_text())["distributed"]
    runs = result["scaling"]["runs"]
    assert [(r["how"], r["saved"], r["ranks"]) for r in runs] == [("save", 2, 2), ("restore", 2, 2),
                                                                   ("dcp-load", 2, 2)]
    for run in runs:
        assert len(run["per_rank"]) == 2
        for rank in run["per_rank"]:
            keys = ["save", "state_dict", "dcp_save"] if run["how"] == "save" else ["restore"]
            for key in keys:
                assert rank[f"{key}_s"] > 0 and rank[f"{key}_cpu"] >= 0 and rank[f"{key}_rss"] >= 0
    saved = runs[0]["per_rank"]
    assert all(rank["state_dict_size"] > 512 * 8 * 1024 for rank in saved)  # a part holds 512 samples of 8 KiB
    simulated = result["simulate"]
    assert simulated["index_bytes"] > 0 and [p["ranks"] for p in simulated["plans"]] == [3, 5]
    assert all(len(p["parts_per_rank"]) == p["ranks"] for p in simulated["plans"])
