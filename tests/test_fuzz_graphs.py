"""The graph fuzz (tests/fuzz_grammar.py, tests/fuzz_oracle.py) at a small size.

Random graphs over every pipe of the coverage table are run, saved at random cuts (in-process
and with workers) and restored in fresh processes onto another service; a run that saves must
equal one that never saves, and each restore must continue the saved run exactly. Each drawn
case is one test, so a failure names its case and prints a one-line reproducer.

The draw is derandomized (hypothesis, fixed seed): the same cases every run. Run more with
``SNAPSHOT_FUZZ_EXAMPLES=500 pytest tests/test_fuzz_graphs.py`` or, printing the counts table,
``python -m tests.fuzz_grammar --examples 500``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchdata.datapipes.iter")

import snapshot
from tests import fuzz_grammar, fuzz_oracle

EXAMPLES = int(os.environ.get("SNAPSHOT_FUZZ_EXAMPLES", "40"))
CASES = fuzz_grammar.draw_cases(EXAMPLES)

#: Cases known to be wrong, by index in the small draw, each with the issue that fixes it.
KNOWN: dict[int, str] = {}


@pytest.fixture(scope="module")
def outcomes() -> Iterator[dict[int, list[fuzz_oracle.Outcome]]]:
    with tempfile.TemporaryDirectory(prefix="fuzz-data-") as root:
        found = fuzz_oracle.run(CASES, root)
    print("\n" + fuzz_oracle.table(found, CASES))
    by_case: dict[int, list[fuzz_oracle.Outcome]] = {i: [] for i in range(len(CASES))}
    for o in found:
        by_case[o.case].append(o)
    yield by_case


def _unseeded_sample_mux(graph: Any) -> bool:
    """torchdata 0.9 draws an unseeded SampleMultiplexer from the operating system: two runs differ."""
    if not isinstance(graph, list) or not graph:
        return False
    if graph[0] == "sample_mux" and graph[1][-1] is None:
        return True
    return any(_unseeded_sample_mux(child) for child in graph[2:])


def _params() -> list[Any]:
    return [pytest.param(i, id=f"case{i}", marks=[pytest.mark.xfail(reason=KNOWN[i], strict=False)]
                         if i in KNOWN else []) for i in range(len(CASES))]


@pytest.mark.parametrize("index", _params())
def test_case(index: int, outcomes: dict[int, list[fuzz_oracle.Outcome]]) -> None:
    case = CASES[index]
    mine = outcomes[index]
    assert mine, "no outcome recorded"
    problems = [o for o in mine if o.outcome in fuzz_oracle.FINDINGS]
    if not _unseeded_sample_mux(case["graph"]):
        problems += [o for o in mine if o.outcome == "irreproducible"]
    assert not problems, "\n".join(
        [f"{o.outcome} [{o.cut}] at {o.stage}: {o.detail}" for o in problems] + [fuzz_oracle.reproducer(case)])


def test_every_pipe_of_the_coverage_table_is_drawn_or_excluded_with_a_reason() -> None:
    from snapshot.hooks._coverage import coverage

    assert fuzz_grammar.undrawable() == []
    names = {r.name for r in coverage()}
    assert set(fuzz_grammar.EXCLUDED) <= names and set(fuzz_grammar.CONSTRUCTED) <= names
    assert all(reason for reason in fuzz_grammar.EXCLUDED.values())


def test_a_case_rebuilds_from_its_one_line_reproducer() -> None:
    case = CASES[-1]
    line = fuzz_oracle.reproducer(case)
    assert json.loads(line.split("--case ", 1)[1].strip("'")) == case
    with tempfile.TemporaryDirectory() as root:
        a = list(fuzz_grammar.build(case["graph"], root))
        b = list(fuzz_grammar.build(json.loads(json.dumps(case["graph"])), root))
    assert len(a) == len(b)


def test_the_draw_is_the_same_every_time() -> None:
    assert fuzz_grammar.draw_cases(EXAMPLES) == CASES


# -- the oracle can fail -------------------------------------------------------------------------

def _job(graph: Any, cut: int, expected: list[list[Any]], root: str) -> dict[str, Any]:
    with snapshot.DataLoader2(fuzz_grammar.build(graph, root)) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(cut):
            next(it)
        data = loader.save_snapshot().to_bytes()
    return {"case": 0, "cut": f"after {cut}", "graph": graph, "root": root, "restore_on": "inproc",
            "strategy": "auto", "rebuild": "code", "data": data, "expected": expected}


def test_a_restore_that_continues_differently_is_wrong() -> None:
    graph = ["shuffle", [4], ["range", [10]]]
    with tempfile.TemporaryDirectory() as root:
        with snapshot.DataLoader2(fuzz_grammar.build(graph, root)) as loader:
            loader.seed(0)
            reference = [list(loader) for _ in range(2)]
        right = _job(graph, 3, [reference[0][3:], reference[1]], root)
        assert fuzz_oracle.restore(right)[0] == "exact"
        swapped = [reference[0][3:], reference[1][::-1]]
        outcome, stage, detail = fuzz_oracle.restore({**right, "expected": swapped})
    assert (outcome, stage) == ("wrong", "restore") and "1 epochs after the cut" in detail


def test_a_restore_in_a_fresh_process_reports_each_job() -> None:
    graph = ["batch", [3, False], ["range", [10]]]
    with tempfile.TemporaryDirectory() as root:
        job = _job(graph, 2, [[[6, 7, 8], [9]], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]], root)
        bad = {**job, "data": job["data"][:-5]}
        results = fuzz_oracle.run_jobs([job, bad])
    assert [r[0] for r in results] == ["exact", "refused"]
    assert "Snapshot" in results[1][2] or "Error" in results[1][2]


def test_refusals_and_crashes_are_told_apart() -> None:
    assert fuzz_oracle._is_refusal(snapshot.LayoutError("x"))
    assert not fuzz_oracle._is_refusal(snapshot.WorkerError("x"))
    assert not fuzz_oracle._is_refusal(ValueError("x"))
