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
# # 04 · Inspecting snapshots offline
#
# A snapshot file carries a JSON *manifest* next to its pickled payload. The manifest says
# where the stream stood, how the graph looked, how big each node's state is, and how a
# restore would proceed, and it can be read **without unpickling anything**: no code from the
# file runs, and the graph's own modules need not be installed. This notebook:
#
# 1. saves a snapshot of a graph that uses a module of its own;
# 2. removes that module, and still reads everything with `snapshot.read_manifest` and the
#    `snapshot inspect` command, while a real restore, which must unpickle the graph, says
#    clearly what is missing;
# 3. measures restore time against position for the `fast_forward` and `state` strategies,
#    and plots it.

# %%
# %%writefile features.py
from torch.utils.data.datapipes.iter import IterableWrapper


def features(i):
    return {"id": i, "square": i * i}


def build_graph():
    return IterableWrapper(range(1_000)).shuffle(buffer_size=64).map(features).batch(8)


# %% tags=["remove-input"]
# Set-up (its code is hidden on the site): work in a scratch directory. Run as a plain script
# (`python tutorials/04_inspecting_snapshots.py`), the `%%writefile` line above is only a comment:
# features.py is written from this file's own text.
import os
import sys
import tempfile
from pathlib import Path

if "__file__" in globals():
    _text = Path(__file__).read_text().split("# %%writefile features.py\n", 1)[1].split("\n# %%", 1)[0]
else:
    _text = Path("features.py").read_text()
    Path("features.py").unlink()
os.chdir(tempfile.mkdtemp(prefix="tutorial-"))
Path("features.py").write_text(_text)
sys.path.insert(0, os.getcwd())   # modules written here are importable, as in a notebook

# %%
import importlib
import json
import os
import subprocess
import sys
import time

import matplotlib.pyplot as plt
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from features import build_graph

dl = snapshot.DataLoader2(build_graph())
dl.seed(7)
it = iter(dl)
for _ in range(25):
    next(it)
dl.save_snapshot("run.snap", verify=4)   # also record fingerprints of the next 4 batches
dl.shutdown()
print(os.path.getsize("run.snap"), "bytes")

# %% [markdown]
# ## 1. "Another machine": the graph's module is gone

# %%
os.remove("features.py")
del sys.modules["features"]
importlib.invalidate_caches()

# %% [markdown]
# ## 2. Reading the manifest
#
# `read_manifest` checks the header and the manifest's checksum, parses the JSON, and stops:
# the payload is not even read.

# %%
manifest = snapshot.read_manifest("run.snap")
print("position:", manifest["loader"])
print("seed:", manifest["randomness"]["seed"], f'({manifest["randomness"]["seed_source"]})')
print("versions:", manifest["versions"])
print("verify:", manifest["verify"]["count"], "fingerprints")
shard = manifest["shards"][0]
print("plan:", shard["plan"])
for node in manifest["graph"]["nodes"]:
    record = shard["nodes"][node["path"]]
    print(f'{node["path"]:30} {node["type"].rsplit(".", 1)[-1]:28} yielded={record["yielded"]:<4} '
          f'state={record["state_bytes"]}B buffered={record["buffered"]}')

assert manifest["loader"]["epoch"] == 0 and manifest["loader"]["yielded"] == 25
assert shard["nodes"]["0/datapipe"]["yielded"] == 25 * 8                  # the map saw 200 samples
assert shard["nodes"]["0/datapipe/datapipe"]["buffered"] == 64           # the full shuffle buffer
assert manifest["graph"]["nodes"][1]["args"]["fn"] == "features.features"  # named, not imported
assert shard["plan"]["drivers"] == []                                     # restore: all from state

# %% [markdown]
# The `snapshot` command prints the same as a report (`--json` prints the manifest itself).
# It runs in its own process, where `features` does not exist either.

# %%
command = [sys.executable, "-m", "snapshot", "inspect"]
# fitted to 80 columns, as on a terminal that wide (a pipe gets whole lines otherwise)
report = subprocess.run([*command, "run.snap"], capture_output=True, text=True,
                        env={**os.environ, "COLUMNS": "80"})
print(report.stdout + report.stderr)
assert max(len(line) for line in report.stdout.splitlines()) <= 80
assert report.returncode == 0 and "Mapper(fn=features.features)" in report.stdout

as_json = subprocess.run([*command, "--json", "run.snap"], capture_output=True, text=True, check=True)
assert json.loads(as_json.stdout)["graph"] == manifest["graph"]

# %% [markdown]
# A restore is a different matter: it must unpickle the graph, which refers to
# `features.features`. It fails before touching anything, and says what to do.

# %%
try:
    snapshot.DataLoader2.from_snapshot("run.snap")
except snapshot.SerializationError as error:
    print(error)
    assert "features" in str(error)
else:
    raise AssertionError("restoring without the graph's module must fail clearly")

# %% [markdown]
# ## 3. Restore time against position
#
# How long does a restore take, as a function of how far into the epoch the snapshot was
# taken? Take snapshots of `IterableWrapper(range(200_000)).shuffle(buffer_size=1000).map(f)`
# at several positions, restore each into a freshly built loader with both strategies, and
# time it up to the first sample after the cut (best of 5).
#
# - `fast_forward` rebuilds the graph and replays every sample since the start of the
#   epoch: its cost grows with the position.
# - `state` puts every node back from its saved state (here, mostly the 1,000-sample
#   shuffle buffer): its cost depends on the size of the state, not on the position.

# %%
def double(x):
    return 2 * x


def build_timed():
    return IterableWrapper(range(200_000)).shuffle(buffer_size=1_000).map(double)


positions = [0, 10_000, 20_000, 40_000, 80_000, 120_000]
snaps, following = {}, {}
dl = snapshot.DataLoader2(build_timed())
dl.seed(0)
it = iter(dl)
done = 0
for n in positions:
    for _ in range(n - done):
        next(it)
    done = n
    snaps[n] = dl.save_snapshot().to_bytes()
    following[n] = next(it)                 # what the uninterrupted run yields next
    done += 1


def restore_seconds(data, strategy, expected, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        loader = snapshot.DataLoader2(build_timed())
        loader.restore_snapshot(data, strategy=strategy)
        first = next(iter(loader))
        best = min(best, time.perf_counter() - start)
        assert first == expected, f"{strategy} restore is not exact"
    return best


timings = {strategy: [restore_seconds(snaps[n], strategy, following[n]) for n in positions]
           for strategy in ("fast_forward", "state")}
for i, n in enumerate(positions):
    print(f"n={n:>7,}: fast_forward {timings['fast_forward'][i] * 1e3:7.1f} ms   "
          f"state {timings['state'][i] * 1e3:6.1f} ms")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for strategy, marker in (("fast_forward", "o"), ("state", "s")):
    ax.plot([n / 1e3 for n in positions], [t * 1e3 for t in timings[strategy]], marker=marker,
            label=f'strategy="{strategy}"')
ax.set_xlabel("position of the snapshot (thousand samples into the epoch)")
ax.set_ylabel("restore time to the next sample (ms)")
ax.set_title("Restore time against position")
ax.grid(True, alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# The claim, checked with a generous margin so that a busy machine does not make it flaky:
# from the first to the last position, the `state` restore time grows far less than the
# `fast_forward` one, and at the last position `state` is several times faster.

# %%
ff, st = timings["fast_forward"], timings["state"]
ff_growth, state_growth = ff[-1] - ff[0], st[-1] - st[0]
print(f"growth from n=0 to n={positions[-1]:,}: fast_forward +{ff_growth * 1e3:.1f} ms, "
      f"state {state_growth * 1e3:+.1f} ms")
assert ff_growth > 10 * max(state_growth, 0.002), "state restore time should barely grow with the position"
assert st[-1] < ff[-1] / 5, "at the last position, state should be several times faster than fast_forward"

# %% [markdown]
# The [benchmarks page](../docs/benchmarks.md) has the same measurement up to a million
# samples, side by side with torch's own fast-forward and torchdata's `StatefulDataLoader`.
