"""Lightning: its own checkpoint carries the loader, and ``fit(ckpt_path=...)`` continues mid-epoch.

Real ``lightning`` on CPU, in fresh processes (one, or two DDP ranks launched by Lightning
itself): an uninterrupted ``fit`` records every batch a training step sees and writes
checkpoints with ``ModelCheckpoint`` (mid-epoch, and at the end of an epoch); new processes
resume from each checkpoint, and the batches their training steps see must be exactly the
uninterrupted run's from that step on, across epoch boundaries.

Run as a script, this file is the job: ``python tests/integrations/test_lightning.py SPEC``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from tests.dist import run_ranks  # noqa: E402
from tests.integration_jobs import job_env, page_script, read_results, run_job, write_result  # noqa: E402

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
            self.epochs: list[int] = []  # the epoch of each batch in ``seen``
            self.start_step = -1

        def on_train_start(self) -> None:
            self.start_step = self.trainer.global_step

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen.append(batch.tolist())
            self.epochs.append(self.current_epoch)
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            if spec.get("estimate"):  # with max_epochs set, this loads the train dataloader early
                assert self.trainer.estimated_stepping_batches == STEPS
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    def trainer(callbacks: list[Any]) -> Any:
        devices = spec["devices"]
        return L.Trainer(max_steps=spec.get("steps", STEPS), max_epochs=3 if spec.get("estimate") else None,
                         accelerator="cpu", devices=devices,
                         strategy="ddp" if devices > 1 else "auto", callbacks=callbacks,
                         enable_checkpointing=bool(callbacks), logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)

    def checkpointing(directory: str | None) -> list[Any]:
        if directory is None:
            return []
        return [ModelCheckpoint(dirpath=directory, filename="{step}", every_n_train_steps=spec["every"],
                                save_top_k=-1),
                ModelCheckpoint(dirpath=directory, filename="end-{epoch}", every_n_epochs=1,
                                save_on_train_epoch_end=True, save_top_k=-1)]

    results: dict[str, Any] = {}
    if spec["task"] == "train":
        t, model, data = trainer(checkpointing(spec["checkpoints"])), Model(), Data(spec["workers"])
        t.fit(model, data)
        results = {"seen": model.seen, "service": data.service}
    else:
        for path in spec["resume"]:
            name = Path(path).stem
            directory = str(Path(spec["checkpoints"]) / name) if spec.get("checkpoints") else None
            t, model, data = trainer(checkpointing(directory)), Model(), Data(spec["workers"])
            try:
                t.fit(model, data, ckpt_path=path)
            except snapshot.SnapshotError as exc:
                results[name] = {"error": str(exc), "seen": model.seen}
                continue
            results[name] = {"seen": model.seen, "epochs": model.epochs, "start": model.start_step,
                             "service": data.service}
    write_result(spec["out"], spec.get("name", spec["task"]), t.global_rank, results)


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
    found.update(bare_loader(spec["out"]))
    write_result(spec["out"], "checks", 0, found)


def bare_loader(out: str) -> dict[str, str]:
    """A bare DataLoader2 in Lightning's fit loop: refused when Lightning saves it and loads it."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    import snapshot
    from snapshot.integrations.lightning import LightningLoader

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    def fit(loader: Any, checkpoints: bool, ckpt_path: str | None = None) -> None:
        callbacks = [ModelCheckpoint(dirpath=out, filename="{step}", every_n_train_steps=2)] if checkpoints else []
        L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=checkpoints, callbacks=callbacks,
                  default_root_dir=out).fit(Tiny(), train_dataloaders=loader, ckpt_path=ckpt_path)

    found = {}
    with snapshot.DataLoader2(make_graph()) as loader:
        try:
            fit(loader, True)
        except snapshot.SnapshotError as exc:
            found["bare_save"] = str(exc)
    with snapshot.DataLoader2(make_graph()) as loader:
        trainer_for_wrapper = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                                        enable_progress_bar=False, enable_model_summary=False,
                                        callbacks=[ModelCheckpoint(dirpath=out, filename="wrapped-{step}",
                                                                   every_n_train_steps=2, save_top_k=-1)],
                                        default_root_dir=out)
        trainer_for_wrapper.fit(Tiny(), train_dataloaders=LightningLoader(loader, trainer_for_wrapper))
    with snapshot.DataLoader2(make_graph()) as loader:
        try:
            fit(loader, False, str(Path(out) / "wrapped-step=2.ckpt"))
        except snapshot.SnapshotError as exc:
            found["bare_load"] = str(exc)
    return found


# -- the tests ---------------------------------------------------------------------------------

def run(tmp_path: Path, spec: dict[str, Any], timeout: float = 300) -> None:
    spec = {"out": str(tmp_path), **spec}
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    run_job([str(Path(__file__)), json.dumps(spec)], cwd=tmp_path, env=env, timeout=timeout)


def _free_port() -> int:
    from tests.dist import free_port

    return free_port()


def train(tmp_path: Path, *, devices: int, workers: int, every: int) -> None:
    """An uninterrupted fit of STEPS steps: its batches in ``tmp_path``, its checkpoints in ``tmp_path/ckpt``."""
    run(tmp_path, {"task": "train", "devices": devices, "workers": workers, "checkpoints": str(tmp_path / "ckpt"),
                   "every": every})


def check_resumes(tmp_path: Path, *, devices: int, workers: int, resume_workers: int, every: int,
                  ends: list[str], twice: str | None = None, trained: bool = False) -> None:
    """Resume from mid-epoch and end-of-epoch checkpoints; with ``twice``, resume again from the
    checkpoint ``twice`` that a resumed run (from the first end of epoch) wrote. With ``trained``,
    :func:`train` has run in ``tmp_path`` already."""
    checkpoints = tmp_path / "ckpt"
    if not trained:
        train(tmp_path, devices=devices, workers=workers, every=every)
    full = read_results(tmp_path, "train")
    assert len(full) == devices
    names = [f"step={every}", f"step={2 * every}", *ends]
    paths = [str(checkpoints / f"{name}.ckpt") for name in names]
    for path in paths:
        assert Path(path).exists(), sorted(p.name for p in checkpoints.iterdir())
    again = tmp_path / "ckpt-of-resumed"
    run(tmp_path, {"task": "resume", "devices": devices, "workers": resume_workers, "resume": paths,
                   "checkpoints": str(again) if twice else None, "every": 2})
    resumed = read_results(tmp_path, "resume")
    if twice:
        path = again / ends[0] / f"{twice}.ckpt"
        assert path.exists(), sorted(p.name for p in path.parent.iterdir())
        run(tmp_path, {"task": "resume", "name": "twice", "devices": devices, "workers": resume_workers,
                       "resume": [str(path)]})
        for rank, result in enumerate(read_results(tmp_path, "twice")):
            resumed[rank][f"{ends[0]}, then {twice}"] = result[twice]
    for rank in range(devices):
        seen = full[rank]["seen"]
        assert len(seen) == STEPS
        for name, got in resumed[rank].items():
            start = got["start"]
            assert 0 < start < STEPS, (name, start)
            assert got["seen"] == seen[start:], f"rank {rank}, resumed from {name} (step {start})"


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fit on one device without workers, a checkpoint every 6 steps (one Lightning job for two tests)."""
    directory = tmp_path_factory.mktemp("one-device")
    train(directory, devices=1, workers=0, every=6)
    return directory


def test_fit_resumes_mid_epoch_with_the_same_batches(one_device: Path) -> None:
    # 15 batches per epoch: checkpoints at steps 6 and 12 (mid-epoch 0) and after epoch 0 (step
    # 15); each resume runs to step 20, across the start of epoch 1 (new seeds).
    # A run resumed from the end of epoch 0 writes a checkpoint at step 18, and a third run resumes
    # from that one (a restore of a restore).
    check_resumes(one_device, devices=1, workers=0, resume_workers=0, every=6, ends=["end-epoch=0"],
                  twice="step=18", trained=True)
    service = read_results(one_device, "train")[0]["service"]
    assert service == "InProcessReadingService"


def test_a_checkpoint_lightning_did_not_load_is_an_error_not_a_wrong_stream(one_device: Path,
                                                                            tmp_path: Path) -> None:
    # Lightning does not load dataloader states when configure_optimizers reads
    # trainer.estimated_stepping_batches (with max_epochs set): the loader would silently start
    # the epoch over; LightningLoader stops before a training step sees a wrong batch.
    run(tmp_path, {"task": "resume", "devices": 1, "workers": 0, "estimate": True,
                   "resume": [str(one_device / "ckpt" / "step=6.ckpt")]})
    (resumed,) = read_results(tmp_path, "resume")
    error = resumed["step=6"]["error"]
    assert "the loader's state in the checkpoint was not loaded" in error
    assert "estimated_stepping_batches" in error and "#20550" in error
    assert resumed["step=6"]["seen"] == []  # no training step saw a batch of the restarted epoch


def test_fit_with_workers_resumes_onto_another_worker_count(tmp_path: Path) -> None:
    # 2 workers (2 logical shards): the snapshot accounts for what the workers and Lightning's
    # fetcher took ahead; the resume runs 1 worker on the same 2 logical shards.
    check_resumes(tmp_path, devices=1, workers=2, resume_workers=1, every=7, ends=["end-epoch=0"])
    assert read_results(tmp_path, "train")[0]["service"] == "MultiProcessingReadingService"


@pytest.mark.timeout(600)  # four Lightning jobs of up to three processes each
def test_ddp_fit_resumes_on_every_rank(tmp_path: Path) -> None:
    # Two DDP ranks launched by Lightning, one worker each: 8 batches per rank and epoch.
    check_resumes(tmp_path, devices=2, workers=1, resume_workers=1, every=3, ends=["end-epoch=0", "end-epoch=1"])
    full = read_results(tmp_path, "train")
    assert {r["service"] for r in full} == {"SequentialReadingService"}
    first = [set(map(tuple, r["seen"][:8])) for r in full]
    assert not first[0] & first[1], "the two ranks must read different batches"
    # onto one device: from the end of an epoch, epoch 2 of the one stream of the 2 logical shards;
    # from mid-epoch, the batch each rank's fetcher had taken ahead, then the rest of both shares
    # (each batch once), then epoch 1 of that stream
    checkpoints = tmp_path / "ckpt"
    run(tmp_path, {"task": "resume", "name": "alone", "devices": 1, "workers": 0, "steps": 32,
                   "resume": [str(checkpoints / "end-epoch=1.ckpt"), str(checkpoints / "step=3.ckpt")]})
    (alone,) = read_results(tmp_path, "alone")
    single = _one_stream(epochs=3)
    end = alone["end-epoch=1"]
    assert end["start"] == 16 and _from_zero(end["epochs"]) == [0] * 16 and end["seen"] == single[2]
    mid = alone["step=3"]
    assert mid["start"] == 3 and _from_zero(mid["epochs"]) == [0] * 10 + [1] * 16 + [2] * 3
    before = [x for rank in full for b in rank["seen"][:3] for x in b]
    assert sorted(before + [x for b in mid["seen"][:10] for x in b]) == list(range(60))  # epoch 0: once each
    assert [tuple(b) for b in mid["seen"][:2]] == [tuple(rank["seen"][3]) for rank in full]  # taken ahead
    assert mid["seen"][10:26] == single[1] and mid["seen"][26:] == single[2][:3]
    # onto three: the 2 batches taken ahead go to ranks 0 and 1, and the restore evens out the rest
    # of the epoch around them, so the 3 ranks take the same number of steps (DDP's all-reduce
    # would hang otherwise) and lose fewer than 3 batches of epoch 0; epoch 1 is, rank by rank, that
    # of a run that always had 3 ranks (and the 2 logical shards)
    run(tmp_path, {"task": "resume", "name": "three", "devices": 3, "workers": 0,
                   "resume": [str(checkpoints / "step=3.ckpt")]})
    three = [rank["step=3"] for rank in read_results(tmp_path, "three")]
    assert all("error" not in rank and rank["start"] == 3 for rank in three), three
    assert len({len(rank["seen"]) for rank in three}) == 1
    assert len({tuple(rank["epochs"]) for rank in three}) == 1, "the ranks' epochs end at different steps"
    assert [tuple(three[r]["seen"][0]) for r in range(2)] == [tuple(rank["seen"][3]) for rank in full]
    rest = [b for rank in three for b, e in zip(rank["seen"], _from_zero(rank["epochs"])) if e == 0]
    done = before + [x for b in rest for x in b]
    assert len(set(done)) == len(done) and 60 - len(done) < 4 * 3, "epoch 0: once each, < 3 batches lost"
    fresh = run_ranks(3, _three_ranks_epoch_1)
    for rank, result in enumerate(three):
        epoch_1 = [b for b, e in zip(result["seen"], _from_zero(result["epochs"])) if e == 1]
        assert epoch_1 == fresh[rank], f"rank {rank}"


def _from_zero(epochs: list[int]) -> list[int]:
    """Lightning's epoch numbers counted from the resumed run's first (it numbers a resume from the
    end of an epoch as that epoch)."""
    return [e - epochs[0] for e in epochs]


def _one_stream(epochs: int) -> list[list[Any]]:
    """The batches of the seed's stream with the DDP run's 2 logical shards, in one process."""
    import snapshot

    with snapshot.DataLoader2(make_graph(), reading_service=snapshot.InProcessReadingService(logical_shards=2)) \
            as loader:
        loader.seed(SEED)
        return [[b.tolist() for b in loader] for _ in range(epochs)]


def _three_ranks_epoch_1(rank: int, world: int) -> list[Any]:
    """Epoch 1 on a run that always had 3 ranks and 2 logical shards (Lightning's policy: drop)."""
    import snapshot

    ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=2, even_batches="drop")
    with snapshot.DataLoader2(make_graph(), reading_service=ranks) as loader:
        loader.seed(SEED)
        list(loader)
        return [b.tolist() for b in loader]


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
    assert "asked a bare snapshot.DataLoader2 for its state" in found["bare_save"]
    assert "one batch late" in found["bare_save"] and "LightningLoader(loader, self.trainer)" in found["bare_save"]
    assert "restoring a bare snapshot.DataLoader2" in found["bare_load"]
    assert "LightningLoader(loader, self.trainer)" in found["bare_load"]



def test_the_how_to_page_runs(tmp_path: Path) -> None:
    script = tmp_path / "how_to_lightning.py"
    script.write_text(page_script(ROOT / "docs/how-to/lightning.md", "tests/integrations/test_lightning.py"))
    run_job([str(script)], cwd=tmp_path)  # the page's asserts are its claims


if __name__ == "__main__":
    job(json.loads(sys.argv[1]))
