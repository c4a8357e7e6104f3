"""``python -m benchmarks {restore,iterate,workers,distributed,scale,io,all} [--json PATH] [--repeat N]``.

``io`` takes more options: ``--size 20MB`` (the corpus; up to GBs), ``--pipelines tar,jsonl.gz``,
``--modes 0,2`` (in-process, 2 workers), ``--positions 0.1,0.5,0.9``, ``--peer-python NAME=PYTHON``
(repeatable) or ``--peers-dir DIR``; see ``benchmarks/io.py``. ``scale`` takes ``--items bytes,arrays``,
``--only 157`` (just the case of the save budgets, 10 000 x 16 KiB), ``--large``, ``--rounds N`` and
``--fork`` (a quick check: measurements in forked children); see ``benchmarks/scale.py``. ``distributed``
takes ``--ranks 2,4,8,16`` (torchrun jobs of those sizes: per-rank bytes read, memory and times, restored on
the same and the neighbouring counts) and ``--simulate 1024`` (the index of 1,024 ranks x 8 workers, planned
onto 768 and 1,280 in one process); see ``benchmarks/distributed.py``. ``all`` runs ``io`` and ``scale`` at
their defaults.
"""

from __future__ import annotations

import argparse
import importlib
import json

from benchmarks._scale_case import ITEM_KINDS

#: Each suite's module is imported when it runs (most import torch: 3 to 4 s of CPU), so that a wrong
#: argument is refused at once.
SUITES = ("restore", "iterate", "workers", "distributed", "scale", "io")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("which", choices=[*SUITES, "all"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure, the median reported (scale: each in "
                        "a fresh process)")
    parser.add_argument("--json", help="also write all figures to this JSON file")
    group = parser.add_argument_group("io")
    group.add_argument("--size", default="20MB", help="io: the corpus's size (20MB, 1GB, ...)")
    group.add_argument("--pipelines", help="io: comma-separated pipelines (all by default)")
    group.add_argument("--modes", default="0,2", help="io: worker counts, comma-separated (0 = in-process)")
    group.add_argument("--peer-python", action="append", metavar="NAME=PYTHON",
                       help="io: run a peer (datasets, litdata, streaming) with this Python")
    group.add_argument("--peers-dir", help="io: virtualenvs of the peers: DIR/hf, DIR/litdata, DIR/streaming")
    group.add_argument("--positions", default="0.1,0.5,0.9", help="io: cut points, fractions of the epoch")
    group = parser.add_argument_group("scale")
    group.add_argument("--items", default=",".join(ITEM_KINDS),
                       help="scale: the kinds of buffered samples, comma-separated (bytes: shared by a background "
                            "save; arrays: numpy uint8 arrays, copied)")
    group.add_argument("--only", metavar="CASE",
                       help="scale: run one case: 157 (10000x16KiB, the case of the save budgets) or BUFFERxSIZE, "
                            "e.g. 100x16KiB")
    group.add_argument("--large", action="store_true", help="scale: also run 10000 x 256 KiB (2.6 GB per copy)")
    group.add_argument("--rounds", type=int, help="scale: the codec table and the in-process API figures are the "
                                                  "fastest of this many runs (max(repeat, 20) by default)")
    group.add_argument("--fork", action="store_true", help="scale: measure in children forked from this process "
                                                            "instead of fresh interpreters (a quick check)")
    group = parser.add_argument_group("distributed")
    group.add_argument("--ranks", help="distributed: rank counts, comma-separated (2,4,8,16): torchrun jobs on "
                                       "127.0.0.1, per-rank costs against R")
    group.add_argument("--simulate", type=int, metavar="RANKS",
                       help="distributed: build the index of RANKS x 8 workers in one process and plan its restore "
                            "onto 0.75x and 1.25x the ranks")
    args = parser.parse_args()
    io_options = {"size": args.size, "pipelines": args.pipelines, "modes": args.modes,
                  "peer_python": args.peer_python, "peers_dir": args.peers_dir,
                  "positions": tuple(float(p) for p in args.positions.split(","))}
    scale_options = {"items": args.items, "only": args.only, "large": args.large, "rounds": args.rounds,
                     "fork": args.fork}
    distributed_options = {"ranks": [int(r) for r in args.ranks.split(",")] if args.ranks else None,
                           "simulate": args.simulate}
    chosen = list(SUITES) if args.which == "all" else [args.which]
    results = {}
    for name in chosen:
        options = {"io": io_options, "scale": scale_options, "distributed": distributed_options}.get(name, {})
        suite = importlib.import_module(f"benchmarks.{name}")
        results[name] = suite.run(repeat=args.repeat, **options)
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
