"""The graph fuzz (tests/fuzz_grammar.py, tests/fuzz_oracle.py, tests/fuzz_ranks.py) at a small size.

Random graphs over every pipe of the coverage table (sources sharded by file among them: a
``sharding_filter`` between the lister and the opener) are run, saved at random cuts (in-process
and with workers) and restored in fresh processes onto another service; a run that saves must
equal one that never saves, and each restore must continue the saved run exactly. At least half
of a case's restores must be exact: a refusal counts against it unless ``fuzz_oracle.EXPLAINED``
says why (the design, or the open issue that lifts it), and each one is listed with its reason.
Each drawn case is one test, so a failure names its case and prints a one-line reproducer.

A few rank cases (real gloo groups) save on R ranks and restore on R' ranks or other workers:
each rank's stream in order where R' = R, every item once (and the next epoch of a run that
always had R' ranks) where not; see ``tests/fuzz_ranks.py``.

The draw is derandomized (hypothesis, fixed seed): the same cases every run. Run more with
``SNAPSHOT_FUZZ_EXAMPLES=500 pytest tests/end_to_end/test_fuzz_graphs.py`` (``SNAPSHOT_FUZZ_RANK_EXAMPLES``
for the ranks) or, printing the counts table, ``python -m tests.fuzz_grammar --examples 500``.
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
from tests import fuzz_grammar, fuzz_oracle, fuzz_ranks

DEFAULT_EXAMPLES = 40
EXAMPLES = int(os.environ.get("SNAPSHOT_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES)))


@functools.cache
def cases() -> list[dict[str, Any]]:
    """The drawn cases (drawn once, on first use: collecting this file draws nothing)."""
    return fuzz_grammar.draw_cases(EXAMPLES)


#: Cases of the default draw known to be wrong, by their one-line JSON, each with the issue that fixes
#: it: such a case fails as an xfail (strict=False: it may pass, as these are not always wrong). None
#: today (issue 22's re-iterated random pipes were fixed).
KNOWN: dict[str, str] = {}


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
    short = fuzz_oracle.shortfall(mine)
    refusals = [f"refused [{o.cut}] at {o.stage} ({fuzz_oracle.explained(o) or 'not explained'}): {o.detail}"
                for o in mine if o.outcome == "refused"]
    message = "\n".join([f"{o.outcome} [{o.cut}] at {o.stage}: {o.detail}" for o in problems]
                        + ([f"too few exact restores: {short}"] if short else []) + refusals
                        + [fuzz_oracle.reproducer(case)])
    if (problems or short) and _line(case) in KNOWN:
        pytest.xfail(f"{KNOWN[_line(case)]}\n{message}")
    assert not problems and not short, message


@pytest.mark.skipif(EXAMPLES != DEFAULT_EXAMPLES, reason="the known cases are cases of the default draw")
def test_the_known_cases_are_still_drawn() -> None:
    drawn = {_line(c) for c in cases()}
    assert [line for line in KNOWN if line not in drawn] == [], "remove these from KNOWN: no longer drawn"


# -- rank services (real gloo groups: few cases) -------------------------------------------------

DEFAULT_RANK_EXAMPLES = 12
RANK_EXAMPLES = int(os.environ.get("SNAPSHOT_FUZZ_RANK_EXAMPLES", str(DEFAULT_RANK_EXAMPLES)))


@functools.cache
def rank_cases() -> list[dict[str, Any]]:
    return fuzz_grammar.draw_cases(RANK_EXAMPLES, 0, "ranks")


#: Rank cases of the default draw that fail, by their one-line JSON, with the issue that fixes them;
#: each is a strict xfail (``test_a_rescaled_rank_case_known_to_fail``) until the fix lands. None
#: since issue 31's re-shard plan: before it, the rescaled case
#: ``{"graph":["filter",[3],["sharded_files",["tar_shards"]]],"seed":907490,"save_on":"r3w0",
#: "restore_on":"r2w0","cut":623,"policy":"drop"}`` lost 5 samples of the interrupted epoch, silently.
RANK_KNOWN: dict[str, str] = {}


@pytest.fixture(scope="module")
def rank_root() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="fuzz-ranks-data-") as root:
        yield root


def _rank_message(outcome: fuzz_oracle.Outcome, case: dict[str, Any]) -> str:
    return f"{outcome.outcome} at {outcome.stage}: {outcome.detail}\n{_line(case)}"


@pytest.mark.parametrize("index", range(RANK_EXAMPLES), ids=lambda i: f"ranks{i}")
def test_rank_case(index: int, rank_root: str) -> None:
    case = rank_cases()[index]
    if _line(case) in RANK_KNOWN:
        pytest.skip("known to fail today: test_a_rescaled_rank_case_known_to_fail runs it")
    outcome = fuzz_ranks.run_case(index, case, rank_root)
    print(_rank_message(outcome, case))  # refusals too, with their reasons
    assert outcome.outcome == "exact" or fuzz_oracle.explained(outcome), _rank_message(outcome, case)


@pytest.mark.parametrize("line", sorted(RANK_KNOWN))
def test_a_rescaled_rank_case_known_to_fail(line: str, rank_root: str, request: pytest.FixtureRequest) -> None:
    request.applymarker(pytest.mark.xfail(strict=True, reason=RANK_KNOWN[line]))
    case = json.loads(line)
    outcome = fuzz_ranks.run_case(0, case, rank_root)
    assert outcome.outcome == "exact", _rank_message(outcome, case)


@pytest.mark.skipif(RANK_EXAMPLES != DEFAULT_RANK_EXAMPLES, reason="the known cases are cases of the default draw")
def test_the_known_rank_cases_are_still_drawn() -> None:
    drawn = {_line(c) for c in rank_cases()}
    assert [line for line in RANK_KNOWN if line not in drawn] == [], "remove these from RANK_KNOWN: no longer drawn"


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


def test_a_case_needs_its_share_of_exact_restores() -> None:
    def outcome(kind: str, detail: str = "") -> fuzz_oracle.Outcome:
        return fuzz_oracle.Outcome(0, "cut", kind, "restore", detail)

    unexplained = outcome("refused", "RestoreError: something no one has explained")
    layout = outcome("refused", "LayoutError: the snapshot has 1 logical shard(s), which cannot keep 2 workers busy")
    assert fuzz_oracle.explained(layout) and fuzz_oracle.explained(unexplained) is None
    assert "0 of 1 restores exact" in (fuzz_oracle.shortfall([unexplained]) or "")  # every cut refused: a failure
    assert fuzz_oracle.shortfall([layout]) is None  # refused by design (or an open issue) only
    assert fuzz_oracle.shortfall([outcome("exact"), unexplained]) is None
    assert fuzz_oracle.shortfall([outcome("exact"), unexplained, unexplained]) is not None


def test_the_rank_oracle_finds_an_item_repeated_or_lost_on_another_number_of_ranks(tmp_path: Any) -> None:
    case = {"graph": ["shard", [], ["range", [10]]], "seed": 1, "save_on": "r2w0", "restore_on": "r3w0", "cut": 500,
            "policy": None}
    saved = [{"head": [0, 2]}, {"head": [1, 3]}]  # what 2 ranks read before the save; 3 ranks read the rest
    for rest, found in [([[4, 7], [5, 8], [6, 9, 9]], "repeats, or invents, 1 item"),
                        ([[4, 7], [5, 8], [6]], "lost 1 item")]:
        with pytest.raises(fuzz_ranks.Finding, match=found):
            fuzz_ranks.check_rescaled(case, str(tmp_path), saved, [{"rest": r} for r in rest], 2)


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
