"""The package's shape, as docs/architecture.md describes it: imports point one way (no circle,
not even through an import made only for type checking or inside a function), and modules,
classes and functions stay small enough to read."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapshot

ROOT = Path(snapshot.__file__).parent.parent

# Issue 14's bounds: a module about a screenful of ideas, a class one idea, a function one step.
MODULE_LINES = 400
CLASS_LINES = 250
FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((ROOT / "snapshot").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """The package's modules that the module at ``path`` imports, anywhere in it: at the top,
    inside functions and under ``if TYPE_CHECKING``. ``from package import name`` counts as
    importing the submodule ``package.name`` when there is one, else the package itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= submodules or {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & MODULES.keys()


def _edges() -> dict[str, set[str]]:
    return {name: _imports(path) - {name} for name, path in MODULES.items()}


def _circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among ``edges`` as a list of modules (first == last), or ``None``."""
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module):], module]
        if module in done:
            return None
        for target in sorted(edges.get(module, ())):
            found = visit(target, [*trail, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(edges):
        found = visit(module, [])
        if found:
            return found
    return None


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None


def test_the_import_reader_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from snapshot.graph import Graph\n"
                      "def f():\n    from snapshot import format\n    import snapshot.errors\n")
    assert _imports(source) == {"snapshot.graph", "snapshot.format", "snapshot.errors"}


def test_no_import_circle_in_the_package() -> None:
    circle = _circle(_edges())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_only_the_face_and_the_top_import_the_package_root() -> None:
    """Modules inside the package import the modules they need, not ``snapshot`` itself (whose
    ``__init__`` imports nearly everything); only the layers above the public API may."""
    above = ("snapshot.integrations", "snapshot.testing", "snapshot.__main__")
    offenders = sorted(name for name, targets in _edges().items()
                       if "snapshot" in targets and not name.startswith(above))
    assert not offenders, f"these modules import the package root: {offenders}"


def _definitions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_class_and_function_sizes(name: str) -> None:
    path = MODULES[name]
    text = path.read_text()
    too_long = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES:
        too_long.append(f"module {name}: {lines} lines (at most {MODULE_LINES})")
    for what, node in _definitions(ast.parse(text)):
        assert node.end_lineno is not None
        size = node.end_lineno - node.lineno + 1
        limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
        if size > limit:
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            too_long.append(f"{kind} {name}:{what} (line {node.lineno}): {size} lines (at most {limit})")
    assert not too_long, "split these by idea:\n" + "\n".join(too_long)
