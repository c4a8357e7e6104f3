"""MultiProcessingReadingService: one stream for any number of workers, exact elastic restores."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Any

import pytest

import snapshot
from snapshot import InProcessReadingService
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.testing import Cut, assert_resumes_exactly, first_difference
from tests import graphs, helpers
from tests.conftest import _service_pids, child_pids

SHARDED = [graphs.sharded, graphs.sharded_hookless, graphs.replicated_source, graphs.sharded_batches]
L = 3


def in_process():
    return InProcessReadingService(logical_shards=L)


def workers(n: int, shards: int | None = L, **kwargs):
    return functools.partial(Workers, n, logical_shards=shards, **kwargs)


SERVICES = {"in_process": in_process, "workers_1": workers(1), "workers_2": workers(2), "workers_3": workers(3)}


def epochs(factory, service, seed: int = 7, count: int = 2):
    with snapshot.DataLoader2(factory(), reading_service=service()) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(count)]


@pytest.mark.parametrize("factory", SHARDED, ids=lambda f: f.__name__)
def test_the_stream_does_not_depend_on_the_number_of_workers(factory) -> None:
    reference = epochs(factory, in_process)
    for name, service in SERVICES.items():
        got = epochs(factory, service)
        for epoch, (want, have) in enumerate(zip(reference, got)):
            assert first_difference(want, have) is None, f"{name}, epoch {epoch}"
    assert first_difference(reference[0], reference[1]) is not None  # epochs reshuffle


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("factory", [graphs.sharded, graphs.sharded_hookless], ids=lambda f: f.__name__)
def test_every_cut_restores_exactly(factory, service: str) -> None:
    # every node of graphs.sharded has a hook: auto would make state's plan (tests/helpers.py)
    strategies = ("auto", "fast_forward") if factory is graphs.sharded_hookless else helpers.HOOKED_STRATEGIES
    assert_resumes_exactly(factory, reading_service=SERVICES[service], epochs=2, strategies=strategies,
                           via_file=False)


@pytest.mark.parametrize("saved, restored", [("workers_3", "workers_1"), ("workers_2", "workers_3"),
                                             ("workers_3", "in_process"), ("in_process", "workers_2"),
                                             ("workers_1", "workers_2")])
def test_elastic_restore_onto_another_worker_count(saved: str, restored: str) -> None:
    for factory in (graphs.sharded, graphs.replicated_source):
        assert_resumes_exactly(factory, reading_service=SERVICES[saved], restore_service=SERVICES[restored],
                               epochs=2, strategies=("auto", "fast_forward"), via_file=False,
                               cuts=[Cut(0, 1), Cut(0, 5), Cut(0, 9, then=12), Cut(1, 3)])


@pytest.mark.slow
def test_restore_onto_workers_in_a_fresh_process() -> None:
    assert_resumes_exactly(graphs.sharded_batches, reading_service=workers(2), restore_service=workers(3),
                           epochs=2, fresh_process=True, cuts=[Cut(0, 3), Cut(1, 2)])


def marked(directory: str, x: int) -> int:
    """``x``, leaving a file named by the worker process and ``x`` (a sample computed there)."""
    open(os.path.join(directory, f"{os.getpid()}-{x}"), "w").close()
    return graphs.double(x)


def marked_batches(directory: str, n: int = 64) -> Any:
    """``graphs.sharded_batches`` whose map marks each sample it computes."""
    from torch.utils.data.datapipes.iter import Batcher, Collator, IterableWrapper, Mapper, ShardingFilter, Shuffler

    dp = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=16))
    return Collator(Batcher(Mapper(dp, functools.partial(marked, directory)), batch_size=4))


def test_snapshot_holds_the_samples_in_flight(tmp_path) -> None:
    with snapshot.DataLoader2(marked_batches(str(tmp_path)), reading_service=Workers(2, prefetch_factor=4)) as loader:
        loader.seed(1)
        it = iter(loader)
        next(it)
        # a worker that has computed a sample of its third batch has handed its first two to the
        # loader's queue: with one batch taken, at least one is produced and not yet yielded
        deadline = time.monotonic() + 60
        while max(Counter(n.split("-")[0] for n in os.listdir(tmp_path)).values(), default=0) < 9:
            assert time.monotonic() < deadline, "no worker computed 9 samples within 60 s"
            time.sleep(0.01)
        manifest = loader.save_snapshot().manifest
    in_flight = [shard["in_flight"] for shard in manifest["shards"]]
    assert sum(in_flight) > 0, in_flight
    assert manifest["service"]["workers"] == 2 and manifest["service"]["logical_shards"] == 2
    assert manifest["upstream"][0]["routers"]["0/datapipe/datapipe/datapipe"]["position"] > 0


def test_a_graph_without_sharding_point_runs_in_one_worker() -> None:
    reference = epochs(graphs.linear, InProcessReadingService)
    with pytest.warns(UserWarning, match="no sharding point"):
        got = epochs(graphs.linear, workers(2, shards=None))
    assert got == reference


def test_global_generators_are_per_shard_and_restorable() -> None:
    isolate = functools.partial(InProcessReadingService, logical_shards=2, global_rng="isolate")
    reference = epochs(graphs.global_rng_graph, isolate)
    assert epochs(graphs.global_rng_graph, workers(2, shards=2)) == reference
    assert epochs(graphs.global_rng_graph, workers(1, shards=2)) == reference
    assert_resumes_exactly(graphs.global_rng_graph, reading_service=workers(2, shards=2),
                           restore_service=workers(1, shards=2), epochs=2, via_file=False,
                           cuts=[Cut(0, 3), Cut(0, 10), Cut(1, 4)])


def test_in_process_leaves_the_callers_generators_alone() -> None:
    import random

    isolate = functools.partial(InProcessReadingService, logical_shards=2, global_rng="isolate")
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    with snapshot.DataLoader2(graphs.global_rng_graph(), reading_service=isolate()) as loader:
        it = iter(loader)
        got = []
        for _ in range(3):
            next(it)
            got.append(random.random())
    assert got == expected


# -- layouts -----------------------------------------------------------------------------------

def snapshot_with(service, factory=graphs.sharded, samples: int = 4):
    return helpers.snapshot_after(factory, samples, seed=0, reading_service=service)


def test_a_different_explicit_logical_shards_is_refused() -> None:
    snap = snapshot_with(Workers(2))
    with pytest.raises(snapshot.LayoutError, match="logical_shards=3"):
        snapshot.DataLoader2(graphs.sharded(), reading_service=InProcessReadingService(logical_shards=3)) \
            .restore_snapshot(snap)


def test_logical_shards_need_a_sharding_point() -> None:
    with pytest.raises(snapshot.ShardingError, match="needs a sharding point"):
        iter(snapshot.DataLoader2(graphs.linear(), reading_service=InProcessReadingService(logical_shards=2)))


def fork_around_the_sharding_point():
    from torch.utils.data.datapipes.iter import Forker, IterableWrapper, ShardingFilter, Zipper

    a, b = Forker(IterableWrapper(range(10)), 2)
    return Zipper(ShardingFilter(a), b)


def test_a_graph_that_would_duplicate_data_is_refused_for_several_shards() -> None:
    with pytest.raises(snapshot.ShardingError, match="feeds both a sharding_filter and 0/datapipes/1"):
        iter(snapshot.DataLoader2(fork_around_the_sharding_point(),
                                  reading_service=InProcessReadingService(logical_shards=2)))


def test_with_one_logical_shard_the_graph_runs_whole() -> None:
    """With one shard nothing is cut, so graphs that cannot be cut still run (as torchdata ran them)."""
    expected = list(fork_around_the_sharding_point())
    assert epochs(fork_around_the_sharding_point, InProcessReadingService, count=1) == [expected]
    assert epochs(fork_around_the_sharding_point, workers(1, shards=None), count=1) == [expected]
    assert_resumes_exactly(fork_around_the_sharding_point, epochs=1, via_file=False,
                           strategies=("state", "fast_forward"))


# -- failures ----------------------------------------------------------------------------------

def workers_left(before: set[int], timeout: float = 20) -> set[int]:
    """Child processes started since ``before`` that are still alive after waiting up to ``timeout`` s
    for them to exit (multiprocessing's own helpers, such as its resource tracker, are not workers)."""
    deadline = time.monotonic() + timeout
    while True:
        left = child_pids() - before - _service_pids()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def test_an_exception_in_a_worker_surfaces_with_its_traceback_and_node() -> None:
    before = child_pids()
    loader = snapshot.DataLoader2(graphs.failing_graph(), reading_service=Workers(2))
    with pytest.raises(KeyError, match="bad sample 7") as info:
        list(loader)
    # KeyError's str() is a repr, so the text goes in a note (torch's own wrapper special-cases it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Caught KeyError in worker process 1" in notes and "by the DataPipe at 0" in notes
    assert "Original Traceback" in notes and "_fail_at" in notes
    assert workers_left(before) == set()  # the loader shut its workers down when the error surfaced


def test_a_killed_worker_is_reported_within_the_timeout() -> None:
    loader = snapshot.DataLoader2(graphs.killing_graph(), reading_service=Workers(2, timeout=60))
    start = time.monotonic()
    with pytest.raises(snapshot.WorkerError, match="killed by signal SIGKILL") as info:
        list(loader)
    assert time.monotonic() - start < 30  # found by the process sentinel, well before the timeout
    assert "restore from your last snapshot" in str(info.value)


def test_a_hung_worker_times_out() -> None:
    loader = snapshot.DataLoader2(graphs.hanging_graph(), reading_service=Workers(2, timeout=2))
    start = time.monotonic()
    with pytest.raises(snapshot.WorkerError, match="sent nothing for 2 s"):
        list(loader)
    assert time.monotonic() - start < 15


def test_shutdown_and_del_leave_no_child_process() -> None:
    before = child_pids()
    loader = snapshot.DataLoader2(graphs.sharded_batches(), reading_service=Workers(2))
    next(iter(loader))
    pids = {w.process.pid for w in loader.reading_service._executor.workers}
    assert pids <= child_pids()
    loader.shutdown()
    assert not (pids & child_pids())
    loader = snapshot.DataLoader2(graphs.sharded_batches(), reading_service=Workers(2))
    next(iter(loader))
    pids = {w.process.pid for w in loader.reading_service._executor.workers}
    del loader
    import gc

    gc.collect()
    assert not (pids & child_pids())
    assert child_pids() - before == set() or child_pids() <= before | set()


def test_interpreter_exit_leaves_no_worker_behind() -> None:
    script = textwrap.dedent("""
        import snapshot
        from snapshot.reading_service import MultiProcessingReadingService as Workers
        from tests import graphs
        loader = snapshot.DataLoader2(graphs.sharded_batches(), reading_service=Workers(2))
        next(iter(loader))
        print(" ".join(str(w.process.pid) for w in loader.reading_service._executor.workers), flush=True)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_workers_exit_when_the_main_process_is_killed() -> None:
    script = textwrap.dedent("""
        import os, signal, snapshot
        from snapshot.reading_service import MultiProcessingReadingService as Workers
        from tests import graphs
        loader = snapshot.DataLoader2(graphs.sharded_batches(), reading_service=Workers(2))
        next(iter(loader))
        print(" ".join(str(w.process.pid) for w in loader.reading_service._executor.workers), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == -signal.SIGKILL
    pids = [int(p) for p in proc.stdout.split()]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
