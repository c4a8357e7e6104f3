"""The command on distributed snapshots (a directory: manifest.snap and a part per rank), run for real.

The snapshots come from a real two-rank gloo run (``tests/dist.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import snapshot
from snapshot import format as fmt
from tests import graphs
from tests.cli.test_cli import run_cli_batch
from tests.dist import run_ranks

KEY = "ranks-share-this"


def graph() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper, Mapper, ShardingFilter, Shuffler

    return Shuffler(Mapper(ShardingFilter(Shuffler(IterableWrapper(range(64)), buffer_size=8)), graphs.double),
                    buffer_size=3)


def save_on_rank(rank: int, world: int, steps: int, directory: str, key: str | None) -> None:
    with snapshot.DataLoader2(graph(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        loader.seed(7)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        loader.save_snapshot(directory, key=key)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("dist")
    paths = {name: str(root / f"{name}.snap") for name in ("early", "later", "signed")}
    run_ranks(2, save_on_rank, 3, paths["early"], None)
    run_ranks(2, save_on_rank, 5, paths["later"], None)
    run_ranks(2, save_on_rank, 3, paths["signed"], KEY)
    mixed = root / "mixed.snap"  # a directory with one part from another save
    shutil.copytree(paths["early"], mixed)
    shutil.copy(Path(paths["later"]) / "rank-00001.snap", mixed / "rank-00001.snap")
    missing = root / "missing.snap"
    shutil.copytree(paths["early"], missing)
    (missing / "rank-00000.snap").unlink()
    (root / "empty").mkdir()
    paths.update(mixed=str(mixed), missing=str(missing), empty=str(root / "empty"))
    return paths


@pytest.fixture(scope="module")
def results(dirs: dict[str, str]) -> dict[str, subprocess.CompletedProcess[str]]:
    calls = {
        "inspect": ["inspect", dirs["early"]],
        "part": ["inspect", str(Path(dirs["early"]) / "rank-00001.snap")],
        "verify": ["verify", dirs["early"]],
        "mixed": ["verify", dirs["mixed"]],
        "missing": ["verify", dirs["missing"]],
        "signed": ["verify", dirs["signed"], "--key", KEY],
        "wrong_key": ["verify", dirs["signed"], "--key", "not-it"],
        "diff": ["diff", dirs["early"], dirs["later"]],
        "graph": ["graph", dirs["early"]],
        "empty": ["inspect", dirs["empty"]],
    }
    return dict(zip(calls, run_cli_batch(*calls.values())))


def lines_after(text: str, header: str, count: int) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line.split() for line in lines[start + 1:start + 1 + count]]


def test_inspect_a_directory(results: dict[str, Any], dirs: dict[str, str]) -> None:
    proc = results["inspect"]
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    manifest = snapshot.read_manifest(str(Path(dirs["early"]) / "manifest.snap"))
    assert f"{dirs['early']}: distributed snapshot of 2 parts, format 3" in out
    total = manifest["loader"]["yielded"]
    assert [r["yielded"] for r in manifest["ranks"]] == [3, 3]
    assert f"position    epoch 0, {total} samples yielded (the whole run, 2 ranks; each rank's under" in out
    assert "figures summed over 2 logical shards" in out
    assert lines_after(out, "  rank  epoch  yielded", 2) == [["0", "0", "3", "no", "0"], ["1", "0", "3", "no", "0"]]
    parts = {p["file"]: p for p in manifest["parts"]}
    for name in ("rank-00000.snap", "rank-00001.snap"):
        row = next(line.split() for line in out.splitlines() if line.startswith(f"  {name}"))
        assert row[3] == f"{parts[name]['size']:,}"
    total = Path(dirs["early"], "manifest.snap").stat().st_size + sum(p["size"] for p in parts.values())
    assert f"({total:,} bytes)" in out


def test_inspect_one_ranks_part(results: dict[str, Any]) -> None:
    proc = results["part"]
    assert proc.returncode == 0, proc.stderr
    shards = lines_after(proc.stdout, "  shard  yielded", 2)
    assert shards[0][0] == "1"  # rank 1 holds logical shard 1 (of 2), and its manifest has null for shard 0
    assert shards[1][:1] != ["0"] and re.search(r"^  rank +1$", proc.stdout, re.MULTILINE)


def test_verify_checks_every_part(results: dict[str, Any]) -> None:
    ok = results["verify"]
    assert ok.returncode == 0, ok.stdout
    assert "the manifest of a distributed snapshot" in ok.stdout
    for rank in (0, 1):
        assert f"ok    rank {rank}     rank-0000{rank}.snap, " in ok.stdout
    mixed = results["mixed"]
    assert mixed.returncode == 1
    assert "FAIL  rank 1     rank-00001.snap is not the part the manifest records" in mixed.stdout
    assert "mixes parts of different saves" in mixed.stdout and "ok    rank 0" in mixed.stdout
    missing = results["missing"]
    assert missing.returncode == 1 and "rank-00000.snap: the manifest lists it, but it cannot be read" in missing.stdout
    assert results["signed"].returncode == 0, results["signed"].stdout
    assert results["signed"].stdout.count("signature matches the key") == 3  # the manifest and both parts
    wrong = results["wrong_key"]
    assert wrong.returncode == 1 and "does not match this key" in wrong.stdout


def test_diff_and_graph_of_directories(results: dict[str, Any], dirs: dict[str, str]) -> None:
    diff = results["diff"]
    assert diff.returncode == 1
    early, later = (snapshot.read_manifest(str(Path(dirs[name]) / "manifest.snap"))["loader"]["yielded"]
                    for name in ("early", "later"))
    assert f"Position: B is {later - early} samples ahead of A in epoch 0 ({early} → {later})" in diff.stdout
    assert lines_after(diff.stdout, "Ranks:", 3)[1:] == [["rank", "0", "yielded", "3", "5"],
                                                         ["rank", "1", "yielded", "3", "5"]]
    assert "rank-00000.snap: different bytes" in diff.stdout
    assert results["graph"].returncode == 0 and results["graph"].stdout.startswith("digraph")


def test_a_directory_that_is_not_a_snapshot(results: dict[str, Any]) -> None:
    proc = results["empty"]
    assert proc.returncode == 2
    assert "is a directory without manifest.snap: not a complete distributed snapshot" in proc.stderr


def test_the_parts_are_signed_with_the_key(dirs: dict[str, str]) -> None:
    for name in ("manifest.snap", "rank-00000.snap", "rank-00001.snap"):
        assert fmt.unpack((Path(dirs["signed"]) / name).read_bytes(), key=KEY).signed
