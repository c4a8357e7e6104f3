"""Lightning: its own checkpoint carries the loader, and ``fit(ckpt_path=...)`` continues mid-epoch.

Real ``lightning`` on CPU, in fresh processes (one, or two DDP ranks launched by Lightning
itself): an uninterrupted ``fit`` records every batch a training step sees and writes
checkpoints with ``ModelCheckpoint`` (mid-epoch, and at the end of an epoch); new processes
resume from each checkpoint, and the batches their training steps see must be exactly the
uninterrupted run's from that step on, across epoch boundaries.

Run as a script, this file is the job: ``python tests/test_integrations_lightning.py SPEC``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from tests.integration_jobs import job_env, read_results, run_job, write_result  # noqa: E402

if importlib.util.find_spec("lightning") is None:  # (not imported here: only the jobs import Lightning)
    pytest.skip("the lightning extra is not installed", allow_module_level=True)

SEED = 31
STEPS = 20


def make_graph() -> Any:
    import torch
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(60)).shuffle(buffer_size=16).sharding_filter().batch(4).map(torch.tensor)


# -- the job (in its own process) -------------------------------------------------------------

def job(spec: dict[str, Any]) -> None:
    if spec["task"] == "checks":
        return checks(spec)
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    import snapshot
    from snapshot.integrations.lightning import LightningLoader, reading_service_for

    class Data(L.LightningDataModule):
        def __init__(self, workers: int) -> None:
            super().__init__()
            self.workers = workers
            self.loader: LightningLoader | None = None
            self.service = ""

        def train_dataloader(self) -> LightningLoader:
            service = reading_service_for(self.trainer, num_workers=self.workers, timeout=60)
            self.service = type(service).__name__
            loader = snapshot.DataLoader2(make_graph(), reading_service=service)
            loader.seed(SEED)
            self.loader = LightningLoader(loader, self.trainer)
            return self.loader

        def teardown(self, stage: str) -> None:
            if self.loader is not None:
                self.loader.shutdown()

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[Any] = []
            self.start_step = -1

        def on_train_start(self) -> None:
            self.start_step = self.trainer.global_step

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen.append(batch.tolist())
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    def trainer(callbacks: list[Any]) -> Any:
        devices = spec["devices"]
        return L.Trainer(max_steps=STEPS, accelerator="cpu", devices=devices,
                         strategy="ddp" if devices > 1 else "auto", callbacks=callbacks,
                         enable_checkpointing=bool(callbacks), logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)

    results: dict[str, Any] = {}
    if spec["task"] == "train":
        checkpoints = spec["checkpoints"]
        callbacks = [ModelCheckpoint(dirpath=checkpoints, filename="{step}", every_n_train_steps=spec["every"],
                                     save_top_k=-1),
                     ModelCheckpoint(dirpath=checkpoints, filename="end-{epoch}", every_n_epochs=1,
                                     save_on_train_epoch_end=True, save_top_k=-1)]
        t, model, data = trainer(callbacks), Model(), Data(spec["workers"])
        t.fit(model, data)
        results = {"seen": model.seen, "service": data.service}
    else:
        for path in spec["resume"]:
            t, model, data = trainer([]), Model(), Data(spec["workers"])
            t.fit(model, data, ckpt_path=path)
            results[Path(path).stem] = {"seen": model.seen, "start": model.start_step, "service": data.service}
    write_result(spec["out"], spec["task"], t.global_rank, results)


def checks(spec: dict[str, Any]) -> None:
    """Which reading service reading_service_for picks for each strategy; refusals (no training)."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    import snapshot
    from snapshot.integrations.lightning import LightningLoader, reading_service_for

    def describe(service: Any) -> Any:
        parts = getattr(service, "reading_services", None)
        if parts is not None:
            return [type(service).__name__, [describe(p) for p in parts]]
        return [type(service).__name__, getattr(service, "num_workers", None),
                getattr(service, "even_batches", None)]

    found: dict[str, Any] = {}
    for strategy, devices in [("auto", 1), ("single_device", 1), ("ddp", 2), ("ddp_spawn", 2), ("ddp_fork", 2),
                              ("ddp", 1)]:
        t = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                      enable_progress_bar=False, enable_model_summary=False)
        found[f"{strategy}/{devices}"] = {str(n): describe(reading_service_for(t, num_workers=n)) for n in (0, 2)}
    try:
        reading_service_for(L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(), logger=False))
        found["model_parallel"] = "accepted"
    except ValueError as exc:
        found["model_parallel"] = str(exc)
    with snapshot.DataLoader2(make_graph()) as loader:
        wrapped = LightningLoader(loader, L.Trainer(accelerator="cpu", devices=1, logger=False))
        try:
            wrapped.load_state_dict(loader.state_dict())
        except snapshot.SnapshotError as exc:
            found["bare_state"] = str(exc)
    try:
        LightningLoader(make_graph(), wrapped.trainer)  # type: ignore[arg-type]
    except TypeError as exc:
        found["not_a_loader"] = str(exc)
    write_result(spec["out"], "checks", 0, found)


# -- the tests ---------------------------------------------------------------------------------

def run(tmp_path: Path, spec: dict[str, Any], timeout: float = 300) -> None:
    spec = {"out": str(tmp_path), **spec}
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    run_job([str(Path(__file__)), json.dumps(spec)], cwd=tmp_path, env=env, timeout=timeout)


def _free_port() -> int:
    from tests.dist import free_port

    return free_port()


def check_resumes(tmp_path: Path, *, devices: int, workers: int, resume_workers: int, every: int,
                  ends: list[str]) -> None:
    checkpoints = tmp_path / "ckpt"
    run(tmp_path, {"task": "train", "devices": devices, "workers": workers, "checkpoints": str(checkpoints),
                   "every": every})
    full = read_results(tmp_path, "train")
    assert len(full) == devices
    names = [f"step={every}", f"step={2 * every}", *ends]
    paths = [str(checkpoints / f"{name}.ckpt") for name in names]
    for path in paths:
        assert Path(path).exists(), sorted(p.name for p in checkpoints.iterdir())
    run(tmp_path, {"task": "resume", "devices": devices, "workers": resume_workers, "resume": paths})
    resumed = read_results(tmp_path, "resume")
    for rank in range(devices):
        seen = full[rank]["seen"]
        assert len(seen) == STEPS
        for name in names:
            got = resumed[rank][name]
            start = got["start"]
            assert 0 < start < STEPS, (name, start)
            assert got["seen"] == seen[start:], f"rank {rank}, resumed from {name} (step {start})"


def test_fit_resumes_mid_epoch_with_the_same_batches(tmp_path: Path) -> None:
    # 15 batches per epoch: checkpoints at steps 6 and 12 (mid-epoch 0) and after epoch 0 (step
    # 15); each resume runs to step 20, across the start of epoch 1 (new seeds).
    check_resumes(tmp_path, devices=1, workers=0, resume_workers=0, every=6, ends=["end-epoch=0"])
    service = read_results(tmp_path, "train")[0]["service"]
    assert service == "InProcessReadingService"


def test_fit_with_workers_resumes_onto_another_worker_count(tmp_path: Path) -> None:
    # 2 workers (2 logical shards): the snapshot accounts for what the workers and Lightning's
    # fetcher took ahead; the resume runs 1 worker on the same 2 logical shards.
    check_resumes(tmp_path, devices=1, workers=2, resume_workers=1, every=7, ends=["end-epoch=0"])
    assert read_results(tmp_path, "train")[0]["service"] == "MultiProcessingReadingService"


def test_ddp_fit_resumes_on_every_rank(tmp_path: Path) -> None:
    # Two DDP ranks launched by Lightning, one worker each: 8 batches per rank and epoch.
    check_resumes(tmp_path, devices=2, workers=1, resume_workers=1, every=3, ends=["end-epoch=0", "end-epoch=1"])
    full = read_results(tmp_path, "train")
    assert {r["service"] for r in full} == {"SequentialReadingService"}
    first = [set(map(tuple, r["seen"][:8])) for r in full]
    assert not first[0] & first[1], "the two ranks must read different batches"


def test_reading_service_follows_the_strategy_and_refusals_are_clear(tmp_path: Path) -> None:
    run(tmp_path, {"task": "checks"})
    (found,) = read_results(tmp_path, "checks")
    in_process, workers = ["InProcessReadingService", None, None], ["MultiProcessingReadingService", 2, None]
    for single in ("auto/1", "single_device/1"):
        assert found[single] == {"0": in_process, "2": workers}
    distributed = ["DistributedReadingService", None, "drop"]
    for ddp in ("ddp/2", "ddp_spawn/2", "ddp_fork/2", "ddp/1"):
        assert found[ddp]["0"] == distributed
        assert found[ddp]["2"] == ["SequentialReadingService", [distributed, workers]]
    assert "does not support ModelParallelStrategy" in found["model_parallel"]
    assert "not a LightningLoader state" in found["bare_state"]
    assert "DataLoader2.load_state_dict()" in found["bare_state"]
    assert "wraps a snapshot.DataLoader2, got" in found["not_a_loader"]



if __name__ == "__main__":
    job(json.loads(sys.argv[1]))
