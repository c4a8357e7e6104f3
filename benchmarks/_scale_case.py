"""One measurement of ``python -m benchmarks scale``, run in a fresh process of its own.

``python -m benchmarks._scale_case KIND BUFFER SIZE OPTION ITEMS`` prints one JSON line. KIND is

- ``sync``: ``save_snapshot(path)`` (its time, the file's size), then a restore into a new
  loader up to its first sample (its time, and its peak memory above the new loader's, measured as the
  save's once the first loader is gone);
- ``background``: ``save_snapshot(path, blocking=False)``: the time until it returns (the
  blocking part) and until its future is done, while the loader takes up to 100 more samples;
- ``dcp-items`` / ``dcp-one``: ``torch.distributed.checkpoint.async_save`` (one process, no
  process group) of the same bytes, as one uint8 tensor per buffered item or as one tensor:
  the time until it returns (its staging copy) and until its future is done.

Memory is isolated to the save: once the loader is cut 100 samples in (its buffer full), the
collector runs, freed heap memory goes back to the system (``malloc_trim``), the kernel's
peak-RSS mark of this process is reset to its current RSS (``/proc/self/clear_refs``), and
the RSS is read. After the save (the background one: after its future is done) the peak mark
(``VmHWM``, what ``getrusage``'s ``ru_maxrss`` reports for this process's own memory) minus
that RSS is what the save added above the loader's footprint. Without the reset, the peak
would include whatever came before (building the buffer, or the peak of the parent process,
which ``ru_maxrss`` inherits across ``exec``); ``peak_reset`` says whether it worked.

The state size is measured, not computed: the bytes of the samples held by the shuffle
buffers (``len`` of ``bytes``, ``nbytes`` of arrays) just before the save.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any

#: Samples taken before the save (the buffer is full), and at most while a background save runs.
CUT = 100
KINDS = ("sync", "background", "dcp-items", "dcp-one")
ITEM_KINDS = ("bytes", "arrays")


def item(size: int, i: int) -> bytes:
    """``size`` deterministic bytes for sample ``i``."""
    return i.to_bytes(8, "little") * (size // 8)


def array_item(size: int, i: int) -> Any:
    """The same bytes as :func:`item`, as a numpy uint8 array of its own (mutable)."""
    import numpy

    return numpy.frombuffer(item(size, i), dtype=numpy.uint8).copy()


def build(buffer: int, size: int, items: str = "bytes") -> Any:
    """``IterableWrapper(range(buffer + 200)).map(item).shuffle(buffer_size=buffer)``."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    make = array_item if items == "arrays" else item
    return IterableWrapper(range(buffer + 2 * CUT)).map(functools.partial(make, size)).shuffle(buffer_size=buffer)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _high_water() -> int:
    """The process's peak RSS since the last reset (``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _settle() -> tuple[int, bool]:
    """Free what can be freed, reset the peak-RSS mark; the RSS now and whether the reset worked."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    return _rss(), reset


def buffered_bytes() -> int:
    """The bytes of the samples held by every live shuffle buffer of this process."""
    total, found = 0, False
    for obj in gc.get_objects():
        if type(obj).__name__ == "ShufflerIterator" and isinstance(getattr(obj, "_buffer", None), list):
            found = True
            total += sum(getattr(x, "nbytes", None) or len(x) for x in obj._buffer)
    if not found:
        raise RuntimeError("no shuffle buffer found to measure the state size (ShufflerIterator renamed?)")
    return total


def _dcp(kind: str, buffer: int, size: int, directory: str) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    if kind == "dcp-items":
        state = {f"item{i}": torch.from_numpy(array_item(size, i)) for i in range(buffer)}
    else:
        tensor = torch.empty(buffer * size, dtype=torch.uint8)
        for i in range(buffer):
            tensor[i * size:(i + 1) * size] = torch.frombuffer(bytearray(item(size, i)), dtype=torch.uint8)
        state = {"buffer": tensor}
    result: dict[str, Any] = {"state": sum(t.nbytes for t in state.values())}
    before, result["peak_reset"] = _settle()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future: Any = dcp.async_save(state, checkpoint_id=directory)
        result["blocking"] = time.perf_counter() - start
        future.result()
    result["total"] = time.perf_counter() - start
    result["peak"] = _high_water() - before
    result["size"] = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    return result


def _save(kind: str, buffer: int, size: int, option: str, items: str, directory: str) -> dict[str, Any]:
    import snapshot

    path = os.path.join(directory, "s.snap")
    loader: Any = snapshot.DataLoader2(build(buffer, size, items), buffer_state=option)
    loader.seed(0)
    it = iter(loader)
    for _ in range(CUT):
        next(it)
    result: dict[str, Any] = {"state": buffered_bytes()}
    before, result["peak_reset"] = _settle()
    start = time.perf_counter()
    if kind == "sync":
        loader.save_snapshot(path)
        result["sync"] = time.perf_counter() - start
    else:
        future = loader.save_snapshot(path, blocking=False)
        result["blocking"] = time.perf_counter() - start
        taken = 0
        while not future.done() and taken < CUT:  # the loader keeps going; each sample is dropped at once
            next(it)
            taken += 1
        future.result(timeout=1800)
        result["total"] = time.perf_counter() - start
        result["taken_during_save"] = taken
    result["peak"] = _high_water() - before
    result["size"] = os.path.getsize(path)
    loader.shutdown()
    if kind == "sync":
        del loader, it
        restored: Any = snapshot.DataLoader2(build(buffer, size, items), buffer_state=option)
        before, reset = _settle()  # the restore's peak: what it adds above a loader with its graph
        result["peak_reset"] = result["peak_reset"] and reset
        start = time.perf_counter()
        restored.restore_snapshot(path)
        next(iter(restored))
        result["restore"] = time.perf_counter() - start
        result["restore_peak"] = _high_water() - before
        restored.shutdown()
    return result


def case(kind: str, buffer: int, size: int, option: str, items: str) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    directory = tempfile.mkdtemp()
    try:
        if kind.startswith("dcp"):
            return _dcp(kind, buffer, size, directory)
        return _save(kind, buffer, size, option, items, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    kind, buffer, size, option, items = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    if kind not in KINDS or items not in ITEM_KINDS:
        raise SystemExit(f"usage: python -m benchmarks._scale_case {{{','.join(KINDS)}}} BUFFER SIZE OPTION "
                         f"{{{','.join(ITEM_KINDS)}}}")
    from benchmarks import _scale_case  # not ``__main__``: the graph pickles its functions by module name

    print(json.dumps(_scale_case.case(kind, buffer, size, option, items)))


if __name__ == "__main__":
    main()
