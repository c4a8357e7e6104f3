"""Packaging: the name on the package index, and what an installed package offers type checkers."""

import os
import subprocess
import sys
from pathlib import Path

from snapshot._version import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]


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


def _makefile_editable_flags() -> list[str]:
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("EDITABLE :="):
            return line.split(":=", 1)[1].split()
    raise AssertionError("the Makefile defines no EDITABLE flags")


def test_type_checkers_find_the_package_installed_as_make_installs_it(tmp_path: Path) -> None:
    """mypy, run from a user's directory, sees ``snapshot``'s types through the editable install."""
    import sysconfig
    import venv

    assert (ROOT / "snapshot" / "py.typed").exists()
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # this environment's packages (pip, setuptools, mypy, torch) without its own `snapshot`
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    install = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
               *_makefile_editable_flags(), str(ROOT)]
    proc = subprocess.run(install, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    user = tmp_path / "project"
    user.mkdir()
    (user / "train.py").write_text(
        "import snapshot\n\n"
        "loader: snapshot.DataLoader2[int] = snapshot.DataLoader2(None)\n"
        "reveal_type(snapshot.latest)\n"
        "loader.save_snapshot(3.5)\n"  # a type error mypy can only see with the package's types
    )
    # the package's own code is what is checked against, not torch's (kept fast)
    (user / "mypy.ini").write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    proc = subprocess.run([python, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "train.py"],
                          cwd=user, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "Cannot find implementation or library stub" not in out, out
    assert 'Revealed type is "def (directory: str | os.PathLike[str]) -> str | None"' in out, out
    # save_snapshot is overloaded on ``blocking`` (it returns a Snapshot or a Future): mypy names the overloads
    assert 'No overload variant of "save_snapshot" of "DataLoader2" matches argument type "float"' in out, out
