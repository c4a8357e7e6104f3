"""The rank half of the graph fuzz: a drawn graph saved on R ranks, restored on R' (real gloo groups).

For a rank case (``tests/fuzz_grammar.rank_cases``: a graph, mostly over a source sharded by file,
a seed, the layout that saves, the layout that restores, a cut, the equalizing policy):

1. the reference: each rank's epochs 0 and 1 on the saving layout, read uninterrupted;
2. the saving run: every rank reads ``k`` items of epoch 0 (the cut's permille of the shortest
   rank's epoch), saves a directory snapshot and reads on through epoch 1; each rank's whole
   stream must be the reference's (saving changes nothing);
3. the restore onto the other layout reads the rest of epoch 0 and epoch 1:

   - on as many ranks (whatever the workers), each rank's rest and next epoch are, in order, the
     saving run's;
   - on another number of ranks, the items the ranks read before the save and the rest hold every
     item of epoch 0 (the one stream of the saved logical shards, read in one process) once,
     except fewer than R' items that ``even_batches="drop"`` may drop; epoch 1 is, rank by rank and
     in order, that of a run that always had R' ranks (and the saved logical shards).

A case ends ``exact``, ``refused`` (a ``SnapshotError`` on every rank, at the save or the restore,
with its reason), ``wrong`` or ``crash`` (any other error, a rank that fails alone, a hang).
Items are compared by ``repr`` where they are counted (a batch is a list).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from typing import Any

import snapshot
from snapshot.testing import first_difference
from tests import fuzz_files, fuzz_grammar
from tests.dist import RankFailure, run_ranks
from tests.fuzz_oracle import Outcome, _is_refusal, _short

#: Seconds a rank job may take before it counts as a hang.
RANK_TIMEOUT = 180


def layout(name: str) -> tuple[int, int]:
    """``r<ranks>w<workers>`` as (ranks, workers per rank)."""
    ranks, workers = name[1:].split("w")
    return int(ranks), int(workers)


def service(name: str, policy: str | None, shards: int | None = None) -> Any:
    _, workers = layout(name)
    ranks = snapshot.DistributedReadingService(timeout=60, logical_shards=shards, even_batches=policy)
    if workers:
        return snapshot.SequentialReadingService(
            ranks, snapshot.MultiProcessingReadingService(workers, timeout=60))
    return ranks


def _loader(case: dict[str, Any], root: str, name: str, shards: int | None = None) -> Any:
    graph = fuzz_grammar.build(case["graph"], root)
    return snapshot.DataLoader2(graph, reading_service=service(name, case["policy"], shards))


def _message(exc: BaseException) -> dict[str, Any]:
    if _is_refusal(exc):
        return {"refused": _short(exc)}
    raise exc


# -- rank functions ---------------------------------------------------------------------------------

def epochs_on_ranks(rank: int, world: int, case: dict[str, Any], root: str, name: str,
                    shards: int | None) -> dict[str, Any]:
    """Epochs 0 and 1 on the layout ``name`` (``shards`` logical shards, or its own)."""
    try:
        with _loader(case, root, name, shards) as dl:
            dl.seed(case["seed"])
            return {"epochs": [list(dl), list(dl)]}
    except Exception as exc:  # noqa: BLE001 - a refusal is an outcome; anything else fails the rank
        return _message(exc)


def saving_run(rank: int, world: int, case: dict[str, Any], root: str, directory: str, k: int) -> dict[str, Any]:
    with _loader(case, root, case["save_on"]) as dl:
        dl.seed(case["seed"])
        it = iter(dl)
        head = [next(it) for _ in range(k)]
        try:
            dl.save_snapshot(directory)
        except Exception as exc:  # noqa: BLE001
            return _message(exc)
        return {"head": head, "rest": list(it), "next": list(dl)}


def restoring_run(rank: int, world: int, case: dict[str, Any], root: str, directory: str) -> dict[str, Any]:
    with _loader(case, root, case["restore_on"]) as dl:
        try:
            dl.restore_snapshot(directory)
        except Exception as exc:  # noqa: BLE001
            return _message(exc)
        return {"rest": list(dl), "next": list(dl)}


# -- the oracle -------------------------------------------------------------------------------------

class Finding(Exception):
    """An outcome other than ``exact``, reached before the end of the checks."""

    def __init__(self, outcome: str, stage: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.stage, self.detail = outcome, stage, detail


def _ranks(stage: str, world: int, *args: Any) -> list[dict[str, Any]]:
    """``run_ranks`` whose failures are outcomes: a crash, or a refusal on every rank."""
    try:
        results = run_ranks(world, *args, timeout=RANK_TIMEOUT, pg_timeout=60, allow_errors=True)
    except AssertionError as exc:  # a rank that did not finish
        raise Finding("crash", stage, str(exc)) from None
    failed = [r for r in results if isinstance(r, RankFailure)]
    if failed:
        raise Finding("crash", stage, f"rank {failed[0].rank}: {failed[0].message.splitlines()[0]}")
    refused = [r["refused"] for r in results if "refused" in r]
    if refused and len(refused) < len(results):
        raise Finding("crash", stage, f"refused on {len(refused)} of {len(results)} ranks: {refused[0]}")
    if refused:
        raise Finding("refused", stage, refused[0])
    return results


def _every(case: dict[str, Any], root: str, shards: int) -> Counter[str]:
    """Epoch 0's items, counted: the one stream of ``shards`` logical shards, in one process."""
    service_ = snapshot.InProcessReadingService(logical_shards=shards)
    with snapshot.DataLoader2(fuzz_grammar.build(case["graph"], root), reading_service=service_) as dl:
        dl.seed(case["seed"])
        return Counter(map(repr, dl))


def _same(what: str, want: list[Any], got: list[Any]) -> None:
    at = first_difference(want, got)
    if at is not None:
        raise Finding("wrong", "restore", f"{what} differs at item {at} ({len(want)} expected, {len(got)} read)")


def check_rescaled(case: dict[str, Any], root: str, saved: list[dict[str, Any]], restored: list[dict[str, Any]],
                    shards: int) -> None:
    new_ranks = layout(case["restore_on"])[0]
    got = Counter(repr(x) for r in saved for x in r["head"]) + Counter(repr(x) for r in restored for x in r["rest"])
    every = _every(case, root, shards)
    extra = sum((got - every).values())
    if extra:
        raise Finding("wrong", "restore", f"the rest of epoch 0 repeats, or invents, {extra} item(s)")
    lost = sum((every - got).values())
    if lost >= (new_ranks if case["policy"] else 1):
        raise Finding("wrong", "restore", f"the rest of epoch 0 lost {lost} item(s) on {new_ranks} ranks "
                                        f"(policy {case['policy']})")
    fresh = _ranks("fresh", new_ranks, epochs_on_ranks, case, root, case["restore_on"], shards)
    for rank, (after, again) in enumerate(zip(restored, fresh)):
        _same(f"rank {rank}'s epoch 1 (against a run that always had {new_ranks} ranks)", again["epochs"][1],
              after["next"])


def check(case: dict[str, Any], root: str) -> tuple[str, str, str]:
    """Run one rank case: (outcome, stage, detail)."""
    ranks, workers = layout(case["save_on"])
    shards = ranks * max(workers, 1)
    try:
        reference = _ranks("run", ranks, epochs_on_ranks, case, root, case["save_on"], None)
        shortest = min(len(r["epochs"][0]) for r in reference)
        k = shortest * case["cut"] // 1000
        with tempfile.TemporaryDirectory(prefix="fuzz-ranks-") as tmp:
            directory = os.path.join(tmp, "data.snap")
            saved = _ranks("save", ranks, saving_run, case, root, directory, k)
            for rank, (want, run) in enumerate(zip(reference, saved)):
                for index, got in enumerate([run["head"] + run["rest"], run["next"]]):
                    at = first_difference(want["epochs"][index], got)
                    if at is not None:
                        return ("wrong", "save", f"rank {rank}'s run that saved after {k} differs in epoch {index} "
                                                 f"at item {at}")
            restored = _ranks("restore", layout(case["restore_on"])[0], restoring_run, case, root, directory)
        if len(restored) == ranks:
            for rank, (before, after) in enumerate(zip(saved, restored)):
                _same(f"rank {rank}'s rest of epoch 0", before["rest"], after["rest"])
                _same(f"rank {rank}'s epoch 1", before["next"], after["next"])
        else:
            check_rescaled(case, root, saved, restored, shards)
    except Finding as stop:
        return stop.outcome, stop.stage, stop.detail
    return "exact", "restore", ""


def run_case(index: int, case: dict[str, Any], root: str) -> Outcome:
    fuzz_files.write_data(root)  # before the ranks fork: they read it
    outcome, stage, detail = check(case, root)
    return Outcome(index, f"epoch 0, after {case['cut']} permille", outcome, stage, detail)
