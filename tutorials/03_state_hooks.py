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
# # 03 · State hooks for your own pipe
#
# Every DataPipe that ships with torch has a *state hook*: a restore puts it back from its
# saved state, in time proportional to the size of that state. A DataPipe you write yourself,
# as a generator, keeps its position in local variables that nobody can read. `snapshot`
# still restores it exactly, by *replaying* it. This notebook shows:
#
# 1. a generator pipe without a hook: the restore plan replays it, and says why;
# 2. the same pipe with a hook: restored from its state, nothing replayed;
# 3. how `snapshot.testing.assert_resumes_exactly` proves a hook right, and catches a wrong one.
#
# The pipe goes in a module, `my_pipes.py`, as it would in your project: a snapshot's
# pickled graph refers to its class by module and name, and the process that restores it
# imports it from there. (Keep DataPipe classes out of `__main__`, that is out of notebook
# cells and directly-run scripts, for now: `dill` pickles such classes by value and loses
# their `IterDataPipe` base class on the way.)

# %%
# %%writefile my_pipes.py
from collections import deque

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper


class Windows(IterDataPipe):
    """Sliding windows of `size` consecutive samples: (a, b, c), (b, c, d), ..."""

    def __init__(self, datapipe, size):
        self.datapipe, self.size = datapipe, size

    def __iter__(self):
        window = deque(maxlen=self.size)
        for x in self.datapipe:
            window.append(x)
            if len(window) == self.size:
                yield tuple(window)


def build_graph():
    return Windows(IterableWrapper(range(200)).shuffle(buffer_size=16), size=3).batch(4)


# %%
# Work in a scratch directory. Run as a plain script (`python tutorials/03_state_hooks.py`), the
# `%%writefile` line above is only a comment: my_pipes.py is written from this file's own text.
import os
import sys
import tempfile
from pathlib import Path

if "__file__" in globals():
    _text = Path(__file__).read_text().split("# %%writefile my_pipes.py\n", 1)[1].split("\n# %%", 1)[0]
else:
    _text = Path("my_pipes.py").read_text()
    Path("my_pipes.py").unlink()
os.chdir(tempfile.mkdtemp(prefix="tutorial-"))
sys.path.insert(0, os.getcwd())   # modules written here are importable, as in a notebook
Path("my_pipes.py").write_text(_text)

# %%
import subprocess
import sys

import snapshot
from snapshot.hooks import ResumableIterator, register_state_hook
from snapshot.testing import assert_resumes_exactly

from my_pipes import Windows, build_graph

STRATEGIES = ("state", "auto", "fast_forward")


def snapshot_after(batches, path=None):
    """A snapshot of a seeded loader over `build_graph()`, taken after `batches` batches."""
    dl = snapshot.DataLoader2(build_graph())
    dl.seed(0)
    it = iter(dl)
    for _ in range(batches):
        next(it)
    return dl.save_snapshot(path)


def show(snap):
    shard = snap.manifest["shards"][0]
    print("plan:", shard["plan"])
    for path, node in shard["nodes"].items():
        print(f"  {path:28} restore={node['restore']:7} yielded={node['yielded']}")
    return shard


# %% [markdown]
# ## 1. Without a hook, the pipe is replayed
#
# After 10 batches of 4 windows, `Windows` (at path `0/datapipe`) has yielded 40 windows.
# The plan recorded in the snapshot replays those 40, together with the shuffle and the
# source under it; the batch on top is still restored from its state.

# %%
shard = show(snapshot_after(10))
assert shard["plan"]["drivers"] == [{"path": "0/datapipe", "replay": 40}]
assert "no state hook" in shard["plan"]["reasons"]["0/datapipe"]
assert shard["nodes"]["0"]["restore"] == "state"
assert {shard["nodes"][p]["restore"] for p in ("0/datapipe", "0/datapipe/datapipe")} == {"replay"}

# %% [markdown]
# Replaying is exact, just slower: the harness cuts the stream at many points (start, first
# sample, middle, last, end of epoch, the next epoch, twice in a row), restores each cut into a
# fresh loader and compares sample by sample. `strategy="state"` is refused up front, naming
# the node that has no hook.

# %%
report = assert_resumes_exactly(build_graph, strategies=("auto", "fast_forward"))
print("exact at", len(report.cuts), "cut points; epoch lengths", report.epoch_lengths)

try:
    snapshot.DataLoader2(build_graph()).restore_snapshot(snapshot_after(10), strategy="state")
except snapshot.StrategyError as error:
    print(error)
else:
    raise AssertionError("strategy='state' must be refused for a pipe without a hook")

# %% [markdown]
# ## 2. Give it a hook
#
# For a generator pipe, the hook is a *resumable iterator*: an iterator that yields exactly
# what `Windows.__iter__` yields, but keeps its position in attributes, so that it can be read
# between two samples (`get_state`) and put back (`set_state`). The engine runs it in place of
# the generator; your graph does not change.
#
# `get_state` returns plain values: here, the samples in the current window. It never
# includes the input's position: every node is restored on its own, and the input is back in
# place before `set_state` is called.

# %%
class WindowsIterator(ResumableIterator):
    def __init__(self, datapipe, inputs):
        super().__init__(datapipe, inputs)       # inputs: iterators of the input pipes
        self.window = []

    def next(self):
        while True:
            self.window = (self.window + [next(self.inputs[0])])[-self.datapipe.size:]
            if len(self.window) == self.datapipe.size:
                return tuple(self.window)

    def get_state(self):
        return {"window": list(self.window)}

    def set_state(self, state):
        self.window = list(state["window"])


register_state_hook(Windows, WindowsIterator)

# %% [markdown]
# The same snapshot now restores every node from its state: nothing is replayed.

# %%
shard = show(snapshot_after(10))
assert shard["plan"]["drivers"] == [] and shard["plan"]["reasons"] == {}
assert {node["restore"] for node in shard["nodes"].values()} == {"state"}

# %% [markdown]
# `snapshot inspect` shows the plan too, reading only the manifest (nothing is unpickled):

# %%
snapshot_after(10, "windows.snap")
shown = subprocess.run([sys.executable, "-m", "snapshot", "inspect", "windows.snap"],
                       capture_output=True, text=True, check=True).stdout
print(shown)
assert "Windows" in shown

# %% [markdown]
# And the harness proves the hook right, with every strategy, `state` included:

# %%
report = assert_resumes_exactly(build_graph, strategies=STRATEGIES)
print("exact at", len(report.cuts), "cut points with", report.strategies)

# %% [markdown]
# ## 3. The harness catches a wrong hook
#
# A hook that forgets part of its state is the typical mistake. This one does not save the
# window: after a restore the window starts empty, so the pipe skips the windows that
# needed the lost samples, and the harness says where the stream diverges.

# %%
class ForgetfulWindowsIterator(WindowsIterator):
    def get_state(self):
        return {"window": []}                    # wrong: the window is lost


register_state_hook(Windows, ForgetfulWindowsIterator, replace=True)
try:
    assert_resumes_exactly(build_graph, strategies=("state",))
except AssertionError as error:
    print(error)
    assert "diverges" in str(error)
else:
    raise AssertionError("the harness must catch a hook that loses its window")

register_state_hook(Windows, WindowsIterator, replace=True)   # back to the right one
report = assert_resumes_exactly(build_graph, strategies=STRATEGIES)

# %% [markdown]
# ## The other kinds of hook
#
# - A pipe that keeps its position in attributes can instead define `state_dict()` and
#   `load_state_dict(state)` itself (torchdata's `Stateful` protocol): no registration needed.
# - For a class you cannot edit, `register_state_hook(cls, state_dict=..., load_state_dict=...)`
#   takes two functions.
#
# The [state hook guide](../docs/hooks.md) has the contract and an example of each. Put
# `assert_resumes_exactly(your_factory, strategies=("state", "auto", "fast_forward"))` in your
# test suite for every pipe you give a hook.
