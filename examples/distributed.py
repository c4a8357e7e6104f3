"""Distributed training with exact data checkpoints, ready for torchrun.

    torchrun --nproc_per_node=2 examples/distributed.py WORKDIR --crash-at 14   # dies after step 14
    torchrun --nproc_per_node=3 examples/distributed.py WORKDIR                 # resumes on 3 ranks
    python examples/distributed.py WORKDIR --check                              # every sample once?

Each rank trains a small model with ``DistributedDataParallel`` (gloo, CPU) on its share of a
sharded DataPipe graph, read through ``snapshot.DistributedReadingService``. Every
``SAVE_EVERY`` steps the ranks save one checkpoint, a directory ``WORKDIR/ckpt/step-NNNNNN/``
(numbered by the steps trained so far) that holds the model and the optimizer (``model.pt``,
written by rank 0) and the data position (``data.snap``, saved by every rank, with the epoch
and the steps as its ``metadata``). Both are
written into a hidden staging directory, which rank 0 then renames into place: the rename is
the commit, so a checkpoint is complete (both files) or absent, whenever the job dies
(``--crash-between STEP`` kills rank 0 after the data snapshot of that step, before the
model). Only the ``KEEP_LAST`` newest checkpoints are kept, each removed whole. A run started
when a checkpoint exists resumes from the newest, on any number of ranks (when it does not
divide ``LOGICAL_SHARDS``, the logical shards are split into sub-shards, so the ranks' shares
stay equal).

(The other way to keep them together is one file or one ``torch.distributed.checkpoint``
directory that holds both: ``{"model": ..., "data": loader.state_dict()}``. It gathers every
rank's data position on rank 0, where ``save_snapshot`` writes each rank's part once.)

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
import shutil
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
KEEP_LAST = 3


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


def checkpoints(ckpt: str) -> list[str]:
    """The committed checkpoints in ``ckpt``, oldest first (fixed-width step numbers sort in order;
    a staging directory is hidden, so it is never one of them)."""
    return sorted(glob.glob(os.path.join(ckpt, "step-" + "[0-9]" * 6)))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(ckpt: str, progress: dict[str, int], model: Any, optimizer: Any, loader: Any,
                    crash_between: bool = False) -> str:
    """The model and the data position as one checkpoint, ``ckpt/step-NNNNNN/`` (``progress["total"]``,
    the steps trained so far): complete or absent.

    Collective: every rank calls it at the same step. Every rank writes its part of ``data.snap``
    (with ``progress`` as its metadata) into a hidden staging directory, rank 0 writes ``model.pt``
    beside it and then renames the directory into place (the commit), and removes the checkpoints
    beyond ``KEEP_LAST``, each whole.
    """
    rank, name = dist.get_rank(), f"step-{progress['total']:06d}"
    staging, final = os.path.join(ckpt, f".{name}.tmp"), os.path.join(ckpt, name)
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)     # left by a job that died while saving
    dist.barrier()
    loader.save_snapshot(os.path.join(staging, "data.snap"), metadata=progress)  # every rank
    if rank == 0:
        if crash_between:
            os.kill(os.getpid(), signal.SIGKILL)       # the data is written, the model is not
        model_file = os.path.join(staging, "model.pt")
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, model_file)
        _fsync(model_file)
        os.rename(staging, final)                      # the commit: both files, or neither
        _fsync(ckpt)
        for old in checkpoints(ckpt)[:-KEEP_LAST]:     # rotation keeps pairs: a whole directory goes
            hidden = os.path.join(ckpt, f".{os.path.basename(old)}.old")
            os.rename(old, hidden)
            shutil.rmtree(hidden)
    dist.barrier()
    return final


def train(workdir: str, crash_at: int | None, crash_between: int | None = None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(workdir, "ckpt")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    service = snapshot.DistributedReadingService(timeout=120, logical_shards=LOGICAL_SHARDS)
    loader = snapshot.DataLoader2(build_graph(), reading_service=service)
    start_epoch, step, total = 0, 0, 0
    found = checkpoints(ckpt)
    if found:
        saved = torch.load(os.path.join(found[-1], "model.pt"), weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data = loader.restore_snapshot(os.path.join(found[-1], "data.snap"))  # refused before reading if
        start_epoch, step, total = data.metadata["epoch"], data.metadata["step"], data.metadata["total"]
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
                step, total = step + 1, total + 1
                log.write(json.dumps({"epoch": epoch, "step": step, "ids": ids.tolist()}) + "\n")
                log.flush()
                if step % SAVE_EVERY == 0:
                    save_checkpoint(ckpt, {"epoch": epoch, "step": step, "total": total}, model, optimizer, loader,
                                    crash_between=(epoch, step) == (0, crash_between))
                    if rank == 0:
                        log.write(json.dumps({"checkpoint": [epoch, step]}) + "\n")
                        log.flush()
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
    committed = [tuple(r["checkpoint"]) for r in first if "checkpoint" in r]
    last = committed[-1] if resumed else (EPOCHS, 0)
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
    parser.add_argument("--crash-between", type=int, metavar="STEP",
                        help="kill rank 0 while it saves the checkpoint of this step of epoch 0, after the data "
                             "snapshot and before the model")
    parser.add_argument("--check", action="store_true", help="check the logs; no training")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.check:
        sys.exit(0 if check(args.workdir) else 1)
    init_process_group()
    try:
        train(args.workdir, args.crash_at, args.crash_between)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
