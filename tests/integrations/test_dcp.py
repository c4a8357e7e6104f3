"""torch.distributed.checkpoint: the loader is ``Stateful``; model, optimizer and data restore together.

Real gloo process groups (``tests/dist.py``): a DDP training loop on two ranks, one worker
each, saves model, optimizer (with momentum), its step counter and the loader in one
``dcp.save``; fresh ranks load it (``snapshot.integrations.dcp.load``) into fresh objects and must
continue exactly (same batches, same final weights) on two ranks, and read every remaining sample of
the interrupted epoch exactly once on three ranks or one, with the model and optimizer restored.
Each rank's part is written once, by that rank; no rank's state dict holds another's part.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

import snapshot
from tests.dist import run_ranks

SAMPLES = 96
SHARDS = 6  # logical shards, fixed by the first run: restores go to 1, 2, 3 or 6 ranks
STEPS = 16
SAVE_AT = 5


def make_graph() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=16).sharding_filter().batch(4).map(torch.tensor)


def service(workers: int, even_batches: str | None) -> snapshot.ReadingServiceInterface:
    ranks = snapshot.DistributedReadingService(60, logical_shards=SHARDS, even_batches=even_batches)
    if workers:
        return snapshot.SequentialReadingService(ranks, snapshot.MultiProcessingReadingService(workers))
    return ranks


def parts(workers: int = 1, even_batches: str | None = "drop") -> tuple[Any, Any, snapshot.DataLoader2[Any]]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loader = snapshot.DataLoader2(make_graph(), reading_service=service(workers, even_batches))
    loader.seed(11)
    return model, optimizer, loader


def checkpoint_state(model: Any, optimizer: Any, loader: snapshot.DataLoader2[Any], step: int) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer),
            "progress": {"step": step}, "data": loader}


def load(model: Any, optimizer: Any, loader: snapshot.DataLoader2[Any], checkpoint: str) -> int:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from snapshot.integrations import dcp as snapshot_dcp

    state = checkpoint_state(model, optimizer, loader, -1)
    snapshot_dcp.load(state, checkpoint_id=checkpoint)  # the loader's load_state_dict is called in place
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return int(state["progress"]["step"])


def snapshot_of(model: Any, optimizer: Any) -> dict[str, Any]:
    momentum = [optimizer.state[p]["momentum_buffer"].flatten().tolist() for p in model.parameters()
                if "momentum_buffer" in optimizer.state[p]]
    return {"weights": [p.detach().flatten().tolist() for p in model.parameters()], "momentum": momentum}


def train(rank: int, world: int, checkpoint: str, resume: bool) -> dict[str, Any]:
    model, optimizer, loader = parts()
    with loader:
        step = load(model, optimizer, loader, checkpoint) if resume else 0
        start, saved, epochs = step, None, []
        while step < STEPS:
            epochs.append([])
            for batch in loader:
                loss = model(batch.float().unsqueeze(1)).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                epochs[-1].append(batch.tolist())
                step += 1
                if step == SAVE_AT and not resume:
                    dcp.save(checkpoint_state(model, optimizer, loader, step), checkpoint_id=checkpoint)
                    saved = snapshot_of(model, optimizer)
                if step == STEPS:
                    break
        return {"start": start, "epochs": epochs, "saved": saved, "end": snapshot_of(model, optimizer)}


def rest_of_epoch(rank: int, world: int, checkpoint: str) -> dict[str, Any]:
    model, optimizer, loader = parts(workers=0, even_batches=None)
    with loader:
        step = load(model, optimizer, loader, checkpoint)
        return {"step": step, "rest": list(loader), "restored": snapshot_of(model, optimizer)}


def flat(epochs: list[list[Any]]) -> list[Any]:
    return [batch for epoch in epochs for batch in epoch]


def test_a_loader_is_stateful_for_dcp() -> None:
    with snapshot.DataLoader2(make_graph()) as loader:
        assert isinstance(loader, Stateful)
        assert sorted(loader.state_dict()) == ["manifest", "payload", "snapshot_format"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    checkpoint = str(tmp_path_factory.mktemp("dcp") / "step5")
    return checkpoint, run_ranks(2, train, checkpoint, False, timeout=180)


def test_model_optimizer_and_loader_resume_together_on_the_same_ranks(saved_run) -> None:
    checkpoint, full = saved_run
    assert [len(e) for e in full[0]["epochs"]] == [12, 4]  # 3 logical shards x 4 batches per rank and epoch
    resumed = run_ranks(2, train, checkpoint, True, timeout=180)
    for rank in range(2):
        assert resumed[rank]["start"] == SAVE_AT
        assert flat(resumed[rank]["epochs"]) == flat(full[rank]["epochs"])[SAVE_AT:], f"rank {rank}"
        assert resumed[rank]["end"] == full[rank]["end"]  # weights and momentum: bit for bit


@pytest.mark.parametrize("world", [3, 1])
def test_onto_another_world_size_every_remaining_sample_once(saved_run, world: int) -> None:
    checkpoint, full = saved_run
    restored = run_ranks(world, rest_of_epoch, checkpoint, timeout=180)
    before = [x for rank in full for batch in rank["epochs"][0][:SAVE_AT] for x in batch]
    after = [x for rank in restored for batch in rank["rest"] for x in batch.tolist()]
    assert Counter(before + after) == Counter(range(SAMPLES))
    for rank in restored:
        assert rank["step"] == SAVE_AT
        assert rank["restored"] == full[0]["saved"]  # the model and optimizer as they were at the save


def test_each_rank_writes_its_own_part_once_and_rank_zero_the_index(saved_run) -> None:
    checkpoint, _ = saved_run
    metadata = dcp.FileSystemReader(checkpoint).read_metadata()
    written = {index.fqn: info.relative_path for index, info in metadata.storage_data.items()
               if index.fqn.startswith("data.")}
    assert written == {"data.snapshot_format": written["data.snapshot_format"], "data.manifest": "__0_0.distcp",
                       "data.parts.rank-00000.snap": "__0_0.distcp", "data.parts.rank-00001.snap": "__1_0.distcp"}


class Recorded:
    """A loader in DCP's state dict, recording what its ``state_dict()`` gave DCP."""

    def __init__(self, loader: snapshot.DataLoader2[Any]) -> None:
        self.loader = loader
        self.given: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        state = self.loader.state_dict()
        self.given = {"keys": sorted(state), "parts": sorted(state.get("parts", {}))}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def given_to_dcp(rank: int, world: int, checkpoint: str) -> dict[str, Any]:
    with snapshot.DataLoader2(make_graph(), reading_service=service(0, None)) as loader:
        loader.seed(11)
        it = iter(loader)
        next(it)
        recorded = Recorded(loader)
        dcp.save({"data": recorded}, checkpoint_id=checkpoint)
        return recorded.given


def test_under_dcp_each_rank_s_state_dict_holds_its_own_part_only(tmp_path) -> None:
    given = run_ranks(3, given_to_dcp, str(tmp_path / "ckpt"), timeout=180)
    assert given[0] == {"keys": ["manifest", "parts", "snapshot_format"], "parts": ["rank-00000.snap"]}
    for rank in (1, 2):
        assert given[rank] == {"keys": ["parts", "snapshot_format"], "parts": [f"rank-0000{rank}.snap"]}


def plain_load(rank: int, world: int, checkpoint: str) -> str:
    with snapshot.DataLoader2(make_graph(), reading_service=service(0, None)) as loader:
        try:
            dcp.load({"data": loader}, checkpoint_id=checkpoint)
        except Exception as exc:  # noqa: BLE001 - the message is the test's subject
            return f"{type(exc).__name__}: {exc}"
    return "loaded"


def test_dcp_s_own_load_onto_fewer_ranks_says_to_use_ours(saved_run) -> None:
    checkpoint, _ = saved_run
    [message] = run_ranks(1, plain_load, checkpoint, timeout=180)
    assert "holds 1 of the 2 parts its index lists, and not rank-00001.snap, which this restore reads" in message
    assert "snapshot.integrations.dcp.load()" in message


def test_the_how_to_script_runs_under_torchrun(tmp_path) -> None:
    from tests.dist import free_port
    from tests.integration_jobs import ROOT, page_script, run_job

    script = tmp_path / "train.py"
    script.write_text(page_script(ROOT / "docs/how-to/dcp.md", "tests/integrations/test_dcp.py"))
    output = run_job(["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                      f"--master_port={free_port()}", str(script)], cwd=tmp_path, timeout=180)
    for rank in range(2):  # the script asserts its claims on each rank
        assert f"rank {rank}: resumed at step 7, same batches and weights" in output, output
