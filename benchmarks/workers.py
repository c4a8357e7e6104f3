"""Throughput with 2 workers, and snapshot/restore latency with workers running.

Graph (issue 4): 16 KiB samples with some CPU work each, batched by 64 and collated::

    IterableWrapper(range(N)).shuffle(buffer_size=1000).sharding_filter().map(make_sample)
        .batch(64).collate()

Measured side by side in one run, in interleaved rounds (each round rotates the order; the
medians are reported), each loader reading two whole epochs with 2 workers kept alive
between them (``persistent_workers=True`` where the loader has the option):

- torch ``DataLoader(graph, batch_size=None, num_workers=2)``;
- torchdata 0.9 ``DataLoader2`` with its ``MultiProcessingReadingService(num_workers=2)``;
- torchdata ``StatefulDataLoader(graph, batch_size=None, num_workers=2)``;
- ours: ``snapshot.DataLoader2`` with ``MultiProcessingReadingService(2)``.

Then, for ours: ``save_snapshot`` mid-epoch with the workers running, and a restore onto 2
fresh workers up to the first batch (process start included). Last, a restore onto W' = 3 and 4
workers of a snapshot with L = 2 logical shards (more workers than shards: each shard is split
into sub-shards from where it stood) against one of a snapshot with L = W' (nothing split), both
saved at the same step by 2 workers: the time to the first batch and the bytes read (``rchar`` of
the process and its workers: the file, and what they send each other), in interleaved rounds,
medians reported.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from benchmarks._io_peer import rchar
from benchmarks.common import ms, save_json, table

SAMPLES = 16_384
BATCH = 64
SEED = 99


def make_sample(i: int) -> torch.Tensor:
    """16 KiB of float32 and a little CPU work (a seeded draw, a few element-wise ops)."""
    g = torch.Generator().manual_seed(i)
    x = torch.randn(4096, generator=g)
    return torch.tanh(x * 0.5 + 0.1).cumsum(0) / 4096


def build(samples: int = SAMPLES) -> Any:
    return (IterableWrapper(range(samples)).shuffle(buffer_size=1000).sharding_filter()
            .map(make_sample).batch(BATCH).collate())


def epoch_time(loader: Any) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    elapsed = time.perf_counter() - start
    assert count == SAMPLES // BATCH, count
    return elapsed


def measure(make: Any) -> tuple[float, float]:
    """(first epoch including the workers' start, the next epoch)."""
    loader = make()
    try:
        first = epoch_time(loader)
        warm = epoch_time(loader)
    finally:
        shutdown = getattr(loader, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            del loader
            gc.collect()
    return first, warm


def torch_loader() -> Any:
    torch.manual_seed(SEED)
    return DataLoader(build(), batch_size=None, num_workers=2, persistent_workers=True, prefetch_factor=2)


def torchdata_dl2() -> Any:
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

    dl = DataLoader2(build(), reading_service=MultiProcessingReadingService(num_workers=2))
    dl.seed(SEED)
    return dl


def stateful_loader() -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(SEED)
    return StatefulDataLoader(build(), batch_size=None, num_workers=2, persistent_workers=True)


def ours() -> Any:
    service = snapshot.MultiProcessingReadingService(2)
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build(), reading_service=service)
    dl.seed(SEED)
    return dl


def snapshot_latency(repeat: int) -> tuple[float, float, int, float]:
    """Median save_snapshot mid-epoch, median restore to the first batch, file size, in-flight."""
    saves, restores = [], []
    size, in_flight = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.snap")
        loader = ours()
        try:
            it = iter(loader)
            for step in range(1, 121):
                next(it)
                if step % 20 == 0:
                    time.sleep(0.05)  # let the workers fill their prefetch
                    start = time.perf_counter()
                    snap = loader.save_snapshot(path)
                    saves.append(time.perf_counter() - start)
                    in_flight = sum(s["in_flight"] for s in snap.manifest["shards"])
            size = os.path.getsize(path)
        finally:
            loader.shutdown()
        for _ in range(repeat):
            start = time.perf_counter()
            restored: snapshot.DataLoader2[Any] = snapshot.DataLoader2(
                build(), reading_service=snapshot.MultiProcessingReadingService(2))
            restored.restore_snapshot(path)
            next(iter(restored))
            restores.append(time.perf_counter() - start)
            restored.shutdown()
    return statistics.median(saves), statistics.median(restores), size, in_flight


def saved_mid_epoch(path: str, logical_shards: int, steps: int = 60) -> None:
    """A snapshot of 2 workers running ``logical_shards`` after ``steps`` batches, the workers running ahead."""
    loader: snapshot.DataLoader2[Any] = snapshot.DataLoader2(
        build(), reading_service=snapshot.MultiProcessingReadingService(2, logical_shards=logical_shards))
    loader.seed(SEED)
    try:
        it = iter(loader)
        for _ in range(steps):
            next(it)
        time.sleep(0.05)
        loader.save_snapshot(path)
    finally:
        loader.shutdown()


def restore_onto(path: str, workers: int) -> tuple[float, int]:
    """Restore onto ``workers`` new workers: seconds and bytes read up to the first batch."""
    read, start = rchar(), time.perf_counter()
    restored: snapshot.DataLoader2[Any] = snapshot.DataLoader2(
        build(), reading_service=snapshot.MultiProcessingReadingService(workers))
    try:
        restored.restore_snapshot(path)
        next(iter(restored))
        took, read = time.perf_counter() - start, rchar() - read  # (before the workers exit)
    finally:
        restored.shutdown()
    return took, read


def elastic(repeat: int, layouts: tuple[int, ...] = (3, 4)) -> dict[int, dict[str, tuple[float, int]]]:
    """Per number of workers W' of ``layouts``: a snapshot of L = 2 (split) and one of L = W' (whole)
    restored onto W' workers, in interleaved rounds: median seconds and bytes read to the first batch."""
    runs: dict[tuple[int, str], list[tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for workers in layouts:
            for kind, shards in (("split", 2), ("whole", workers)):
                paths[workers, kind] = os.path.join(tmp, f"{kind}-{workers}.snap")
                saved_mid_epoch(paths[workers, kind], shards)
        keys = list(paths)
        for round_ in range(max(repeat, 3)):
            for key in keys[round_ % len(keys):] + keys[:round_ % len(keys)]:
                runs.setdefault(key, []).append(restore_onto(paths[key], key[0]))
    out: dict[int, dict[str, tuple[float, int]]] = {}
    for (workers, kind), found in runs.items():
        out.setdefault(workers, {})[kind] = (statistics.median(t for t, _ in found),
                                             int(statistics.median(b for _, b in found)))
    return out


def run(repeat: int = 3, json_path: str | None = None) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    contenders = {"torch DataLoader": torch_loader, "torchdata DataLoader2": torchdata_dl2,
                  "StatefulDataLoader": stateful_loader, "ours": ours}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeat):  # interleaved rounds, rotated, so drift hits everyone alike
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            try:
                samples[name].append(measure(contenders[name]))
            except ImportError:
                samples[name].append((float("nan"), float("nan")))
    times = {name: (statistics.median(f for f, _ in runs), statistics.median(w for _, w in runs))
             for name, runs in samples.items()}
    mine = times["ours"][1]
    rows = [[name, f"{first:6.2f} s", f"{warm:6.2f} s", f"{SAMPLES / warm:8.0f}/s", f"{warm / mine:5.2f}x"]
            for name, (first, warm) in times.items()]
    print(f"2 workers, {SAMPLES} samples of 16 KiB per epoch, batch {BATCH}, collated")
    print(table(["loader", "1st epoch", "warm epoch", "samples/s", "ours faster by"], rows))
    save_s, restore_s, size, in_flight = snapshot_latency(repeat)
    print(f"save_snapshot mid-epoch, 2 workers running: {ms(save_s)} "
          f"(file {size / 1024:.0f} KiB, {in_flight:.0f} batches in flight stored by value)")
    print(f"restore onto 2 new workers up to the first batch: {ms(restore_s)}")
    grown = elastic(repeat)
    print("restore onto W' workers to the first batch: a snapshot of L = 2 logical shards (split into sub-shards) "
          "against one of L = W' (whole)")
    rows = []
    for workers, kinds in grown.items():
        (split_s, split_b), (whole_s, whole_b) = kinds["split"], kinds["whole"]
        rows.append([str(workers), str(math.lcm(2, workers)), ms(whole_s), ms(split_s), f"{split_s / whole_s:5.2f}x",
                     f"{whole_b:,}", f"{split_b:,}", f"{split_b / whole_b:5.2f}x"])
    print(table(["W'", "units", "L = W'", "L = 2", "ratio", "bytes, L = W'", "bytes, L = 2", "ratio"], rows))
    payload = {"benchmark": "workers", "samples": SAMPLES, "batch": BATCH,
               "epoch_seconds": {k: {"first": v[0], "warm": v[1]} for k, v in times.items()},
               "ours_speedup_vs": {k: v[1] / mine for k, v in times.items() if k != "ours"},
               "save_snapshot_s": save_s, "restore_to_first_batch_s": restore_s, "file_bytes": size,
               "restore_onto_more_workers": {str(w): {kind: {"seconds": t, "bytes_read": b}
                                                      for kind, (t, b) in k.items()} for w, k in grown.items()}}
    save_json(json_path, payload)
    return payload
