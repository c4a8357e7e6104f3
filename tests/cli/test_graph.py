"""``snapshot graph``, run for real: DOT written by us, SVG/PNG through Graphviz when it is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from snapshot.storage import _sources
from tests import graphs
from tests.cli.test_cli import rewrite, run_cli, run_cli_batch, save, three_shards

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="Graphviz's `dot` is not on PATH, so the SVG/PNG path cannot run here: install Graphviz "
           "(apt-get install graphviz; .ci/run does that in CI)")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("graph")
    paths = {"combining": save(str(root / "c.snap")),
             "replay": save(str(root / "g.snap"), graphs.with_generator_pipe, samples=3)}

    def awkward(manifest: dict[str, Any]) -> None:
        manifest["graph"]["nodes"][0]["args"] = {"fn": 'say "hi"\\now', "sep": "a\\b", "ctrl": "x\ty"}

    paths["awkward"] = rewrite(paths["combining"], str(root / "awkward.snap"), awkward)
    paths["shards"] = rewrite(paths["combining"], str(root / "shards.snap"), three_shards)
    return paths


def node_lines(dot: str) -> dict[str, str]:
    """``{node id: attribute text}`` for every node statement."""
    return dict(re.findall(r"^  (n\d+) \[(.*)\];$", dot, flags=re.M))


def test_dot_text_is_the_annotated_graph(files: dict[str, str], tmp_path) -> None:
    out_file = tmp_path / "c.dot"
    stdout, to_file, replay, shards = run_cli_batch(
        ["graph", files["combining"]], ["graph", files["combining"], "-o", str(out_file)],
        ["graph", "--format", "dot", files["replay"]], ["graph", files["shards"]])
    assert stdout.returncode == 0, stdout.stderr
    dot = stdout.stdout
    assert dot.startswith("digraph snapshot {") and dot.rstrip().endswith("}")
    assert out_file.read_text() == dot and to_file.stdout == ""
    manifest = _sources.read_manifest(files["combining"])
    nodes = manifest["graph"]["nodes"]
    assert len(node_lines(dot)) == len(nodes)
    edges = set(re.findall(r"^  (n\d+) -> (n\d+);$", dot, flags=re.M))
    ids = {node["path"]: f"n{i}" for i, node in enumerate(nodes)}
    assert edges == {(ids[source], ids[node["path"]]) for node in nodes for source in node["inputs"]}
    sink = node_lines(dot)["n0"]
    assert 'label="MultiplexerIterDataPipe\\n0\\nyielded 5 · buffered 1\\nrestore: from its state (17 B)"' in sink
    assert 'fillcolor="#e3efff"' in sink and 'tooltip="0"' in sink
    assert "c.snap: epoch 0, 5 samples yielded" in dot

    assert replay.returncode == 0
    squares = node_lines(replay.stdout)["n1"]
    assert 'label="Squares\\n0/datapipe\\nyielded 9\\nrestore: replay, drives 9 samples"' in squares
    assert "penwidth=2.5" in squares and 'fillcolor="#ffe1c2"' in squares
    assert "restore: replay, ≈15 samples again" in node_lines(replay.stdout)["n3"]

    assert "figures summed over 3 logical shards" in shards.stdout
    assert "yielded 215 · buffered 3" in node_lines(shards.stdout)["n0"]


def test_labels_are_escaped(files: dict[str, str]) -> None:
    proc = run_cli("graph", files["awkward"])
    assert proc.returncode == 0
    label = node_lines(proc.stdout)["n0"]
    assert r'(fn=say \"hi\"\\now, sep=a\\b, ctrl=x\\x09y)' in label
    if shutil.which("dot"):  # Graphviz itself accepts what we wrote
        check = subprocess.run(["dot", "-Tsvg"], input=proc.stdout, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr


@needs_dot
def test_svg_and_png_through_graphviz(files: dict[str, str], tmp_path) -> None:
    png = tmp_path / "c.png"
    svg, png_proc = run_cli_batch(["graph", "--format", "svg", files["replay"]],
                                  ["graph", "-f", "png", "-o", str(png), files["combining"]])
    assert svg.returncode == 0, svg.stderr
    assert "<svg" in svg.stdout and "Squares" in svg.stdout and "drives 9 samples" in svg.stdout
    assert png_proc.returncode == 0, png_proc.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_without_graphviz_a_clear_message_and_exit_3(files: dict[str, str], tmp_path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    out = tmp_path / "c.svg"
    env = {"PATH": str(empty_bin)}
    svg, png, dot = run_cli_batch(["graph", "--format", "svg", "-o", str(out), files["combining"]],
                                  ["graph", "--format", "png", "-o", str(out), files["combining"]],
                                  ["graph", files["combining"]], env=env)
    for proc, name in ((svg, "svg"), (png, "png")):
        assert proc.returncode == 3
        message = proc.stderr
        assert message.startswith(f"snapshot: `--format {name}` needs Graphviz's `dot` program, which is not installed")
        assert "`apt-get install graphviz`" in message and "`brew install graphviz`" in message
        assert "`pip install graphviz` installs only Python bindings, not the `dot` program" in message
        assert "--format dot" in message and "Traceback" not in message
    assert not out.exists()
    assert dot.returncode == 0 and dot.stdout.startswith("digraph")  # DOT needs no Graphviz


def test_a_graphviz_failure_is_reported(files: dict[str, str], tmp_path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: out of crayons' >&2\nexit 1\n")
    os.chmod(fake, 0o755)
    proc = run_cli("graph", "-f", "svg", files["combining"], env={"PATH": f"{fake_bin}:/usr/bin:/bin"})
    assert proc.returncode == 3
    assert proc.stderr.strip() == "snapshot: Graphviz's dot failed: Error: out of crayons"
    assert Path(files["combining"]).exists()
