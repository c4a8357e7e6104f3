"""``save_snapshot(metadata=...)``: the user's plain data (a step) in the manifest, beside the position.

It is read back from every form a snapshot takes (the file, the returned ``Snapshot``, its state dict,
a background save, a distributed directory), belongs to its own save only, is refused before anything
is captured when it is not plain JSON data or too large, and files without it still read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import schema
from snapshot.schema.manifest import METADATA_LIMIT
from tests import dist, graphs

FORMAT1 = Path(__file__).resolve().parents[1] / "fixtures" / "format1"


def _loader(samples: int = 3) -> tuple[snapshot.DataLoader2[Any], Any]:
    loader = snapshot.DataLoader2(graphs.linear())
    loader.seed(7)
    it = iter(loader)
    for _ in range(samples):
        next(it)
    return loader, it


def test_metadata_is_read_back_from_every_form_of_the_snapshot(tmp_path: Path) -> None:
    loader, _ = _loader()
    with loader:
        data = {"step": 120, "run": "a", "lr": (0.1, 0.01), "model": {"file": "model.pt", "best": None}}
        written = loader.save_snapshot(tmp_path / "a.snap", metadata=data)
        kept = {"step": 120, "run": "a", "lr": [0.1, 0.01], "model": {"file": "model.pt", "best": None}}
        assert written.metadata == kept                                       # what save_snapshot returns
        assert snapshot.load(tmp_path / "a.snap").metadata == kept            # the file
        assert snapshot.read_manifest(tmp_path / "a.snap")["metadata"] == kept
        in_memory = loader.save_snapshot(metadata={"step": 121})
        assert in_memory.metadata == {"step": 121}
        assert snapshot.load(in_memory.state_dict()).metadata == {"step": 121}  # its state-dict form
        snapshot.save(snapshot.load(tmp_path / "a.snap"), tmp_path / "copy.snap")
        assert snapshot.load(tmp_path / "copy.snap").metadata == kept         # saved again as it is
        future = loader.save_snapshot(tmp_path / "b.snap", metadata={"step": 122}, blocking=False)
        assert future.result(timeout=60) == str(tmp_path / "b.snap")
        assert snapshot.load(tmp_path / "b.snap").metadata == {"step": 122}
        written.metadata["step"] = 0                                         # a copy: the snapshot keeps its own
        assert written.metadata["step"] == 120


def test_metadata_belongs_to_its_own_save(tmp_path: Path) -> None:
    """A loader restored from a snapshot with metadata saves none unless given some again: a step
    carried over would be the step of another position."""
    loader, _ = _loader()
    with loader:
        loader.save_snapshot(tmp_path / "step-3.snap", metadata={"step": 3})
    with snapshot.DataLoader2(graphs.linear()) as restored:
        assert restored.restore_snapshot(tmp_path / "step-3.snap").metadata == {"step": 3}
        it = iter(restored)
        next(it)
        assert restored.save_snapshot(tmp_path / "step-4.snap").metadata == {}
        assert "metadata" not in snapshot.read_manifest(tmp_path / "step-4.snap")
        assert restored.save_snapshot(tmp_path / "step-5.snap", metadata={"step": 5}).metadata == {"step": 5}
    with snapshot.DataLoader2.from_snapshot(tmp_path / "step-5.snap") as again:   # a restore of a restore
        assert again.save_snapshot().metadata == {}
    assert snapshot.load(tmp_path / "step-5.snap").metadata == {"step": 5}


@pytest.mark.parametrize(("metadata", "error", "words"), [
    ({"loss": float("nan")}, TypeError, "metadata['loss'] is nan, which JSON cannot hold"),
    ({"loss": torch.tensor(0.5)}, TypeError, "metadata['loss'] is a torch.Tensor: metadata holds plain JSON data"),
    ({"steps": [1, {2: 3}]}, TypeError, "metadata['steps'][1] has the key 2: metadata keys are strings"),
    ([("step", 1)], TypeError, "metadata must be a dict of plain JSON data, not a list"),
    ({"model": "x" * METADATA_LIMIT}, ValueError, "over the limit of 65,536 bytes"),
])
def test_metadata_that_is_not_small_plain_data_is_refused_before_the_save(
        tmp_path: Path, metadata: Any, error: type[Exception], words: str) -> None:
    with snapshot.DataLoader2(graphs.linear()) as whole:
        whole.seed(7)
        expected = list(whole)[3:]
    loader, it = _loader()
    with loader:
        with pytest.raises(error) as raised:
            loader.save_snapshot(tmp_path / "step-1.snap", metadata=metadata, keep_last=2)
        assert words in str(raised.value)
        assert not os.path.exists(tmp_path / "step-1.snap")
        assert list(it) == expected                                          # the stream went on unchanged


def test_the_limit_is_the_json_size() -> None:
    at_limit = {"m": "x" * (METADATA_LIMIT - len('{"m":""}'))}
    assert schema.manifest.check_metadata(at_limit) == at_limit
    with pytest.raises(ValueError, match="65,537 bytes as JSON"):
        schema.manifest.check_metadata({"m": "x" * (METADATA_LIMIT - len('{"m":""}') + 1)})


def test_files_without_metadata_read_as_before(tmp_path: Path) -> None:
    loader, _ = _loader()
    with loader:
        plain = loader.save_snapshot(tmp_path / "plain.snap")
    assert plain.metadata == {} and "metadata" not in snapshot.read_manifest(tmp_path / "plain.snap")
    old = sorted(FORMAT1.glob("*.snap"))
    if not old:
        pytest.skip("the format-1 fixtures are not in this tree")
    for path in old:
        assert schema.Manifest.from_dict(snapshot.read_manifest(path)).metadata is None


def test_a_manifest_whose_metadata_is_not_an_object_is_refused_naming_the_field(tmp_path: Path) -> None:
    loader, _ = _loader()
    with loader:
        manifest = loader.save_snapshot(metadata={"step": 1}).manifest
    with pytest.raises(snapshot.ManifestError, match=r"metadata: expected an object"):
        schema.Manifest.from_dict({**manifest, "metadata": [1, 2]})


def _distributed_save(rank: int, world: int, directory: str) -> dict[str, Any]:
    service = snapshot.DistributedReadingService(timeout=60)
    with snapshot.DataLoader2(IterableWrapper(range(40)).sharding_filter(), reading_service=service) as loader:
        loader.seed(3)
        it = iter(loader)
        for _ in range(4):
            next(it)
        part = loader.save_snapshot(directory, metadata={"step": 4, "rank": rank})
    return part.metadata


def test_a_distributed_index_carries_rank_0s_metadata_and_each_part_its_own(tmp_path: Path) -> None:
    directory = str(tmp_path / "step-4.snap")
    assert dist.run_ranks(2, _distributed_save, directory) == [{"step": 4, "rank": 0}, {"step": 4, "rank": 1}]
    assert snapshot.read_manifest(os.path.join(directory, "manifest.snap"))["metadata"] == {"step": 4, "rank": 0}
    assert snapshot.read_manifest(os.path.join(directory, "rank-00001.snap"))["metadata"] == {"step": 4, "rank": 1}
    assert snapshot.load(directory).metadata == {"step": 4, "rank": 0}
