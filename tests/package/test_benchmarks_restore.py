"""The small restore's fixed costs in ``python -m benchmarks restore``: every step is timed, inside restores
that continue with the sample the saving loader would have yielded. No figure is asserted (the budget is
read from the printout, docs/benchmarks.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import restore


def test_fixed_costs_times_each_step_of_exact_restores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "small.snap")
    loader, it = restore.loader_at(100)
    loader.save_snapshot(path)
    expected = next(it)
    loader.shutdown()
    best = restore.fixed_costs(path, expected, rounds=3)
    assert list(best) == list(restore.STEPS)
    assert all(0 < best[step] < math.inf for step in restore.STEPS)
    assert best["total"] >= max(best[step] for step in restore.STEPS[:-1])
    restore._print_fixed_costs(100, best)
    out = capsys.readouterr().out
    assert "budget: DataLoader2(graph) to the first sample <= 1 ms:" in out
    for step in restore.STEPS:
        assert step in out


def test_fixed_costs_refuses_a_restore_that_is_not_exact(tmp_path: Path) -> None:
    path = str(tmp_path / "small.snap")
    loader, it = restore.loader_at(100)
    loader.save_snapshot(path)
    loader.shutdown()
    with pytest.raises(AssertionError, match="not exact"):
        restore.fixed_costs(path, object(), rounds=1)
