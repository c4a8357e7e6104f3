"""Packaging: the name on the package index, and what an installed package offers type checkers."""

import subprocess
import sys
from pathlib import Path

from snapshot._version import DISTRIBUTION

ROOT = Path(__file__).resolve().parent.parent


def test_distribution_name_is_not_the_taken_one_and_docs_install_it() -> None:
    # `snapshot` on the package index is an unrelated project: `pip install snapshot` would install it
    out = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == DISTRIBUTION == "datapipe-snapshot"
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    assert f"pip install {DISTRIBUTION}" in text
    assert "pip install snapshot" not in text and "pip install \"snapshot[" not in text
    assert "pip install 'snapshot[" not in text
