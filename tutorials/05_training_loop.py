# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · A training loop that survives a crash, with accelerate or without
#
# A training script built on Hugging Face accelerate checkpoints everything with
# `accelerator.save_state()`: the model, the optimizer, the random generators and, registered
# beside them, the `snapshot.DataLoader2` that feeds it. A loop of your own saves the step in
# the data snapshot and the model beside it, as one checkpoint (the last part). This notebook:
#
# 1. writes the script: a small regression, fed by a DataPipe graph read by two worker
#    processes, with a checkpoint every 10 steps;
# 2. runs it once without interruption, for reference;
# 3. runs it again and kills it at step 27, seven steps after its last checkpoint, then
#    starts it once more, as a job scheduler would;
# 4. checks that the restarted job picked up at step 20, trained on exactly the batches of
#    the uninterrupted run from there on (across an epoch boundary, with the next epoch's
#    shuffle), and ended with bit-for-bit the same weights;
# 5. does the same without accelerate: the step in the snapshot's metadata, the model and the
#    data saved as one checkpoint, and a job killed between the two writes.

# %%
# %%writefile train.py
"""Fit y = 3x + 1 with accelerate; resume from the latest checkpoint if there is one."""
import argparse
import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.integrations.accelerate import reading_service_for


def sample(i):
    """Sample i of the data set: always the same (x, y) pair."""
    g = torch.Generator().manual_seed(i)
    x = torch.rand(1, generator=g) * 4 - 2
    return x, 3 * x + 1 + 0.1 * torch.randn(1, generator=g)


def build_graph():
    graph = IterableWrapper(range(256)).shuffle(buffer_size=64).sharding_filter()
    return graph.map(sample).batch(16).collate()     # 16 batches an epoch


class Progress:
    """The step counter, checkpointed with everything else."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--crash-at", type=int)
    args = parser.parse_args()

    config = ProjectConfiguration(project_dir=args.run_dir, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = snapshot.DataLoader2(build_graph(), reading_service=reading_service_for(accelerator, num_workers=2))
    loader.seed(2024)
    progress = Progress()
    accelerator.register_for_checkpointing(loader, progress)

    log = open(os.path.join(args.run_dir, "steps.jsonl"), "a")
    if os.path.isdir(os.path.join(args.run_dir, "checkpoints")):
        accelerator.load_state()                      # the latest checkpoint
        accelerator.project_configuration.iteration = progress.step // args.every  # next: checkpoint_2, ...
        log.write(json.dumps({"resumed_at": progress.step}) + "\n")
    with loader:
        while progress.step < args.steps:
            for x, y in loader:                       # after load_state: the rest of the interrupted epoch
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                progress.step += 1
                log.write(json.dumps({"step": progress.step, "x": x.flatten().tolist(), "loss": loss.item()}) + "\n")
                log.flush()
                if progress.step % args.every == 0:
                    accelerator.save_state()          # model, optimizer, RNG, loader, progress
                if progress.step == args.crash_at:
                    os._exit(1)                       # killed: no clean-up, no last checkpoint
                if progress.step == args.steps:
                    break
    weights = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
    with open(os.path.join(args.run_dir, "weights.json"), "w") as f:
        json.dump(weights, f)


if __name__ == "__main__" and len(sys.argv) > 1:   # run as train.py, with its arguments
    main()

# %%
# Work in a scratch directory. Run as a plain script (`python tutorials/05_training_loop.py`), the
# `%%writefile` line above is only a comment: train.py is written from this file's own text.
import os
import sys
import tempfile
from pathlib import Path

if "__file__" in globals():
    _text = Path(__file__).read_text().split("# %%writefile train.py\n", 1)[1].split("\n# %%", 1)[0]
else:
    _text = Path("train.py").read_text()
    Path("train.py").unlink()
os.chdir(tempfile.mkdtemp(prefix="tutorial-"))
sys.path.insert(0, os.getcwd())   # modules written here are importable, as in a notebook
Path("train.py").write_text(_text)

# %% [markdown]
# ## An uninterrupted run, for reference

# %%
import json
import os
import subprocess
import sys


def run(run_dir, *options):
    os.makedirs(run_dir, exist_ok=True)
    return subprocess.run([sys.executable, "train.py", run_dir, *options], capture_output=True, text=True,
                          timeout=300)


def read_log(run_dir):
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights(run_dir):
    with open(os.path.join(run_dir, "weights.json")) as f:
        return json.load(f)


reference = run("runs/reference")
assert reference.returncode == 0, reference.stderr
reference_steps = {entry["step"]: entry for entry in read_log("runs/reference")}
print(f"{len(reference_steps)} steps, loss {reference_steps[1]['loss']:.3f} -> {reference_steps[40]['loss']:.4f}")
print("weights:", weights("runs/reference"))
assert reference_steps[40]["loss"] < reference_steps[1]["loss"] / 10   # it learns

# %% [markdown]
# ## A run that is killed at step 27, then restarted

# %%
crashed = run("runs/job", "--crash-at", "27")
assert crashed.returncode == 1                        # killed after step 27
print(sorted(os.listdir("runs/job/checkpoints")))     # the last two checkpoints: steps 10 and 20

restarted = run("runs/job")
assert restarted.returncode == 0, restarted.stderr
log = read_log("runs/job")
first_life = [e for e in log[:log.index({"resumed_at": 20})]]
second_life = log[log.index({"resumed_at": 20}) + 1:]
print(f"first life: steps {first_life[0]['step']}-{first_life[-1]['step']}, "
      f"second life: steps {second_life[0]['step']}-{second_life[-1]['step']}")

# %% [markdown]
# The second life resumed from the checkpoint of step 20 (steps 21 to 27 of the first life
# were lost with it, and are done again). From step 21 on, every batch is the uninterrupted
# run's: the rest of epoch 1, then epoch 2, shuffled with its own seed. Each step's loss is the
# same too, since the model and the optimizer's momentum came back exactly, and so are the
# final weights.

# %%
assert [e["step"] for e in second_life] == list(range(21, 41))
for entry in second_life:
    expected = reference_steps[entry["step"]]
    assert entry["x"] == expected["x"], f"step {entry['step']}: another batch"
    assert entry["loss"] == expected["loss"], f"step {entry['step']}: another loss"
for entry in first_life:                               # the lost steps were the same as well
    assert entry["x"] == reference_steps[entry["step"]]["x"]
assert weights("runs/job") == weights("runs/reference")
print("steps 21-40 after the restart: same batches, same losses; same final weights")

# %% [markdown]
# ## Without accelerate: the step in the snapshot, the model beside it
#
# A loop of your own saves the same things itself. Two habits make its checkpoints safe:
#
# - **the step goes into the data snapshot**, `save_snapshot(..., metadata={"step": step})`,
#   and comes back from `restore_snapshot(...).metadata`: nothing is parsed back from a file
#   name, and `snapshot inspect` shows it;
# - **the model and the data are one checkpoint**: a directory `step-NNNNNN/` holding
#   `model.pt` and `data.snap`, written under a hidden name and renamed into place. The rename
#   is the commit, so a job killed between the two writes leaves no half checkpoint, and the
#   rotation removes whole directories, so the model and the data stay paired. (Across ranks it
#   is the same, with a barrier: see the distributed how-to, `docs/how-to/distributed.md`.)

# %%
import glob
import shutil

import torch

import snapshot
from train import build_graph


def checkpoints(ckpt):
    """The committed checkpoints, oldest first (a checkpoint being written is hidden)."""
    return sorted(glob.glob(os.path.join(ckpt, "step-" + "[0-9]" * 6)))


def save_checkpoint(ckpt, step, model, optimizer, loader, keep_last=2, crash_between=False):
    name = f"step-{step:06d}"
    staging = os.path.join(ckpt, f".{name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)                 # left by a job killed while saving
    loader.save_snapshot(os.path.join(staging, "data.snap"), metadata={"step": step})
    if crash_between:
        raise SystemExit(f"killed at step {step}, between the two writes")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(staging, "model.pt"))
    os.rename(staging, os.path.join(ckpt, name))               # the commit: both, or neither
    for old in checkpoints(ckpt)[:-keep_last]:                 # whole checkpoints, oldest first
        os.rename(old, os.path.join(ckpt, f".{os.path.basename(old)}.old"))
        shutil.rmtree(os.path.join(ckpt, f".{os.path.basename(old)}.old"))


def fit(ckpt, steps=40, every=10, crash_between=None):
    """The regression of train.py, in this process; resumes from the newest checkpoint."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with snapshot.DataLoader2(build_graph()) as loader:
        found = checkpoints(ckpt)
        if found:
            saved = torch.load(os.path.join(found[-1], "model.pt"), weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            step = loader.restore_snapshot(os.path.join(found[-1], "data.snap")).metadata["step"]
            print(f"resumed from {os.path.basename(found[-1])}, step {step}")
        else:
            loader.seed(2024)
            step = 0
        while step < steps:
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                if step % every == 0:
                    save_checkpoint(ckpt, step, model, optimizer, loader, crash_between=step == crash_between)
                if step == steps:
                    break
    return [p.detach().flatten().tolist() for p in model.parameters()]


plain_reference = fit("runs/plain-reference")
try:
    fit("runs/plain", crash_between=30)                       # dies saving step 30
except SystemExit as death:
    print(death)
print(sorted(os.listdir("runs/plain")))                       # step 30's data, no model: not committed
assert [os.path.basename(c) for c in checkpoints("runs/plain")] == ["step-000010", "step-000020"]
assert fit("runs/plain") == plain_reference                   # from step 20: its model and its data
print(snapshot.load("runs/plain/step-000040/data.snap").metadata)

# %% [markdown]
# The killed job left `.step-000030.tmp` with the data snapshot of step 30 and no model: not a
# checkpoint, so the restart took step 20, whose model and data belong together, and ended
# with the uninterrupted run's weights. `snapshot inspect runs/plain/step-000040/data.snap`
# prints the step under `metadata`.

# %% [markdown]
# ## With Lightning
#
# Lightning writes and loads checkpoints itself: return the loader from
# `LightningDataModule.train_dataloader()`, wrapped in
# `snapshot.integrations.lightning.LightningLoader` (Lightning fetches one batch ahead; the
# wrapper keeps it in the checkpoint), and `Trainer.fit(ckpt_path=...)` resumes mid-epoch
# with the same batches. See the Lightning how-to (`docs/how-to/lightning.md`), and
# `snapshot.integrations.lightning.reading_service_for(trainer)` for the reading service
# that matches the strategy.
