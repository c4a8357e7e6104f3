"""Peers of the io benchmark: each one run by ``_io_peer.py`` with the Python of its own virtualenv.

A peer is named by ``NAME=PYTHON`` (``--peer-python datasets=/work/peers/hf/bin/python``);
``--peers-dir DIR`` stands for ``DIR/hf``, ``DIR/litdata`` and ``DIR/streaming``. A peer
whose Python is missing, or which cannot import its library there, is skipped with a note
that says why (mosaicml-streaming imports torchvision, whose CPU build may not install).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from benchmarks.common import table

__all__ = ["PEER_DIRS", "peers_in", "run_peers"]

#: Peer name -> (the folder of its virtualenv under ``--peers-dir``, the module it imports).
PEER_DIRS = {"datasets": ("hf", "datasets"), "litdata": ("litdata", "litdata"), "streaming": ("streaming", "streaming")}
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_io_peer.py")
TIMEOUT = 1800


def peers_in(directory: str | None) -> dict[str, str]:
    if not directory:
        return {}
    return {name: os.path.join(directory, folder, "bin", "python") for name, (folder, _) in PEER_DIRS.items()}


def _cannot_import(python: str, module: str) -> str | None:
    if not os.path.exists(python):
        return f"no Python at {python}"
    proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                          env=_env())
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import {module}` fails with {python}: {last}"
    return None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the peer's own packages only
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_peers(pythons: dict[str, str], jsonl_dir: str, positions: tuple[float, ...], ours: dict[float, float],
              work: str, repeat: int) -> list[dict[str, Any]]:
    """Run each peer on the gzip JSON-lines files; print its table beside ours (``ours``: at -> seconds)."""
    if not pythons:
        print("\npeers: none given (--peer-python NAME=PYTHON or --peers-dir DIR); skipped")
        return []
    results, rows = [], []
    for name, python in pythons.items():
        reason = _cannot_import(python, PEER_DIRS.get(name, (name, name))[1])
        if reason:
            print(f"peer {name} skipped: {reason}")
            results.append({"peer": name, "skipped": reason})
            continue
        peer_work = os.path.join(work, f"peer-{name}")
        os.makedirs(peer_work, exist_ok=True)
        proc = subprocess.run([python, SCRIPT, name, jsonl_dir, peer_work, ",".join(map(str, positions)), str(repeat)],
                              capture_output=True, text=True, timeout=TIMEOUT, env=_env())
        if proc.returncode:
            reason = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"peer {name} failed: {reason}")
            results.append({"peer": name, "failed": reason})
            continue
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(found)
        for r in found["results"]:
            mine = ours.get(r["at"])
            rows.append([name, f"{r['at']:.0%}", f"{r['restore_s'] * 1e3:.1f} ms", f"{r['read'] / 1e6:.2f} MB",
                         "yes" if r["exact"] else f"NO ({r['lost']}/{r['repeated']})", f"{found['convert_s']:.1f} s",
                         f"{mine * 1e3:.1f} ms" if mine is not None else "-",
                         f"{r['restore_s'] / mine:.2f}x" if mine else "-"])
    if rows:
        print("\npeers on the same gzip JSON-lines files, restore to the first batch of 16 (in-process), "
              "ours = the jsonl.gz pipeline with 0 workers")
        print(table(["peer", "at", "restore", "read", "exact (lost/repeated)", "convert", "ours", "peer/ours"], rows))
        if "litdata" in pythons:
            print("(litdata reads its chunks through memory maps, which rchar does not count)")
    return results
