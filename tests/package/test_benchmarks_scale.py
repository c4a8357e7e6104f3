"""``python -m benchmarks scale`` runs one tiny case with both item kinds and prints its tables and budgets.

No timing or memory figure is asserted: the budgets are read from the benchmark's printout
(docs/benchmarks.md). What is checked is that every row is measured and the state is the
buffered samples' bytes. The run is the benchmark's quick check (``--rounds 2 --fork``: measurements in
children forked from its process, not fresh interpreters, 10 s instead of 90 s on an idle machine); one
measurement in a fresh interpreter, the default, is checked on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_scale_benchmark_prints_its_rows_and_budgets(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "scale", "--only", "100x4KiB", "--items", "bytes,arrays", "--repeat", "1",
         "--rounds", "2", "--fork", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=290)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    rows = [line.split() for line in text.splitlines() if line.split()[:2] == ["100", "4"]]
    assert sorted((r[3], r[4]) for r in rows if len(r) > 4 and r[3] in ("bytes", "arrays")) == sorted(
        (kind, option) for kind in ("bytes", "arrays") for option in ("values", "positions"))
    assert "one tensor per item" in text and "budgets (each read from this run):" in text
    assert "against a pickle.dump as durable as a save (fsync, rename, the directory's fsync)" in text
    for heading in ("1. peak memory of a save by value", "2. blocking part of a background save <= 5%",
                    "3. blocking part of a background save by value <= DCP"):
        assert heading in text, text
    result = json.loads(out.read_text())["scale"]
    figures = result["scale"]
    assert len(figures) == 4
    # the state is measured in the shuffle buffer: 100 samples of 4 KiB
    assert all(f["state"] == 100 * 4096 and f["dcp_items"]["state"] == 100 * 4096 for f in figures)
    assert all(f["size"] > 0 and f["sync"] > 0 and f["blocking"] > 0 and f["dcp_one"]["blocking"] > 0
               for f in figures)
    by_value = {f["kind"]: f["size"] for f in figures if f["buffer_state"] == "values"}
    assert all(size > 100 * 4096 for size in by_value.values()), by_value
    # memory: sync, background and restore per by-value row; blocking and positions saves: one per row;
    # the codec's three states, encoded and decoded; a Stateful pipe's save and restore through the API
    assert sorted(v["budget"] for v in result["budgets"]) == sorted(
        ["memory sync", "memory background", "memory restore"] * 2 + ["blocking positions"] * 2
        + ["blocking values"] * 2 + ["positions save"] * 2 + ["codec encode", "codec decode"] * 3
        + ["api save", "api restore"])
    assert all(isinstance(v["pass"], bool) for v in result["budgets"])


def test_a_measurement_runs_in_a_fresh_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import scale

    monkeypatch.chdir(ROOT)  # ``python -m benchmarks._scale_case`` runs in the current directory

    figures = scale._measure(1, "sync", 100, 4096, "positions", "bytes")
    assert figures["runs"] == 1 and figures["state"] == 100 * 4096 and isinstance(figures["peak_reset"], bool)
    assert all(figures[key] > 0 for key in ("sync", "size", "restore")), figures


def test_scale_benchmark_refuses_an_unknown_case() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks", "scale", "--only", "lots"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "expected 157 or BUFFERxSIZE" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "benchmarks._scale_case" in imported and "torch" not in imported  # refused before any heavy import
