"""The command line fits an 80-column terminal, and its help is plain text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper, Mapper

import snapshot
from snapshot.cli import main
from snapshot.cli._dot import fold
from tests import graphs


def deep(n: int = 60) -> Any:
    """A long chain: node paths grow past any terminal's width."""
    dp: Any = IterableWrapper(range(n)).shuffle(buffer_size=10_000)
    for _ in range(14):
        dp = Mapper(dp, graphs.double)
    return graphs.Squares(dp).batch(3)


def save(path: Path, factory: Any, steps: int, service: Any = None) -> str:
    with snapshot.DataLoader2(factory(), reading_service=service) as dl:
        dl.seed(7)
        it = iter(dl)
        for _ in range(steps):
            next(it)
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
        *(["graph", f] for f in files.values()),
        ["inspect", files["deep"] + ".missing"],
    ]
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
