"""``python -m benchmarks {restore,iterate,workers,distributed,scale,all} [--json PATH] [--repeat N]``."""

from __future__ import annotations

import argparse
import json

from benchmarks import distributed, iterate, restore, scale, workers

SUITES = {"restore": restore.run, "iterate": iterate.run, "workers": workers.run, "distributed": distributed.run,
          "scale": scale.run}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("which", choices=[*SUITES, "all"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write all figures to this JSON file")
    args = parser.parse_args()
    chosen = list(SUITES) if args.which == "all" else [args.which]
    results = {}
    for name in chosen:
        results[name] = SUITES[name](repeat=args.repeat)
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
