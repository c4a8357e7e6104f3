"""The tests' own layout (tests/README.md): each test file sits in the folder of what it tests.

A folder per layer of the package (``tests/storage/`` for ``snapshot/storage/``, and so on for every
sub-package of ``snapshot/``), ``tests/package/`` for the package as a whole and what ships with it,
``tests/end_to_end/`` for whole jobs, and ``tests/torchdata_new/`` for torchdata >= 0.10. No test
file is loose at the root of ``tests/``, and every folder is a package: basenames repeat across
folders (``cli/test_verify.py``, ``loader/test_verify.py``), which pytest imports as
``tests.cli.test_verify`` and ``tests.loader.test_verify`` only because of the ``__init__.py``.
"""

from __future__ import annotations

from pathlib import Path

import snapshot

ROOT = Path(snapshot.__file__).parent.parent

#: The folders of ``tests/`` that are not a layer of the package.
BEYOND_THE_LAYERS = ("package", "end_to_end", "torchdata_new")


def layers(package: Path) -> set[str]:
    """The package's layer folders: its sub-packages."""
    return {p.parent.name for p in package.glob("*/__init__.py")}


def misplaced(tests: Path, folders: set[str]) -> list[str]:
    """What breaks the layout of ``tests``: a test file outside ``folders``, a folder without
    ``__init__.py``, a folder the README does not name."""
    problems = [f"{path.relative_to(tests)}: not in a folder of tests/README.md ({', '.join(sorted(folders))})"
                for path in sorted(tests.rglob("test_*.py"))
                if path.parent.parent != tests or path.parent.name not in folders]
    readme = (tests / "README.md").read_text() if (tests / "README.md").exists() else ""
    for folder in sorted(folders):
        if not (tests / folder / "__init__.py").exists():
            problems.append(f"{folder}/: no __init__.py (test basenames repeat across folders)")
        if f"`{folder}/`" not in readme:
            problems.append(f"{folder}/: not described in tests/README.md")
    return problems


def test_every_test_file_is_in_the_folder_of_its_layer() -> None:
    folders = layers(ROOT / "snapshot") | set(BEYOND_THE_LAYERS)
    assert not misplaced(ROOT / "tests", folders), "\n".join(misplaced(ROOT / "tests", folders))


def test_every_layer_of_the_package_has_a_test_folder() -> None:
    assert layers(ROOT / "snapshot") == {"cli", "container", "engine", "hooks", "integrations", "loader",
                                         "reading_service", "schema", "storage"}
    missing = sorted(name for name in layers(ROOT / "snapshot") if not (ROOT / "tests" / name).is_dir())
    assert not missing, f"layers of snapshot/ without a folder in tests/: {missing}"


def test_the_check_finds_a_loose_file_an_unknown_folder_and_a_missing_init(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("`storage/` bytes in and out\n")
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "__init__.py").write_text("")
    (tmp_path / "storage" / "test_ok.py").write_text("")
    assert misplaced(tmp_path, {"storage"}) == []
    (tmp_path / "test_loose.py").write_text("")
    (tmp_path / "storage" / "deeper").mkdir()
    (tmp_path / "storage" / "deeper" / "test_deep.py").write_text("")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "test_graph.py").write_text("")
    assert [p.split(":")[0] for p in misplaced(tmp_path, {"storage"})] == [
        "engine/test_graph.py", "storage/deeper/test_deep.py", "test_loose.py"]
    assert misplaced(tmp_path, {"storage", "engine"})[-2:] == [
        "engine/: no __init__.py (test basenames repeat across folders)", "engine/: not described in tests/README.md"]


def test_the_files_run_first_exist_and_come_first() -> None:
    """tests/conftest.py's ``LONGEST_FIRST`` (the order ``make unit`` starts files in) names files that exist:
    a moved or renamed file would silently drop back to the end of the run."""
    from tests.conftest import LONGEST_FIRST

    missing = [path for path in LONGEST_FIRST if not (ROOT / path).is_file()]
    assert not missing, f"tests/conftest.py's LONGEST_FIRST names files that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
