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
def test_distributed_example_crashes_on_2_ranks_and_resumes_on_3(tmp_path) -> None:
    """The how-to's three commands: killed after step 14 on 2 ranks, resumed on 3, checked."""
    work = tmp_path / "run"
    first = _torchrun(2, str(work), "--crash-at", "14", cwd=tmp_path, fails=True)
    assert "first run on 2 rank(s)" in first, first
    # the crash came after the checkpoint at step 12 and before the end of the epoch
    logged = (work / "log-first-rank0.jsonl").read_text()
    assert '"checkpoint": [0, 12]' in logged and '"step": 14' in logged and '"step": 15' not in logged

    resumed = _torchrun(3, str(work), cwd=tmp_path)
    assert "resumed run on 3 rank(s), from epoch 0, step 12" in resumed, resumed

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
