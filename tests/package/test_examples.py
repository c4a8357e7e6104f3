"""The runnable examples in ``examples/`` do what their docstrings and the docs say."""

from __future__ import annotations

import re

import pytest

from tests.dist import free_port
from tests.integration_jobs import ROOT, run_job

SCRIPT = str(ROOT / "examples" / "distributed.py")


def _torchrun(ranks: int, *args: str, cwd, fails: bool = False) -> str:
    return run_job(["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}", "--max_restarts=0", SCRIPT, *args],
                   cwd=cwd, timeout=240, fails=fails)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 3), (4, 3)])
def test_distributed_example_crashes_and_resumes_on_another_number_of_ranks(tmp_path, before: int,
                                                                            after: int) -> None:
    """The how-to's three commands: killed after step 14 (2 ranks) or 8 (4 ranks), resumed on 3,
    checked: every sample of both epochs trained on once, the ranks' steps in lockstep (DDP)."""
    work = tmp_path / "run"
    crash, saved = (14, 12) if before == 2 else (8, 6)
    first = _torchrun(before, str(work), "--crash-at", str(crash), cwd=tmp_path, fails=True)
    assert f"first run on {before} rank(s)" in first, first
    # the crash came after the last checkpoint and before the end of the epoch
    logged = (work / "log-first-rank0.jsonl").read_text()
    assert f'"checkpoint": [0, {saved}]' in logged and f'"step": {crash}' in logged
    assert f'"step": {crash + 1}' not in logged

    resumed = _torchrun(after, str(work), cwd=tmp_path)
    assert f"resumed run on {after} rank(s), from epoch 0, step {saved}" in resumed, resumed

    check = run_job([SCRIPT, str(work), "--check"], cwd=tmp_path, timeout=60)
    for epoch in range(2):
        assert re.search(rf"epoch {epoch}: 192 samples trained on, 0 lost, 0 repeated", check), check
    assert "every sample exactly once: True" in check, check


def test_check_catches_a_lost_sample(tmp_path) -> None:
    """``--check`` can fail: a log with one sample missing is reported as lost."""
    work = tmp_path / "run"
    work.mkdir()
    ids = list(range(192))
    lines = [f'{{"epoch": {e}, "step": 1, "ids": {ids[:-1] if e == 1 else ids}}}' for e in range(2)]
    (work / "log-first-rank0.jsonl").write_text("\n".join(lines) + "\n")
    output = run_job([SCRIPT, str(work), "--check"], cwd=tmp_path, timeout=60, fails=True)
    assert "epoch 1: 191 samples trained on, 1 lost, 0 repeated" in output, output
