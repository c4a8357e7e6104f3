"""A directory's index lists a record of every logical shard and upstream copy of the job; a rank's restore
uses few. Reading the index checks every record's shape (and that its nodes are the graph's); each record
is checked in full where it is used: by the plan of the rank that continues the unit, by ``snapshot.load``
of the whole directory, by ``inspect`` and ``verify``. Forged indexes are made as a forger would: the
index edited and packed again, so that every checksum matches.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import format as fmt
from snapshot import multipart, schema
from snapshot.cli import main
from snapshot.reading_service.reshard import SavedLayout, plan_restore
from snapshot.storage import _sources
from tests.dist import run_ranks


def save_on_ranks(rank: int, world: int, directory: str) -> None:
    service = snapshot.DistributedReadingService(timeout=30, logical_shards=4)
    with snapshot.DataLoader2(IterableWrapper(range(40)).sharding_filter(), reading_service=service) as loader:
        loader.seed(1)
        it = iter(loader)
        for _ in range(3):
            next(it)
        loader.save_snapshot(directory)


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("index") / "data.snap")
    run_ranks(2, save_on_ranks, path, pg_timeout=30)
    return path


def _index(directory: str) -> dict[str, Any]:
    return copy.deepcopy(_sources.read_container(os.path.join(directory, fmt.DIRECTORY_MANIFEST)).manifest)


def _forged(directory: str, dest: Path, edit: Any) -> str:
    copied = str(shutil.copytree(os.path.realpath(directory), dest))
    index = _index(copied)
    edit(index)
    Path(copied, fmt.DIRECTORY_MANIFEST).write_bytes(fmt.pack(index, b""))
    return copied


def _run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("COLUMNS", raising=False)  # whole lines, however the test runner set the width
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(list(args))
    return code, out.getvalue()


def test_an_index_reads_each_record_in_full_when_used(directory: str) -> None:
    raw = _index(directory)
    index = schema.Manifest.from_dict(raw, source="manifest.snap")
    assert isinstance(index.shards, schema.Records) and isinstance(index.upstream, schema.Records)
    shards = tuple(schema.ShardPosition.from_dict(s, f"shards[{i}]") for i, s in enumerate(raw["shards"]))
    upstream = tuple(schema.UpstreamPosition.from_dict(u, f"upstream[{i}]") for i, u in enumerate(raw["upstream"]))
    assert len(shards) == 4 and upstream
    assert index.shards[-1] == shards[-1] and index.shards[1:3] == shards[1:3]
    assert index.shards == shards and tuple(index.upstream) == upstream
    assert pickle.loads(pickle.dumps(index)) == index
    assert schema.Manifest.from_dict(index.to_dict()).to_dict() == index.to_dict()
    # a rank's part is no index: its records are read at once
    part = _sources.read_container(os.path.join(directory, multipart.part_name(1))).info
    assert isinstance(part.shards, tuple)


SHAPES = [
    ("a shard record that is not an object", lambda i: i["shards"].__setitem__(1, 5),
     "shards[1]: expected an object, got 5"),
    ("a shard's nodes that are not an object", lambda i: i["shards"][1].update(nodes=[1]),
     "shards[1].nodes: expected an object, got [1]"),
    ("a node that the graph has not", lambda i: i["shards"][2]["nodes"].update(elsewhere={}),
     "shards[2].nodes: expected paths of nodes of graph.nodes, got 'elsewhere'"),
    ("a shard left out", lambda i: i["shards"].__setitem__(3, None),
     "shards[3]: expected the position of logical shard 3"),
    ("an upstream copy's shard that is not a count", lambda i: i["upstream"][0].update(shards=["0"]),
     "upstream[0].shards[0]: expected a non-negative int, got '0'"),
    ("an upstream copy of a shard that is not", lambda i: i["upstream"][0].update(shards=[9]),
     "upstream[0].shards[0]: expected a logical shard below 4, got 9"),
]


@pytest.mark.parametrize(("case", "edit", "message"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_record_of_the_wrong_shape_is_refused_when_the_index_is_read(
        directory: str, tmp_path: Path, case: str, edit: Any, message: str) -> None:
    forged = _forged(directory, tmp_path / "d.snap", edit)
    with pytest.raises(snapshot.ManifestError) as info:
        multipart.read_index(forged)
    assert message in str(info.value) and fmt.DIRECTORY_MANIFEST in str(info.value)


def _yielded(unit: int, value: Any) -> Any:
    def edit(index: dict[str, Any]) -> None:
        node = next(iter(index["shards"][unit]["nodes"].values()))
        node["yielded"] = value
    return edit


def test_a_forged_record_is_refused_wherever_it_is_used(directory: str, tmp_path: Path) -> None:
    forged = _forged(directory, tmp_path / "d.snap", _yielded(3, -3))
    message = "].yielded: expected a non-negative int, got -3"
    index = multipart.read_index(forged).info  # read: shapes checked, the record not yet used
    plan = plan_restore(SavedLayout.from_manifest(index), 4)  # type: ignore[arg-type]
    assert plan.rank(0).units == (0,)  # a rank that does not continue unit 3 does not read its record
    with pytest.raises(snapshot.ManifestError) as info:
        plan.rank(3)  # the rank that continues it does, and refuses it, naming the field and the file
    assert "shards[3].nodes['" in str(info.value) and message in str(info.value)
    assert fmt.DIRECTORY_MANIFEST in str(info.value)
    with pytest.raises(snapshot.ManifestError, match=r"shards\[3\]\.nodes"):
        snapshot.load(forged)  # the whole directory: every record
    code, out = _run("verify", forged)
    assert code == 1 and message in out
    code, out = _run("inspect", forged)
    assert code != 0 and message in out


def test_an_honest_index_plans_and_loads_as_before(directory: str) -> None:
    index = multipart.read_index(directory).info
    saved = SavedLayout.from_manifest(index)
    assert saved is not None
    eager = [schema.ShardPosition.from_dict(s) for s in _index(directory)["shards"]]
    assert list(saved.in_flight) == [s.in_flight for s in eager]
    assert list(saved.buffered) == [sum(n.buffered for n in s.nodes.values()) for s in eager]
    assert [plan_restore(saved, 3).rank(r).reads for r in range(3)] == [(0, 1), (0, 1), (0, 1)]
    assert snapshot.load(directory).info.is_index
    assert _run("inspect", directory)[0] == 0
