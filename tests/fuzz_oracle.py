"""The oracle of the graph fuzz: each drawn case is run, saved at its cuts and restored elsewhere.

For a case (a graph of ``tests/fuzz_grammar.py``, a seed, a service that saves and another
that restores, cut points, a strategy, and whether the restore rebuilds the graph in code or
unpickles it):

1. the reference: the graph read uninterrupted through the epochs, on the saving service;
2. the saving run: the same, saving a snapshot at every cut; its whole stream must equal the
   reference (a run that saves equals one that never saves);
3. each snapshot is restored onto the other service in a fresh process (several per process)
   and the rest of its epoch and the following epochs must equal the saving run's (with
   ``again``, the restored loader is saved again halfway through the rest of the epoch and
   that snapshot restored too: a restore of a restore).

Each cut ends ``exact``, ``refused`` (a ``SnapshotError`` at save or restore), ``wrong`` (any
difference: a finding) or ``crash`` (any other exception, a worker error, a hang: a finding). A
refusal is accepted only where :data:`EXPLAINED` says why (the design, or the issue that lifts
it): at least :data:`MIN_EXACT` of a case's other restores must be exact. The table lists every
refusal with its reason. A case whose graph fails in the reference run is ``refused`` (a
``SnapshotError``) or ``invalid`` (torch itself cannot run the graph: a grammar problem). A
case whose two runs without saving differ (one seed) is also ``irreproducible``: its cuts are
then checked against the saving run's own stream (a restore continues the run it was saved
from), which is what they are checked against in every case.
"""

from __future__ import annotations

import argparse
import collections
import functools
import io
import json
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

import snapshot
from snapshot.testing import first_difference
from tests import fuzz_grammar

OUTCOMES = ("exact", "refused", "wrong", "crash", "invalid", "irreproducible")
FINDINGS = ("wrong", "crash")
#: Refusals the fuzz accepts, by a pattern of their message, each with why: a decision of the design or
#: the open issue that lifts it. Any other refusal counts against its case's share of exact restores.
EXPLAINED: dict[str, str] = {
    r"cannot keep \d+ workers busy": "issue 34 item 1: a restore onto more workers than logical shards (W' > L)",
    r"needs a sharding point, and this graph has none": "by design: logical_shards > 1 needs a sharding point",
    r"replaying the graph did not reproduce the saved position":
        "issue 34 item 3: a replay through in_memory_cache does not reach the saved position",
}
#: The share of a case's restores that must be exact, besides the explained refusals.
MIN_EXACT = 0.5
#: Seconds a worker may stay silent before the service raises.
WORKER_TIMEOUT = 60.0
#: Cases whose epochs are longer than this are not cut (too slow to be worth it).
MAX_EPOCH = 3000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Outcome:
    case: int
    cut: str
    outcome: str
    stage: str
    detail: str = ""


class AsIfWorkers(snapshot.InProcessReadingService):
    """In one process, the units a restore onto ``n`` workers runs: a restore onto more workers than the
    snapshot's units splits them into sub-shards (another order), and must read what these read."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    @property
    def workers(self) -> int:
        return self.n


def service(name: str) -> Any:
    """The reading service called ``name`` in ``fuzz_grammar.SERVICES`` (``as_if_mpN``: :class:`AsIfWorkers`)."""
    if name.startswith("as_if_"):
        return AsIfWorkers(int(name[len("as_if_mp")]))
    if name.startswith("inproc"):
        return snapshot.InProcessReadingService(logical_shards=2 if name.endswith("_L2") else None)
    workers = int(name[2])
    shards = int(name.split("_L")[1]) if "_L" in name else None
    return snapshot.MultiProcessingReadingService(workers, logical_shards=shards, timeout=WORKER_TIMEOUT)


def reproducer(case: dict[str, Any]) -> str:
    return f"python -m tests.fuzz_grammar --case '{json.dumps(case, separators=(',', ':'))}'"


def _short(exc: BaseException) -> str:
    """One line: the error, and for an error raised in a worker the last line of its traceback."""
    text = f"{type(exc).__name__}: {exc}"
    if "Traceback" in text:
        head, _, trace = text.partition("Traceback")
        lines = trace.splitlines()
        starts = [i for i, line in enumerate(lines) if re.match(r"[\w.]+(Error|Exception|Exit):", line)]
        text = head.strip() + " ... " + " ".join(line.strip() for line in lines[starts[-1] if starts else -1:])
    text = text.replace("\n", " ")
    return text if len(text) < 500 else text[:497] + "..."


def _is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, snapshot.SnapshotError) and not isinstance(exc, snapshot.ExecutionError)


def _loader(case: dict[str, Any], root: str) -> Any:
    loader = snapshot.DataLoader2(fuzz_grammar.build(case["graph"], root), reading_service=service(case["save_on"]))
    loader.seed(case["seed"])
    return loader


def _runs_natively(graph: Any, root: str) -> bool:
    try:
        for _ in range(2):
            list(fuzz_grammar.build(graph, root))
    except Exception:  # noqa: BLE001 - any failure of torch's own run means a graph torch cannot run
        return False
    return True


def _resolve(cuts: list[list[Any]], lengths: list[int]) -> list[tuple[int, int, bool]]:
    out = set()
    for epoch, what, permille in cuts:
        n = lengths[epoch]
        out.add((epoch, n * permille // 1000, False) if what == "at" else (epoch, n, what == "after_end"))
    return sorted(out)


def _cut_name(cut: tuple[int, int, bool]) -> str:
    return f"epoch {cut[0]}, after {cut[1]} samples" + (" and StopIteration" if cut[2] else "")


def _saving_run(case: dict[str, Any], root: str, cuts: list[tuple[int, int, bool]], epochs: int,
                ) -> tuple[list[list[Any]], dict[tuple[int, int, bool], Any]]:
    """Read ``epochs`` epochs, saving at each cut: the stream and each cut's bytes (or error)."""
    saved: dict[tuple[int, int, bool], Any] = {}
    streams: list[list[Any]] = []
    wanted = set(cuts)

    def save(cut: tuple[int, int, bool]) -> None:
        if cut in wanted:
            try:
                saved[cut] = loader.save_snapshot().to_bytes()
            except Exception as exc:  # noqa: BLE001 - classified by the caller
                saved[cut] = exc

    with _loader(case, root) as loader:
        for epoch in range(epochs):
            stream: list[Any] = []
            it = iter(loader)
            while True:
                save((epoch, len(stream), False))
                try:
                    stream.append(next(it))
                except StopIteration:
                    break
            save((epoch, len(stream), True))
            streams.append(stream)
    return streams, saved


def prepare(index: int, case: dict[str, Any], root: str) -> tuple[list[Outcome], list[dict[str, Any]]]:
    """Run the reference and the saving run of ``case``: outcomes so far and the restore jobs."""
    epochs = max(c[0] for c in case["cuts"]) + 2
    try:
        with _loader(case, root) as loader:
            reference = [list(loader) for _ in range(epochs)]
    except Exception as exc:  # noqa: BLE001
        if _is_refusal(exc):
            return [Outcome(index, "-", "refused", "run", _short(exc))], []
        kind = "crash" if _runs_natively(case["graph"], root) else "invalid"
        return [Outcome(index, "-", kind, "run", _short(exc))], []
    if max(map(len, reference)) > MAX_EPOCH:
        return [Outcome(index, "-", "invalid", "run", f"epochs of {list(map(len, reference))} samples: too long")], []
    cuts = _resolve(case["cuts"], [len(e) for e in reference])
    outcomes: list[Outcome] = []
    try:
        with _loader(case, root) as loader:
            again = [list(loader) for _ in range(epochs)]
    except Exception as exc:  # noqa: BLE001
        return [Outcome(index, "-", "crash", "rerun", _short(exc))], []
    reproducible = _compare(reference, again) is None
    if not reproducible:
        outcomes.append(Outcome(index, "-", "irreproducible", "rerun", "two runs with one seed differ in "
                                + str(_compare(reference, again))))
    try:
        streams, saved = _saving_run(case, root, cuts, epochs)
    except Exception as exc:  # noqa: BLE001
        return [*outcomes, Outcome(index, "-", "crash", "save", _short(exc))], []
    difference = _compare(reference, streams)
    if reproducible and difference is not None:
        outcomes.append(Outcome(index, "-", "wrong", "save", f"the saving run differs in {difference}"))
    jobs = []
    for cut in cuts:
        if cut not in saved:  # the saving run ended before (a difference reported above)
            continue
        data = saved[cut]
        if isinstance(data, Exception):
            outcomes.append(Outcome(index, _cut_name(cut), "refused" if _is_refusal(data) else "crash", "save",
                                    _short(data)))
            continue
        epoch, samples, finished = cut
        # what the saving run read after the cut (the reference too, unless saving changed it)
        expected = ([] if finished else [streams[epoch][samples:]]) + streams[epoch + 1:]
        jobs.append({"case": index, "cut": _cut_name(cut), "graph": case["graph"], "root": root,
                     "restore_on": case["restore_on"], "strategy": case["strategy"], "rebuild": case["rebuild"],
                     "again": case.get("again", False),
                     "data": data, "expected": expected})
    return outcomes, jobs


def _compare(want: list[list[Any]], got: list[list[Any]]) -> str | None:
    """Where two runs' epochs first differ (``None`` when they are equal)."""
    for epoch, (a, b) in enumerate(zip(want, got)):
        at = first_difference(a, b)
        if at is not None:
            return f"epoch {epoch} at sample {at}: {_show(a, at)} then {_show(b, at)}"
    return None


def _show(items: list[Any], index: int) -> str:
    text = repr(items[index]) if index < len(items) else "<end of epoch>"
    return text if len(text) < 100 else text[:97] + "..."


def _restored(job: dict[str, Any], data: bytes) -> Any:
    """A fresh loader on the job's service, restored from ``data`` (graph rebuilt or unpickled)."""
    rs = service(job["restore_on"])
    if job["rebuild"] == "pickle":
        return snapshot.DataLoader2.from_snapshot(io.BytesIO(data), rs, strategy=job["strategy"])
    loader = snapshot.DataLoader2(fuzz_grammar.build(job["graph"], job["root"]), reading_service=rs)
    loader.restore_snapshot(io.BytesIO(data), strategy=job["strategy"])
    return loader


def _read(job: dict[str, Any]) -> list[list[Any]]:
    """The rest of the job's epochs from its snapshot; with ``again``, saved again halfway
    through the first of them and that snapshot restored into a third loader."""
    epochs = len(job["expected"])
    with _restored(job, job["data"]) as loader:
        if not (job.get("again") and epochs):
            return [list(loader) for _ in range(epochs)]
        it = iter(loader)
        head = [next(it) for _ in range(len(job["expected"][0]) // 2)]
        data = loader.save_snapshot().to_bytes()
    with _restored(job, data) as loader:
        rest = [list(loader) for _ in range(epochs)]
    return [head + rest[0], *rest[1:]]


def _splits(job: dict[str, Any]) -> bool:
    """Whether the job restores onto more workers than its snapshot has units (they are then split)."""
    name = job["restore_on"]
    service_record = snapshot.read_manifest(io.BytesIO(job["data"]))["service"]
    units = service_record.get("units") or service_record.get("logical_shards") or 1
    return name.startswith("mp") and int(name[2]) > units


def restore(job: dict[str, Any]) -> tuple[str, str, str]:
    """Restore one job's snapshot onto its service and compare: (outcome, stage, detail). A restore that
    splits the units is compared with the same units run in one process (the saving run's order is not
    kept: see docs/concepts/logical-shards.md)."""
    try:
        streams = _read(job)
        expected = _read({**job, "restore_on": "as_if_" + job["restore_on"]}) if _splits(job) else job["expected"]
    except Exception as exc:  # noqa: BLE001
        return ("refused" if _is_refusal(exc) else "crash", "restore", _short(exc))
    for offset, (want, got) in enumerate(zip(expected, streams)):
        at = first_difference(want, got)
        if at is not None:
            return ("wrong", "restore", f"{offset} epochs after the cut, at sample {at} of the rest: "
                    f"{_show(want, at)} expected, {_show(got, at)} read ({len(want)} expected, {len(got)} read)")
    return ("exact", "restore", "")


def child_main(jobs_path: str, results_path: str) -> int:
    """Run the jobs pickled in ``jobs_path``, appending one JSON line per result."""
    with open(jobs_path, "rb") as f:
        jobs = pickle.load(f)
    with open(results_path, "a", encoding="utf-8") as out:
        for job in jobs:
            outcome, stage, detail = restore(job)
            out.write(json.dumps([outcome, stage, detail]) + "\n")
            out.flush()
    return 0


def run_jobs(jobs: list[dict[str, Any]], timeout: float = 600) -> list[tuple[str, str, str]]:
    """Every job restored in fresh processes; one that hangs or kills its process is a crash."""
    results: list[tuple[str, str, str]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="fuzz-restore-") as tmp:
        while len(results) < len(jobs):
            pending = jobs[len(results):]
            jobs_path, results_path = os.path.join(tmp, "jobs.pkl"), os.path.join(tmp, "results.jsonl")
            with open(jobs_path, "wb") as f:
                pickle.dump(pending, f)
            open(results_path, "w").close()
            try:
                done = subprocess.run([sys.executable, "-m", "tests.fuzz_oracle", "--child", jobs_path, results_path],
                                      cwd=ROOT, env=env, timeout=timeout, capture_output=True, text=True)
                problem = f"the restoring process exited with {done.returncode}: {done.stderr[-300:]}"
            except subprocess.TimeoutExpired:
                problem = f"the restoring process did not finish within {timeout:g} s"
            with open(results_path, encoding="utf-8") as f:
                got = [tuple(json.loads(line)) for line in f if line.strip()]
            results.extend(got)  # type: ignore[arg-type]
            if len(got) < len(pending):
                results.append(("crash", "restore", problem.replace("\n", " ")))
    return results


def run(cases: list[dict[str, Any]], root: str, batch: int = 40, log: Any = None) -> list[Outcome]:
    """Every case of ``cases``, with restores batched ``batch`` jobs to a process.

    The global generators start from fixed states (and are put back after), so a graph that
    wrongly draws from them fails the same way whatever ran before in this process.
    """
    saved = random.getstate(), torch.get_rng_state()
    random.seed(0)
    torch.manual_seed(0)
    try:
        return _run(cases, root, batch, log)
    finally:
        random.setstate(saved[0])
        torch.set_rng_state(saved[1])


def _run(cases: list[dict[str, Any]], root: str, batch: int, log: Any) -> list[Outcome]:
    outcomes: list[Outcome] = []
    jobs: list[dict[str, Any]] = []

    def flush() -> None:
        for job, (outcome, stage, detail) in zip(jobs, run_jobs(jobs)):
            outcomes.append(Outcome(job["case"], job["cut"], outcome, stage, detail))
        jobs.clear()

    for index, case in enumerate(cases):
        done, more = prepare(index, case, root)
        outcomes.extend(done)
        jobs.extend(more)
        if len(jobs) >= batch:
            flush()
        if log is not None and index % 25 == 24:
            log(f"{index + 1}/{len(cases)} cases prepared, {len(outcomes)} outcomes")
    if jobs:
        flush()
    return sorted(outcomes, key=lambda o: o.case)


def explained(outcome: Outcome) -> str | None:
    """Why a refusal is accepted (see :data:`EXPLAINED`); ``None`` for any other outcome."""
    if outcome.outcome != "refused":
        return None
    return next((why for pattern, why in EXPLAINED.items() if re.search(pattern, outcome.detail)), None)


def shortfall(outcomes: list[Outcome]) -> str | None:
    """Why a case's outcomes hold too few exact restores (``None`` when they hold enough).

    Explained refusals and graphs that cannot run at all are left out; every other outcome is
    judged, and at least :data:`MIN_EXACT` of those must be exact restores.
    """
    judged = [o for o in outcomes if o.outcome in ("exact", *FINDINGS, "refused") and explained(o) is None]
    exact = sum(o.outcome == "exact" for o in judged)
    if judged and exact < MIN_EXACT * len(judged):
        return f"{exact} of {len(judged)} restores exact (at least {MIN_EXACT:.0%} must be), besides explained refusals"
    return None


def _gist(detail: str) -> str:
    """The part of a message that names the reason (for a worker's error, its own error)."""
    text = detail.split(" ... ")[-1]
    return re.sub(r"\d+", "N", text)[:130]


def table(outcomes: list[Outcome], cases: list[dict[str, Any]]) -> str:
    """The counts (per cut) and every finding with its reproducer."""
    counts = collections.Counter(o.outcome for o in outcomes)
    lines = [f"{len(cases)} cases, {len(outcomes)} outcomes: "
             + ", ".join(f"{counts.get(k, 0)} {k}" for k in OUTCOMES)]
    refusals = collections.Counter(f"{o.stage}: {_gist(o.detail)}" for o in outcomes if o.outcome == "refused")
    if refusals:
        lines.append("refusals (most common first):")
        lines += [f"  {n:4d} x {text}" for text, n in refusals.most_common(25)]
    for o in outcomes:
        if o.outcome == "refused":
            lines.append(f"REFUSED case {o.case} [{o.cut}] at {o.stage} ({explained(o) or 'NOT EXPLAINED'}): "
                         f"{o.detail}")
    for index in sorted({o.case for o in outcomes}):
        why = shortfall([o for o in outcomes if o.case == index])
        if why:
            lines.append(f"TOO FEW EXACT case {index}: {why}")
            lines.append(f"  {reproducer(cases[index])}")
    for o in outcomes:
        if o.outcome in (*FINDINGS, "irreproducible"):
            lines.append(f"{o.outcome.upper()} case {o.case} [{o.cut}] at {o.stage}: {o.detail}")
            lines.append(f"  {reproducer(cases[o.case])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, draw: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_grammar", description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=int(os.environ.get("SNAPSHOT_FUZZ_EXAMPLES", 100)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", help="one case as JSON (from a report): run it alone")
    parser.add_argument("--json", help="also write every outcome to this file")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(*args.child)
    cases = [json.loads(args.case)] if args.case else (draw or fuzz_grammar.draw_cases)(args.examples, args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-data-") as root:
        outcomes = run(cases, root, log=functools.partial(print, file=sys.stderr, flush=True))
    print(table(outcomes, cases))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cases": cases, "outcomes": [asdict(o) for o in outcomes]}, f)
    short = any(shortfall([o for o in outcomes if o.case == i]) for i in range(len(cases)))
    return 1 if short or any(o.outcome in FINDINGS for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
