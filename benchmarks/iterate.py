"""In-process iteration throughput: the loader with state hooks against plain iteration.

Same graph as the restore benchmark, 200k samples, same seed, measured side by side:

- plain: ``iter(graph)``, torch's own DataPipe generators (seeded like the loader);
- torch ``DataLoader(graph, batch_size=None)``;
- torchdata 0.9 ``DataLoader2(graph, InProcessReadingService())``;
- torchdata ``StatefulDataLoader(graph, batch_size=None)``;
- ours: ``snapshot.DataLoader2(graph)`` (every node runs through its state hook).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

import snapshot
from benchmarks.common import save_json, table, timed
from benchmarks.restore import SEED, build
from snapshot.graph import Graph
from snapshot.randomness import SeedGenerator, epoch_seeds

SAMPLES = 200_000


def consume(iterable: Iterable[Any], n: int = SAMPLES) -> None:
    it = iter(iterable)
    for _ in range(n):
        next(it)


def plain() -> Any:
    graph = build()
    g = Graph(graph)
    for path, seed in epoch_seeds(SeedGenerator(SEED), g).for_shard(0).items():
        g[path].datapipe.set_seed(seed)
    return graph


def ours() -> Any:
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build())
    dl.seed(SEED)
    return dl


def torchdata_dl2() -> Any:
    from torchdata.dataloader2 import DataLoader2, InProcessReadingService

    dl = DataLoader2(build(), reading_service=InProcessReadingService())
    dl.seed(SEED)
    return dl


def stateful() -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(SEED)
    return StatefulDataLoader(build(), batch_size=None, num_workers=0)


def run(repeat: int = 3, json_path: str | None = None) -> dict[str, Any]:
    warnings.filterwarnings("ignore", category=UserWarning)
    contenders = {"plain iter(graph)": plain, "torch DataLoader": lambda: DataLoader(build(), batch_size=None),
                  "torchdata DataLoader2": torchdata_dl2, "StatefulDataLoader": stateful, "ours": ours}
    times = {}
    for name, make in contenders.items():
        try:
            times[name] = timed(lambda make=make: consume(make()), repeat=repeat)
        except ImportError:
            times[name] = float("nan")
    base = times["plain iter(graph)"]
    rows = [[name, f"{t:7.3f} s", f"{SAMPLES / t / 1e3:8.1f} k/s", f"{base / t:5.2f}x",
             f"{t / times['ours']:5.2f}x"] for name, t in times.items()]
    print(f"in-process iteration, {SAMPLES} samples, shuffle(1000) + map, same seed")
    print(table(["loader", "time", "throughput", "vs plain", "ours faster by"], rows))
    payload = {"benchmark": "iterate", "samples": SAMPLES, "seconds": times,
               "ours_over_plain_throughput": base / times["ours"]}
    save_json(json_path, payload)
    return payload
