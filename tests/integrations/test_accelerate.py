"""accelerate: ``register_for_checkpointing(loader)`` + ``save_state`` / ``load_state`` resume exactly.

Real ``accelerate`` on CPU, in fresh processes: a training run saves its state mid-epoch and trains
on, recording every batch and the final weights; another process loads that state and trains on,
and must see exactly the batches the first run saw from that step on (across the epoch boundary)
and end with the same weights. The
same on two ranks launched by torchrun (the loader's state dict is a collective there), and
from two ranks onto one process, where every sample of the interrupted epoch is read once.

Run as a script, this file is the job: ``python tests/integrations/test_accelerate.py SPEC``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from tests.integration_jobs import job_env, page_script, read_results, run_job, write_result  # noqa: E402

if importlib.util.find_spec("accelerate") is None:  # (not imported here: only the jobs import accelerate)
    pytest.skip("the accelerate extra is not installed", allow_module_level=True)

SEED = 5
STEPS = 20
SAMPLES = 60


def make_graph() -> Any:
    import torch
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(SAMPLES)).shuffle(buffer_size=16).sharding_filter().batch(4).map(torch.tensor)


# -- the job (in its own process, or in each rank's) --------------------------------------------

class Progress:
    """The training loop's own counter, checkpointed beside the loader."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def job(spec: dict[str, Any]) -> None:
    import torch
    from accelerate import Accelerator

    import snapshot
    from snapshot.integrations.accelerate import reading_service_for

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    service = reading_service_for(accelerator, timeout=60)
    loader = snapshot.DataLoader2(make_graph(), reading_service=service)
    loader.seed(SEED)
    progress = Progress()
    accelerator.register_for_checkpointing(loader, progress)
    if spec.get("resume"):
        accelerator.load_state(spec["resume"])
    start = progress.step
    epochs: list[list[Any]] = []
    while progress.step < STEPS:
        epochs.append([])
        for batch in loader:  # the first `for` after load_state continues the interrupted epoch
            loss = model(batch.float().unsqueeze(1)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            epochs[-1].append(batch.tolist())
            progress.step += 1
            if progress.step == spec.get("save_at"):
                accelerator.save_state(spec["checkpoint"])  # on every process
            if progress.step == STEPS:
                break
    weight = accelerator.unwrap_model(model).weight.detach().flatten().tolist()
    write_result(spec["out"], spec["name"], accelerator.process_index,
                 {"start": start, "epochs": epochs, "weight": weight, "service": type(service).__name__,
                  "world": accelerator.num_processes})
    loader.shutdown()
    accelerator.end_training()


# -- the tests ---------------------------------------------------------------------------------

def run(tmp_path: Path, name: str, ranks: int = 1, **spec: Any) -> list[Any]:
    spec = {"out": str(tmp_path), "name": name, **spec}
    args = [str(Path(__file__)), json.dumps(spec)]
    if ranks > 1:
        from tests.dist import free_port

        args = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", *args]
    run_job(args, cwd=tmp_path, env=job_env(), timeout=300)
    return read_results(tmp_path, name)


def flat(epochs: list[list[Any]]) -> list[Any]:
    return [batch for epoch in epochs for batch in epoch]


def test_save_state_mid_epoch_then_load_state_in_a_new_process(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    # one run saves at step 7 and trains on (the stream of a run that saves is the uninterrupted one: checked
    # for every cut by snapshot.testing elsewhere), so the resumed run is compared with the whole run
    (full,) = run(tmp_path, "full", save_at=7, checkpoint=checkpoint)
    (resumed,) = run(tmp_path, "resumed", resume=checkpoint)
    assert full["service"] == "InProcessReadingService" and full["world"] == 1
    assert [len(e) for e in full["epochs"]] == [15, 5]  # 15 batches per epoch: the resume crosses into epoch 1
    assert resumed["start"] == 7
    assert flat(resumed["epochs"]) == flat(full["epochs"])[7:]
    assert [len(e) for e in resumed["epochs"]] == [8, 5]  # the rest of epoch 0, then epoch 1 with its own seeds
    assert resumed["weight"] == full["weight"]  # model, optimizer and data all continued exactly
    assert sorted(p.name for p in Path(checkpoint).iterdir() if p.name.startswith("custom")) == \
        ["custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl"]


def test_two_ranks_save_on_every_rank_and_resume_on_two_or_one(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    full = run(tmp_path, "full", ranks=2, save_at=3, checkpoint=checkpoint)
    assert [r["service"] for r in full] == ["DistributedReadingService"] * 2 and full[0]["world"] == 2
    # one file, written by the main process, holds both ranks' parts
    resumed = run(tmp_path, "resumed", ranks=2, resume=checkpoint)
    for rank in range(2):
        assert resumed[rank]["start"] == 3
        assert flat(resumed[rank]["epochs"]) == flat(full[rank]["epochs"])[3:], f"rank {rank}"
        assert resumed[rank]["weight"] == full[rank]["weight"]
    # onto one process: the rest of the interrupted epoch, every sample once
    (alone,) = run(tmp_path, "alone", resume=checkpoint)
    assert alone["world"] == 1
    before = [x for rank in full for batch in rank["epochs"][0][:3] for x in batch]
    after = [x for batch in alone["epochs"][0] for x in batch]
    assert Counter(before + after) == Counter(range(SAMPLES))


def test_the_how_to_page_runs(tmp_path: Path) -> None:
    script = tmp_path / "how_to_accelerate.py"
    script.write_text(page_script(ROOT / "docs/how-to/accelerate.md", "tests/integrations/test_accelerate.py"))
    run_job([str(script)], cwd=tmp_path)  # the page's asserts are its claims


if __name__ == "__main__":
    job(json.loads(sys.argv[1]))
