"""A restore from a file holds one copy of the state: in a real process, the peak resident memory that a
restore of a by-value shuffle buffer adds is at most 1.2x the buffered bytes (format 2 read the file whole,
then decoded a second copy: 2x)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import gc, json, os, sys
    import numpy
    from torch.utils.data.datapipes.iter import IterableWrapper
    import snapshot

    def sample(i):
        return numpy.full(16384, i % 251, dtype=numpy.uint8)

    def graph():
        return IterableWrapper(range(3000)).map(sample).shuffle(buffer_size=2500)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def high_water():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    path = sys.argv[2]
    if sys.argv[1] == "save":
        loader = snapshot.DataLoader2(graph())
        loader.seed(0)
        it = iter(loader)
        for _ in range(100):
            next(it)
        loader.save_snapshot(path)
        print(json.dumps({"next": int(next(it)[0])}))
    else:
        loader = snapshot.DataLoader2(graph())
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak mark starts again from the current resident memory
        before = rss()
        loader.restore_snapshot(path)
        first = next(iter(loader))
        print(json.dumps({"peak": high_water() - before, "next": int(first[0])}))
""")


def _run(*args: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's peak-RSS reset")
def test_a_restore_from_a_file_holds_one_copy_of_the_state(tmp_path: Path) -> None:
    path = str(tmp_path / "buffer.snap")
    saved = _run("save", path)
    state = 2500 * 16384  # the buffered samples: 39 MiB
    restored = _run("restore", path)
    assert restored["next"] == saved["next"]
    assert restored["peak"] <= 1.2 * state, f"the restore added {restored['peak'] / state:.2f}x the state"
