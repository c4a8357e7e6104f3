"""The graph fuzz (tests/fuzz_grammar.py, tests/fuzz_oracle.py) at a small size.

Random graphs over every pipe of the coverage table are run, saved at random cuts (in-process
and with workers) and restored in fresh processes onto another service; a run that saves must
equal one that never saves, and each restore must continue the saved run exactly. Each drawn
case is one test, so a failure names its case and prints a one-line reproducer.

The draw is derandomized (hypothesis, fixed seed): the same cases every run. Run more with
``SNAPSHOT_FUZZ_EXAMPLES=500 pytest tests/end_to_end/test_fuzz_graphs.py`` or, printing the counts table,
``python -m tests.fuzz_grammar --examples 500``.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchdata.datapipes.iter")

import snapshot
from tests import fuzz_grammar, fuzz_oracle

DEFAULT_EXAMPLES = 40
EXAMPLES = int(os.environ.get("SNAPSHOT_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES)))


@functools.cache
def cases() -> list[dict[str, Any]]:
    """The drawn cases (drawn once, on first use: collecting this file draws nothing)."""
    return fuzz_grammar.draw_cases(EXAMPLES)


REITER = ("issue 22 item 2 (re-iterated random pipes, `reiter`): a cycle over a random pipe draws its "
          "next pass's seed from torch's global generator")
#: Cases of the default draw known to be wrong, by their one-line JSON, each with the issue that
#: fixes it: such a case fails as an xfail (strict=False: it may pass, as these are not always wrong).
KNOWN: dict[str, str] = {
    '{"graph":["cycle",[2],["bucketbatch",[5,false,2,2,false],["shard",[],["range",[3]]]]],"seed":0,'
    '"save_on":"mp1","restore_on":"inproc","cuts":[[0,"at",9],[0,"at",330],[0,"at",242]],'
    '"strategy":"auto","rebuild":"pickle","again":false}': REITER,
    '{"graph":["shard",[],["threadpool_map",[],["cycle",[3],["shuffled_flatmap",[8],["files",'
    '["webdataset"]]]]]],"seed":5,"save_on":"mp2","restore_on":"mp1","cuts":[[0,"at",4]],'
    '"strategy":"auto","rebuild":"code","again":false}': REITER,
    '{"graph":["threadpool_map",[],["cycle",[2],["shuffle",[5],["shard",[],["range",[3]]]]]],"seed":3,'
    '"save_on":"inproc","restore_on":"mp1","cuts":[[0,"at",0],[0,"at",4]],"strategy":"auto",'
    '"rebuild":"code","again":false}': REITER,
    '{"graph":["shard",[],["threadpool_map",[],["cycle",[2],["shuffle",[2],["range",[5]]]]]],"seed":3,'
    '"save_on":"mp1","restore_on":"inproc","cuts":[[0,"at",0]],"strategy":"auto","rebuild":"code",'
    '"again":false}': REITER,
}


def _line(case: dict[str, Any]) -> str:
    return json.dumps(case, separators=(",", ":"))


@pytest.fixture(scope="module")
def outcomes() -> Iterator[dict[int, list[fuzz_oracle.Outcome]]]:
    with tempfile.TemporaryDirectory(prefix="fuzz-data-") as root:
        found = fuzz_oracle.run(cases(), root)
    print("\n" + fuzz_oracle.table(found, cases()))
    by_case: dict[int, list[fuzz_oracle.Outcome]] = {i: [] for i in range(len(cases()))}
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


@pytest.mark.parametrize("index", range(EXAMPLES), ids=lambda i: f"case{i}")
def test_case(index: int, outcomes: dict[int, list[fuzz_oracle.Outcome]]) -> None:
    case = cases()[index]
    mine = outcomes[index]
    assert mine, "no outcome recorded"
    problems = [o for o in mine if o.outcome in fuzz_oracle.FINDINGS]
    if not _unseeded_sample_mux(case["graph"]):
        problems += [o for o in mine if o.outcome == "irreproducible"]
    message = "\n".join(
        [f"{o.outcome} [{o.cut}] at {o.stage}: {o.detail}" for o in problems] + [fuzz_oracle.reproducer(case)])
    if problems and _line(case) in KNOWN:
        pytest.xfail(f"{KNOWN[_line(case)]}\n{message}")
    assert not problems, message


@pytest.mark.skipif(EXAMPLES != DEFAULT_EXAMPLES, reason="the known cases are cases of the default draw")
def test_the_known_cases_are_still_drawn() -> None:
    drawn = {_line(c) for c in cases()}
    assert [line for line in KNOWN if line not in drawn] == [], "remove these from KNOWN: no longer drawn"


def test_every_pipe_of_the_coverage_table_is_drawn_or_excluded_with_a_reason() -> None:
    from snapshot.hooks._coverage import coverage

    assert fuzz_grammar.undrawable() == []
    names = {r.name for r in coverage()}
    assert set(fuzz_grammar.EXCLUDED) <= names and set(fuzz_grammar.CONSTRUCTED) <= names
    assert all(reason for reason in fuzz_grammar.EXCLUDED.values())


def test_a_case_rebuilds_from_its_one_line_reproducer() -> None:
    case = cases()[-1]
    line = fuzz_oracle.reproducer(case)
    assert json.loads(line.split("--case ", 1)[1].strip("'")) == case
    with tempfile.TemporaryDirectory() as root:
        a = list(fuzz_grammar.build(case["graph"], root))
        b = list(fuzz_grammar.build(json.loads(json.dumps(case["graph"])), root))
    assert len(a) == len(b)


def test_the_draw_is_the_same_every_time() -> None:
    assert fuzz_grammar.draw_cases(EXAMPLES) == cases()


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
        assert fuzz_oracle.restore({**right, "again": True})[0] == "exact"  # a restore of a restore
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


# -- the elastic draw: restores onto more workers than units, streams no opener made (issue 34) ----------

ELASTIC_EXAMPLES = int(os.environ.get("SNAPSHOT_FUZZ_ELASTIC_EXAMPLES", "6"))


@functools.cache
def elastic_cases() -> list[dict[str, Any]]:
    from tests import fuzz_elastic

    return fuzz_elastic.draw_cases(ELASTIC_EXAMPLES)


@pytest.fixture(scope="module")
def elastic_outcomes() -> Iterator[dict[int, list[fuzz_oracle.Outcome]]]:
    with tempfile.TemporaryDirectory(prefix="fuzz-data-") as root:
        found = fuzz_oracle.run(elastic_cases(), root)
    print("\n" + fuzz_oracle.table(found, elastic_cases()))
    by_case: dict[int, list[fuzz_oracle.Outcome]] = {i: [] for i in range(len(elastic_cases()))}
    for o in found:
        by_case[o.case].append(o)
    yield by_case


@pytest.mark.slow
@pytest.mark.parametrize("index", range(ELASTIC_EXAMPLES), ids=lambda i: f"elastic{i}")
def test_elastic_case(index: int, elastic_outcomes: dict[int, list[fuzz_oracle.Outcome]]) -> None:
    # no restore is refused for its number of workers or for a stream that no opener made
    case = elastic_cases()[index]
    mine = elastic_outcomes[index]
    assert mine, "no outcome recorded"
    refused = [o for o in mine if o.outcome == "refused" and o.stage == "restore"]
    problems = refused + [o for o in mine if o.outcome in fuzz_oracle.FINDINGS
                          or (o.outcome == "irreproducible" and not _unseeded_sample_mux(case["graph"]))]
    message = "\n".join(
        [f"{o.outcome} [{o.cut}] at {o.stage}: {o.detail}" for o in problems] + [fuzz_oracle.reproducer(case)])
    assert not problems, message
