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
# # 02 · Workers and rescaling
#
# `snapshot.MultiProcessingReadingService` loads in worker processes. Two promises come with
# it, and this notebook checks both with `assert`s:
#
# 1. **The stream does not depend on the number of workers.** The graph is cut at its
#    `sharding_filter` into L *logical shards*; workers only decide who runs which shard. For
#    a fixed seed and L, in-process and 1, 2, 3 or 4 workers yield the same batches.
# 2. **A snapshot taken with W workers restores onto another number of workers**, or
#    in-process, even though the workers had run ahead of the loader when it was taken: the
#    restored stream is the uninterrupted one, batch for batch, on up to L workers; on more, every
#    sample is still read exactly once.
#
# [Logical shards and topology independence](../docs/concepts/logical-shards.md) explains
# the mechanics.

# %%
import os
import subprocess
import sys
import tempfile
import time

from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot

L = 4       # logical shards
SEED = 7
os.chdir(tempfile.mkdtemp(prefix="tutorial-"))   # snapshot files go to a scratch directory


def load(i):
    """Stands for the expensive part: open, decode, augment sample i."""
    return i


def build_graph():
    return (IterableWrapper(range(96))
            .shuffle(buffer_size=16)     # the whole index, in the same order in every worker
            .sharding_filter()           # the sharding point: sample i goes to shard i % L
            .map(load)
            .shuffle(buffer_size=4)      # below the sharding point: one per logical shard
            .batch(4))


def epochs(service, count=2):
    """`count` epochs of the graph through `service`."""
    with snapshot.DataLoader2(build_graph(), reading_service=service) as loader:
        loader.seed(SEED)
        return [list(loader) for _ in range(count)]


# %% [markdown]
# ## 1. One stream, whatever the number of workers
#
# The reference runs in this process, with the graph cut into `L` logical shards. Then the
# same graph runs with 1 to 4 worker processes: worker `w` runs shards `w`, `w + W`, ...,
# and the loader takes one batch from shard 0, 1, 2, 3, 0, ... in turn.

# %%
reference = epochs(snapshot.InProcessReadingService(logical_shards=L))
print("epoch 0 starts with", reference[0][:3])

for workers in range(1, L + 1):
    start = time.perf_counter()
    got = epochs(snapshot.MultiProcessingReadingService(num_workers=workers, logical_shards=L))
    print(f"{workers} worker(s): same 2 epochs as in-process: {got == reference} "
          f"({time.perf_counter() - start:.2f} s)")
    assert got == reference

assert reference[0] != reference[1]          # each epoch is reshuffled

# %% [markdown]
# What the stream depends on is the seed and L. Another number of logical shards is another
# (equally valid) order of the same samples. Without `logical_shards=`,
# `MultiProcessingReadingService(num_workers=W)` takes L = W on a first run, so choose L
# for the most workers you may want later.

# %%
def ids(batches):
    return [i for batch in batches for i in batch]


other = epochs(snapshot.InProcessReadingService(logical_shards=2))
assert other[0] != reference[0]
assert sorted(ids(other[0])) == sorted(ids(reference[0])) == list(range(96))

# %% [markdown]
# ## 2. A snapshot while two workers run ahead
#
# Two workers, four logical shards: each worker runs two. The loader asks each shard for
# `prefetch_factor` (default 2) batches ahead, so while the training step runs, the workers
# produce batches the loader has not yielded yet. The snapshot does not stop them and does
# not lose those batches: it stores them, by value, as *in flight*.

# %%
loader = snapshot.DataLoader2(build_graph(),
                              reading_service=snapshot.MultiProcessingReadingService(num_workers=2, logical_shards=L))
loader.seed(SEED)
it = iter(loader)
seen = [next(it) for _ in range(5)]
time.sleep(0.5)                              # "the training step": the workers run ahead meanwhile
snap = loader.save_snapshot("workers.snap")
rest = list(it)                              # the uninterrupted run goes on
following = list(loader)                     # and its next epoch
loader.shutdown()
assert seen + rest == reference[0] and following == reference[1]   # the snapshot changed nothing

# %% [markdown]
# The manifest (read without unpickling anything) has the layout, and per logical shard the
# batches the loader `yielded`, those the shard had `produced`, and the difference, stored in
# the snapshot: `in_flight`.

# %%
manifest = snapshot.read_manifest("workers.snap")
print(manifest["service"])
print("shard  yielded  produced  in flight")
for index, shard in enumerate(manifest["shards"]):
    print(f"{index:5}  {shard['yielded']:7}  {shard['produced']:8}  {shard['in_flight']:9}")
    assert shard["produced"] == shard["yielded"] + shard["in_flight"]
assert manifest["loader"]["yielded"] == 5
assert sum(shard["yielded"] for shard in manifest["shards"]) == 5
assert sum(shard["in_flight"] for shard in manifest["shards"]) > 0

# %% [markdown]
# `snapshot inspect` shows the same, with the part of the graph above the sharding point that
# each worker ran (how far its copy had read, and what it had queued for its shards):

# %%
shown = subprocess.run([sys.executable, "-m", "snapshot", "inspect", "workers.snap"],
                       capture_output=True, text=True, check=True).stdout
print(shown[shown.index("Reading service"):shown.index("Buffers")])

# %% [markdown]
# ## 3. Restore onto one worker, and in-process
#
# A fresh loader, with the graph built in code and **another** reading service, restores the
# snapshot. The batches that were in flight come first, then each logical shard continues
# from its own state; the loader takes its place in the round-robin. The rest of the epoch,
# and the next epoch, are exactly those of the uninterrupted run. The restored loader keeps
# the snapshot's L = 4, whatever its number of workers.

# %%
for service in (snapshot.MultiProcessingReadingService(num_workers=1),
                snapshot.InProcessReadingService()):
    with snapshot.DataLoader2(build_graph(), reading_service=service) as restored:
        restored.restore_snapshot("workers.snap")
        got_rest, got_following = list(restored), list(restored)
    name = type(service).__name__ + (f"(num_workers={service.num_workers})" if service.workers else "()")
    print(f"{name}: rest of epoch 0 exact: {got_rest == rest}; epoch 1 exact: {got_following == following}")
    assert got_rest == rest and got_following == following

# %% [markdown]
# Exactly once, in terms of samples: the batches yielded before the snapshot and those
# yielded after the restore hold every sample of the epoch once.

# %%
assert sorted(ids(seen) + ids(rest)) == list(range(96))
print(f"{len(ids(seen))} samples before the snapshot + {len(ids(rest))} after the restore = 96, none twice")

# %% [markdown]
# ## 4. More workers than logical shards
#
# Each logical shard runs in one worker, so 5 workers cannot share the snapshot's 4 shards whole.
# The restore splits each shard into sub-shards from where it stood, so that every worker has
# one (lcm(4, 5) = 20 sub-shards, 4 per worker), as a restore onto another number of ranks does.
# The plan says so before anything runs:

# %%
plan = subprocess.run([sys.executable, "-m", "snapshot", "inspect", "workers.snap", "--plan-for", "1x5"],
                      capture_output=True, text=True, check=True).stdout
print(plan)
assert "runs as 20 unit(s)" in plan

# %% [markdown]
# Every sample is still read exactly once, the batches in flight included; what changes is the
# order. The rest of the epoch is the round-robin over the 20 sub-shards (a batch is made of one
# sub-shard's samples), and the next epochs are the stream of a job started with 5 workers and
# `logical_shards=4`. To keep one identical stream while adding workers, start the job with
# `logical_shards=` a multiple of every number of workers you may use.

# %%
with snapshot.DataLoader2(build_graph(), reading_service=snapshot.MultiProcessingReadingService(num_workers=5)) \
        as restored:
    restored.restore_snapshot("workers.snap")
    split_rest, split_following = list(restored), list(restored)
assert sorted(ids(seen) + ids(split_rest)) == list(range(96))      # every sample once
assert sorted(ids(split_following)) == list(range(96))             # and in the next epoch
assert split_following == epochs(snapshot.MultiProcessingReadingService(num_workers=5, logical_shards=L))[1]
print(f"5 workers: {len(ids(seen))} + {len(ids(split_rest))} samples, none twice; epoch 1 as a job started on 5")

# %% [markdown]
# ## What to take away
#
# - Put a `sharding_filter` after what must see the whole dataset (a shuffle of the index or
#   of file names) and before the expensive work.
# - The stream depends on the seed and the number of logical shards L, not on the number of
#   workers. L is fixed by the first run (`logical_shards=`, default: the number of workers)
#   and saved in every snapshot.
# - Snapshots are exact while workers run ahead, and restore onto any number of workers, or
#   in-process: up to L with the same stream, beyond L with the shards split into sub-shards
#   (every sample once, another order). Choose `logical_shards=` for the most workers you may use
#   to keep one stream.
#
# Across ranks, each rank yields its share of the same stream, and a snapshot restores onto
# another number of ranks with every sample once: see
# [distributed training](../docs/how-to/distributed.md).
