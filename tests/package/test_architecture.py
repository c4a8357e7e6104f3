"""The package's shape, as docs/architecture.md describes it: imports point one way (no circle,
not even through an import made only for type checking or inside a function) and down the layers,
each layer a folder (storage knows nothing of the engine, the command line runs without torch),
and modules, classes and functions stay small enough to read."""

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


#: The layers of docs/architecture.md from the bottom up, each as the module prefixes it holds. A
#: module imports its own layer and those below it, never one above; what no prefix names is the
#: front (``__init__``, ``testing``, ``integrations/``, ``cli/`` and the old module paths).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", ("snapshot.errors", "snapshot.schema", "snapshot.hooks", "snapshot._choice",
                    "snapshot._progress", "snapshot._warnings", "snapshot._version")),
    ("engine", ("snapshot.engine",)),
    ("container", ("snapshot.container",)),
    ("storage", ("snapshot.storage",)),
    ("reading services", ("snapshot.reading_service",)),
    ("loader", ("snapshot.loader",)),
)

#: The paths that public modules had before the layer folders, which stay the same module objects.
OLD_PATHS = ("snapshot.capture", "snapshot.dataloader2", "snapshot.execution", "snapshot.format", "snapshot.graph",
             "snapshot.multipart", "snapshot.plan", "snapshot.randomness", "snapshot.restore", "snapshot.sharding")

#: Imports the layout rules out although the order above would allow them: ``(importer, imported)``.
NEVER = (
    # bytes in and out know nothing of running a graph, nor of who runs it
    ("snapshot.storage", "snapshot.engine"),
    ("snapshot.storage", "snapshot.reading_service"),
)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str) -> int:
    """The index of ``module``'s layer in :data:`LAYERS`; the front is above them all."""
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(_within(module, prefix) for prefix in prefixes):
            return index
    return len(LAYERS)


def _upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import of ``edges`` that points to a higher layer or is one of :data:`NEVER`."""
    names = [name for name, _ in LAYERS] + ["front"]
    found = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if _layer(target) > _layer(module):
                found.append(f"{module} ({names[_layer(module)]}) imports {target} ({names[_layer(target)]})")
            elif any(_within(module, a) and _within(target, b) for a, b in NEVER):
                found.append(f"{module} imports {target}, which the layout rules out")
    return found


def test_the_layer_check_sees_an_import_upward_and_a_ruled_out_one() -> None:
    edges = {"snapshot.engine.plan": {"snapshot.container.format", "snapshot.errors"},
             "snapshot.storage._io": {"snapshot.engine.graph", "snapshot.container.format"},
             "snapshot.loader.dataloader2": {"snapshot.storage._io"}, "snapshot.testing": {"snapshot.loader"}}
    assert _upward(edges) == [
        "snapshot.engine.plan (engine) imports snapshot.container.format (container)",
        "snapshot.storage._io imports snapshot.engine.graph, which the layout rules out"]


def test_every_module_is_in_a_layer_folder_or_the_front_or_the_vocabulary() -> None:
    """The package's root holds only the front and the shared vocabulary; every other module
    lives in the folder of its layer."""
    front = {"snapshot.__main__", "snapshot.testing", *OLD_PATHS}
    at_root = {name for name in MODULES if name.count(".") == 1 and MODULES[name].name != "__init__.py"}
    loose = sorted(at_root - front - set(LAYERS[0][1]))
    assert not loose, f"these modules belong in a layer's folder: {loose}"


def test_imports_point_down_the_layers() -> None:
    upward = _upward(_edges())
    assert not upward, "imports against the layers of docs/architecture.md:\n" + "\n".join(upward)


def test_no_module_inside_the_package_imports_an_old_path() -> None:
    """The old module paths (``snapshot.format`` ...) are for users: the package imports the modules
    where they live. Only the package's face may, to keep ``snapshot.capture`` and
    ``snapshot.restore`` the functions they are."""
    old = set(OLD_PATHS)
    offenders = sorted(f"{name} imports {sorted(targets & old)}" for name, targets in _edges().items()
                       if targets & old and name not in old | {"snapshot"})
    assert not offenders, "\n".join(offenders)


def test_the_command_line_runs_without_torch(tmp_path: Path) -> None:
    """``snapshot inspect | verify | diff | graph`` read manifests only: run as the command runs
    (``python -m snapshot``), they never import torch."""
    import subprocess
    import sys

    from torch.utils.data.datapipes.iter import IterableWrapper

    path = str(tmp_path / "a.snap")
    with snapshot.DataLoader2(IterableWrapper(range(5))) as dl:
        next(iter(dl))
        dl.save_snapshot(path)
    for args in (["inspect", path], ["verify", path], ["diff", path, path], ["graph", path], ["--help"]):
        code = (f"import runpy, sys\nsys.argv = ['snapshot', *{args!r}]\nexit = None\n"
                "try:\n    runpy.run_module('snapshot', run_name='__main__', alter_sys=True)\n"
                "except SystemExit as exc:\n    exit = exc.code\n"
                "print('EXIT', exit, 'torch' in sys.modules, file=sys.stderr)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.stderr.strip().splitlines()[-1] == "EXIT 0 False", (args, out.stderr[-2000:])


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """The modules that ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_save_path_never_enters_restore_code() -> None:
    """Saving (``loader/_save.py``, and all it imports) reaches neither the loader's restore nor
    ``snapshot.restore``: what both need (the digests ahead) lives below both."""
    restore = {"snapshot.loader._restore", "snapshot.loader.restore", "snapshot.restore"}
    entered = sorted(_reach(_edges(), "snapshot.loader._save") & restore)
    assert not entered, f"the save path imports restore code: {entered}"


def _loader_members() -> set[str]:
    """The private attributes ``DataLoader2`` sets on itself (``self._x = ...``): its own state."""
    tree = ast.parse((ROOT / "snapshot/loader/dataloader2.py").read_text())
    return {target.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for target in node.targets
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "self" and target.attr.startswith("_")}


def _members_reached(source: str, members: set[str]) -> list[str]:
    """Where ``source`` reads one of ``members`` of an object other than ``self`` (``loader._position``)."""
    return [f"line {node.lineno}: .{node.attr}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in members
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")]


def test_the_member_check_sees_a_helper_reaching_into_the_loader() -> None:
    members = _loader_members()
    assert {"_position", "_service", "_graph", "_saver", "_restorer"} <= members
    assert _members_reached("def f(loader):\n    return loader._position.epoch\n", members) == ["line 2: ._position"]
    assert _members_reached("class A:\n    def f(self):\n        return self._position\n", members) == []


def test_the_loader_helpers_are_objects_that_never_reach_into_the_loader() -> None:
    """The loader's helpers (position, graph copy, service, saver, restorer, iterator) own their
    state and are given what they use: no module of ``loader/`` reads ``DataLoader2``'s members."""
    members = _loader_members()
    reached = {path.name: found for path in sorted((ROOT / "snapshot/loader").glob("*.py"))
               if path.name != "dataloader2.py" and (found := _members_reached(path.read_text(), members))}
    assert not reached, f"loader helpers that read DataLoader2's private members: {reached}"


def _private_reads(source: str) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls``: another object's private attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        private = isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
        if private and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_private_reads_are_found() -> None:
    assert _private_reads("def f(self, executor):\n    return self._a, executor._count, x.__dict__\n") == \
        ["line 2: executor._count"]


def test_the_reading_services_compose_through_public_methods() -> None:
    """A service drives another (the distributed service its executor) through public methods that take
    the re-shard plan, never through its private attributes."""
    reached = {str(path.relative_to(ROOT)): found for path in sorted((ROOT / "snapshot/reading_service").rglob("*.py"))
               if (found := _private_reads(path.read_text()))}
    assert not reached, f"reading-service modules that read another object's private attributes: {reached}"
