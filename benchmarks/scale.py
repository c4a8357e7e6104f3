"""Large buffers: snapshot size, blocking and total save time, restore, peak memory, and the save budgets.

Graph: ``IterableWrapper(range(B + 200)).map(item).shuffle(buffer_size=B)`` where ``item(i)``
makes ``S`` deterministic bytes, or the same bytes as a numpy uint8 array (``--items``), cut
100 samples in (the buffer is full). For each buffer size B, item size S, item kind and
``buffer_state`` option, two fresh processes (so that peak memory belongs to one save): a
synchronous save followed by a restore, and a background save (``blocking=False``); see
``benchmarks/_scale_case.py`` for what each measures and how the save's memory is isolated.

The state is the bytes of the buffered samples (measured in the buffer, not the file's size).
Peak memory is what the save adds above the loader's RSS, also as a multiple of the state.
Anchor, in the same run and for the same bytes: ``torch.distributed.checkpoint.async_save``
(one process, no process group) of one uint8 tensor per buffered item (the state dict a
buffer of arrays would be), and of one tensor holding them all; the ratio of our blocking
part to its staging (the time until it returns) is printed beside each row.

First the data encoding against pickle and msgpack, and a Stateful pipe's save and restore against pickle
(``benchmarks/_codec_table.py``). Then the budgets of a streamed save, each read from this run's figures
(PASS/FAIL):
peak memory of a by-value save at most 1.2x the state, synchronous and background; a
background save's blocking part at most 5 % of a synchronous save with buffers saved as
positions; by value, no longer than ``async_save``'s staging of the same bytes as one tensor; the peak
memory of a restore by value at most 1.2x the state; a positions save no slower than format 1's.

``--only 157`` runs only the case these budgets are stated for: 10 000 x 16 KiB, 157 MiB of
samples (``--only 100x16KiB`` any other case). The 256 KiB x 10 000 case (2.6 GB per copy)
runs only with ``--large``. Each measurement runs ``--repeat`` times (3 by default), each in a
fresh process, and every figure is the median of those runs: ten fresh processes per case
and repeat (``--only 157 --repeat 3``: about a minute and a half on an idle 2-core machine).

For a quick check that every row and budget is computed (tests/package/test_benchmarks_scale.py):
``--only 100x4KiB --rounds 2 --fork``. ``--rounds N``: the codec table and the API's in-process figures are
the fastest of N runs (``max(repeat, 20)`` by default). ``--fork``: each measurement runs in a child forked
from the benchmark's process (torch and snapshot imported once) instead of a fresh interpreter; peaks are
still the child's own above its RSS before the save, but a restore "in a fresh process" starts with the
parent's warm caches.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from benchmarks import _scale_case
from benchmarks._scale_case import ITEM_KINDS, build, item
from benchmarks.common import forked, save_json, table

__all__ = ["BUFFERS", "ITEMS", "ITEM_KINDS", "OPTIONS", "build", "item", "parse_case", "run"]

BUFFERS = (100, 1_000, 10_000)
ITEMS = (16 * 1024, 256 * 1024)
OPTIONS = ("values", "positions")
#: The case the save budgets are stated for: 10 000 samples of 16 KiB, 157 MiB.
ISSUE_CASE = (10_000, 16 * 1024)
MEMORY_BUDGET = 1.2
BLOCKING_BUDGET = 0.05
#: A synchronous save of the 10 000 positions with format 1 (the C pickler), as docs/benchmarks.md records it.
FORMAT1_POSITIONS_SAVE = 6.8e-3

HEADERS = ["buffer", "item", "kind", "buffer_state", "state", "snapshot", "sync save", "blocking (bg), % of sync",
           "total (bg)", "restore", "peak, sync (x state)", "peak, bg (x state)", "peak, restore (x state)",
           "blocking / DCP staging"]


def parse_case(text: str) -> tuple[int, int]:
    """``157`` (the budgets' case) or ``BxS`` with S in bytes, ``KiB`` or ``MiB``: ``100x16KiB``."""
    if text == "157":
        return ISSUE_CASE
    buffer, _, size = text.partition("x")
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    unit = next((u for u in units if size.endswith(u)), "")
    try:
        return int(buffer.replace("_", "")), int(size.removesuffix(unit)) * units.get(unit, 1)
    except ValueError:
        raise SystemExit(f"--only {text!r}: expected 157 or BUFFERxSIZE, e.g. 10000x16KiB") from None


def _measure(repeat: int, kind: str, buffer: int, size: int, option: str = "values",
             items: str = "bytes", fork: bool = False) -> dict[str, Any]:
    """The median of each figure over ``repeat`` fresh (or forked) processes (``peak_reset``: in all of them)."""
    runs = []
    for _ in range(max(1, repeat)):
        if fork:
            runs.append(forked(_scale_case.case, kind, buffer, size, option, items, timeout=1800))
            continue
        output = subprocess.run([sys.executable, "-m", "benchmarks._scale_case", kind, str(buffer), str(size),
                                 option, items], check=True, capture_output=True, text=True, timeout=1800)
        runs.append(json.loads(output.stdout.strip().splitlines()[-1]))
    merged: dict[str, Any] = {key: all(r[key] for r in runs) if isinstance(value, bool)
                              else statistics.median(r[key] for r in runs) for key, value in runs[0].items()}
    merged["runs"] = len(runs)
    return merged


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _figure(repeat: int, buffer: int, size: int, kind: str, option: str,
            dcp: dict[str, dict[str, Any]], fork: bool) -> dict[str, Any]:
    """The sync and background measurements of one row, and their ratios."""
    sync = _measure(repeat, "sync", buffer, size, option, kind, fork)
    background = _measure(repeat, "background", buffer, size, option, kind, fork)
    state = sync["state"]
    return {"buffer": buffer, "item": size, "kind": kind, "buffer_state": option, "state": state,
            "size": sync["size"], "sync": sync["sync"], "restore": sync["restore"],
            "blocking": background["blocking"], "total": background["total"],
            "blocking_share": background["blocking"] / sync["sync"],
            "peak_sync": sync["peak"], "peak_background": background["peak"], "peak_restore": sync["restore_peak"],
            "peak_sync_x_state": sync["peak"] / state, "peak_background_x_state": background["peak"] / state,
            "peak_restore_x_state": sync["restore_peak"] / state,
            "peak_reset": sync["peak_reset"] and background["peak_reset"], "runs": sync["runs"],
            "dcp_items": dcp["items"], "dcp_one": dcp["one"],
            "blocking_x_dcp_items": background["blocking"] / dcp["items"]["blocking"],
            "blocking_x_dcp_one": background["blocking"] / dcp["one"]["blocking"]}


def _row(f: dict[str, Any]) -> list[str]:
    return [f"{f['buffer']:,}", f"{f['item'] // 1024} KiB", f["kind"], f["buffer_state"], _mb(f["state"]),
            _mb(f["size"]), _ms(f["sync"]), f"{_ms(f['blocking'])} ({f['blocking_share']:.1%})", _ms(f["total"]),
            _ms(f["restore"]), f"{_mb(f['peak_sync'])} ({f['peak_sync_x_state']:.2f}x)",
            f"{_mb(f['peak_background'])} ({f['peak_background_x_state']:.2f}x)",
            f"{_mb(f['peak_restore'])} ({f['peak_restore_x_state']:.2f}x)",
            f"{f['blocking_x_dcp_items']:.2f}x items, {f['blocking_x_dcp_one']:.2f}x one"]


def _dcp_row(buffer: int, size: int, dcp: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{buffer:,}", f"{size // 1024} KiB", _mb(dcp["items"]["state"]),
            *(f"{_ms(d['blocking'])} / {_ms(d['total'])} / {_mb(d['peak'])} ({d['peak'] / d['state']:.2f}x)"
              for d in (dcp["items"], dcp["one"]))]


def budgets(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print each budget of a streamed save with the figures it is read from; return the verdicts."""
    verdicts: list[dict[str, Any]] = []

    def check(name: str, f: dict[str, Any], ok: bool, text: str) -> str:
        verdicts.append({"budget": name, "buffer": f["buffer"], "item": f["item"], "kind": f["kind"],
                         "buffer_state": f["buffer_state"], "pass": ok})
        return f"   {f['buffer']:,} x {f['item'] // 1024} KiB {f['kind']}: {text} {_verdict(ok)}"

    values = [f for f in figures if f["buffer_state"] == "values"]
    positions = [f for f in figures if f["buffer_state"] == "positions"]
    print(f"\nbudgets (each read from this run):\n1. peak memory of a save by value, above the loader's RSS, "
          f"<= {MEMORY_BUDGET}x the state:")
    for f in values:
        for mode in ("sync", "background"):
            x = f[f"peak_{mode}_x_state"]
            print(check(f"memory {mode}", f, x <= MEMORY_BUDGET, f"{mode} {x:.2f}x"))
    print(f"2. blocking part of a background save <= {BLOCKING_BUDGET:.0%} of a synchronous save, buffers saved as "
          "positions (also shown: its share of the synchronous save by value of the same buffer):")
    for f in positions:
        by_value = next((v["sync"] for v in values if (v["buffer"], v["item"], v["kind"]) ==
                         (f["buffer"], f["item"], f["kind"])), None)
        also = f"; {f['blocking'] / by_value:.1%} of the save by value" if by_value else ""
        print(check("blocking positions", f, f["blocking_share"] <= BLOCKING_BUDGET,
                    f"{_ms(f['blocking'])} = {f['blocking_share']:.1%} of {_ms(f['sync'])}{also}"))
    print("3. blocking part of a background save by value <= DCP async_save's staging of the same bytes "
          "as one tensor (also shown: against one tensor per item):")
    for f in values:
        dcp = f["dcp_one"]["blocking"]
        print(check("blocking values", f, f["blocking"] <= dcp,
                    f"{_ms(f['blocking'])} vs {_ms(dcp)} ({f['blocking_x_dcp_one']:.2f}x; one tensor per item "
                    f"{_ms(f['dcp_items']['blocking'])}, {f['blocking_x_dcp_items']:.2f}x)"))
    print(f"4. peak memory of a restore by value, above the new loader's RSS, <= {MEMORY_BUDGET}x the state:")
    for f in values:
        x = f["peak_restore_x_state"]
        print(check("memory restore", f, x <= MEMORY_BUDGET, f"{x:.2f}x"))
    print(f"5. a synchronous save of the positions of a buffer of {ISSUE_CASE[0]:,} <= format 1's "
          f"({_ms(FORMAT1_POSITIONS_SAVE)}, docs/benchmarks.md):")
    for f in positions:
        print(check("positions save", f, f["sync"] <= FORMAT1_POSITIONS_SAVE, _ms(f["sync"])))
    return verdicts


def run(repeat: int = 1, json_path: str | None = None, large: bool = False, items: str = ",".join(ITEM_KINDS),
        only: str | None = None, rounds: int | None = None, fork: bool = False) -> dict[str, Any]:
    kinds = [k for k in items.split(",") if k]
    unknown = sorted(set(kinds) - set(ITEM_KINDS))
    if unknown or not kinds:
        raise SystemExit(f"--items {items!r}: choose from {','.join(ITEM_KINDS)}")
    cases = [parse_case(only)] if only else [(buffer, size) for size in ITEMS for buffer in BUFFERS]
    from benchmarks import _codec_table  # after the arguments are checked: it imports torch

    codec = _codec_table.run(repeat, rounds, fork)
    print()
    figures, rows, dcp_rows = [], [], []
    for buffer, size in cases:
        if size * buffer > 1e9 and not large:
            rows.append([f"{buffer:,}", f"{size // 1024} KiB", "", "skipped (--large)", *[""] * 10])
        else:
            dcp = {"items": _measure(repeat, "dcp-items", buffer, size, fork=fork),
                   "one": _measure(repeat, "dcp-one", buffer, size, fork=fork)}
            dcp_rows.append(_dcp_row(buffer, size, dcp))
            for kind in kinds:
                for option in OPTIONS:
                    figures.append(_figure(repeat, buffer, size, kind, option, dcp, fork))
                    rows.append(_row(figures[-1]))
        print(table(HEADERS, rows), flush=True)
        print()
    if dcp_rows:
        print("anchor: torch.distributed.checkpoint.async_save of the same bytes, blocking / total / peak (x state)")
        print(table(["buffer", "item", "state", "one tensor per item", "one tensor"], dcp_rows))
    if not all(f["peak_reset"] for f in figures):
        print("\nnote: the peak-RSS mark could not be reset (/proc/self/clear_refs): peaks include earlier ones")
    verdicts = budgets(figures)
    result = {"codec": codec, "scale": figures, "budgets": codec["budgets"] + verdicts}
    save_json(json_path, result)
    return result
