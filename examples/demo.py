"""The main job: train, snapshot mid-epoch, crash, restore in a new process, prove the stream.

    python examples/demo.py            (what `make demo` runs)

1. A reference run trains a small model for two epochs without interruption and records a
   fingerprint of every batch it saw.
2. A second process trains the same way, saves the model and the data position every few
   steps, and is killed (SIGKILL, no clean-up) in the middle of the second epoch.
3. A third process loads the last checkpoint, restores the loader from the snapshot file and
   finishes training.
4. The batches seen by 2 (up to its last snapshot) followed by those seen by 3 must equal
   the reference run's batches, and the final weights must be bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot

EPOCHS = 2
SAMPLES = 2_000
BATCH = 32
SEED = 2024
SAVE_EVERY = 10
CRASH_AT = (1, 23)  # (epoch, step): after the snapshot at step 20 of epoch 1


def make_sample(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic synthetic example: 16 features, a binary label."""
    g = torch.Generator().manual_seed(i)
    x = torch.randn(16, generator=g)
    return x, (x.sum() > 0).float()


def build_graph() -> Any:
    return (IterableWrapper(range(SAMPLES))
            .shuffle(buffer_size=500)
            .sharding_filter()
            .map(make_sample)
            .batch(BATCH)
            .collate())


def fingerprint(batch: Any) -> str:
    x, y = batch
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]


def new_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Any) -> float:
    x, y = batch
    opt.zero_grad()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def log(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def train(workdir: str, role: str) -> None:
    """Run as a separate process: ``reference``, ``crashing`` or ``resumed``."""
    torch.set_num_threads(1)
    seen = os.path.join(workdir, f"{role}.jsonl")
    model, opt = new_model()
    ckpt_dir = os.path.join(workdir, "ckpt")   # model-<n>.pt and data-<n>.snap, the last 2 of each
    if role == "resumed":
        data_snap = snapshot.latest(ckpt_dir)   # the newest complete snapshot
        assert data_snap is not None, "no snapshot to resume from"
        ckpt = torch.load(data_snap.replace("data-", "model-").replace(".snap", ".pt"), weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        dl = snapshot.DataLoader2.from_snapshot(data_snap)   # graph pickled inside the file
        start_epoch, start_step = ckpt["epoch"], ckpt["step"]
        print(f"  [pid {os.getpid()}] restored model and data at epoch {start_epoch}, step {start_step}")
    else:
        dl = snapshot.DataLoader2(build_graph())
        dl.seed(SEED)
        start_epoch, start_step = 0, 0
    for epoch in range(start_epoch, EPOCHS):
        first = start_step if epoch == start_epoch else 0
        for i, batch in enumerate(dl, start=first):
            loss = step(model, opt, batch)
            log(seen, {"epoch": epoch, "step": i, "batch": fingerprint(batch), "loss": round(loss, 6)})
            if role == "crashing" and (i + 1) % SAVE_EVERY == 0:
                # the model first (atomically), then the data: a data snapshot always has its model
                n = f"{epoch:03d}{i + 1:05d}"
                model_ckpt = os.path.join(ckpt_dir, f"model-{n}.pt")
                os.makedirs(ckpt_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "epoch": epoch, "step": i + 1}, model_ckpt + ".tmp")
                os.replace(model_ckpt + ".tmp", model_ckpt)
                dl.save_snapshot(os.path.join(ckpt_dir, f"data-{n}.snap"), keep_last=2)
                for name in os.listdir(ckpt_dir):   # models whose data snapshot was pruned
                    if name.endswith(".pt") and not os.path.exists(
                            os.path.join(ckpt_dir, name.replace("model-", "data-")[:-3] + ".snap")):
                        os.unlink(os.path.join(ckpt_dir, name))
                log(seen, {"checkpoint": [epoch, i + 1]})
            if role == "crashing" and (epoch, i) == CRASH_AT:
                print(f"  [pid {os.getpid()}] simulated crash at epoch {epoch}, step {i} (SIGKILL)")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    log(seen, {"final_weights": weights_digest(model)})
    dl.shutdown()


def read(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def run_role(workdir: str, role: str) -> int:
    return subprocess.run([sys.executable, __file__, "--role", role, workdir], timeout=600).returncode


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        print(f"graph: range({SAMPLES}) -> shuffle -> sharding_filter -> map(make_sample) "
              f"-> batch({BATCH}) -> collate; seed {SEED}; {EPOCHS} epochs")
        print("1. reference run (no interruption)")
        assert run_role(workdir, "reference") == 0
        print("2. training run that saves every 10 steps and is killed mid-epoch")
        code = run_role(workdir, "crashing")
        assert code == -signal.SIGKILL, f"expected the crashing run to be killed, got exit code {code}"
        last = snapshot.latest(os.path.join(workdir, "ckpt"))
        assert last is not None
        manifest = snapshot.read_manifest(last)
        print(f"   newest of the snapshots kept ({', '.join(sorted(os.listdir(os.path.dirname(last))))}): "
              f"{os.path.basename(last)}, epoch {manifest['loader']['epoch']}, "
              f"{manifest['loader']['yielded']} batches in, {manifest['payload']['size']} payload bytes")
        print("3. new process restores the model and the data position, finishes training")
        assert run_role(workdir, "resumed") == 0

        reference = read(os.path.join(workdir, "reference.jsonl"))
        crashed = read(os.path.join(workdir, "crashing.jsonl"))
        resumed = read(os.path.join(workdir, "resumed.jsonl"))
        last_ckpt = [r["checkpoint"] for r in crashed if "checkpoint" in r][-1]
        before = [r for r in crashed if "batch" in r and (r["epoch"], r["step"]) < tuple(last_ckpt)]
        after = [r for r in resumed if "batch" in r]
        combined = [r["batch"] for r in before + after]
        expected = [r["batch"] for r in reference if "batch" in r]
        wasted = sum(1 for r in crashed if "batch" in r) - len(before)
        same_stream = combined == expected
        same_weights = reference[-1]["final_weights"] == resumed[-1]["final_weights"]
        print("4. proof")
        print(f"   uninterrupted run: {len(expected)} batches over {EPOCHS} epochs")
        print(f"   crashed run: {len(before)} batches up to its last snapshot "
              f"(+{wasted} after it, lost with the crash and seen again)")
        print(f"   resumed run: {len(after)} batches")
        print(f"   crashed-before-snapshot + resumed == uninterrupted, batch by batch: {same_stream}")
        print(f"   final weights bit-identical to the uninterrupted run: {same_weights} "
              f"({resumed[-1]['final_weights']})")
        if not (same_stream and same_weights):
            index = next((i for i, (a, b) in enumerate(zip(combined, expected)) if a != b), None)
            print(f"   MISMATCH at batch {index}")
            return 1
        print("OK: the restored stream is exactly the uninterrupted one.")
        return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--role":
        train(sys.argv[3], sys.argv[2])
    else:
        sys.exit(main())
