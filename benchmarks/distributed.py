"""Snapshots across ranks, on one machine (gloo on 127.0.0.1).

``python -m benchmarks distributed --ranks 2,4,8,16`` measures per-rank costs against the number of ranks
(torchrun jobs; :mod:`benchmarks._dist_scaling`), and ``--simulate 1024`` builds the index of a
1,024-rank x 8-worker job in one process and plans its restore (:mod:`benchmarks._dist_simulate`).
Without either, 4 ranks x 1 worker:

Each rank runs the workers benchmark's graph with
``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(1))``
and reads a few batches; then, measured on every rank:

- the collective ``save_snapshot(directory)`` (each rank writes its part, rank 0 the
  manifest, the directory is swapped in), taken as the slowest rank's time;
- a restore onto 4 fresh loaders up to the first batch, after the process group is up
  (process-group start-up excluded), again the slowest rank.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import socket
import statistics
import tempfile
import time
import warnings
from typing import Any

import snapshot
from benchmarks.common import ms, save_json
from benchmarks.workers import build

RANKS = 4


def _service() -> Any:
    return snapshot.SequentialReadingService(snapshot.DistributedReadingService(timeout=120),
                                             snapshot.MultiProcessingReadingService(1))


def _rank(rank: int, port: int, directory: str, repeat: int, conn: Any) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=120))
    saves, restores = [], []
    loader: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build(4096), reading_service=_service())
    loader.seed(1)
    it = iter(loader)
    for _ in range(repeat):
        for _ in range(3):
            next(it)
        dist.barrier()
        start = time.perf_counter()
        loader.save_snapshot(directory)
        saves.append(time.perf_counter() - start)
    loader.shutdown()
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        restored: snapshot.DataLoader2[Any] = snapshot.DataLoader2(build(4096), reading_service=_service())
        restored.restore_snapshot(directory)
        next(iter(restored))
        restores.append(time.perf_counter() - start)
        restored.shutdown()
    conn.send_bytes(pickle.dumps((saves, restores)))
    dist.destroy_process_group()


def run(repeat: int = 3, json_path: str | None = None, ranks: list[int] | None = None,
        simulate: int | None = None) -> dict[str, Any]:
    if ranks is None and simulate is None:
        return _four_ranks(repeat, json_path)
    payload: dict[str, Any] = {"benchmark": "distributed"}
    if ranks is not None:
        from benchmarks import _dist_scaling

        payload["scaling"] = _dist_scaling.run(ranks)
    if simulate is not None:
        from benchmarks import _dist_simulate

        if ranks is not None:
            print()
        payload["simulate"] = _dist_simulate.run(simulate, repeat=repeat)
    save_json(json_path, payload)
    return payload


def _four_ranks(repeat: int, json_path: str | None) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "data.snap")
        pipes, processes = [], []
        for rank in range(RANKS):
            receiver, sender = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_rank, args=(rank, port, directory, repeat, sender))
            process.start()
            sender.close()
            pipes.append(receiver)
            processes.append(process)
        try:
            results = []
            for receiver in pipes:
                if not receiver.poll(600):
                    raise RuntimeError("a rank did not finish within 600 s")
                results.append(pickle.loads(receiver.recv_bytes()))
        finally:
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.kill()
    save_s = statistics.median(max(r[0][i] for r in results) for i in range(repeat))
    restore_s = statistics.median(max(r[1][i] for r in results) for i in range(repeat))
    print(f"{RANKS} ranks x 1 worker (gloo, one machine):")
    print(f"  collective save_snapshot (slowest rank, median of {repeat}): {ms(save_s)}")
    print(f"  restore to the first batch, process group already up (slowest rank): {ms(restore_s)}")
    payload = {"benchmark": "distributed", "ranks": RANKS, "save_snapshot_s": save_s,
               "restore_to_first_batch_s": restore_s}
    save_json(json_path, payload)
    return payload
