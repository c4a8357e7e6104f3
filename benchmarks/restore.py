"""Restore latency: torch's own fast-forward, StatefulDataLoader, and ours (fast-forward, state).

Graph (issues 2 and 3): ``IterableWrapper(range(2_000_000)).shuffle(buffer_size=1000).map(f)``.
For each position n, measured in the same run, each on a freshly built graph and each up
to the first sample after the cut:

- torch: ``_simple_graph_snapshot_restoration(graph, n, rng)``;
- StatefulDataLoader (torchdata): ``load_state_dict`` of its state at n (it skips n samples);
- ours fast_forward: ``DataLoader2(graph).restore_snapshot(snap, strategy="fast_forward")``;
- ours state: the same with ``strategy="state"``, reading the snapshot file from disk;
- capture + atomic save (temp file, fsync, rename) and the file's size.
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


def stateful_dataloader_state(n: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(SEED)
    loader = StatefulDataLoader(build(), batch_size=None, num_workers=0)
    it = iter(loader)
    for _ in range(n):
        next(it)
    return loader.state_dict()


def stateful_dataloader_restore(state: Any) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(build(), batch_size=None, num_workers=0)
    loader.load_state_dict(state)
    next(iter(loader))


def our_restore(src: Any, strategy: str) -> None:
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build())
    dl.restore_snapshot(src, strategy=strategy)
    next(iter(dl))


def _has_stateful_dataloader() -> bool:
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError:
        return False
    return True


def run(sizes: tuple[int, ...] = SIZES, repeat: int = 3, json_path: str | None = None) -> dict[str, Any]:
    rows = []
    results = []
    sdl = _has_stateful_dataloader()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.snap")
        for n in sizes:
            dl, it = loader_at(n)
            capture_save = timed(lambda dl=dl: dl.save_snapshot(path), repeat=max(repeat, 9))
            size = os.path.getsize(path)
            expected = next(it)
            snap = snapshot.load(path)
            for strategy in ("state", "fast_forward"):  # both continue with the same sample
                check: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build())
                check.restore_snapshot(snap, strategy=strategy)
                assert next(iter(check)) == expected, f"{strategy} restore is not exact"
            torch_s = timed(lambda n=n: torch_restore(n), repeat=repeat)
            sdl_s = float("nan")
            if sdl:
                sdl_state = stateful_dataloader_state(n)
                sdl_s = timed(lambda s=sdl_state: stateful_dataloader_restore(s), repeat=repeat)
            ff_s = timed(lambda snap=snap: our_restore(snap, "fast_forward"), repeat=repeat)
            state_s = timed(lambda: our_restore(path, "state"), repeat=max(repeat, 9))
            rows.append([f"{n:.0e}", ms(torch_s), ms(sdl_s), ms(ff_s), f"{ff_s / torch_s:5.2f}x",
                         ms(state_s), f"{ff_s / state_s:8.1f}x", ms(capture_save),
                         f"{size / 1024:6.1f} KiB"])
            results.append({"n": n, "torch_fast_forward_s": torch_s, "stateful_dataloader_s": sdl_s,
                            "ours_fast_forward_s": ff_s, "ours_state_with_file_s": state_s,
                            "fast_forward_over_torch": ff_s / torch_s, "fast_forward_over_state": ff_s / state_s,
                            "capture_save_s": capture_save, "file_bytes": size})
            dl.shutdown()
    print("restore latency to the first sample after the cut,")
    print("graph: IterableWrapper(range(2e6)).shuffle(buffer_size=1000).map(f)")
    print(table(["n", "torch ff", "StatefulDL", "ours ff", "ff/torch", "ours state+file",
                 "ff/state", "capture+save", "file"], rows))
    payload = {"benchmark": "restore", "torch": str(torch.__version__), "results": results}
    save_json(json_path, payload)
    return payload
