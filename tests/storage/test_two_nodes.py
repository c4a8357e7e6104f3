"""A job of two nodes saving to S3, restored on one node of 3 ranks and on two nodes of 2.

Each node is a torchrun agent (``--nnodes 2``, c10d rendezvous on 127.0.0.1) in a working directory
of its own (its local disk): the nodes share nothing but the S3 test server (moto, in server mode).
A counting storage wrapper in every rank (each object s3fs gets, by key: :mod:`tests.node_job`)
shows which parts each rank read. The restored ranks read every remaining sample of the interrupted
epoch at most once (``even_batches="drop"`` drops fewer than R' of them), and every later epoch
exactly once, in equal shares. A part that is missing or altered is an error on every rank that
names the part, well within the test's time limit (a rank that waited for the others would not be).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import snapshot
from tests.node_job import EPOCHS, SAMPLES
from tests.nodes import results, run_nodes
from tests.storage.test_s3 import s3  # noqa: F401 - the S3 server, a fixture of this module too

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

ALL = Counter(range(0, 2 * SAMPLES, 2))


@pytest.fixture(scope="module")
def saved(s3, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:  # noqa: F811
    """A snapshot saved to S3 by two nodes of two ranks, 5 samples into the first epoch."""
    bucket, _ = s3
    url = f"s3://{bucket}/two-nodes/data.snap"
    root = tmp_path_factory.mktemp("save")
    nodes = [root / "node0", root / "node1"]
    run_nodes(nodes, 2, ["save", url])
    before = results(nodes, "save")
    for node in nodes:  # each node's disk holds its own ranks' results and its agent's log, no snapshot
        assert sorted(p.suffix for p in node.iterdir()) == [".json", ".json", ".log"]
    return url, before


def parts_read(result: dict[str, Any]) -> list[str]:
    """The parts a rank read, in the order it read them (each key once, if it read each once)."""
    return [key.rsplit("/", 1)[1] for key in result["reads"] if "/rank-" in key]


def planned(url: str, ranks: int) -> list[list[str]]:
    """The parts each of ``ranks`` ranks is to read, by the re-shard plan of the index at ``url``."""
    from snapshot import schema
    from snapshot.reading_service.reshard import SavedLayout, plan_restore

    index = schema.Manifest.from_dict(snapshot.read_manifest(f"{url}/manifest.snap"))
    layout = SavedLayout.from_manifest(index)
    assert layout is not None
    plan = plan_restore(layout, ranks)
    return [[schema.part_name(saved) for saved in plan.rank(rank).reads] for rank in range(ranks)]


def check_exactly_once(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    """Nothing of the interrupted epoch read twice, fewer than R' samples dropped; later epochs whole and
    equal across the ranks."""
    ranks = len(after)
    read = Counter(x for rank in before for x in rank["seen"]) + Counter(x for rank in after for x in rank["rest"])
    assert not read - ALL, f"read twice: {read - ALL}"
    assert len(ALL - read) < ranks, f"lost {ALL - read}"
    for epoch in range(EPOCHS):
        shares = [rank["following"][epoch] for rank in after]
        assert Counter(x for share in shares for x in share) == ALL, f"epoch {epoch + 1}"
        assert len({len(share) for share in shares}) == 1, f"epoch {epoch + 1}: shares {[len(s) for s in shares]}"


def copy_of(url: str, name: str) -> str:
    """A copy of the snapshot at ``url`` under another prefix (its index names its parts' prefix)."""
    import s3fs

    copy = url.replace("/two-nodes/", f"/{name}/")
    s3fs.S3FileSystem().copy(url, copy, recursive=True)
    return copy


def damaged(url: str, how: str) -> str:
    """A copy of the snapshot with rank 2's part removed or altered."""
    import s3fs

    copy = copy_of(url, how)
    store = s3fs.S3FileSystem()
    [part] = [key for key in store.find(copy) if key.endswith("/rank-00002.snap")]
    if how == "missing":
        store.rm(part)
    else:
        data = bytearray(store.cat(part))
        data[len(data) // 2] ^= 0xFF
        store.pipe(part, bytes(data))
    return copy


DAMAGE = ("missing", "altered")


@pytest.fixture(scope="module")
def one_node(saved, tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    """One node of 3 ranks restoring, in turn, the snapshot and the copies with a missing and an altered part:
    every rank's results of each restore."""
    url, _ = saved
    urls = [url, *(damaged(url, how) for how in DAMAGE)]
    node = tmp_path_factory.mktemp("one-node") / "node0"
    run_nodes([node], 3, ["restore", *urls])
    return [results([node], f"restore{index}") for index in range(len(urls))]


def test_one_node_of_three_ranks_resumes_a_two_node_save(saved, one_node) -> None:
    url, before = saved
    after = one_node[0]
    check_exactly_once(before, after)
    for rank, (result, parts) in enumerate(zip(after, planned(url, 3))):  # what its plan names, each once
        assert sorted(parts_read(result)) == parts, f"rank {rank} read {result['reads']}"


def test_two_nodes_of_two_ranks_resume_their_own_streams(saved, tmp_path: Path) -> None:
    url, before = saved
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    run_nodes(nodes, 2, ["restore", url])
    after = results(nodes, "restore0")
    check_exactly_once(before, after)
    for rank, (was, now) in enumerate(zip(before, after)):
        assert now["rest"] == was["rest"] and now["following"] == was["following"], f"rank {rank}"
        assert parts_read(now) == [f"rank-0000{rank}.snap"], f"rank {rank} read {now['reads']}"  # its own only


@pytest.mark.parametrize("how", DAMAGE)
def test_a_missing_or_altered_part_is_an_error_on_every_rank_naming_it(one_node, how: str) -> None:
    after = one_node[1 + DAMAGE.index(how)]
    for rank, result in enumerate(after):
        assert "error" in result, f"rank {rank} restored from a snapshot with a {how} part"
        assert "rank-00002.snap" in result["error"], f"rank {rank}: {result['error']}"
