"""The snapshot command: look inside, compare, check and draw snapshot files.

    snapshot inspect FILE [--json] [--full-paths] [--plan-for RANKS[xWORKERS]]
    snapshot diff A B [--json]
    snapshot verify FILE [--key KEY | --key-file PATH]
                         [--graph MODULE:FACTORY | SCRIPT.py:FACTORY] [--json]
    snapshot graph FILE [--format dot|svg|png] [-o OUT]

FILE is a snapshot file or a distributed run's directory (its manifest.snap is
read, and verify checks every rank's part). inspect, diff and graph read
manifests only (see docs/format.md): they never unpickle, so they are safe on
files from anywhere and work where the graph's modules are not importable.
verify reads the payload's bytes to check them, and unpickles nothing either;
only --graph runs code, the factory you name. Output fits the terminal's width
($COLUMNS); --json output is whole, and graph folds its DOT on a terminal only.

Exit codes:
  0  success: printed; verify found no problem; diff found no difference
  1  verify found a problem (damaged, tampered, unsigned with a key, version
     skew, graph mismatch); diff: the snapshots differ
  2  usage error, or an input that cannot be read or is not a valid snapshot
  3  a program the command needs is missing or failed (Graphviz's dot)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from snapshot._version import __version__
from snapshot.cli import _diff, _dot, _inspect, _verify
from snapshot.cli._exit import EXIT_INVALID, EXIT_OK, CommandError
from snapshot.cli._text import fit
from snapshot.errors import SnapshotError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"snapshot {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (_inspect, _diff, _verify, _dot):
        module.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        code = int(args.run(args))
        sys.stdout.flush()
        return code
    except CommandError as exc:
        print(fit(f"snapshot: {exc}"), file=sys.stderr)
        return exc.code
    except SnapshotError as exc:
        print(fit(f"snapshot: {exc}"), file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `snapshot inspect f | head`: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"snapshot: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
