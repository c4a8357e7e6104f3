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
# # 01 · Quick start: save, crash, restore
#
# A training job reads its data through a graph of DataPipes. Every few steps it saves the
# model *and* the position of the data stream. Then it crashes: the process is killed, with
# no chance to clean up. A new process loads the last checkpoint and continues.
#
# This notebook runs that story for real, with three processes, and checks the claim that
# matters: **the batches seen before the last snapshot, followed by the batches seen after
# the restore, are exactly the batches of an uninterrupted run**, and the final weights are
# bit-identical.
#
# The training script is written to `train.py` in the working directory by the next cell.

# %%
# %%writefile train.py
"""Train a tiny model for 2 epochs; log a fingerprint of every batch it sees.

    python train.py reference|crashing|resumed WORKDIR
"""
import hashlib
import json
import os
import signal
import sys

import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot

EPOCHS, SEED, SAVE_EVERY, CRASH_AT = 2, 2024, 5, (0, 13)   # crash at epoch 0, step 13


def make_sample(i):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, generator=g)
    return x, (x.sum() > 0).float()


def build_graph():
    return IterableWrapper(range(640)).shuffle(buffer_size=100).map(make_sample).batch(16).collate()


def digest(*tensors):
    return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in tensors)).hexdigest()[:12]


def main(role, workdir):
    log = open(os.path.join(workdir, f"{role}.jsonl"), "a")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start_epoch, start_step = 0, 0

    if role == "resumed":
        ckpt = torch.load(os.path.join(workdir, "model.pt"), weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_epoch, start_step = ckpt["epoch"], ckpt["step"]
        dl = snapshot.DataLoader2.from_snapshot(os.path.join(workdir, "data.snap"))  # the graph is inside
    else:
        dl = snapshot.DataLoader2(build_graph())
        dl.seed(SEED)

    for epoch in range(start_epoch, EPOCHS):
        for step, (x, y) in enumerate(dl, start=start_step if epoch == start_epoch else 0):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y).backward()
            opt.step()
            log.write(json.dumps({"epoch": epoch, "step": step, "batch": digest(x, y)}) + "\n")
            log.flush()
            if role == "crashing" and (step + 1) % SAVE_EVERY == 0:
                # the model and the data position, saved together (both writes are atomic)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "epoch": epoch, "step": step + 1}, os.path.join(workdir, "model.tmp"))
                dl.save_snapshot(os.path.join(workdir, "data.snap"))
                os.replace(os.path.join(workdir, "model.tmp"), os.path.join(workdir, "model.pt"))
                log.write(json.dumps({"checkpoint": [epoch, step + 1]}) + "\n")
                log.flush()
            if role == "crashing" and (epoch, step) == CRASH_AT:
                os.kill(os.getpid(), signal.SIGKILL)                      # no clean-up, no goodbye

    log.write(json.dumps({"weights": digest(*model.parameters())}) + "\n")
    dl.shutdown()


if __name__ == "__main__" and len(sys.argv) == 3:
    main(sys.argv[1], sys.argv[2])

# %% tags=["remove-input"]
# Set-up (its code is hidden on the site): work in a scratch directory. Run as a plain script
# (`python tutorials/01_quickstart.py`), the `%%writefile` line above is only a comment:
# train.py is written from this file's own text.
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
Path("train.py").write_text(_text)
sys.path.insert(0, os.getcwd())   # modules written here are importable, as in a notebook

# %% [markdown]
# A helper runs the script as a separate process and reads its log.

# %%
import json
import os
import signal
import subprocess
import sys
import tempfile

import snapshot

workdir = tempfile.mkdtemp(prefix="quickstart-")


def run(role):
    proc = subprocess.run([sys.executable, "train.py", role, workdir], capture_output=True, text=True,
                          timeout=600)
    print(f"{role}: exit status {proc.returncode}")
    if proc.stderr:
        print(proc.stderr[-2000:])
    return proc.returncode


def read_log(role):
    with open(os.path.join(workdir, f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


# %% [markdown]
# ## 1. The uninterrupted run
#
# 640 samples in batches of 16 make 40 batches per epoch, 80 over the two epochs.

# %%
assert run("reference") == 0
reference = read_log("reference")
expected = [r["batch"] for r in reference if "batch" in r]
print(len(expected), "batches; final weights", reference[-1]["weights"])
assert len(expected) == 80

# %% [markdown]
# ## 2. A run that crashes
#
# It saves after every 5 steps and is killed with `SIGKILL` right after training on step 13
# of the first epoch (steps count from 0). Its last checkpoint was taken after step 9, so the
# four batches of steps 10 to 13 were trained on after it: their updates are lost with the crash.

# %%
assert run("crashing") == -signal.SIGKILL
crashed = read_log("crashing")
checkpoints = [r["checkpoint"] for r in crashed if "checkpoint" in r]
print("checkpoints written:", checkpoints)
assert checkpoints[-1] == [0, 10]
seen_after = [r["step"] for r in crashed if "batch" in r and (r["epoch"], r["step"]) >= (0, 10)]
print("steps trained on after the last checkpoint:", seen_after)
assert seen_after == [10, 11, 12, 13]   # the four batches the text above speaks of

# %% [markdown]
# The snapshot on disk can be read without unpickling anything. It says where the stream
# stood when the last checkpoint was taken: 10 batches into epoch 0.

# %%
manifest = snapshot.read_manifest(os.path.join(workdir, "data.snap"))
print(manifest["loader"])
print("seed:", manifest["randomness"]["seed"], "| file size:", manifest["_file"]["size"], "bytes")
assert manifest["loader"]["epoch"] == 0 and manifest["loader"]["yielded"] == 10

# %% [markdown]
# ## 3. A new process restores and finishes
#
# It loads the model checkpoint and calls `snapshot.DataLoader2.from_snapshot("data.snap")`:
# the graph is pickled in the file, and the loader continues at batch 11 of epoch 0.

# %%
assert run("resumed") == 0
resumed = read_log("resumed")
print("first batch after the restore:", resumed[0])
assert (resumed[0]["epoch"], resumed[0]["step"]) == (0, 10)

# %% [markdown]
# ## 4. The proof
#
# The batches the crashed run saw *before its last checkpoint*, followed by the batches the
# resumed run saw, must be exactly the uninterrupted run's batches, and training on them
# must give bit-identical weights.

# %%
last = tuple(checkpoints[-1])
before = [r["batch"] for r in crashed if "batch" in r and (r["epoch"], r["step"]) < last]
after = [r["batch"] for r in resumed if "batch" in r]
lost = sum(1 for r in crashed if "batch" in r) - len(before)
print(f"{len(before)} batches before the last checkpoint + {len(after)} after the restore "
      f"({lost} seen after the checkpoint were lost with the crash and seen again)")
assert before + after == expected, "the resumed stream differs from the uninterrupted one"
assert resumed[-1]["weights"] == reference[-1]["weights"], "the final weights differ"
print("same stream, batch for batch; same final weights:", resumed[-1]["weights"])

# %% [markdown]
# ## What to take away
#
# - `dl.save_snapshot(path)` next to your model checkpoint; both writes are atomic.
# - `DataLoader2.from_snapshot(path)` in the new process (or build the graph in code and
#   call `restore_snapshot(path)`).
# - The rest of the epoch, and every later epoch, is what it would have been.
#
# Next: [03 · state hooks](03_state_hooks.py) for your own DataPipes, and
# [04 · inspecting snapshots](04_inspecting_snapshots.py).
