"""Restore latency against torch's own fast-forward, plus capture/save time and file size.

Graph (issue 2): ``IterableWrapper(range(2_000_000)).shuffle(buffer_size=1000).map(f)``.
For each position n, in the same run:

- torch: ``_simple_graph_snapshot_restoration(graph, n, rng)`` on a freshly built graph;
- ours (fast_forward): ``DataLoader2(graph).restore_snapshot(snap, strategy="fast_forward")``;
- ours (auto): the same with the default strategy, reading the file from disk;
- capture + atomic save of the snapshot (temp file, fsync, rename) and the file's size.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.utils.snapshot import _simple_graph_snapshot_restoration

import snapshot
from benchmarks.common import ms, save_json, table, timed

SIZES = (1_000, 10_000, 100_000, 1_000_000)
SEED = 1234


def f(x: int) -> int:
    return x * 2 + 1


def build() -> Any:
    return IterableWrapper(range(2_000_000)).shuffle(buffer_size=1000).map(f)


def loader_at(n: int) -> tuple[snapshot.DataLoader2[Any], Any]:
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build())
    dl.seed(SEED)
    it = iter(dl)
    for _ in range(n):
        next(it)
    return dl, it


def torch_restore(n: int) -> None:
    graph = build()
    _simple_graph_snapshot_restoration(graph, n, rng=torch.Generator().manual_seed(SEED))
    next(iter(graph))


def our_restore(src: Any, strategy: str) -> None:
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build())
    dl.restore_snapshot(src, strategy=strategy)
    next(iter(dl))


def run(sizes: tuple[int, ...] = SIZES, repeat: int = 3, json_path: str | None = None) -> dict[str, Any]:
    rows = []
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.snap")
        for n in sizes:
            dl, it = loader_at(n)
            capture_save = timed(lambda dl=dl: dl.save_snapshot(path), repeat=max(repeat, 5))
            size = os.path.getsize(path)
            expected = next(it)
            snap = snapshot.load(path)
            # sanity: both restores continue with the same sample
            check = snapshot.DataLoader2(build())
            check.restore_snapshot(snap)
            assert next(iter(check)) == expected, "restore is not exact"
            torch_s = timed(lambda n=n: torch_restore(n), repeat=repeat)
            ff_s = timed(lambda snap=snap: our_restore(snap, "fast_forward"), repeat=repeat)
            auto_s = timed(lambda: our_restore(path, "auto"), repeat=repeat)
            rows.append([f"{n:.0e}", ms(torch_s), ms(ff_s), f"{ff_s / torch_s:5.2f}x", ms(auto_s),
                         f"{torch_s / auto_s:7.1f}x", ms(capture_save), f"{size / 1024:6.1f} KiB"])
            results.append({"n": n, "torch_s": torch_s, "fast_forward_s": ff_s, "auto_s": auto_s,
                            "fast_forward_over_torch": ff_s / torch_s, "torch_over_auto": torch_s / auto_s,
                            "capture_save_s": capture_save, "file_bytes": size})
            dl.shutdown()
    print("restore latency, IterableWrapper(range(2e6)).shuffle(buffer_size=1000).map(f)")
    print(table(["n", "torch ff", "ours ff", "ff/torch", "ours auto+file", "torch/auto",
                 "capture+save", "file"], rows))
    payload = {"benchmark": "restore", "torch": str(torch.__version__), "results": results}
    save_json(json_path, payload)
    return payload
