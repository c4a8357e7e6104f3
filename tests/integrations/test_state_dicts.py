"""A distributed loader's ``state_dict()`` for a trainer that writes rank 0's state (Lightning, accelerate,
``torch.save`` on rank 0): every part on rank 0, each other rank its own, nothing on every rank.

Real gloo groups (``tests/dist.py``). What each rank's dict holds is read from the dicts themselves; the
restores from rank 0's dict are counted sample by sample against the uninterrupted epoch.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.utils.data import IterDataPipe

import snapshot
from snapshot.container import _dict_form, _parts, format
from tests.dist import run_ranks
from tests.reading_service.test_distributed import check_exactly_once, read, restore_from, service, unique_graph


def parts_of(state: dict[str, Any]) -> dict[str, int]:
    return {name: len(blob) for name, blob in state.get("parts", {}).items()}


def take_state(rank: int, world: int, path: str) -> dict[str, Any]:
    with snapshot.DataLoader2(unique_graph(), reading_service=service(logical_shards=6)) as loader:
        loader.seed(11)
        seen, it = read(loader, 5)
        state = loader.state_dict()
        if rank == 0:
            torch.save(state, path)
        rest, following = list(it), list(loader)
    return {"seen": seen, "rest": rest, "following": following, "keys": sorted(state), "parts": parts_of(state)}


def test_rank_zero_holds_every_part_and_the_index_the_others_their_own_part(tmp_path) -> None:
    path = str(tmp_path / "state.pt")
    before = run_ranks(3, take_state, path)
    names = [f"rank-0000{r}.snap" for r in range(3)]
    assert before[0]["keys"] == ["manifest", "parts", "snapshot_format"]
    assert sorted(before[0]["parts"]) == names
    for rank in (1, 2):  # their own part, no index: no rank but 0 holds another's part
        assert before[rank]["keys"] == ["parts", "snapshot_format"]
        assert before[rank]["parts"] == {names[rank]: before[0]["parts"][names[rank]]}
    after = run_ranks(2, restore_from, 0, path)  # rank 0's dict restores anywhere: here on 2 ranks
    check_exactly_once(before, after)


def own_part_alone(rank: int, world: int) -> Any:
    with snapshot.DataLoader2(unique_graph(), reading_service=service()) as loader:
        loader.seed(11)
        read(loader, 3)
        state = loader.state_dict()
    if rank == 1:
        with snapshot.DataLoader2(unique_graph()) as alone, pytest.raises(snapshot.SnapshotFileError) as error:
            alone.load_state_dict(state)
        return str(error.value)
    return None


def test_a_rank_s_own_part_without_the_index_is_refused_naming_rank_zero_s() -> None:
    message = run_ranks(2, own_part_alone)[1]
    assert "holds rank-00001.snap of a distributed loader's state, without the index" in message
    assert "restore from rank 0's state_dict()" in message


class Fragile(IterDataPipe):
    """A pipe whose state cannot be taken on rank 1 (its ``state_dict`` raises there)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __iter__(self) -> Any:
        yield from self.source

    def state_dict(self) -> dict[str, Any]:
        if torch.distributed.get_rank() == 1:
            raise ValueError("rank 1 cannot say where it stands")
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def one_rank_cannot(rank: int, world: int) -> str:
    # a timeout far beyond the test's: a rank that waited for the failing one would fail the test
    with snapshot.DataLoader2(Fragile(unique_graph()), reading_service=service(timeout=900)) as loader:
        loader.seed(11)
        read(loader, 3)
        with pytest.raises(snapshot.RankError) as error:
            loader.state_dict()
        return str(error.value)


def test_a_rank_that_cannot_take_its_state_fails_every_rank_at_once() -> None:
    messages = run_ranks(3, one_rank_cannot, timeout=120)
    for message in messages:
        assert "the loader's state dict was not taken: rank 1:" in message
        assert "rank 1 cannot say where it stands" in message


def joined_state(rank: int, world: int, directory: str) -> dict[str, Any]:
    with snapshot.DataLoader2(unique_graph(), reading_service=service()) as loader:
        loader.seed(11)
        seen, it = read(loader, 4)
        loader.save_snapshot(directory)
        return {"seen": seen, "rest": list(it), "following": list(loader)}


def test_a_state_dict_of_joined_parts_from_earlier_versions_still_loads(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, joined_state, directory)
    blobs = [(tmp_path / "data.snap" / f"rank-0000{r}.snap").read_bytes() for r in range(2)]
    infos = [_parts.part_info(r, format.unpack(blob).manifest, blob) for r, blob in enumerate(blobs)]
    index = _parts.distributed_manifest(infos, save=format.unpack(blobs[0]).info.save)
    payload = _parts.join_parts(blobs)
    index[format.PAYLOAD] = format.payload_record(payload)
    state = _dict_form.to_state_dict(index, payload)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    one_process = snapshot.InProcessReadingService(logical_shards=2)
    with snapshot.DataLoader2(unique_graph(), reading_service=one_process) as loader:
        loader.load_state_dict(torch.load(buffer, weights_only=True))
        rest, following = list(loader), list(loader)
    check_exactly_once(before, [{"rest": rest, "following": following}])
