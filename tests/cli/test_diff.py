"""``snapshot diff A B``, run for real: progress, structure, seeds, layout; exit 0 same, 1 differ, 2 bad input."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests import graphs, helpers
from tests.cli.test_cli import long_chain, rewrite, run_cli, run_cli_batch, save, three_shards

Results = dict[str, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("diff")
    paths = {name: str(root / f"{name}.snap") for name in ("a", "a_again", "b", "other_graph", "other_seed")}
    with helpers.loader_at(graphs.combining(), 5, seed=1) as (dl, it):
        dl.save_snapshot(paths["a"])
        dl.save_snapshot(paths["a_again"])  # same position, later: only the creation time differs
        for _ in range(4):
            next(it)
        dl.save_snapshot(paths["b"])
    save(paths["other_graph"], graphs.linear, samples=5)
    save(paths["other_seed"], graphs.combining, samples=5, seed=2)
    paths["layout"] = rewrite(paths["a"], str(root / "layout.snap"), three_shards)
    paths["deep"] = rewrite(paths["a"], str(root / "deep.snap"), long_chain)
    return paths


@pytest.fixture(scope="module")
def results(files: dict[str, str]) -> Results:
    calls = {
        "progress": ["diff", files["a"], files["b"]],
        "same_file": ["diff", files["a"], files["a"]],
        "same_position": ["diff", files["a"], files["a_again"]],
        "graph": ["diff", files["a"], files["other_graph"]],
        "seed": ["diff", files["a"], files["other_seed"]],
        "layout": ["diff", files["a"], files["layout"]],
        "json": ["diff", "--json", files["a"], files["b"]],
        "backwards": ["diff", files["b"], files["a"]],
        "many": ["diff", files["a"], files["deep"]],
    }
    return dict(zip(calls, run_cli_batch(*calls.values())))


def test_how_far_a_run_progressed(results: Results) -> None:
    proc = results["progress"]
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "Position: B is 4 samples ahead of A in epoch 0 (5 → 9)" in out
    sink = next(line for line in out.splitlines() if line.startswith("  0 "))
    assert sink.split()[1:7] == ["Multiplexer", "5", "→", "9", "+4", "1"]  # type, yielded, change, buffered 1 → 0
    assert "Same: graph, randomness, layout, plan, versions" in out
    assert "Payload: different bytes" in out
    assert "Position: B is 4 samples behind A in epoch 0 (9 → 5)" in results["backwards"].stdout


def test_identical_snapshots_exit_0(results: Results) -> None:
    for name in ("same_file", "same_position"):
        proc = results[name]
        assert proc.returncode == 0, (name, proc.stdout)
        assert "No differences: same position, graph, seeds, layout, plan, versions and payload." in proc.stdout


def test_a_different_graph_names_every_node_and_explains_the_refusal(results: Results) -> None:
    proc = results["graph"]
    assert proc.returncode == 1
    out = proc.stdout
    assert "restoring one snapshot onto the other's graph is refused" in out
    assert "  at 0:\n    in A: MultiplexerIterDataPipe()\n    in B: BatcherIterDataPipe(batch_size=4" in out
    assert "  at 0/datapipe:\n    in A: (none)\n    in B: FilterIterDataPipe(" in out
    assert "Graph: 19 nodes differ" in out and out.count("  at ") == 19
    assert "Per-node positions" not in out  # the only common path, 0, is a different node


def test_long_lists_are_cut_short(results: Results) -> None:
    out = results["many"].stdout
    assert "Graph: 1515 nodes differ" in out and out.count("  at ") == 20
    assert "  ... and 1495 more (--json lists every difference)" in out


def test_a_different_seed(results: Results) -> None:
    out = results["seed"].stdout
    assert results["seed"].returncode == 1
    randomness = out[out.index("Randomness:"):]
    assert randomness.splitlines()[1].split() == ["A", "B"]
    assert randomness.splitlines()[2].split() == ["seed", "1", "2"]
    assert "derived seed of 0/datapipes/0/datapipes/0" in randomness
    assert "Graph:" not in out  # same structure


def test_a_different_layout_and_number_of_shards(results: Results) -> None:
    out = results["layout"].stdout
    assert results["layout"].returncode == 1
    layout = out[out.index("Reading service and layout:"):].splitlines()
    assert layout[2].split() == ["name", "InProcessReadingService", "MultiProcessingReadingService"]
    assert ["workers", "0", "3"] in [line.split() for line in layout]
    assert ["logical", "shards", "recorded", "1", "3"] in [line.split() for line in out.splitlines()]
    assert "Logical shards:" in out and "Same: position, graph, randomness, plan, versions, payload" in out


def test_json_lists_each_difference(results: Results) -> None:
    data: dict[str, Any] = json.loads(results["json"].stdout)
    assert data["same"] is False
    position = [d for d in data["differences"] if d["section"] == "position"]
    assert position == [{"section": "position", "item": "yielded", "a": 5, "b": 9, "field": ""}]
    sink = [d for d in data["differences"] if d["section"] == "nodes" and d["item"] == "0"]
    assert {d["field"]: (d["a"], d["b"]) for d in sink} == {"yielded": (5, 9), "buffered": (1, 0)}


def test_one_node_differs_in_the_singular(tmp_path) -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    a = save(str(tmp_path / "a.snap"), lambda: IterableWrapper(range(20)).shuffle(buffer_size=3), 2)
    b = save(str(tmp_path / "b.snap"), lambda: IterableWrapper(range(20)).shuffle(buffer_size=4), 2)
    proc = run_cli("diff", a, b)
    assert proc.returncode == 1 and "Graph: 1 node differs (fingerprint" in proc.stdout, proc.stdout
