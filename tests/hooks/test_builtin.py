"""Every built-in hook yields exactly what torch's own pipe yields, and resumes exactly."""

from __future__ import annotations

import ast
import copy
import functools
import os
from pathlib import Path

import pytest
from torch.utils.data import MapDataPipe
from torch.utils.data.datapipes.iter import (
    Batcher,
    Demultiplexer,
    FileLister,
    FileOpener,
    Forker,
    Grouper,
    IterableWrapper,
    Mapper,
    RoutedDecoder,
    StreamReader,
    UnBatcher,
    Zipper,
)

import snapshot
from snapshot.graph import Graph
from snapshot.hooks import ResumableIterator, hook_for, registered_types
from snapshot.hooks._registry import hook_for_class
from snapshot.testing import assert_hook_roundtrip, assert_resumes_exactly, first_difference
from tests import graphs
from tests.helpers import HOOKED_STRATEGIES
from tests.hook_cases import CASES, TORCH, TORCHDATA, bind, files_graph, key_mod4, route3
from tests.hook_cases import td as TORCHDATA_ITER
from tests.native import hooked_epochs, native_epochs

STRATEGIES = HOOKED_STRATEGIES  # auto: the same plan as state for these (tests/helpers.py)


def _overflowing_fork():
    a, b = Forker(IterableWrapper(range(10)), 2, buffer_size=2)
    return Zipper(Batcher(a, 4), b)


def _ids(name):
    return name


def test_cases_are_listed_once_each_with_a_prefix() -> None:
    assert all(name.split(":", 1)[0] in ("torch", "torchdata") for name in CASES)
    assert len(CASES) == len(TORCH) + len(TORCHDATA)


@pytest.mark.parametrize("name", sorted(CASES), ids=_ids)
def test_hook_yields_what_the_pipe_yields(name: str, data_dir: str) -> None:
    factory = bind(CASES[name], data_dir)
    expected = native_epochs(factory, seed=3, epochs=2)
    got = hooked_epochs(factory, seed=3, epochs=2)
    for epoch, (want, have) in enumerate(zip(expected, got)):
        assert first_difference(want, have) is None, f"epoch {epoch}: {want} != {have}"
        assert [type(x) for x in want] == [type(x) for x in have]


@pytest.mark.parametrize("name", sorted(CASES), ids=_ids)
def test_hook_resumes_exactly(name: str, data_dir: str) -> None:
    assert_resumes_exactly(bind(CASES[name], data_dir), epochs=2, strategies=STRATEGIES, via_file=False)


@pytest.mark.parametrize("name", sorted(CASES), ids=_ids)
def test_hook_state_roundtrips_at_every_step(name: str, data_dir: str) -> None:
    report = assert_hook_roundtrip(bind(CASES[name], data_dir), seed=3, epochs=2, max_steps=20)
    assert len(report.cuts) >= 4


def _ours(cls: type) -> bool:
    """A hook registered by snapshot itself (not by a test or a user)."""
    hook = hook_for_class(cls)
    assert hook is not None
    return (hook.iterator or hook.state_dict).__module__.startswith("snapshot.")  # type: ignore[union-attr]


def test_every_registered_hook_has_a_case(data_dir: str) -> None:
    for name in ("DataLoader2", "MultiProcessingReadingService", "DistributedReadingService"):
        getattr(snapshot, name)  # modules that may register hooks of their own
    if TORCHDATA:
        hook_for_class(TORCHDATA_ITER.Header)  # loads torchdata's table
    covered: set[type] = set()
    for factory in CASES.values():
        covered |= {type(node.datapipe) for node in Graph(bind(factory, data_dir)())}
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in registered_types()
                     if _ours(c) and c not in covered)
    assert not missing, ("these classes have a registered hook and no case in tests/hook_cases.py "
                         "(add one that builds a graph holding them):\n" + "\n".join(missing))


def test_every_builtin_node_is_restored_from_state(data_dir: str) -> None:
    factories = [*(bind(f, data_dir) for f in CASES.values()), graphs.linear, graphs.combining, graphs.grouped,
                 graphs.collate_unbatch, graphs.sampled, graphs.sharded]
    for factory in factories:
        for node in Graph(factory()):
            if isinstance(node.datapipe, MapDataPipe):
                continue  # a map-style source is read by index, by its consumer
            hook = hook_for(node.datapipe)
            assert hook is not None and hook.iterator is not None, node.signature


@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_file_pipes_yield_what_torch_yields(data_dir: str, chunk) -> None:
    os.makedirs(os.path.join(data_dir, "sub"))
    with open(os.path.join(data_dir, "sub", "z.txt"), "w") as f:
        f.write("nested file\n")
    factory = functools.partial(files_graph, data_dir, chunk)
    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=2, strategies=STRATEGIES)


def test_text_mode_stream_reader_resumes(data_dir: str) -> None:
    def factory():
        return StreamReader(FileOpener(FileLister(data_dir, "*.txt"), mode="t"), chunk=3)

    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=1, strategies=STRATEGIES)


def test_routed_decoder(data_dir: str) -> None:
    factory = functools.partial(graphs.files, data_dir)
    assert first_difference(native_epochs(factory)[1], hooked_epochs(factory)[1]) is None
    decoded = lambda: RoutedDecoder(FileOpener(FileLister(data_dir, "*.json"), mode="b"))  # noqa: E731
    assert native_epochs(decoded, epochs=1) == hooked_epochs(decoded, epochs=1)


def test_stream_reader_without_a_file_opener_replays_its_input(data_dir: str) -> None:
    """A map between the opener and the reader hides where the stream came from: the reader keeps
    its state and its input is replayed (not the reader itself), and the plan says why."""
    from snapshot.plan import RestoreStrategy, make_plan

    def factory():
        return StreamReader(Mapper(FileOpener(FileLister(data_dir, "*.txt"), mode="b"), graphs._identity))

    graph = Graph(factory())
    plan = make_plan(graph, {"0": 3}, RestoreStrategy.AUTO)
    assert plan.method("0") == "state"
    assert "FileOpener" in plan.reasons["0/datapipe"]
    assert plan.drivers == (("0/datapipe", 0),)
    assert_resumes_exactly(factory, epochs=1, strategies=("auto", "fast_forward"))


@pytest.mark.parametrize("exc_case", ["forker_overflow", "demux_bad_class", "unbatch_too_deep", "grouper_fails"])
def test_errors_are_raised_at_the_same_sample(exc_case: str) -> None:
    factory = {
        "forker_overflow": lambda: _overflowing_fork(),
        "demux_bad_class": lambda: Demultiplexer(IterableWrapper(range(10)), 2, route3, buffer_size=-1)[0],
        "unbatch_too_deep": lambda: UnBatcher(Batcher(IterableWrapper(range(5)), 2), unbatch_level=3),
        "grouper_fails": lambda: Grouper(IterableWrapper(range(20)), key_mod4, buffer_size=3, group_size=3),
    }[exc_case]

    def collect(it):
        got = []
        try:
            for x in it:
                got.append(x)
        except Exception as exc:  # noqa: BLE001
            return got, type(exc)
        return got, None

    native = collect(factory())
    dl = snapshot.DataLoader2(factory())
    ours = collect(dl)
    assert native[1] is not None
    assert ours == native


def test_errors_name_the_node() -> None:
    def boom(x):
        if x == 3:
            raise KeyError("bad sample")
        return x

    dl = snapshot.DataLoader2(Batcher(Mapper(IterableWrapper(range(10)), boom), 2))
    with pytest.raises(KeyError) as info:
        list(dl)
    assert "raised by the DataPipe at 0/datapipe (MapperIterDataPipe)" in "\n".join(info.value.__notes__)


def test_subclass_that_keeps_the_iteration_inherits_the_hook() -> None:
    class Tagged(Mapper):
        pass

    class Custom(Mapper):
        def __iter__(self):
            for x in self.datapipe:
                yield self.fn(x) + 1

    assert hook_for(Tagged(IterableWrapper([1]), graphs.double)) is not None
    assert hook_for(Custom(IterableWrapper([1]), graphs.double)) is None


def test_hook_objects_are_fresh_per_epoch_and_do_not_touch_the_graph() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    before = copy.copy(vars(dl.datapipe))
    list(dl)
    list(dl)
    after = vars(dl.datapipe)
    assert set(before) == set(after)
    for node in Graph(dl.datapipe):
        assert not isinstance(getattr(node.datapipe, "_fast_forward_iterator", None), ResumableIterator) \
            or node.path != "0"


def _imports(path: Path, package: str) -> set[str]:
    """The ``snapshot.*`` modules that the module at ``path`` imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found |= {n for n in names if n in MODULES_OF(package)} or {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.startswith(package)}


def MODULES_OF(package: str) -> set[str]:
    root = Path(snapshot.__file__).parent.parent
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for p in (root / package.replace(".", "/")).rglob("*.py")}


def test_hooks_imports_point_one_way() -> None:
    """No import circle in snapshot.hooks, function-level imports included (a package's
    ``__init__`` is not counted as imported by its submodules)."""
    package = "snapshot.hooks"
    root = Path(snapshot.__file__).parent.parent
    edges = {}
    for module in MODULES_OF(package):
        path = root / module.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        edges[module] = _imports(path, package) - {module}
    registry = root / "snapshot/hooks/_registry.py"
    assert edges["snapshot.hooks._registry"] <= {"snapshot.hooks._base"}, edges["snapshot.hooks._registry"]
    assert "snapshot.hooks.builtin" not in registry.read_text(), "the registry names a module of hooks"

    def cycle_from(start: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(edges.get(start, ())):
            if nxt in seen:
                return (*seen[seen.index(nxt):], nxt)
            found = cycle_from(nxt, (*seen, nxt))
            if found:
                return found
        return None

    for module in sorted(edges):
        cycle = cycle_from(module, (module,))
        assert cycle is None, "import circle: " + " -> ".join(cycle)
