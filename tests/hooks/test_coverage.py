"""The coverage table (docs/coverage.md) is the registry's, and every pipe it lists as
restored by a state hook resumes exactly, in-process and with 2 worker processes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchdata.datapipes.iter")

from torch.utils.data.datapipes.iter import IterableWrapper, ShardingFilter

import snapshot
from snapshot.graph import Graph
from snapshot.hooks._coverage import BUILDS, STATE_HOOK, Row, _load, coverage, render
from snapshot.testing import Cut, assert_resumes_exactly
from tests import graphs
from tests.hook_cases import CASES, bind
from tests.hooks import test_private_rng

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coverage.md"


def test_the_page_is_what_the_registry_says() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(coverage()), (
        "docs/coverage.md is out of date with the hook registry: make it again with "
        "`python -m snapshot.hooks._coverage docs/coverage.md`")


def test_every_public_pipe_is_listed_once() -> None:
    import torch.utils.data.datapipes.iter as torch_iter
    import torchdata.datapipes.iter as td_iter

    names = [r.name for r in coverage()]
    assert len(names) == len(set(names))
    assert set(torch_iter.__all__) <= set(names)
    assert set(td_iter.__all__) - {"IterDataPipe"} <= set(names)


def _built_by(name: str) -> Any:
    import torchdata.datapipes.iter as td

    source = IterableWrapper(range(6))
    return {
        "Demultiplexer": lambda: td.Demultiplexer(source, 2, graphs.parity),
        "Forker": lambda: td.Forker(source, 2),
        "UnZipper": lambda: td.UnZipper(IterableWrapper([(1, 2)]), 2),
        "RoundRobinDemultiplexer": lambda: td.RoundRobinDemultiplexer(source, 2),
        "BucketBatcher": lambda: [td.BucketBatcher(source, 2),
                                  td.BucketBatcher(source, 2, use_in_batch_shuffle=False, sort_key=sorted)],
        "BatchAsyncMapper": lambda: td.BatchAsyncMapper(source, _async_identity, batch_size=2),
        "RandomSplitter": lambda: source.random_split(weights={"a": 1, "b": 1}, seed=0, total_length=6),
    }[name]()


async def _async_identity(x: Any) -> Any:
    return x


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_composites_build_what_the_table_says(name: str) -> None:
    built = _built_by(name)
    found = set()
    for sink in (built if isinstance(built, list) else [built]):
        found |= {type(n.datapipe) for n in Graph(sink)}
    assert found - {type(IterableWrapper([]))} == {_load(path) for path in BUILDS[name]}


# -- exact resume of every pipe with a state hook ---------------------------------------------

def _factories() -> dict[str, Callable[..., Any]]:
    """The hook cases (tests/hook_cases.py) and the shared graphs (no other table)."""
    found: dict[str, Callable[..., Any]] = dict(CASES)
    for fn in (graphs.linear, graphs.combining, graphs.grouped, graphs.collate_unbatch, graphs.sampled,
               graphs.sharded, test_private_rng.mux):
        found[f"{fn.__module__.rsplit('.', 1)[-1]}:{fn.__name__}"] = fn
    return found


def _classes(factory: Callable[..., Any]) -> set[type]:
    return {type(node.datapipe) for node in Graph(factory())}


def _supported() -> list[Row]:
    return [r for r in coverage() if r.method == STATE_HOOK]


def _chosen() -> list[str]:
    """A few factories whose graphs hold every class of every supported row (greedy cover)."""
    needed = {c for r in _supported() for c in r.classes}
    classes = {name: _classes(f) & needed for name, f in _factories().items()}
    chosen: list[str] = []
    while needed:
        best = max(sorted(classes), key=lambda n: len(classes[n] & needed))
        if not classes[best] & needed:
            break
        chosen.append(best)
        needed -= classes[best]
    return chosen


def test_every_supported_pipe_has_a_graph() -> None:
    covered = set().union(*(_classes(_factories()[n]) for n in _chosen()))
    missing = [f"{r.module}.{r.name}: {', '.join(c.__name__ for c in r.classes if c not in covered)}"
               for r in _supported() if not set(r.classes) <= covered]
    assert not missing, "no graph factory in the tests holds these pipes:\n" + "\n".join(missing)


def _sharded_at_sink(factory: Callable[[], Any]) -> Any:
    """The graph with a sharding point at its end: 2 workers each run a copy and deal samples."""
    datapipe = factory()
    if any(isinstance(n.datapipe, ShardingFilter) for n in Graph(datapipe)):
        return datapipe
    return ShardingFilter(datapipe)


def _two_workers() -> Any:
    return snapshot.MultiProcessingReadingService(num_workers=2)


@pytest.mark.parametrize("service", ["in_process", "2_workers"])
@pytest.mark.parametrize("name", _chosen())
def test_supported_pipes_resume_exactly(name: str, service: str, data_dir: str) -> None:
    factory = bind(_factories()[name], data_dir)
    if service == "in_process":
        with snapshot.DataLoader2(factory()) as loader:
            loader.seed(0)  # the harness's seed: a shuffle before a grouper changes the epoch's length
            length = len(list(loader))
        cuts = [Cut(0, 1), Cut(0, length // 2), Cut(0, length, finished=True), Cut(1, length // 3)]
        assert_resumes_exactly(factory, epochs=2, cuts=cuts, strategies=("auto",), via_file=False)
    else:
        sharded = functools.partial(_sharded_at_sink, factory)
        with snapshot.DataLoader2(sharded(), reading_service=_two_workers()) as loader:
            loader.seed(0)
            length = len(list(loader))
        cuts = [Cut(0, length // 2), Cut(0, length, finished=True)]
        assert_resumes_exactly(sharded, reading_service=_two_workers, epochs=2, cuts=cuts, strategies=("auto",),
                               via_file=False)
