"""Plot a results file of ``python -m benchmarks all --json PATH``.

    python -m benchmarks.plot RESULTS.json [--out DIR]

Writes ``restore.svg`` (restore latency against position, log-log), ``iterate.svg``
(in-process throughput per loader) and ``workers.svg`` (throughput with 2 worker processes,
per loader), for the results the file holds, into ``DIR`` (default: beside the results file). The
docs' benchmarks page shows the figures made from the results file committed beside them.
Needs matplotlib (the ``docs`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

#: restore-result key -> legend label, in drawing order.
RESTORE_SERIES = {
    "stateful_dataloader_s": "torchdata StatefulDataLoader",
    "torch_fast_forward_s": "torch fast-forward",
    "ours_fast_forward_s": "snapshot, strategy=fast_forward",
    "ours_state_with_file_s": "snapshot, strategy=state (from the file)",
}


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "snapshot-benchmarks"  # stable element ids
    return plt


def plot_restore(results: dict[str, Any], path: str) -> None:
    plt = _figure()
    rows = results["results"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in RESTORE_SERIES.items():
        points = [(r["n"], r[key] * 1e3) for r in rows if r.get(key) == r.get(key)]  # drop NaN
        if points:
            ns, ms = zip(*points)
            ax.plot(ns, ms, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("position n (samples since the start of the epoch)")
    ax.set_ylabel("restore latency to the next sample (ms)")
    ax.set_title("Restore latency against position")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def _bars(rates: dict[str, float], path: str, *, xlabel: str, title: str, height: float) -> None:
    """A horizontal bar per loader, in the results' order (ours labelled by its name)."""
    plt = _figure()
    labels = ["snapshot DataLoader2" if n == "ours" else n for n in rates]
    fig, ax = plt.subplots(figsize=(7, height))
    ax.barh(labels, list(rates.values()))
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def plot_iterate(results: dict[str, Any], path: str) -> None:
    samples = results["samples"]
    rates = {n: samples / s / 1e3 for n, s in results["seconds"].items() if s == s}  # drop NaN
    _bars(rates, path, xlabel="thousand samples per second (higher is better)",
          title=f"In-process iteration, {samples:,} samples", height=3.2)


def plot_workers(results: dict[str, Any], path: str) -> None:
    samples = results["samples"]
    rates = {n: samples / epoch["warm"] for n, epoch in results["epoch_seconds"].items()}
    _bars(rates, path, xlabel="samples per second, warm epoch (higher is better)",
          title=f"2 worker processes, {samples:,} samples of 16 KiB, batch {results['batch']}", height=2.8)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a JSON file written by `python -m benchmarks ... --json`")
    parser.add_argument("--out", help="directory for the figures (default: beside the results)")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    out = args.out or os.path.dirname(os.path.abspath(args.results))
    os.makedirs(out, exist_ok=True)
    written = []
    if "restore" in results:
        written.append(os.path.join(out, "restore.svg"))
        plot_restore(results["restore"], written[-1])
    if "iterate" in results:
        written.append(os.path.join(out, "iterate.svg"))
        plot_iterate(results["iterate"], written[-1])
    if "workers" in results:
        written.append(os.path.join(out, "workers.svg"))
        plot_workers(results["workers"], written[-1])
    if not written:
        parser.error(f"{args.results} holds no 'restore', 'iterate' or 'workers' results")
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
