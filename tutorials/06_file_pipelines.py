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
# # 06 · Resuming a WebDataset pipeline
#
# Real jobs read files: here, WebDataset-style tar shards, each sample a group of members
# (`KEY.jpg`, `KEY.json`, `KEY.cls`) read by torchdata 0.9's `load_from_tar` and `webdataset`.
# This notebook:
#
# 1. writes a small corpus of tar shards;
# 2. reads it through the pipeline a user would write, and saves a snapshot mid-epoch;
# 3. restores the snapshot into a fresh loader and checks that the rest of the epoch is, batch for
#    batch, the uninterrupted run's; then the same with two worker processes;
# 4. looks at what the snapshot says about each pipe, at what a restore reads, and at the shuffle
#    buffer saved by value or by address (`buffer_state="positions"`).
#
# See [Resume file pipelines](../how-to/resume-file-pipelines.md) for what each reader saves.

# %%
import io
import json
import os
import random
import tarfile
import tempfile

os.chdir(tempfile.mkdtemp(prefix="tutorial-"))   # a scratch directory for the corpus and snapshots
os.makedirs("shards")
for shard in range(6):
    with tarfile.open(f"shards/shard-{shard:02d}.tar", "w") as tar:
        for i in range(shard * 40, shard * 40 + 40):
            rng = random.Random(i)
            key = f"sample{i:05d}"
            members = {"jpg": rng.randbytes(2048), "json": json.dumps({"key": key}).encode(),
                       "cls": str(rng.randrange(10)).encode()}
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
print(sorted(os.listdir("shards")), "240 samples")

# %% [markdown]
# ## The pipeline
#
# List the shards, shuffle and shard them, open them in binary mode, unpack them, group the
# members of each sample, decode, shuffle samples in a buffer and batch. Each sample keeps its
# key, so that we can compare streams.

# %%
import warnings

warnings.filterwarnings("ignore", category=UserWarning, module="torchdata")   # torchdata 0.9's deprecation banner

import torch
from torchdata.datapipes.iter import FileLister

import snapshot


def decode(sample):
    return {"key": os.path.basename(sample["__key__"]),
            "image": torch.frombuffer(bytearray(sample[".jpg"].read()), dtype=torch.uint8),
            "meta": json.loads(sample[".json"].read()), "label": int(sample[".cls"].read())}


def build():
    return (FileLister("shards", "*.tar").shuffle().sharding_filter().open_files(mode="b")
            .load_from_tar().webdataset().map(decode).shuffle(buffer_size=50).batch(8))


def keys(batches):
    return [[sample["key"] for sample in batch] for batch in batches]


def loader(workers=0, buffer_state="values"):
    service = snapshot.MultiProcessingReadingService(workers) if workers else None
    return snapshot.DataLoader2(build(), reading_service=service, buffer_state=buffer_state)


dl = loader()
dl.seed(0)
uninterrupted = keys(dl)
dl.shutdown()
print(len(uninterrupted), "batches; the first:", uninterrupted[0])

# %% [markdown]
# ## Save mid-epoch, restore, compare
#
# After 17 of the 30 batches, the loader saves a snapshot to a file. A fresh loader, built from
# the same code (as a restarted job would), restores it and yields the rest of the epoch.

# %%
dl = loader()
dl.seed(0)
it = iter(dl)
for _ in range(17):
    next(it)
snap = dl.save_snapshot("mid-epoch.snap")
dl.shutdown()

restored = loader()
restored.restore_snapshot("mid-epoch.snap")
rest = keys(restored)
restored.shutdown()
assert rest == uninterrupted[17:], "the restored stream differs from the uninterrupted one"
print(f"restored at batch 17: the next {len(rest)} batches are the uninterrupted run's")

# %% [markdown]
# ## What the snapshot says about each pipe
#
# The manifest (readable without unpickling anything) lists every node with how a restore
# puts it back: `state` (from its saved state) or `replay` (re-run from the nearest input that
# has state), and the plan names the pipes it replays and why.

# %%
shard = snap.manifest["shards"][0]
for path, node in shard["nodes"].items():
    kind = snap.manifest["graph"]["nodes"][[n["path"] for n in snap.manifest["graph"]["nodes"]].index(path)]["type"]
    print(f"{kind.rsplit('.', 1)[-1]:42} restore={node['restore']:6} yielded={node['yielded']}")
print("replayed:", shard["plan"]["drivers"] or "nothing")
assert shard["plan"]["drivers"] == [], "every pipe of this pipeline restores from its state"

# %% [markdown]
# ## With two worker processes
#
# The same pipeline, read by two workers: each worker reads its own shards. A snapshot taken while
# the workers run ahead accounts for the batches they made and the loader has not yielded yet.

# %%
dl = loader(workers=2)
dl.seed(0)
two_workers = keys(dl)
dl.shutdown()

dl = loader(workers=2)
dl.seed(0)
it = iter(dl)
for _ in range(12):
    next(it)
dl.save_snapshot("workers.snap")
dl.shutdown()

restored = loader(workers=2)
restored.restore_snapshot("workers.snap")
assert keys(restored) == two_workers[12:]
restored.shutdown()
print("with 2 workers: restored at batch 12, the rest of the epoch is the uninterrupted run's")

# %% [markdown]
# ## What a restore reads
#
# Each file reader saved where it stands (the tar shard's path, size and modification time, and the
# offset of the next member's header), not what it read. So a restore reads the snapshot and the
# members from that offset on, not the shards before it. On Linux, `/proc/self/io` counts the bytes
# this process reads (`rchar`): compare a restore with a plain pass from the start of the epoch to
# the same batch.

# %%
def bytes_read():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


before = bytes_read()
dl = loader()
dl.seed(0)
it = iter(dl)
for _ in range(18):
    next(it)
dl.shutdown()
plain = bytes_read() - before

before = bytes_read()
restored = loader()
restored.restore_snapshot("mid-epoch.snap")
next(iter(restored))
restored.shutdown()
restore = bytes_read() - before
print(f"a plain pass to batch 18 reads {plain / 1024:.0f} KiB; the restore, to the same batch, "
      f"{restore / 1024:.0f} KiB (the snapshot file is {os.path.getsize('mid-epoch.snap') / 1024:.0f} KiB)")
assert restore < plain

# %% [markdown]
# ## The shuffle buffer: values or addresses
#
# The sample shuffle holds up to 50 decoded samples, and by default (`buffer_state="values"`)
# the snapshot stores them: they are most of its size. With `buffer_state="positions"` each
# buffered sample is saved as its address instead (its shard and member, and the `map` applied
# after the reader), and a restore reads it again. Either way, the restored stream is the same.

# %%
sizes = {}
for buffer_state in ("values", "positions"):
    dl = loader(buffer_state=buffer_state)
    dl.seed(0)
    it = iter(dl)
    for _ in range(17):
        next(it)
    snap = dl.save_snapshot(f"{buffer_state}.snap")
    dl.shutdown()
    restored = loader(buffer_state=buffer_state)
    restored.restore_snapshot(f"{buffer_state}.snap")
    assert keys(restored) == uninterrupted[17:]
    restored.shutdown()
    shuffle = snap.manifest["shards"][0]["nodes"]["0/datapipe"]
    sizes[buffer_state] = os.path.getsize(f"{buffer_state}.snap")
    print(f"{buffer_state:9}: {sizes[buffer_state] / 1024:6.1f} KiB, "
          f"{shuffle['buffered']} samples buffered, saved as: {shuffle['buffer_state']}")
assert shuffle["buffer_state"] == "positions"
assert sizes["positions"] < sizes["values"] / 2
