"""Distributed training with exact data checkpoints, ready for torchrun.

    torchrun --nproc_per_node=2 examples/distributed.py WORKDIR --crash-at 14   # dies after step 14
    torchrun --nproc_per_node=3 examples/distributed.py WORKDIR                 # resumes on 3 ranks
    python examples/distributed.py WORKDIR --check                              # every sample once?

Each rank trains a small model with ``DistributedDataParallel`` (gloo, CPU) on its share of a
sharded DataPipe graph, read through ``snapshot.DistributedReadingService``. Every
``SAVE_EVERY`` steps the ranks checkpoint the model, the optimizer and the loader together:
``loader.state_dict()`` is collective (every rank calls it, and rank 0's holds every rank's
part), and rank 0 writes one file atomically. A run started when the checkpoint exists
resumes from it, on any number of ranks (when it does not divide ``LOGICAL_SHARDS``, the
logical shards are split into sub-shards, so the ranks' shares stay equal).

Every rank logs the sample ids of each step to ``WORKDIR/log-<run>-rank<r>.jsonl``;
``--check`` reads the logs and proves that, over the crashed run (up to its last checkpoint)
and the resumed one, every sample of every epoch was trained on exactly once.

Without torchrun (no ``RANK`` in the environment) the script runs as a single rank.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import socket
import sys
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot

SAMPLES = 192
BATCH = 4
EPOCHS = 2
SEED = 2024
#: Fixed by the first run and saved. On a number of ranks that does not divide it, each epoch
#: is dealt to lcm(6, ranks) sub-shards, so every rank still gets an equal share.
LOGICAL_SHARDS = 6
SAVE_EVERY = 6


def make_sample(i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, generator=g)
    return x, (x.sum() > 0).float(), i


def build_graph() -> Any:
    return (IterableWrapper(range(SAMPLES))
            .shuffle(buffer_size=64)      # the whole index, in the same order on every rank
            .sharding_filter()            # sample i goes to logical shard i % LOGICAL_SHARDS
            .map(make_sample)
            .batch(BATCH)
            .collate())


def init_process_group() -> None:
    if "RANK" in os.environ:   # torchrun, or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, ...
        dist.init_process_group("gloo")
    else:                      # a single rank, without a launcher: explicit rendezvous
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def train(workdir: str, crash_at: int | None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = os.path.join(workdir, "checkpoint.pt")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    service = snapshot.DistributedReadingService(timeout=120, logical_shards=LOGICAL_SHARDS)
    loader = snapshot.DataLoader2(build_graph(), reading_service=service)
    start_epoch, step = 0, 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch, step = saved["epoch"], saved["step"]
        loader.load_state_dict(saved["data"])      # refused before reading if the layout cannot work
        run = "resumed"
    else:
        loader.seed(SEED)
        run = "first"
    if rank == 0:
        print(f"{run} run on {world} rank(s), from epoch {start_epoch}, step {step}", flush=True)
    with open(os.path.join(workdir, f"log-{run}-rank{rank}.jsonl"), "a") as log:
        for epoch in range(start_epoch, EPOCHS):
            if epoch > start_epoch:
                step = 0
            for x, y, ids in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
                loss.backward()                      # gradients are averaged over the ranks
                optimizer.step()
                step += 1
                log.write(json.dumps({"epoch": epoch, "step": step, "ids": ids.tolist()}) + "\n")
                log.flush()
                if step % SAVE_EVERY == 0:
                    data = loader.state_dict()       # collective: on every rank
                    if rank == 0:
                        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                 "epoch": epoch, "step": step, "data": data}
                        torch.save(state, checkpoint + ".tmp")
                        os.replace(checkpoint + ".tmp", checkpoint)        # atomic
                        log.write(json.dumps({"checkpoint": [epoch, step]}) + "\n")
                        log.flush()
                    dist.barrier()
                if crash_at is not None and (epoch, step) == (0, crash_at) and rank == 0:
                    os.kill(os.getpid(), signal.SIGKILL)   # no clean-up; torchrun stops the other ranks
    loader.shutdown()


def check(workdir: str) -> bool:
    """Samples trained on before the last checkpoint of the first run, plus the resumed run."""
    def records(run: str) -> list[dict[str, Any]]:
        out = []
        for path in sorted(glob.glob(os.path.join(workdir, f"log-{run}-rank*.jsonl"))):
            with open(path) as f:
                out.extend(json.loads(line) for line in f)
        return out

    first, resumed = records("first"), records("resumed")
    checkpoints = [tuple(r["checkpoint"]) for r in first if "checkpoint" in r]
    last = checkpoints[-1] if resumed else (EPOCHS, 0)
    counts: dict[int, Counter[int]] = {epoch: Counter() for epoch in range(EPOCHS)}
    for r in first:
        if "ids" in r and (r["epoch"], r["step"]) <= last:
            counts[r["epoch"]].update(r["ids"])
    for r in resumed:
        if "ids" in r:
            counts[r["epoch"]].update(r["ids"])
    ok = True
    for epoch, seen in counts.items():
        full = Counter(range(SAMPLES))
        lost, repeated = full - seen, seen - full
        print(f"epoch {epoch}: {sum(seen.values())} samples trained on, {len(lost)} lost, {len(repeated)} repeated")
        ok = ok and not lost and not repeated
    print("every sample exactly once:", ok)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("--crash-at", type=int, help="kill rank 0 after this step of epoch 0")
    parser.add_argument("--check", action="store_true", help="check the logs; no training")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.check:
        sys.exit(0 if check(args.workdir) else 1)
    init_process_group()
    try:
        train(args.workdir, args.crash_at)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
