"""``python -m benchmarks {restore,all} [--json PATH] [--repeat N]``."""

from __future__ import annotations

import argparse

from benchmarks import restore


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("which", choices=["restore", "all"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.which in ("restore", "all"):
        restore.run(repeat=args.repeat, json_path=args.json)


if __name__ == "__main__":
    main()
