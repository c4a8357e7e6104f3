"""examples/preemption.py does what its docstring and docs/how-to/failures.md say: on SIGTERM its ranks save at
the next step boundary and exit 0 within the grace period, and the job resumes exactly once on 3 ranks."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest

import snapshot
from tests.dist import free_port
from tests.integration_jobs import ROOT, job_env, run_job

SCRIPT = str(ROOT / "examples" / "preemption.py")
#: SLURM's KillWait and Kubernetes' terminationGracePeriodSeconds, by default.
GRACE = 30.0


def torchrun(ranks: int, *args: str) -> list[str]:
    return ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "--max_restarts=0", SCRIPT, *args]


class Job:
    """torchrun in a session of its own; its output read line by line as it comes."""

    def __init__(self, args: list[str], cwd) -> None:
        self.process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=job_env(), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, name="test-job-output")
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str, count: int, timeout: float = 240) -> list[re.Match[str]]:
        """The first ``count`` lines matching ``pattern``, as they come (no polling)."""
        found: list[re.Match[str]] = []
        while len(found) < count:
            line = self.lines.get(timeout=timeout)
            assert line is not None, "the job ended early:\n" + "".join(self.output)
            found.extend(re.finditer(pattern, line))  # the ranks' lines may share one
        return found

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(30)
        self._reader.join(30)


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_exits_0_and_the_job_resumes_exactly_once_on_3_ranks(tmp_path) -> None:
    work = tmp_path / "run"
    job = Job(torchrun(2, str(work), "--hold-at", "9"), cwd=tmp_path)
    try:
        held = job.wait_for(r"rank (\d) holds after step 9 \(pid (\d+)\)", 2)
        for match in held:  # as SLURM does: every task is signalled
            os.kill(int(match[2]), signal.SIGTERM)
        code = job.process.wait(GRACE)  # within the grace period, before a scheduler's SIGKILL
    finally:
        job.close()
    output = "".join(job.output)
    assert code == 0, output
    assert "preempted: saved after step 9 of epoch 0; exiting 0" in output, output
    assert snapshot.latest(work / "data") == str(work / "data" / "step-9.snap")
    assert (work / "model" / "step-9.pt").exists()

    resumed = run_job(torchrun(3, str(work)), cwd=tmp_path, timeout=240)
    assert "resumed run on 3 rank(s), from epoch 0, step 9" in resumed and "done" in resumed, resumed
    check = run_job([SCRIPT, str(work), "--check"], cwd=tmp_path, timeout=60)
    for epoch in range(2):
        assert f"epoch {epoch}: 192 samples trained on, 0 lost, 0 repeated" in check, check
    assert "every sample exactly once: True" in check


@pytest.mark.slow
def test_sigterm_to_torchrun_reaches_the_ranks_which_save_and_exit_0(tmp_path) -> None:
    """As Kubernetes does: the signal goes to the container's first process, torchrun, which passes it on to
    every rank; the ranks save and exit 0, and torchrun exits 1, re-raising the signal it got."""
    work = tmp_path / "run"
    job = Job(torchrun(2, str(work), "--hold-at", "6"), cwd=tmp_path)
    try:
        job.wait_for(r"rank (\d) holds after step 6 \(pid (\d+)\)", 2)
        job.process.send_signal(signal.SIGTERM)
        code = job.process.wait(GRACE)
    finally:
        job.close()
    output = "".join(job.output)
    assert "preempted: saved after step 6 of epoch 0; exiting 0" in output, output
    assert code == 1 and "SignalException" in output, output
    assert snapshot.latest(work / "data") == str(work / "data" / "step-6.snap")
    assert snapshot.read_manifest(work / "data" / "step-6.snap")["loader"]["yielded"] == 12  # 6 batches a rank


def test_check_catches_a_repeated_sample(tmp_path) -> None:
    """``--check`` can fail: a resumed run that trains on a sample the first run already did."""
    work = tmp_path / "run"
    work.mkdir()
    ids = list(range(192))
    (work / "log-first-rank0.jsonl").write_text("".join(
        f'{{"epoch": {e}, "step": 1, "ids": {ids}}}\n' for e in range(2)) + '{"checkpoint": [1, 1]}\n')
    (work / "log-resumed-rank0.jsonl").write_text('{"epoch": 1, "step": 2, "ids": [5]}\n')
    output = run_job([SCRIPT, str(work), "--check"], cwd=tmp_path, timeout=60, fails=True)
    assert "epoch 1: 193 samples trained on, 0 lost, 1 repeated" in output, output
