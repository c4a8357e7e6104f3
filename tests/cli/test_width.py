"""The command line fits an 80-column terminal, and its help is plain text."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper, Mapper

import snapshot
from snapshot.cli import main
from snapshot.cli._dot import fold, to_dot
from snapshot.cli._source import read
from snapshot.cli._view import read_view
from tests import graphs, helpers


def deep(n: int = 60) -> Any:
    """A long chain: node paths grow past any terminal's width."""
    dp: Any = IterableWrapper(range(n)).shuffle(buffer_size=10_000)
    for _ in range(14):
        dp = Mapper(dp, graphs.double)
    return graphs.Squares(dp).batch(3)


def save(path: Path, factory: Any, steps: int, service: Any = None) -> str:
    with helpers.loader_at(factory(), steps, seed=7, reading_service=service) as (dl, _):
        dl.save_snapshot(path, verify=2)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("width")
    return {
        "deep": save(root / "deep.snap", deep, 5),
        "deep_later": save(root / "deep-later.snap", deep, 9),
        "combining": save(root / "combining.snap", graphs.combining, 4),
        "workers": save(root / "workers.snap", graphs.sharded, 6, snapshot.MultiProcessingReadingService(2)),
    }


def output(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # --help
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_screen_fits_80_columns(files: dict[str, str], capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    commands = [
        *(["inspect", f] for f in files.values()),
        *(["inspect", "--full-paths", f] for f in files.values()),
        ["diff", files["deep"], files["deep_later"]],
        ["diff", files["deep"], files["combining"]],
        ["diff", files["combining"], files["workers"]],
        *(["verify", f] for f in files.values()),
        ["inspect", files["deep"] + ".missing"],
    ]  # `graph` fits a terminal only (a pipe gets the DOT source whole): test_graph_fits_a_terminal
    for argv in commands:
        code, text = output(capsys, *argv)
        assert code in (0, 1, 2), (argv, text)
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, f"snapshot {' '.join(argv)}: {len(wide)} lines over 80 columns, e.g.\n{wide[0]}"
    # what is elided in text is whole in --json
    code, text = output(capsys, "inspect", "--json", files["deep"])
    assert "buffer_size" in text and max(len(line) for line in text.splitlines()) > 0


def test_without_a_terminal_lines_stay_whole(files: dict[str, str], capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # and pytest's stdout is not a terminal
    _, text = output(capsys, "inspect", "--full-paths", files["deep"])
    assert max(len(line) for line in text.splitlines()) > 80
    monkeypatch.setenv("COLUMNS", "120")
    _, text = output(capsys, "inspect", "--full-paths", files["deep"])
    assert max(len(line) for line in text.splitlines()) <= 120


def test_folded_dot_reads_the_same() -> None:
    line = '  n0 [label="' + "ShufflerIterDataPipe(buffer_size=10)\\n" * 4 + 'x \\"y\\"", tooltip="0/datapipe"];'
    folded = fold(line, 30)
    assert all(len(part) <= 30 for part in folded.splitlines())
    # Graphviz drops a backslash-newline inside a string; a newline between attributes is a space
    assert folded.replace("\\\n", "").replace("\n", "") == line


@pytest.mark.parametrize("command", [[], ["inspect"], ["diff"], ["verify"], ["graph"]])
def test_help_is_plain_text_that_fits(command: list[str], capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, text = output(capsys, *command, "--help")
    assert code == 0 and "usage: snapshot" in text
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text
    assert max(len(line) for line in text.splitlines()) <= 80


def graph_section(text: str) -> list[str]:
    """The lines of ``inspect``'s graph tree (after the "Graph:" line, up to the blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Graph: "))
    end = lines.index("", start)
    return lines[start + 1:end]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", ["deep", "combining", "workers"])
def test_inspect_keeps_the_whole_tree(name: str, columns: int, files: dict[str, str],
                                      capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """What does not fit is stacked, not cut: every node's place in the tree (its edge from its parent,
    drawn under its parent's branch) and its type are whole, and every line fits."""
    monkeypatch.setenv("COLUMNS", str(columns))
    code, text = output(capsys, "inspect", files[name])
    assert code == 0
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, wide
    tree = graph_section(text)
    assert not [line for line in tree if line.startswith("  …")], "the tree was cut:\n" + "\n".join(tree)
    view = read_view(read(files[name])[0], files[name])
    for node in view.nodes:
        edge = node.path.rsplit("/", 1)[-1] if "/" in node.path else node.path
        assert any(re.search(rf"[─ ]{re.escape(edge)}(\s|$)", line) for line in tree), (node.path, tree)
        short = node.short_type.replace("IterDataPipe", "") if node.short_type != "IterDataPipe" else node.short_type
        assert any(f"{short}(" in line for line in tree), (node.short_type, tree)
    if name == "deep" and columns == 80:  # too deep for one line a node: stacked, the type under the node
        first = tree.index("  └─ datapipe")
        assert tree[first + 1].lstrip().startswith("Squares()") and tree[first + 1].startswith("    S")
        assert any(line.strip().startswith("Mapper(fn=tests.graphs.double)") for line in tree)


def test_inspect_states_the_worker_ceiling(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, text = output(capsys, "inspect", files["workers"])
    assert "  logical shards: 2 (one stream on up to 2 workers per rank; more split them)" in text.splitlines()


def _on_a_terminal(argv: list[str], columns: int) -> str:
    """What ``snapshot ARGV`` prints on a pseudo-terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns))
    proc = subprocess.Popen([sys.executable, "-m", "snapshot", *argv], stdout=follower, stderr=subprocess.PIPE,
                            env=env)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if proc.stderr:
            proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_graph_fits_a_terminal_and_writes_a_pipe_exactly(files: dict[str, str], tmp_path: Path) -> None:
    dot = to_dot(read_view(read(files["deep"])[0], files["deep"]))
    assert max(len(line) for line in dot.splitlines()) > 80
    shown = _on_a_terminal(["graph", files["deep"]], 80)
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert shown.replace("\\\n", "").replace("\n", "") == dot.replace("\n", "")  # folded, nothing else
    # to a pipe, or to a file, even with $COLUMNS set: the DOT source itself, no `\` breaks
    env = dict(os.environ, COLUMNS="80")
    piped = subprocess.run([sys.executable, "-m", "snapshot", "graph", files["deep"]], capture_output=True,
                           text=True, env=env, timeout=120, check=True)
    assert piped.stdout == dot
    out = tmp_path / "deep.dot"
    subprocess.run([sys.executable, "-m", "snapshot", "graph", files["deep"], "-o", str(out)], env=env,
                   timeout=120, check=True)
    assert out.read_text() == dot
