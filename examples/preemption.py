"""Preemption under torchrun: on SIGTERM, save at the next step boundary, exit 0, resume exactly once.

    torchrun --nproc_per_node=2 examples/preemption.py WORKDIR    # SIGTERM its ranks: they save, exit 0
    torchrun --nproc_per_node=3 examples/preemption.py WORKDIR    # resumes from the newest snapshot, 3 ranks
    python examples/preemption.py WORKDIR --check                 # every sample trained on exactly once?

Schedulers stop a job with SIGTERM, then SIGKILL after a grace period: SLURM signals every task
(``KillWait``, 30 s by default; ``--signal=TERM@60`` asks for a warning earlier), Kubernetes the
container's first process (``terminationGracePeriodSeconds``, 30 s), which torchrun passes on to each
rank. So the job has one grace period to leave a snapshot behind.

The signal handler only sets a flag: a signal arrives anywhere (in the middle of a save, of a collective,
of a memory allocation), and a handler that saved, logged or took a lock there could deadlock or write a
torn file. The training loop reads the flag at each step boundary, where nothing is half done, and the
ranks agree on it (one ``all_reduce`` of the flag, ``MAX``), so that they stop after the same step even
when the signal reached them at different steps, or reached only some of them. Then:

- rank 0 writes the model and the optimizer (``torch.save`` to a temporary name, then ``os.replace``),
  ``WORKDIR/model/step-N.pt``;
- every rank writes its part of the data position, ``WORKDIR/data/step-N.snap`` (a directory snapshot,
  published atomically once every part is written), keeping the two newest;
- every rank exits 0; torchrun, seeing every rank succeed, exits 0.

A run started when ``WORKDIR/data`` holds a snapshot resumes from the newest (``snapshot.latest``) and
the model saved at the same step, on any number of ranks. (The model is written first: if the job is
killed between the two writes, the newest data snapshot is the previous one, and its model is still
there.)

Every rank logs the sample ids of each step to ``WORKDIR/log-<run>-rank<r>.jsonl``, and rank 0 the step it
saved; ``--check`` (examples/distributed.py's) reads the logs and proves that over the preempted run and the
resumed one every sample of every epoch was trained on exactly once. ``--hold-at N`` makes each rank stand
still after step N until a signal comes (a test's way to deliver SIGTERM in the middle of an epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import snapshot

# The data, its graph and the model of examples/distributed.py (beside this file); this script changes when
# the job saves, and why. 192 samples in 6 logical shards: 2, 3 and 6 ranks divide them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed import EPOCHS, LOGICAL_SHARDS, SEED, build_graph, check


class Preemption:
    """Set by SIGTERM; read at step boundaries. The handler does nothing else (no I/O, no locks)."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def agreed(self) -> bool:
        """Whether any rank was signalled (a collective: every rank calls it at the same step)."""
        flag = torch.tensor([int(self.requested)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def hold(self, rank: int, step: int) -> None:
        """Stand still until a signal has come (it may already have: the wakeup fd keeps it)."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write)
        try:
            print(f"rank {rank} holds after step {step} (pid {os.getpid()})", flush=True)
            while not self.requested:
                select.select([read], [], [], 60)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)


def save(workdir: str, step: int, epoch: int, model: Any, optimizer: Any, loader: Any) -> None:
    """The model (rank 0), then the data position (every rank's part), both named by the global step."""
    if dist.get_rank() == 0:
        path = os.path.join(workdir, "model", f"step-{step}.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
    loader.save_snapshot(os.path.join(workdir, "data", f"step-{step}.snap"), keep_last=2)


def resume(workdir: str, model: Any, optimizer: Any, loader: Any) -> tuple[int, int] | None:
    """(epoch, global step) of the newest snapshot, with the model and the loader restored; None: a first run."""
    newest = snapshot.latest(os.path.join(workdir, "data"))
    if newest is None:
        return None
    step = int(re.findall(r"\d+", os.path.basename(newest))[-1])
    saved = torch.load(os.path.join(workdir, "model", f"step-{step}.pt"), weights_only=True)
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    loader.restore_snapshot(newest)
    return saved["epoch"], step


def train(workdir: str, hold_at: int | None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    preemption = Preemption()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    service = snapshot.DistributedReadingService(timeout=120, logical_shards=LOGICAL_SHARDS)
    with snapshot.DataLoader2(build_graph(), reading_service=service) as loader:
        resumed = resume(workdir, model, optimizer, loader)
        run, (start_epoch, step) = ("resumed", resumed) if resumed else ("first", (0, 0))
        if resumed is None:
            loader.seed(SEED)
        if rank == 0:
            print(f"{run} run on {world} rank(s), from epoch {start_epoch}, step {step}", flush=True)
        with open(os.path.join(workdir, f"log-{run}-rank{rank}.jsonl"), "a") as log:
            for epoch in range(start_epoch, EPOCHS):
                for x, y, ids in loader:
                    optimizer.zero_grad()
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
                    loss.backward()
                    optimizer.step()
                    step += 1
                    log.write(json.dumps({"epoch": epoch, "step": step, "ids": ids.tolist()}) + "\n")
                    log.flush()
                    if step == hold_at:
                        preemption.hold(rank, step)
                    if preemption.agreed():  # the step boundary: every rank stops after this same step
                        save(workdir, step, epoch, model, optimizer, loader)
                        if rank == 0:
                            log.write(json.dumps({"checkpoint": [epoch, step]}) + "\n")  # what --check counts up to
                            print(f"preempted: saved after step {step} of epoch {epoch}; exiting 0", flush=True)
                        return
    if rank == 0:
        print("done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("--hold-at", type=int, help="stand still after this global step until a signal comes")
    parser.add_argument("--check", action="store_true", help="check the logs; no training")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.check:
        sys.exit(0 if check(args.workdir) else 1)
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    try:
        train(args.workdir, args.hold_at)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
