"""The README's main job keeps working (it runs three processes and a SIGKILL)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_demo_proves_the_restored_stream() -> None:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== uninterrupted, batch by batch: True" in proc.stdout
    assert "bit-identical to the uninterrupted run: True" in proc.stdout
    assert "simulated crash" in proc.stdout
    assert "Warning" not in proc.stderr
