"""``inspect`` answers "where is each reader": per shard, each file reader's file, member and offset
(recorded in the manifest at save time, so that nothing but the manifest is read), and what a restore
reads again; counts in the loader's own unit; the plan once; paths cut in their middle, never so that
two rows read alike; ``diff`` with types beside the paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Mapper

import snapshot
from snapshot.cli._text import elide_middle, table
from tests import file_corpus, graphs
from tests.cli.test_cli import run_cli_batch


def _save(path: Path, graph: Any, steps: int, workers: int = 2) -> str:
    service = snapshot.MultiProcessingReadingService(num_workers=workers) if workers else None
    with snapshot.DataLoader2(graph, reading_service=service) as loader:
        loader.seed(3)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        loader.save_snapshot(path)
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("readers")
    data = file_corpus.write_corpus(str(root / "data"))
    return {"tar": _save(root / "tar.snap", Batcher(file_corpus.webdataset(data), 3), 3),
            "gzip": _save(root / "gzip.snap", Batcher(file_corpus.gzip_lines(data), 4), 3),
            "data": data}


def _reader_states(path: str, node: str) -> list[dict[str, Any] | None]:
    """Each shard's saved state of the reader at ``node``, read from the payload (decoded as data)."""
    saved = snapshot.load(path).saved
    assert saved.service is not None
    return [None if shard is None else shard.nodes[node].state for shard in saved.service.shards]


@pytest.mark.parametrize(("name", "node", "reader"), [
    ("tar", "0/datapipe/datapipe/source_datapipe", "TarArchiveLoader"),
    ("gzip", "0/datapipe/datapipe", "LineReader"),
])
def test_inspect_says_where_each_reader_stands(corpus: dict[str, str], name: str, node: str, reader: str) -> None:
    path = corpus[name]
    manifest = snapshot.read_manifest(path)
    states = _reader_states(path, node)
    read = 0
    for shard, state in zip(manifest["shards"], states):
        if state is not None and state["path"] is None:  # between two files (where the workers stood)
            assert "reading" not in shard["nodes"][node]
            continue
        read += 1
        reading = shard["nodes"][node]["reading"]
        assert state is not None and reading["file"] == os.path.join(corpus["data"], os.path.basename(state["path"]))
        at = state["at"]["offset"] if isinstance(state["at"], dict) else state["at"]
        assert reading["offset"] == at > 0                 # what the reader's own state says, to the byte
        assert reading.get("inflated", False) is (name == "gzip")
    out = run_cli_batch(["inspect", path], env={"COLUMNS": "100"})[0].stdout
    heading = out.index("Readers: where each file reader stands")
    section = out[heading:out.index("\n\n", heading)].splitlines()
    assert section[1].startswith(f"  {reader} at {node}: ")
    if name == "gzip":
        words = " ".join(" ".join(section).split())
        assert "offsets count decompressed bytes; a restore inflates each current file again" in words
    rows = [line.split() for line in section if line.startswith("    ") and line.split()[0].isdigit()]
    expected = [[str(i), shard["nodes"][node]["reading"]["file"], "-", f"{shard['nodes'][node]['reading']['offset']:,}"]
                for i, shard in enumerate(manifest["shards"]) if "reading" in shard["nodes"][node]]
    assert read and rows == expected  # a shard between two files has no row


def test_counts_are_in_the_loaders_unit_and_the_plan_is_printed_once(corpus: dict[str, str]) -> None:
    out = run_cli_batch(["inspect", corpus["tar"]], env={"COLUMNS": "200"})[0].stdout
    manifest = snapshot.read_manifest(corpus["tar"])
    samples = sum(shard["nodes"]["0/datapipe"]["yielded"] for shard in manifest["shards"])
    assert (f"position    epoch 0, 3 batches yielded; the batcher at 0 has taken {samples} samples (with those of "
            "batches in flight or buffered)") in out
    header = next(line for line in out.splitlines() if line.startswith("  shard  "))
    assert header.split()[:4] == ["shard", "batches", "samples", "in"]
    assert out.count("Restore plan (auto)") == 1
    assert "Restore plan (auto), every logical shard: every node from its state, nothing replayed" in out


def test_one_plan_line_per_way_the_shards_restore(tmp_path: Path) -> None:
    path = _save(tmp_path / "g.snap", graphs.with_generator_pipe(), 5, workers=0)
    out = run_cli_batch(["inspect", path])[0].stdout
    assert out.count("Restore plan (auto)") == 1 and "Restore plan (auto): replay " in out


def test_a_middle_cut_keeps_both_ends_and_never_makes_two_rows_alike() -> None:
    assert elide_middle("0/datapipe/datapipe/datapipe/datapipe", 24) == "0/datap…atapipe/datapipe"
    paths = [("0" + "/datapipe" * depth) for depth in range(1, 12)]
    for width in (20, 40, 60):
        for middle in ([0], []):
            lines = table(["node", "type"], [[p, "Mapper"] for p in paths], width=width, middle=middle)
            cells = [line[2:].rsplit("  ", 1)[0].strip() for line in lines[1:]]
            assert len(set(cells)) == len(paths), (width, middle, cells)
            assert all(not cell.startswith("…") for cell in cells)  # never cut from the left


def deep(n: int = 40) -> Any:
    dp: Any = IterableWrapper(range(n)).shuffle(buffer_size=5)
    for _ in range(12):
        dp = Mapper(dp, graphs.double)
    return dp.batch(2)


def test_diff_shows_types_beside_whole_paths(tmp_path: Path) -> None:
    early = _save(tmp_path / "early.snap", deep(), 2, workers=0)
    later = _save(tmp_path / "later.snap", deep(), 5, workers=0)
    for columns in ("80", "120", "300"):
        out = run_cli_batch(["diff", early, later], env={"COLUMNS": columns})[0].stdout
        assert "Position: B is 3 batches ahead of A in epoch 0 (2 → 5)" in out
        section = out[out.index("Per-node positions"):out.index("Logical shards:")]
        # a path too long for the line goes on after a "/", on the next line: join those back
        joined = section.replace("/\n    ", "/")
        paths = ["0" + "/datapipe" * depth for depth in range(14)]
        for path in paths:  # every path whole, on its own or beside its type
            assert f"  {path}\n" in joined or f"  {path} " in joined, (columns, path)
        assert "Mapper" in section and "Batcher" in section and "Shuffler" in section
        assert all(len(line) <= int(columns) for line in out.splitlines())
