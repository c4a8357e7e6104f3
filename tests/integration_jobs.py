"""Run a training job in a fresh Python process (a session of its own), with a hard timeout.

The integration tests run real trainers (accelerate, Lightning, torchrun) in new processes, as
a user's job would run, and read the results each rank writes to a JSON file. A job that
outlives its timeout is killed with every process it started (Lightning's and torchrun's
extra ranks included), so a test never leaves one behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a job: this one, the repository importable, one thread per process."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_job(args: list[str], *, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None,
            fails: bool = False) -> str:
    """Run ``python *args`` in ``cwd``; its output, or an ``AssertionError`` with it if it failed.

    With ``fails=True`` the job is expected to fail (a crash the test provokes): then the
    ``AssertionError`` is for a job that succeeded.
    """
    process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env or job_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        raise AssertionError(f"the job {args} did not finish within {timeout:g} s:\n{output[-4000:]}") from None
    finally:
        _kill_group(process.pid)  # whatever it started and left behind
    if fails and process.returncode == 0:
        raise AssertionError(f"the job {args} was expected to fail but succeeded:\n{output[-6000:]}")
    if not fails and process.returncode != 0:
        raise AssertionError(f"the job {args} failed with exit code {process.returncode}:\n{output[-6000:]}")
    return output


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_results(directory: Path, name: str) -> list[Any]:
    """The results ``name.rank<r>.json`` written by each rank, in rank order."""
    files = sorted(directory.glob(f"{name}.rank*.json"), key=lambda p: int(p.stem.rsplit("rank", 1)[1]))
    assert files, f"the job wrote no {name}.rank*.json in {directory}"
    return [json.loads(p.read_text()) for p in files]


def write_result(directory: str | Path, name: str, rank: int, value: Any) -> None:
    path = Path(directory) / f"{name}.rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


_FENCE = re.compile(r"^```python[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def page_script(page: Path, runner: str) -> str:
    """The ```python blocks of a docs page that say they are run by ``runner`` (a test file), as one script.

    A docs page marks such a block ``<!-- example: not run, ... RUNNER ... -->``: the in-process
    docs test skips it, and ``runner`` runs it in a fresh process instead.
    """
    text = page.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        if "example: not run" in before and runner in before:
            blocks.append(match.group("body"))
    assert blocks, f"{page} has no python block marked as run by {runner}"
    return "\n\n".join(blocks)
