"""The data encoding against pickle and msgpack, in one run (the first table of ``python -m benchmarks scale``).

1. Three states through ``snapshot.container._codec.encode``/``decode``, ``pickle`` (protocol 5) and
   ``msgpack.packb``/``unpackb`` (raw: its own types, an array as an ext of its bytes): 10,000 positions as
   tuples of 3 ints, 12 small node states, 2,000 numpy arrays of 16 KiB. Minimum of ``repeat`` runs, the six
   taken in turn (a shared machine stretches the others). Budgets: ours at most pickle's time, and at most 1.5x
   msgpack's raw time.
2. Through the public API, a user pipe (torchdata's ``Stateful`` protocol) that has read 10,000 items,
   whose state is a set of their ids and their 10,000 ``(file, offset, count)`` tuples:
   ``save_snapshot(path)`` against ``pickle.dump`` of the same state to a file, and, in a fresh
   process each (``snapshot.DataLoader2`` and its default reading service imported first, as a script that
   has built a loader has), a restore to the first sample against ``pickle.load`` of that file, then both again
   in that process (caches warm). Budget: within 1.5x of pickle.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe

from benchmarks.common import table

__all__ = ["Remember", "run"]

#: Ours at most pickle's time, and at most this multiple of msgpack's raw time.
MSGPACK_BUDGET = 1.5
#: Through the public API: within this multiple of pickle.
PICKLE_BUDGET = 1.5


def states() -> dict[str, Any]:
    import numpy

    return {
        "10,000 positions (tuples of 3 ints)": [(i, i * 7, 3) for i in range(10_000)],
        "12 small node states": {f"0/datapipe/{i}": {"yielded": i, "state": {"seen": i, "offset": 4096 * i,
                                                                             "file": f"/data/part-{i:05d}.tar"}}
                                 for i in range(12)},
        "2,000 numpy arrays of 16 KiB": [numpy.full(2048, i, dtype="<f8") for i in range(2_000)],
    }


def _fastest(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """The fastest of ``repeat`` runs of each, taken in turn (so that a change of the machine's load while
    they run stretches them alike)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _msgpack(value: Any) -> tuple[Callable[[], Any], Callable[[bytes], Any]]:
    import msgpack
    import numpy

    def default(obj: Any) -> Any:
        if isinstance(obj, numpy.ndarray):
            return msgpack.ExtType(1, obj.tobytes())
        raise TypeError(type(obj).__name__)

    def hook(code: int, data: bytes) -> Any:
        return numpy.frombuffer(data, "<f8").copy()

    return (lambda: msgpack.packb(value, default=default)), (lambda data: msgpack.unpackb(data, ext_hook=hook))


def _timed(value: Any, repeat: int) -> dict[str, tuple[float, float]]:
    """(encode, decode) seconds of ``value`` by ours, pickle and msgpack."""
    from snapshot.container import _codec

    ours, pickled = _codec.encode(value)[0], pickle.dumps(value, 5)
    pack, unpack = _msgpack(value)
    packed = pack()
    best = _fastest({"ours encode": lambda: _codec.encode(value), "ours decode": lambda: _codec.decode(ours),
                     "pickle encode": lambda: pickle.dumps(value, 5), "pickle decode": lambda: pickle.loads(pickled),
                     "msgpack encode": pack, "msgpack decode": lambda: unpack(packed)}, repeat)
    return {name: (best[f"{name} encode"], best[f"{name} decode"]) for name in ("ours", "pickle", "msgpack")}


def codec_rows(repeat: int) -> list[dict[str, Any]]:
    figures = []
    for name, value in states().items():
        figures.append({"state": name, **_timed(value, repeat)})
    return figures


class Remember(IterDataPipe):  # type: ignore[type-arg]
    """Yields its source's items, keeping the ids it saw and where it read each one (its state)."""

    def __init__(self, source: Any) -> None:
        self.source, self.seen, self.where = source, set(), []

    def __iter__(self) -> Any:
        for item in self.source:
            self.seen.add(item)
            self.where.append((f"/data/part-{item % 100:05d}.jsonl", item * 300, 5))
            yield item

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "where": self.where}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen, self.where = state["seen"], state["where"]


def stateful_graph() -> Any:
    """``IterableWrapper(range(100_000))`` through :class:`Remember`."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return Remember(IterableWrapper(range(100_000)))


def _restore(path: str) -> float:
    import snapshot

    start = time.perf_counter()
    loader: Any = snapshot.DataLoader2(stateful_graph())
    loader.restore_snapshot(path)
    next(iter(loader))
    return time.perf_counter() - start


def _pickle_load(path: str) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        pickle.load(f)
    return time.perf_counter() - start


def _api_case(kind: str, path: str) -> dict[str, float]:
    """One measurement of the public API, in this (fresh) process: a restore (or a load) is timed twice, the
    first one in the process (``seconds``) and the next (``again``: caches warm). The modules of a loader are
    imported first (in this environment, with ``PYTHONDONTWRITEBYTECODE=1``, they are compiled from source in
    each process: 50 to 100 ms, 30 ms with their bytecode cached, that are no part of a restore)."""
    import snapshot
    import snapshot.reading_service.in_process  # what a loader's first construction imports

    snapshot.DataLoader2  # noqa: B018 - what a script's ``from snapshot import DataLoader2`` imports
    if kind in ("restore", "pickle-load"):
        measure = _restore if kind == "restore" else _pickle_load
        first = measure(path)
        return {"seconds": first, "again": measure(path)}
    loader, state = _read_10_000()
    start = time.perf_counter()
    loader.save_snapshot(path)
    save = time.perf_counter() - start
    start = time.perf_counter()
    with open(path + ".pkl", "wb") as f:
        pickle.dump(state, f, protocol=5)
    return {"save": save, "pickle_dump": time.perf_counter() - start}


def _read_10_000() -> tuple[Any, Any]:
    """A loader of :func:`stateful_graph` that has read 10,000 items, and its pipe's state."""
    import snapshot

    loader: Any = snapshot.DataLoader2(stateful_graph())
    it = iter(loader)
    for _ in range(10_000):
        next(it)
    pipe = loader.datapipe
    while not hasattr(pipe, "seen"):
        pipe = pipe.source
    return loader, pipe.state_dict()


def in_process(repeat: int) -> dict[str, dict[str, float]]:
    """In one process, the fastest of ``repeat`` runs of each (taken in turn), in wall and in CPU time (which
    waiting for a core on a shared machine does not stretch, nor do fsyncs): ``save_snapshot``, ``pickle.dump``,
    ``pickle.dump`` made as durable as a save (``pickle_dump_durable``), a restore to the first sample (loader
    built), ``pickle.load``."""

    loader, state = _read_10_000()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "api.snap")

        def dump() -> None:
            with open(path + ".pkl", "wb") as f:
                pickle.dump(state, f, protocol=5)

        def durable_dump() -> None:  # what a save guarantees: the file's bytes, then its name, on disk
            with open(path + ".tmp", "wb") as f:
                pickle.dump(state, f, protocol=5)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path + ".durable.pkl")
            directory = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

        runs = {"save": lambda: loader.save_snapshot(path), "pickle_dump": dump, "pickle_dump_durable": durable_dump,
                "restore": lambda: _restore(path), "pickle_load": lambda: _pickle_load(path + ".pkl")}
        wall, cpu = dict.fromkeys(runs, float("inf")), dict.fromkeys(runs, float("inf"))
        for counted in [False] + [True] * repeat:  # the first round warms the caches
            for name, run in runs.items():
                start, used = time.perf_counter(), time.process_time()
                run()
                if counted:
                    wall[name] = min(wall[name], time.perf_counter() - start)
                    cpu[name] = min(cpu[name], time.process_time() - used)
    return {"wall": wall, "cpu": cpu}


def api_figures(repeat: int, fork: bool = False) -> dict[str, float]:
    import statistics

    from benchmarks.common import forked

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "api.snap")

        def fresh(kind: str, target: str) -> dict[str, float]:
            if fork:
                return forked(_api_case, kind, target)
            out = subprocess.run([sys.executable, "-c", "import sys, json; from benchmarks import _codec_table as t; "
                                  "print(json.dumps(t._api_case(sys.argv[1], sys.argv[2])))", kind, target],
                                 check=True, capture_output=True, text=True, timeout=600)
            return json.loads(out.stdout.strip().splitlines()[-1])

        saves = [fresh("save", path) for _ in range(repeat)]
        restores = [fresh("restore", path) for _ in range(repeat)]
        loads = [fresh("pickle-load", path + ".pkl") for _ in range(repeat)]
    return {"save": statistics.median(s["save"] for s in saves),
            "pickle_dump": statistics.median(s["pickle_dump"] for s in saves),
            "restore": statistics.median(r["seconds"] for r in restores),
            "pickle_load": statistics.median(r["seconds"] for r in loads),
            "restore_again": statistics.median(r["again"] for r in restores),
            "pickle_load_again": statistics.median(r["again"] for r in loads)}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def run(repeat: int, rounds: int | None = None, fork: bool = False) -> dict[str, Any]:
    """Print both tables and their budgets; the figures and the verdicts. ``rounds``: the fastest of how many
    runs (``max(repeat, 20)`` by default); ``fork``: the API's "fresh processes" are forked from this one."""
    rounds = rounds or max(repeat, 20)
    rows = codec_rows(rounds)
    print("the data encoding: encode / decode, fastest of", rounds, "runs")
    print(table(["state", "ours", "pickle (protocol 5)", "msgpack (raw)"],
                [[r["state"], *(f"{_ms(r[k][0])} / {_ms(r[k][1])}" for k in ("ours", "pickle", "msgpack"))]
                 for r in rows]))
    verdicts = []
    print(f"budgets: ours <= pickle and <= {MSGPACK_BUDGET}x msgpack's raw time (encode, decode)")
    for r in rows:
        for index, step in enumerate(("encode", "decode")):
            ours, pick, raw = r["ours"][index], r["pickle"][index], r["msgpack"][index]
            ok = ours <= pick and ours <= MSGPACK_BUDGET * raw
            verdicts.append({"budget": f"codec {step}", "state": r["state"], "pass": ok})
            print(f"   {r['state']}, {step}: {ours / pick:.2f}x pickle, {ours / raw:.2f}x msgpack "
                  f"{'PASS' if ok else 'FAIL'}")
    api = api_figures(repeat, fork)
    print("\nthe public API, a Stateful pipe holding a set of 10,000 ids and 10,000 (file, offset, count) tuples "
          "(medians of", repeat, "forked" if fork else "fresh", "processes):")
    save_ok = api["save"] <= PICKLE_BUDGET * api["pickle_dump"]
    restore_ok = api["restore"] <= PICKLE_BUDGET * api["pickle_load"]
    print(f"   save_snapshot {_ms(api['save'])} vs pickle.dump {_ms(api['pickle_dump'])}: "
          f"{api['save'] / api['pickle_dump']:.2f}x {'PASS' if save_ok else 'FAIL'}")
    print(f"   restore to the first sample {_ms(api['restore'])} vs pickle.load {_ms(api['pickle_load'])}: "
          f"{api['restore'] / api['pickle_load']:.2f}x {'PASS' if restore_ok else 'FAIL'}")
    print(f"   the same, again in that process: {_ms(api['restore_again'])} vs {_ms(api['pickle_load_again'])}: "
          f"{api['restore_again'] / api['pickle_load_again']:.2f}x")
    warm = in_process(rounds)
    print(f"   in one process, fastest of {rounds} (wall / CPU): save_snapshot "
          + " and restore ".join(f"{warm['wall'][ours] / warm['wall'][theirs]:.2f}x / "
                                 f"{warm['cpu'][ours] / warm['cpu'][theirs]:.2f}x"
                                 for ours, theirs in (("save", "pickle_dump"), ("restore", "pickle_load")))
          + " pickle's (a save's two fsyncs are wall time, not CPU)")
    durable = warm["wall"]["pickle_dump_durable"]
    print(f"   against a pickle.dump as durable as a save (fsync, rename, the directory's fsync), {_ms(durable)}: "
          f"save_snapshot {warm['wall']['save'] / durable:.2f}x (wall)")
    verdicts += [{"budget": "api save", "pass": save_ok}, {"budget": "api restore", "pass": restore_ok}]
    return {"codec": rows, "api": api, "in_process": warm, "budgets": verdicts}
