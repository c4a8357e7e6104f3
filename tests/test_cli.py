"""The ``snapshot`` console script, run for real in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import snapshot
from tests import graphs


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("snapshot", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "snapshot"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def snap_file(tmp_path) -> str:
    dl = snapshot.DataLoader2(graphs.combining())
    dl.seed(1)
    it = iter(dl)
    for _ in range(5):
        next(it)
    path = str(tmp_path / "c.snap")
    dl.save_snapshot(path)
    return path


def test_inspect_prints_the_tree_and_position(snap_file: str) -> None:
    proc = run_cli("inspect", snap_file)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 0, 5 samples yielded" in proc.stdout
    assert "0/datapipes/0  ZipperIterDataPipe()" in proc.stdout
    assert "(shared, see above)" in proc.stdout


def test_inspect_json_is_the_manifest(snap_file: str) -> None:
    proc = run_cli("inspect", "--json", snap_file)
    assert json.loads(proc.stdout)["loader"]["yielded"] == 5


def test_python_dash_m_works(snap_file: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "snapshot", "--version"], capture_output=True, text=True)
    assert proc.stdout.strip() == f"snapshot {snapshot.__version__}"


def test_bad_file_exits_2_with_a_message(tmp_path) -> None:
    bad = tmp_path / "bad.snap"
    bad.write_bytes(b"not a snapshot")
    proc = run_cli("inspect", str(bad))
    assert proc.returncode == 2
    assert "not a snapshot file" in proc.stderr
    assert "Traceback" not in proc.stderr
