"""A rank or a worker killed (SIGKILL) in the middle of a save or a restore.

The others raise a ``RankError`` (a ``WorkerError`` in the loader's process) within the documented
timeout, naming the save's path and what is intact there; nothing is published, ``snapshot.latest()``
still returns the previous snapshot, and it restores exactly. Each kill lands where the test says: the
process to kill reaches that point (a sample pickled into its part, unpickled by its restore, a pipe's
state taken for the snapshot) and tells the test through a fork-inherited event
(:class:`tests.faults.Landing`); the test looks at what the process left (its part half-written), then
kills it. Real gloo ranks (:mod:`tests.dist`), real worker processes.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest

import snapshot
from snapshot import DistributedReadingService
from snapshot.reading_service import MultiProcessingReadingService as Workers
from tests import graphs
from tests.dist import RankFailure, run_ranks
from tests.faults import Held, Landing

#: The services' timeout: every collective, and every wait for a worker, has this bound.
TIMEOUT = 20.0
RANKS = 3


def graph(n: int = 60) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([Held(i) for i in range(n)]).shuffle(buffer_size=6).sharding_filter()


def loader() -> snapshot.DataLoader2[Any]:
    return snapshot.DataLoader2(graph(), reading_service=DistributedReadingService(TIMEOUT))


def epoch(rank: int, world: int) -> list[int]:
    with loader() as dl:
        dl.seed(1)
        return [x.value for x in dl]


def restore_rest(rank: int, world: int, source: str) -> list[int]:
    with loader() as dl:
        dl.restore_snapshot(source, allow_pickle=True)
        return [x.value for x in dl]


def save_twice(rank: int, world: int, ckpt: str, victim: int, landing: Landing) -> dict[str, Any]:
    """A snapshot after 3 samples; the victim dies while it writes its part of the one after 5."""
    with loader() as dl:
        dl.seed(1)
        it = iter(dl)
        for _ in range(3):
            next(it)
        dl.save_snapshot(f"{ckpt}/step-3.snap", include_graph=False)
        next(it), next(it)
        if rank == victim:
            Held.hold = staticmethod(landing.arrive)
            Held.armed = True
        start = time.monotonic()
        try:
            dl.save_snapshot(f"{ckpt}/step-5.snap", include_graph=False)
        except snapshot.RankError as exc:
            return {"error": str(exc), "seconds": time.monotonic() - start}
        return {"error": None}


def restore_and_die(rank: int, world: int, source: str, victim: int, landing: Landing, running: bool) -> dict[str, Any]:
    """The victim dies while its restore unpickles the saved samples (``running``: on a loader that has run)."""
    with loader() as dl:
        if running:
            dl.seed(5)
            next(iter(dl))
        if rank == victim:
            Held.hold = staticmethod(landing.arrive)
            Held.reviving = True
        start = time.monotonic()
        try:
            dl.restore_snapshot(source, allow_pickle=True)
        except snapshot.RankError as exc:
            return {"error": str(exc), "seconds": time.monotonic() - start}
        return {"error": None}


def survivors(results: list[Any], victim: int) -> list[tuple[int, dict[str, Any]]]:
    assert isinstance(results[victim], RankFailure) and "died (-9)" in results[victim].message, results[victim]
    return [(rank, result) for rank, result in enumerate(results) if rank != victim]


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_mid_save_publishes_nothing_and_the_others_say_so(tmp_path, victim: int) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dest, previous = ckpt / "step-5.snap", ckpt / "step-3.snap"
    landing = Landing()

    def staged() -> list[str]:
        return [f for name in os.listdir(ckpt) if name.startswith(".step-5.snap.") for f in os.listdir(ckpt / name)]

    with landing.kill_on_arrival(staged):
        results = run_ranks(RANKS, save_twice, str(ckpt), victim, landing, timeout=120, allow_errors=True)
    # it landed mid-save: the victim's part was half-written, a temporary file in the save's staging directory
    assert [f for f in landing.proof if f.startswith(f".rank-{victim:05d}.snap.snapshot-tmp.")], landing.proof
    for rank, result in survivors(results, victim):
        error = result["error"]
        assert error.startswith(f"{dest}: the snapshot was not saved: rank {rank} of {RANKS}: writing the parts of a "
                                f"snapshot failed: another rank died, hung for more than {TIMEOUT:g} s"), error
        assert error.endswith(f"Nothing was written at {dest} (there was no snapshot there before). The newest "
                              f"snapshot there is still {previous}."), error
        assert result["seconds"] < TIMEOUT  # within the documented timeout
    assert snapshot.latest(ckpt) == str(previous)
    assert not [name for name in os.listdir(ckpt) if "step-5" in name]  # no staging directory left
    reference = run_ranks(RANKS, epoch)
    assert run_ranks(RANKS, restore_rest, str(previous)) == [samples[3:] for samples in reference]


def saved_directory(tmp_path) -> str:
    """The newest of two directory snapshots: after 5 samples on each rank."""
    landing = Landing()  # nobody arrives
    run_ranks(RANKS, save_twice, str(tmp_path), -1, landing, timeout=120)
    assert snapshot.latest(tmp_path) == str(tmp_path / "step-5.snap")
    return str(tmp_path / "step-5.snap")


@pytest.mark.slow
def test_a_rank_killed_mid_restore_is_a_rank_error_on_the_others(tmp_path) -> None:
    source = saved_directory(tmp_path)
    landing = Landing()
    with landing.kill_on_arrival():
        results = run_ranks(RANKS, restore_and_die, source, 1, landing, True, timeout=120, allow_errors=True)
    assert landing.killed is not None  # it landed: while rank 1's restore unpickled the saved samples
    for rank, result in survivors(results, 1):
        error = result["error"]
        assert error is not None and re.match(rf"rank {rank} of {RANKS}: [^:]+ failed: another rank died", error), error
        assert "restore from the last complete snapshot" in error
        assert result["seconds"] < TIMEOUT
    assert snapshot.latest(tmp_path) == source
    reference = run_ranks(RANKS, epoch)
    assert run_ranks(RANKS, restore_rest, source) == [samples[5:] for samples in reference]


@pytest.mark.slow
def test_a_rank_killed_mid_restore_of_a_fresh_loader_is_a_rank_error_on_the_others(tmp_path) -> None:
    source = saved_directory(tmp_path)
    landing = Landing()
    with landing.kill_on_arrival():
        results = run_ranks(RANKS, restore_and_die, source, 1, landing, False, timeout=120, allow_errors=True)
    assert landing.killed is not None
    for rank, result in survivors(results, 1):
        assert not isinstance(result, RankFailure), result.message.splitlines()[0]
        error = result["error"]
        assert error is not None and re.match(rf"rank {rank} of {RANKS}: [^:]+ failed: another rank died", error), error
        assert result["seconds"] < TIMEOUT


class HeldCounter(graphs.StatefulCounter):
    """A source whose state, taken for a snapshot in a worker once :attr:`landing` is armed, is where one
    worker dies."""

    landing: Landing | None = None

    def state_dict(self) -> dict[str, int]:
        if HeldCounter.landing is not None and HeldCounter.landing.armed:
            HeldCounter.landing.arrive()
        return super().state_dict()


def worker_graph() -> Any:
    from torch.utils.data.datapipes.iter import Mapper, ShardingFilter, Shuffler

    return Mapper(ShardingFilter(Shuffler(HeldCounter(60), buffer_size=5)), graphs.double)


def run_workers(source: Any = None) -> list[int]:
    with snapshot.DataLoader2(worker_graph(), reading_service=Workers(2, timeout=TIMEOUT)) as dl:
        if source is None:
            dl.seed(0)
        else:
            dl.restore_snapshot(source)
        return list(dl)


@pytest.fixture
def landing():
    HeldCounter.landing = Landing()
    yield HeldCounter.landing
    HeldCounter.landing = None


def test_a_worker_killed_mid_save_is_a_worker_error_naming_it(tmp_path, landing) -> None:
    ckpt = tmp_path / "ckpt"
    dest, previous = ckpt / "step-10.snap", ckpt / "step-6.snap"
    with snapshot.DataLoader2(worker_graph(), reading_service=Workers(2, timeout=TIMEOUT)) as dl:
        dl.seed(0)
        it = iter(dl)
        for _ in range(6):
            next(it)
        dl.save_snapshot(previous)
        for _ in range(4):
            next(it)
        landing.arm()
        start = time.monotonic()
        with landing.kill_on_arrival(lambda: sorted(os.listdir(ckpt))), \
                pytest.raises(snapshot.WorkerError) as info:
            dl.save_snapshot(dest)
        seconds = time.monotonic() - start
    assert landing.proof == ["step-6.snap"]  # mid-save: the worker's state was being taken, nothing written yet
    message = str(info.value)
    killed = re.search(r"the snapshot was not saved: worker (\d) \(pid (\d+)\) exited unexpectedly \(killed by signal "
                       r"SIGKILL\) while the loader waited for taking a snapshot", message)
    assert message.startswith(f"{dest}: ") and killed is not None, message
    assert int(killed[2]) == landing.killed
    assert message.endswith(f"Nothing was written at {dest} (there was no snapshot there before). The newest snapshot "
                            f"there is still {previous}."), message
    assert seconds < TIMEOUT
    assert snapshot.latest(ckpt) == str(previous)
    HeldCounter.landing = None  # disarmed
    assert run_workers(previous) == run_workers()[6:]
