"""Restoring file pipelines: time and bytes read to the first batch, against position.

``python -m benchmarks io [--size 20MB] [--pipelines tar,jsonl.gz] [--modes 0,2] [--peer-python NAME=PATH]``

A corpus of about ``--size`` bytes is made in a temporary directory (``benchmarks/_io_corpus.py``:
WebDataset-style tar shards, gzip JSON lines, CSV, zip, TFRecord), and each pipeline of
``benchmarks/_io_pipelines.py`` (``FileLister -> shuffle -> sharding_filter -> FileOpener(mode="b")
-> reader -> map(decode) -> shuffle(500) -> batch(16)``) runs in-process (``0``) and with 2
worker processes (``2``). At 10, 50 and 90 % of an epoch, side by side in one run:

- *plain*: a fresh ``snapshot.DataLoader2``, seeded, iterated from the start of the epoch
  to the first batch after the cut (worker start included);
- *ff*: ``restore_snapshot(file, strategy="fast_forward")`` on a freshly built graph, to the
  first batch after the cut;
- *ours*: ``restore_snapshot(file)`` (``strategy="auto"``, the default) of the snapshot saved
  with ``buffer_state="values"``, to the first batch (median of ``--repeat``);
- *ours pos*: the same for the snapshot saved with ``buffer_state="positions"`` (shuffle
  buffers as the addresses of their samples where the plan can form them; *read pos* its bytes);
- *read*: bytes read by the restoring process and its worker processes, from the loader's
  construction to the first batch: the ``rchar`` field of ``/proc/PID/io`` (every byte
  returned by ``read``-like system calls, from the page cache or the disk, so a warm cache
  does not hide a re-read). It counts the snapshot file, and with workers also what goes
  through the pipes between the processes (their batches; under ``fork`` a worker starts with
  its share of the restored state in memory, other start methods send it);
- *snap*: the snapshot file's size with each ``buffer_state``; *replayed*: the items the
  restore plan replays (the manifest's drivers), 0 when every node restores from state.

Then the ratios, and the restore budgets read from these figures (``benchmarks/_io_report.py``).

Every restore is checked against the uninterrupted run (*exact*). The corpus lies in the page
cache (it was just written): times are warm-cache times. Peers (HF ``datasets``, ``litdata``,
mosaicml ``streaming``) run as subprocesses with the Python of a virtualenv that has them
(``--peer-python datasets=/work/peers/hf/bin/python``), on the same gzip JSON-lines files
(``benchmarks/_io_peer.py``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import snapshot
from benchmarks import _io_corpus
from benchmarks._io_peers import peers_in, run_peers
from benchmarks._io_pipelines import BATCH, PIPELINES, Pipeline, ids
from benchmarks._io_report import HEADERS, budgets, mb, rows, tables
from benchmarks.common import save_json, table

POSITIONS = (0.1, 0.5, 0.9)
SEED = 7


# -- measuring ------------------------------------------------------------------------------

def _rchar(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _children() -> list[int]:
    """This process's descendants (worker processes), from each process's parent in ``/proc/PID/stat``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found.extend(frontier)
    return found


class Meter:
    """Wall time and bytes read (rchar) by this process and the worker processes it starts."""

    def __enter__(self) -> Meter:
        self.known = set(_children())  # processes that were there before are not ours
        self.start_read = _rchar(os.getpid())
        self.start = time.perf_counter()
        return self

    def stop(self) -> None:
        """Read the figures now, while the workers are alive."""
        self.seconds = time.perf_counter() - self.start
        own = _rchar(os.getpid()) - self.start_read  # before listing processes, which reads /proc
        workers = [pid for pid in _children() if pid not in self.known]
        self.read = own + sum(_rchar(pid) for pid in workers)

    def __exit__(self, *exc: object) -> None:
        pass


def _service(workers: int) -> Any:
    return snapshot.MultiProcessingReadingService(workers) if workers else None


@contextlib.contextmanager
def _loader(pipe: Pipeline, folder: str, workers: int, buffer_state: str = "values") -> Iterator[Any]:
    dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(pipe.build(folder), reading_service=_service(workers),
                                                         buffer_state=buffer_state)
    try:
        yield dl
    finally:
        dl.shutdown()


def save_at(pipe: Pipeline, folder: str, workers: int, k: int, path: str, buffer_state: str) -> dict[str, Any]:
    """Iterate to batch ``k``, save to ``path``: the plain pass's time and bytes, the next batch's ids."""
    with _loader(pipe, folder, workers, buffer_state) as dl, Meter() as meter:
        dl.seed(SEED)
        it = iter(dl)
        for _ in range(k):
            next(it)
        before = time.perf_counter(), _rchar(os.getpid())
        snap = dl.save_snapshot(path)
        saving = time.perf_counter() - before[0], _rchar(os.getpid()) - before[1]
        batch = next(it)
        meter.stop()
    expected = ids(batch)
    drivers = [d for shard in snap.manifest["shards"] for d in shard.get("plan", {}).get("drivers", [])]
    return {"plain_s": meter.seconds - saving[0], "plain_read": meter.read - saving[1], "expected": expected,
            "bytes": os.path.getsize(path), "replayed": sum(d["replay"] for d in drivers)}


def restore_from(pipe: Pipeline, folder: str, workers: int, path: str, strategy: str,
                 expected: list[Any]) -> tuple[float, int, bool]:
    """A fresh loader restored from ``path`` to its first batch: (seconds, bytes read, exact)."""
    with Meter() as meter:
        dl: snapshot.DataLoader2[Any] = snapshot.DataLoader2(pipe.build(folder), reading_service=_service(workers))
        try:
            dl.restore_snapshot(path, strategy=strategy)
            first = next(iter(dl))
            meter.stop()
        finally:
            dl.shutdown()
    return meter.seconds, meter.read, ids(first) == expected


def measure(pipe: Pipeline, folder: str, workers: int, k: int, tmp: str, repeat: int) -> dict[str, Any]:
    values, positions = os.path.join(tmp, "values.snap"), os.path.join(tmp, "positions.snap")
    saved = save_at(pipe, folder, workers, k, values, "values")
    pos = save_at(pipe, folder, workers, k, positions, "positions")
    exact = saved["expected"] == pos["expected"]
    runs = [restore_from(pipe, folder, workers, values, "auto", saved["expected"]) for _ in range(repeat)]
    exact &= all(ok for _, _, ok in runs)
    pos_s, pos_read, ok = restore_from(pipe, folder, workers, positions, "auto", saved["expected"])
    ff_s, ff_read, ff_ok = restore_from(pipe, folder, workers, values, "fast_forward", saved["expected"])
    return {"batch": k, "plain_s": saved["plain_s"], "plain_read": saved["plain_read"],
            "ff_s": ff_s, "ff_read": ff_read,
            "ours_s": statistics.median(s for s, _, _ in runs),
            "ours_read": int(statistics.median(r for _, r, _ in runs)),
            "ours_positions_s": pos_s, "ours_positions_read": pos_read,
            "snapshot_values": saved["bytes"], "snapshot_positions": pos["bytes"],
            "replayed": saved["replayed"], "replayed_positions": pos["replayed"], "exact": exact and ok and ff_ok}


def run(repeat: int = 3, json_path: str | None = None, size: str = "20MB", pipelines: str | None = None,
        modes: str = "0,2", peer_python: list[str] | None = None, peers_dir: str | None = None,
        positions: tuple[float, ...] = POSITIONS) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    chosen = [PIPELINES[name] for name in (pipelines or ",".join(PIPELINES)).split(",") if name]
    results: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="snapshot-io-") as tmp:
        root = os.path.join(tmp, "corpus")
        start = time.perf_counter()
        formats = tuple(dict.fromkeys(p.format for p in chosen))
        corpus = _io_corpus.make(root, _io_corpus.parse_size(size), formats)
        print(f"corpus: {mb(sum(corpus.nbytes.values()))} in {time.perf_counter() - start:.1f} s, "
              + ", ".join(f"{fmt} {corpus.files[fmt]} files / {corpus.samples[fmt]:,} samples / "
                          f"{mb(corpus.nbytes[fmt])}" for fmt in formats))
        for pipe in chosen:
            reason = pipe.missing()
            if reason:
                print(f"skipped {pipe.name}: {reason}")
                continue
            batches = corpus.samples[pipe.format] // BATCH
            for workers in (int(m) for m in modes.split(",")):
                for at in positions:
                    k = max(1, min(batches - 2, round(at * batches)))
                    try:
                        row = measure(pipe, corpus.dir(pipe.format), workers, k, tmp, repeat)
                    except Exception as error:  # noqa: BLE001 (reported; the other pipelines still run)
                        print(f"{pipe.name}, {workers} workers, at {at:.0%}: failed: {type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}", flush=True)
                        failures.append({"pipeline": pipe.name, "workers": workers, "at": at, "error": repr(error)})
                        continue
                    results.append({"pipeline": pipe.name, "workers": workers, "at": at, "batches": batches, **row})
                    print(table(HEADERS, rows(results[-1:])).splitlines()[-1], flush=True)
        tables(results, size)
        ours_jsonl = {r["at"]: r["ours_s"] for r in results if r["pipeline"] == "jsonl.gz" and r["workers"] == 0}
        pythons = dict(peers_in(peers_dir), **dict(p.split("=", 1) for p in peer_python or []))
        peers = run_peers(pythons, corpus.dir("jsonl"), positions, ours_jsonl, tmp, repeat) \
            if "jsonl" in corpus.samples else []
    budgets(results, peers, corpus, _io_corpus.parse_size(size))
    payload = {"benchmark": "io", "size": size, "corpus_bytes": corpus.nbytes, "samples": corpus.samples,
               "files": corpus.files, "largest_file": corpus.largest,
               "results": [{k: v for k, v in r.items() if k != "expected"} for r in results], "peers": peers,
               "failures": failures}
    save_json(json_path, payload)
    return payload
