"""Large buffers (issue 15): snapshot size, blocking and total save time, restore, peak memory.

Graph: ``IterableWrapper(range(B + 200)).map(item).shuffle(buffer_size=B)`` where ``item(i)``
makes ``S`` deterministic bytes, cut 100 samples in (the buffer is full). For each buffer
size B, item size S and ``buffer_state`` option, two fresh processes (so that peak memory
belongs to one save):

- ``sync``: ``save_snapshot(path)`` (blocking; its time and the file's size), then the
  restore into a new loader up to its first sample (time);
- ``background``: ``save_snapshot(path, blocking=False)``: the time until it returns
  (the blocking part) and until its future is done, while the loader keeps iterating.

Peak memory is the process's peak RSS during the save (``resource.getrusage``) minus its RSS
just before it: what the save adds above the loader's own footprint, also as a multiple of
the snapshot's size. Anchor, in the same run: ``torch.distributed.checkpoint.async_save``
(single process, no process group) of the same bytes as one uint8 tensor: its blocking part
(staging) and total. The 256 KiB x 10 000 case (2.6 GB per copy) runs only with ``--large``.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

from benchmarks.common import save_json, table

BUFFERS = (100, 1_000, 10_000)
ITEMS = (16 * 1024, 256 * 1024)
OPTIONS = ("values", "positions")
CUT = 100


def item(size: int, i: int) -> bytes:
    return i.to_bytes(8, "little") * (size // 8)


def build(buffer: int, size: int) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(buffer + 2 * CUT)).map(functools.partial(item, size)).shuffle(buffer_size=buffer)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _case(kind: str, buffer: int, size: int, option: str) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import snapshot

    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "s.snap")
    result: dict[str, Any] = {}
    if kind == "dcp":
        import torch
        import torch.distributed.checkpoint as dcp

        tensor = torch.frombuffer(bytearray(b"".join(item(size, i) for i in range(buffer))), dtype=torch.uint8)
        before = _rss()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            future = dcp.async_save({"buffer": tensor}, checkpoint_id=directory)
            result["blocking"] = time.perf_counter() - start
            future.result()
        result["total"] = time.perf_counter() - start
        result["peak"] = _peak() - before
        result["size"] = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        return result
    loader = snapshot.DataLoader2(build(buffer, size), buffer_state=option)
    loader.seed(0)
    it = iter(loader)
    for _ in range(CUT):
        next(it)
    before = _rss()
    start = time.perf_counter()
    if kind == "sync":
        loader.save_snapshot(path)
        result["sync"] = time.perf_counter() - start
    else:
        future = loader.save_snapshot(path, blocking=False)
        result["blocking"] = time.perf_counter() - start
        iterated = 0
        while not future.done() and iterated < CUT:
            next(it)
            iterated += 1
        future.result()
        result["total"] = time.perf_counter() - start
    result["peak"] = _peak() - before
    result["size"] = os.path.getsize(path)
    loader.shutdown()
    if kind == "sync":
        start = time.perf_counter()
        restored = snapshot.DataLoader2(build(buffer, size), buffer_state=option)
        restored.restore_snapshot(path)
        next(iter(restored))
        result["restore"] = time.perf_counter() - start
        restored.shutdown()
    os.unlink(path)
    return result


def _measure(kind: str, buffer: int, size: int, option: str) -> dict[str, Any]:
    output = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--case", kind, str(buffer), str(size), option],
                            check=True, capture_output=True, text=True, timeout=1800)
    parsed: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    return parsed


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def run(repeat: int = 1, json_path: str | None = None, large: bool = False) -> dict[str, Any]:
    rows, figures = [], []
    for size in ITEMS:
        for buffer in BUFFERS:
            if size * buffer > 1e9 and not large:
                rows.append([f"{buffer:,}", f"{size // 1024} KiB", "skipped (--large)", *[""] * 8])
                continue
            dcp = _measure("dcp", buffer, size, "values")
            for option in OPTIONS:
                sync = _measure("sync", buffer, size, option)
                background = _measure("background", buffer, size, option)
                figure = {"buffer": buffer, "item": size, "buffer_state": option, **sync,
                          "blocking": background["blocking"], "total": background["total"],
                          "peak_sync": sync["peak"], "peak_background": background["peak"],
                          "dcp_blocking": dcp["blocking"], "dcp_total": dcp["total"], "dcp_peak": dcp["peak"]}
                figures.append(figure)
                rows.append([f"{buffer:,}", f"{size // 1024} KiB", option, _mb(sync["size"]),
                             f"{sync['sync'] * 1e3:,.1f} ms",
                             f"{background['blocking'] * 1e3:,.1f} ms ({background['blocking'] / sync['sync']:.1%})",
                             f"{background['total'] * 1e3:,.1f} ms", f"{sync['restore'] * 1e3:,.1f} ms",
                             f"{_mb(max(sync['peak'], 0))} ({max(sync['peak'], 0) / sync['size']:.2f}x)",
                             f"{_mb(max(background['peak'], 0))} ({max(background['peak'], 0) / sync['size']:.2f}x)",
                             f"{dcp['blocking'] * 1e3:,.1f} / {dcp['total'] * 1e3:,.1f} ms"])
            print(table(["buffer", "item", "buffer_state", "snapshot", "sync save", "blocking (bg)", "total (bg)",
                         "restore", "peak RSS, sync (x size)", "peak RSS, bg (x size)",
                         "DCP async blocking / total"], rows), flush=True)
            print()
    save_json(json_path, {"scale": figures})
    return {"scale": figures}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        kind, buffer, size, option = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        print(json.dumps(_case(kind, buffer, size, option)))
        return
    run(large="--large" in sys.argv)


if __name__ == "__main__":
    main()
