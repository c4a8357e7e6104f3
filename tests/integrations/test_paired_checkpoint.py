"""The recommended way to save the model and the data position together (docs/how-to/distributed.md),
as ``examples/distributed.py`` does it: one directory per checkpoint, ``step-NNNNNN/`` holding
``model.pt`` and ``data.snap`` (with the epoch and step as its metadata), written in a hidden staging
directory and committed by one rename, rotated a whole directory at a time.

A job killed between the two writes (the data snapshot written, the model not) leaves the previous
checkpoint as the newest, complete; the resumed job trains on every sample exactly once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import snapshot
from tests.dist import free_port
from tests.integration_jobs import ROOT, run_job

SCRIPT = str(ROOT / "examples" / "distributed.py")


def _run(work: Path, *args: str, ranks: int = 0, fails: bool = False) -> str:
    torchrun = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", "--max_restarts=0"] if ranks else []
    return run_job([*torchrun, SCRIPT, str(work), *args], cwd=work.parent, timeout=240, fails=fails)


def _committed(ckpt: Path) -> list[str]:
    """The names in ``ckpt`` that are not hidden (a distributed data snapshot's directory is)."""
    return sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("."))


def _check_pairs(ckpt: Path) -> None:
    """Every committed checkpoint holds both files, and its data snapshot says its own step."""
    for name in _committed(ckpt):
        files = _committed(ckpt / name)
        assert files == ["data.snap", "model.pt"], (name, files)
        assert snapshot.load(ckpt / name / "data.snap").metadata["total"] == int(name.split("-")[1])
        torch.load(ckpt / name / "model.pt", weights_only=True)  # a whole file


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["one-process", "torchrun-2"])
def test_a_crash_between_the_two_writes_leaves_the_previous_checkpoint(tmp_path: Path, ranks: int) -> None:
    work = tmp_path / "run"
    first = _run(work, "--crash-between", "12", ranks=ranks, fails=True)
    assert "first run on" in first, first
    ckpt = work / "ckpt"
    # the data snapshot of step 12 was written, its model was not: nothing of step 12 is committed
    assert _committed(ckpt) == ["step-000006"]
    assert _committed(ckpt / ".step-000012.tmp") == ["data.snap"]
    _check_pairs(ckpt)

    resumed = _run(work, ranks=ranks)
    assert re.search(r"resumed run on \d rank\(s\), from epoch 0, step 6", resumed), resumed
    check = run_job([SCRIPT, str(work), "--check"], cwd=tmp_path, timeout=60)
    assert "every sample exactly once: True" in check, check
    # rotation kept the 3 newest, whole; the staging left by the crash was replaced when step 12 was saved
    assert len(_committed(ckpt)) == 3 and not [p for p in os.listdir(ckpt) if p.startswith(".")]
    _check_pairs(ckpt)
