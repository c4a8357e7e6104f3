"""One schema for ``snapshot verify`` and ``snapshot.load``, and parts that carry the id of their save.

Forged snapshots are made the way a forger (or a buggy tool) would: the manifest is edited and
the container packed again with :func:`snapshot.format.pack`, so every checksum matches and only
the schema stands between the file and the code. Each forgery must be refused by ``verify`` (exit
1, the field named) and by ``load`` (a :class:`~snapshot.ManifestError` with the same message);
every honest snapshot (in-process, workers, a distributed directory) passes both.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper, Mapper, ShardingFilter, Shuffler

import snapshot
from snapshot import format as fmt
from snapshot import multipart, schema
from snapshot.cli import main
from snapshot.container import _dict_form
from snapshot.storage import _sources
from tests import graphs
from tests.dist import run_ranks

Edit = Callable[[dict[str, Any]], Any]


def sharded(n: int = 64) -> Any:
    return Shuffler(Mapper(ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=8)), graphs.double),
                    buffer_size=3)


def _save(path: Path, factory: Callable[[], Any], steps: int | None, service: Any = None) -> str:
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.seed(5)
        if steps is None:
            list(loader)  # to the end of epoch 0
        elif steps:
            it = iter(loader)
            for _ in range(steps):
                next(it)
        loader.save_snapshot(str(path))
    return str(path)


def save_on_rank(rank: int, world: int, steps: int, directory: str) -> list[int]:
    with snapshot.DataLoader2(sharded(), reading_service=snapshot.DistributedReadingService(60)) as loader:
        loader.seed(7)
        it = iter(loader)
        for _ in range(steps):
            next(it)
        loader.save_snapshot(directory)
        return list(it) + list(loader)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("honest")
    paths = {
        "in-process": _save(root / "a.snap", graphs.linear, 2),
        "before the first epoch": _save(root / "b.snap", graphs.linear, 0),
        "at the end of an epoch": _save(root / "c.snap", graphs.linear, None),
        "workers": _save(root / "d.snap", sharded, 3, snapshot.MultiProcessingReadingService(num_workers=2)),
    }
    for name, steps in (("directory", 3), ("directory, later", 5), ("directory, again", 3)):
        paths[name] = str(root / f"{name.replace(', ', '-')}.snap")
        run_ranks(2, save_on_rank, steps, paths[name])
    return paths


def verify(path: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["verify", "--json", path])
    return code, json.loads(out.getvalue())


def failures(report: dict[str, Any]) -> str:
    return "\n".join(f"{c['check']}: {c['detail']}" for c in report["checks"] if c["status"] == "FAIL")


def test_honest_snapshots_of_every_kind_pass_verify_and_load(honest: dict[str, str]) -> None:
    for name, path in honest.items():
        code, report = verify(path)
        assert code == 0, (name, failures(report))
        snap = snapshot.load(path)
        manifest = {key: value for key, value in _sources.read_manifest(path).items() if key != "_file"}
        assert snap.info == schema.Manifest.from_dict(manifest, source=path), name
        if Path(path).is_dir():
            assert snap.parts is not None and len(snap.parts) == 2
            assert snap.info.save is not None and all(p.info.save == snap.info.save for p in snap.parts)
        else:
            assert snapshot.load(snap.state_dict()).info == snap.info, name  # the state-dict form too


# -- forged manifests -------------------------------------------------------------------------

def _node(m: dict[str, Any]) -> dict[str, Any]:
    return next(iter(m["shards"][0]["nodes"].values()))


FILE_FORGERIES: list[tuple[str, str, Edit, str]] = [
    ("no service", "in-process", lambda m: m.pop("service"), "service: expected a value (the field is missing)"),
    ("no shards", "in-process", lambda m: m.pop("shards"), "shards: expected a value (the field is missing)"),
    ("negative seed", "in-process", lambda m: m["randomness"].update(seed=-1),
     "randomness.seed: expected a seed, an int in [0, 2**64), got -1"),
    ("seed beyond uint64", "in-process", lambda m: m["randomness"].update(seed=2**64),
     "randomness.seed: expected a seed, an int in [0, 2**64), got 18446744073709551616"),
    ("seed as text", "in-process", lambda m: m["randomness"].update(seed="5"),
     "randomness.seed: expected a seed, an int in [0, 2**64), got '5'"),
    ("a source without its seed", "in-process", lambda m: m["randomness"].update(seed=None),
     "randomness.seed_source: expected a seed and its source together, or neither"),
    ("count of 2**70", "in-process", lambda m: m["loader"].update(yielded=2**70),
     "loader.yielded: expected an int below 2**63"),
    ("shard count of 2**70", "in-process", lambda m: m["shards"][0].update(yielded=2**70),
     "shards[0].yielded: expected an int below 2**63"),
    ("negative node count", "in-process", lambda m: _node(m).update(yielded=-3),
     "].yielded: expected a non-negative int, got -3"),
    ("negative lookahead", "in-process", lambda m: m["loader"].update(lookahead=-1),
     "loader.lookahead: expected a non-negative int, got -1"),
    ("count as a float", "in-process", lambda m: m["loader"].update(yielded=2.0),
     "loader.yielded: expected a non-negative int, got 2.0"),
    ("epoch as a boolean", "in-process", lambda m: m["loader"].update(epoch=True),
     "loader.epoch: expected an int >= -1, got True"),
    ("owners as an empty list", "in-process", lambda m: m["service"].update(owners=[]),
     "service.owners: expected the worker that runs each logical shard"),
    ("no owners", "in-process", lambda m: m["service"].pop("owners"),
     "service.owners: expected the worker that runs each logical shard"),
    ("owner beyond the workers", "workers", lambda m: m["service"]["owners"].update({"0": 7}),
     "service.owners['0'].worker: expected a worker below service.workers (2"),
    ("owner of a shard that is not", "in-process", lambda m: m["service"]["owners"].update({"4": 0}),
     "service.owners: expected logical shards below 1, got '4'"),
    ("no logical shards", "in-process", lambda m: m["service"].update(logical_shards=0),
     "service.logical_shards: expected an int >= 1, got 0"),
    ("no workers", "in-process", lambda m: m["service"].pop("workers"),
     "service.workers: expected a value (the field is missing; InProcessReadingService writes it)"),
    ("a rank beyond the ranks", "in-process", lambda m: m["service"].update(rank=1),
     "service.rank: expected a rank below service.ranks (1), got 1"),
    ("fewer units than logical shards", "workers", lambda m: m["service"].update(units=1),
     "service.units: expected an int >= 2, got 1"),
    ("an unknown even_batches policy", "in-process", lambda m: m["service"].update(even_batches="trim"),
     "service.even_batches: expected one of 'drop', 'pad', null, got 'trim'"),
    ("an unknown restore strategy", "in-process", lambda m: _node(m).update(restore="guess"),
     "].restore: expected one of 'state', 'replay', got 'guess'"),
    ("an unknown seed source", "in-process", lambda m: m["randomness"].update(seed_source="dice"),
     "randomness.seed_source: expected one of 'user', 'drawn', got 'dice'"),
    ("a shard left out", "in-process", lambda m: m.update(shards=[None]),
     "shards[0]: expected the position of logical shard 0"),
    ("a shard too many", "in-process", lambda m: m["shards"].append(m["shards"][0]),
     "shards: expected one entry per logical shard (1, as service.logical_shards says), got '2 entries'"),
    ("no shard", "in-process", lambda m: m.update(shards=[]),
     "shards: expected one entry per logical shard (1"),
    ("shards before the first epoch", "in-process", lambda m: m["loader"].update(epoch=-1),
     "shards: expected nothing before the first epoch (loader.epoch is -1), got '1 shards'"),
    ("an upstream copy of a shard that is not", "workers", lambda m: m["upstream"][0].update(shards=[5]),
     "upstream[0].shards[0]: expected a logical shard below 2, got 5"),
    ("a save id that is none", "in-process", lambda m: m.update(save="not-hex"),
     "save: expected a save id (12 to 32 lowercase hex digits), got 'not-hex'"),
    ("a graph node of the wrong type", "in-process", lambda m: m["graph"]["nodes"][0].update(type=5),
     "graph.nodes[0].type: expected a string, got 5"),
]


def _forge(src: str, dest: Path, edit: Edit) -> tuple[str, dict[str, Any], bytes]:
    container = _sources.read_container(src)
    manifest = copy.deepcopy(container.manifest)
    edit(manifest)
    dest.write_bytes(fmt.pack(manifest, container.payload or b""))
    return str(dest), manifest, container.payload or b""


@pytest.mark.parametrize(("case", "base", "edit", "message"), FILE_FORGERIES, ids=[f[0] for f in FILE_FORGERIES])
def test_a_forged_file_is_refused_by_verify_and_load_naming_the_field(
        honest: dict[str, str], tmp_path: Path, case: str, base: str, edit: Edit, message: str) -> None:
    path, manifest, payload = _forge(honest[base], tmp_path / "forged.snap", edit)
    code, report = verify(path)
    assert code == 1, report
    assert [c["check"] for c in report["checks"] if c["status"] == "FAIL"] == ["manifest"]
    assert message in failures(report)
    for load in (lambda: snapshot.load(path), lambda: snapshot.load(_dict_form.to_state_dict(manifest, payload))):
        with pytest.raises(snapshot.ManifestError) as info:
            load()
        assert message in str(info.value)


def _index_of(directory: Path) -> tuple[dict[str, Any], fmt.Container]:
    container = _sources.read_container(str(directory / fmt.DIRECTORY_MANIFEST))
    return copy.deepcopy(container.manifest), container


def _write_index(directory: Path, index: dict[str, Any]) -> None:
    (directory / fmt.DIRECTORY_MANIFEST).write_bytes(fmt.pack(index, b""))


def _replace_part(directory: Path, rank: int, data: bytes, index_edit: Edit | None = None) -> None:
    """Put ``data`` in as rank ``rank``'s part and record its digest in the index, as a forger would."""
    name = multipart.part_name(rank)
    (directory / name).write_bytes(data)
    index, _ = _index_of(directory)
    index["parts"][rank].update(fmt.payload_record(data))
    if index_edit is not None:
        index_edit(index)
    _write_index(directory, index)


def _yielded_of(rank: int, yielded: int) -> Edit:
    def edit(index: dict[str, Any]) -> None:
        index["ranks"][rank]["yielded"] = yielded
        index["loader"]["yielded"] = sum(r["yielded"] for r in index["ranks"])
    return edit


DIRECTORY_FORGERIES: list[tuple[str, Edit, str]] = [
    ("an index with a rank too many", lambda i: i["service"].update(ranks=3),
     "service.ranks: expected the number of parts (2), got 3"),
    ("an index whose count is not its ranks'", lambda i: i["loader"].update(yielded=7),
     "loader.yielded: expected the sum of the ranks' (ranks[].yielded: 6), got 7"),
    ("an index whose ranks are in other epochs", lambda i: i["ranks"][1].update(epoch=4),
     "ranks[1].epoch: expected the index's epoch (0), got 4"),
    ("an index that names one rank", lambda i: i["service"].update(rank=0),
     "service.rank: expected nothing in an index (it describes every rank), got 0"),
    ("an index without ranks", lambda i: i.pop("ranks"),
     "ranks: expected one position per part (2), but this index lists no ranks"),
    ("an index with an unknown even_batches policy", lambda i: i["service"].update(even_batches="trim"),
     "service.even_batches: expected one of 'drop', 'pad', null, got 'trim'"),
    ("an index whose owner is on no rank", lambda i: i["service"]["owners"]["1"].update(rank=2),
     "service.owners['1'].rank: expected a rank below service.ranks (2), got 2"),
]


@pytest.mark.parametrize(("case", "edit", "message"), DIRECTORY_FORGERIES, ids=[f[0] for f in DIRECTORY_FORGERIES])
def test_a_forged_index_is_refused_by_verify_and_load(honest: dict[str, str], tmp_path: Path, case: str,
                                                       edit: Edit, message: str) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "d.snap"))
    index, _ = _index_of(directory)
    edit(index)
    _write_index(directory, index)
    code, report = verify(str(directory))
    assert code == 1 and message in failures(report), report
    with pytest.raises(snapshot.ManifestError) as info:
        snapshot.load(str(directory))
    assert message in str(info.value)


def test_a_forged_part_is_refused_by_verify_and_load(honest: dict[str, str], tmp_path: Path) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "d.snap"))
    container = _sources.read_container(str(directory / "rank-00001.snap"))
    manifest = copy.deepcopy(container.manifest)
    manifest["service"]["rank"] = 2
    _replace_part(directory, 1, fmt.pack(manifest, container.payload or b""))
    message = "service.rank: expected a rank below service.ranks (2), got 2"
    code, report = verify(str(directory))
    assert code == 1 and [c["check"] for c in report["checks"] if c["status"] == "FAIL"] == ["rank 1"]
    assert message in failures(report)
    with pytest.raises(snapshot.ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        snapshot.load(str(directory))


def test_a_manifest_that_describes_another_payload_is_refused_by_load(honest: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """A manifest consistent in itself over another state: only a reader of the payload can tell."""
    for name, edit in {"loader.yielded": lambda m: m["loader"].update(yielded=3),
                       "randomness.seed": lambda m: m["randomness"].update(seed=4),
                       "service": lambda m: m["service"].update(workers=1),
                       "shards[0].yielded": lambda m: m["shards"][0].update(yielded=9)}.items():
        path, _, _ = _forge(honest["in-process"], tmp_path / "f.snap", edit)
        with pytest.raises(snapshot.ManifestError, match=re.escape(f"{name}: expected what the payload's state says")):
            snapshot.load(path)


# -- parts of another save --------------------------------------------------------------------

def test_a_part_of_another_save_is_refused_whatever_its_digest(honest: dict[str, str], tmp_path: Path) -> None:
    """The repro of issue 22: rank 1's part from a later save, its digest (and position) in the index."""
    foreign = (Path(honest["directory, later"]) / "rank-00001.snap").read_bytes()
    message = r"rank-00001.snap \(rank 1\) comes from another save than the index: its save id is [0-9a-f]{12}"
    later = _sources.read_container(io.BytesIO(foreign)).info.loader.yielded
    for case, index_edit in (("digest", None), ("digest and position", _yielded_of(1, later))):
        directory = Path(shutil.copytree(honest["directory"], tmp_path / case))
        _replace_part(directory, 1, foreign, index_edit)
        with pytest.raises(snapshot.CorruptSnapshotError, match=message):
            snapshot.load(str(directory))
        loader = snapshot.DataLoader2(sharded())
        with pytest.raises(snapshot.CorruptSnapshotError, match=message):
            loader.restore_snapshot(str(directory))
        code, report = verify(str(directory))
        assert code == 1 and [c["check"] for c in report["checks"] if c["status"] == "FAIL"] == ["rank 1"]
        assert "comes from another save than the index" in failures(report)


def test_a_part_of_a_save_at_the_same_position_is_refused_too(honest: dict[str, str], tmp_path: Path) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "d.snap"))
    _replace_part(directory, 0, (Path(honest["directory, again"]) / "rank-00000.snap").read_bytes())
    with pytest.raises(snapshot.CorruptSnapshotError, match=r"rank-00000.snap \(rank 0\) comes from another save"):
        snapshot.load(str(directory))


def _without_save_ids(directory: Path) -> None:
    """The directory as a release before save ids wrote it: no ``save`` in the index nor in the parts."""
    index, _ = _index_of(directory)
    for entry in index["parts"]:
        part = _sources.read_container(str(directory / entry["file"]))
        manifest = {key: value for key, value in part.manifest.items() if key != "save"}
        data = fmt.pack(manifest, part.payload or b"")
        (directory / entry["file"]).write_bytes(data)
        entry.update(fmt.payload_record(data))
    index.pop("save")
    _write_index(directory, index)


def test_a_directory_written_before_save_ids_still_loads(honest: dict[str, str], tmp_path: Path) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "old.snap"))
    _without_save_ids(directory)
    assert verify(str(directory))[0] == 0
    expected = snapshot.load(honest["directory"])
    with snapshot.DataLoader2(sharded()) as loader:
        loader.restore_snapshot(str(directory))
        old = list(loader)
    with snapshot.DataLoader2(sharded()) as loader:
        loader.restore_snapshot(honest["directory"])
        assert old == list(loader) and len(old) == 64 - expected.yielded


def test_in_an_old_directory_a_part_of_another_save_is_refused_by_its_position(
        honest: dict[str, str], tmp_path: Path) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "old.snap"))
    later = Path(shutil.copytree(honest["directory, later"], tmp_path / "later.snap"))
    _without_save_ids(directory)
    _without_save_ids(later)
    _replace_part(directory, 1, (later / "rank-00001.snap").read_bytes())
    with pytest.raises(snapshot.CorruptSnapshotError,
                       match=r"rank-00001.snap \(rank 1\) stands at epoch 0, sample 5, where the index records "
                             r"epoch 0, sample 3 for rank 1"):
        snapshot.load(str(directory))
    assert verify(str(directory))[0] == 1


def test_an_old_index_with_a_new_part_is_refused(honest: dict[str, str], tmp_path: Path) -> None:
    directory = Path(shutil.copytree(honest["directory"], tmp_path / "d.snap"))
    index, _ = _index_of(directory)
    index.pop("save")
    _write_index(directory, index)
    with pytest.raises(snapshot.CorruptSnapshotError, match=r"its save id is [0-9a-f]{12}, the index's none"):
        snapshot.load(str(directory))


# -- the layout's vocabulary ------------------------------------------------------------------

def test_units_are_optional_and_at_least_the_logical_shards() -> None:
    layout = {"name": "DistributedReadingService", "logical_shards": 4, "workers": 0, "ranks": 3,
              "owners": {"0": {"rank": 0, "worker": 0}}}
    assert schema.ServiceLayout.from_dict(layout).units is None
    assert schema.ServiceLayout.from_dict({**layout, "units": 12}).to_dict()["units"] == 12
    assert schema.ServiceLayout.from_dict({**layout, "units": 4}).units == 4
    for units, message in ((3, "service.units: expected an int >= 4, got 3"),
                           (6, r"service.units: expected a multiple of logical_shards \(4\), got 6"),
                           ("12", "service.units: expected an int >= 1, got '12'")):
        with pytest.raises(snapshot.ManifestError, match=message):
            schema.ServiceLayout.from_dict({**layout, "units": units})


def test_the_schema_knows_the_policies_the_service_takes() -> None:
    from snapshot.reading_service.distributed import EVEN_BATCHES
    from snapshot.schema._fields import EVEN_BATCHES as KNOWN

    assert KNOWN == EVEN_BATCHES
