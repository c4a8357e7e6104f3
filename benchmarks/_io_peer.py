"""One peer of the io benchmark, run with the Python of a virtualenv that has it (no ``snapshot`` needed).

``python _io_peer.py PEER JSONL_DIR WORK_DIR POSITIONS REPEAT`` prints one JSON line: for each
position (a fraction of the epoch), the time and the bytes read (``rchar`` of this process and its
children) from a fresh dataset to the first batch of 16 samples after a restore from the peer's
own saved state; and whether the rest of the epoch after the restore is the uninterrupted run's
(else how many samples it lost and repeated). Peers:

- ``datasets``: HF ``load_dataset("json", data_files=..., streaming=True)`` shuffled with
  ``shuffle(seed, buffer_size=500)``: ``IterableDataset.state_dict()`` / ``load_state_dict()``;
- ``litdata``: the same lines converted by ``litdata.optimize`` (not timed with the restores),
  read by ``StreamingDataset(shuffle=True)`` through ``StreamingDataLoader(batch_size=16)``:
  its ``state_dict()`` / ``load_state_dict()``;
- ``streaming``: mosaicml-streaming, the lines converted with ``MDSWriter``, read by
  ``StreamingDataset(shuffle=True, batch_size=16)`` through its ``StreamingDataLoader``.
"""

from __future__ import annotations

import collections
import functools
import glob
import gzip
import itertools
import json
import os
import sys
import time
from typing import Any

BATCH = 16
SEED = 7


def rchar() -> int:
    total = 0
    pids = [os.getpid()]
    try:
        import psutil

        pids += [c.pid for c in psutil.Process().children(recursive=True)]
    except ImportError:
        pass
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
        except (OSError, StopIteration):
            pass
    return total


def lines(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "*.jsonl.gz")))


def read_file(path: str) -> Any:
    with gzip.open(path, "rt") as f:
        for line in f:
            yield json.loads(line)


# Each peer: ``save(n)`` iterates ``n`` batches, saves, and returns (state, ids of the rest of the
# epoch); ``restore(state)`` returns an iterator of id lists (one per batch) from a fresh loader.

def _rest(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch]


# -- HF datasets -----------------------------------------------------------------------------

def hf_dataset(folder: str, work: str) -> Any:
    from datasets import load_dataset

    ds = load_dataset("json", data_files=lines(folder), split="train", streaming=True, cache_dir=work)
    return ds.shuffle(seed=SEED, buffer_size=500)


def hf_batches(it: Any) -> Any:
    while True:
        batch = [row["id"] for row in itertools.islice(it, BATCH)]
        if not batch:
            return
        yield batch


def hf_save(folder: str, work: str, n: int) -> tuple[Any, list[int]]:
    ds = hf_dataset(folder, work)
    it = iter(ds)
    for _ in range(n * BATCH):
        next(it)
    return ds.state_dict(), _rest(hf_batches(it))


def hf_restore(folder: str, work: str, state: Any) -> Any:
    ds = hf_dataset(folder, work)
    ds.load_state_dict(state)
    return hf_batches(iter(ds))


# -- litdata ---------------------------------------------------------------------------------

def lit_convert(folder: str, work: str) -> str:
    from litdata import optimize

    out = os.path.join(work, "litdata")
    optimize(fn=read_file, inputs=lines(folder), output_dir=out, chunk_bytes="16MB", num_workers=1,
             mode="overwrite")
    return out


def lit_loader(out: str) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    return StreamingDataLoader(StreamingDataset(out, shuffle=True, seed=SEED), batch_size=BATCH, num_workers=0)


def id_batches(loader: Any) -> Any:
    return ([int(x) for x in batch["id"]] for batch in loader)


def loader_save(make: Any, out: str, work: str, n: int) -> tuple[Any, list[int]]:
    """For the peers with a stateful loader (litdata, streaming): ``make(out)`` is the loader."""
    loader = make(out)
    it = iter(loader)
    for _ in range(n):
        next(it)
    return loader.state_dict(), _rest(id_batches(it))


def loader_restore(make: Any, out: str, work: str, state: Any) -> Any:
    loader = make(out)
    loader.load_state_dict(state)
    return id_batches(loader)


# -- mosaicml streaming ----------------------------------------------------------------------

def mds_convert(folder: str, work: str) -> str:
    from streaming import MDSWriter

    out = os.path.join(work, "mds")
    columns = {"id": "int", "label": "int", "score": "float64", "text": "str"}
    with MDSWriter(out=out, columns=columns, size_limit="16mb") as writer:
        for path in lines(folder):
            for row in read_file(path):
                writer.write(row)
    return out


def mds_loader(out: str) -> Any:
    from streaming import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(local=out, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)


PEERS = {"datasets": (None, hf_save, hf_restore),
         "litdata": (lit_convert, functools.partial(loader_save, lit_loader),
                     functools.partial(loader_restore, lit_loader)),
         "streaming": (mds_convert, functools.partial(loader_save, mds_loader),
                       functools.partial(loader_restore, mds_loader))}


def main() -> None:
    peer, folder, work, positions, repeat = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    total = sum(sum(1 for _ in read_file(p)) for p in lines(folder))
    convert, save, restore = PEERS[peer]
    start = time.perf_counter()
    source = convert(folder, work) if convert else folder
    convert_s = time.perf_counter() - start
    results = []
    for at in (float(p) for p in positions.split(",")):
        k = max(1, min(total // BATCH - 2, round(at * total / BATCH)))
        state, rest = save(source, work, k)
        times, reads = [], []
        for _ in range(repeat):
            read0, t0 = rchar(), time.perf_counter()
            batches = restore(source, work, state)
            first = next(batches, [])
            times.append(time.perf_counter() - t0)
            reads.append(rchar() - read0)
        got = first + _rest(batches)  # the rest of the last restore's epoch, untimed
        lost, repeated = collections.Counter(rest) - collections.Counter(got), \
            collections.Counter(got) - collections.Counter(rest)
        results.append({"at": at, "batch": k, "restore_s": sorted(times)[len(times) // 2],
                        "read": sorted(reads)[len(reads) // 2], "exact": got == rest,
                        "lost": sum(lost.values()), "repeated": sum(repeated.values()),
                        "state_bytes": len(json.dumps(state, default=repr))})
    print(json.dumps({"peer": peer, "lines": total, "convert_s": convert_s, "results": results}))


if __name__ == "__main__":
    main()
