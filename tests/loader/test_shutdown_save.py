"""A save after the loader stopped: exact where it stopped, or a ``SnapshotError`` that says why not.

Every way a loader stops (``shutdown()``, the end of a ``with`` block, an exception in the
user's loop, a failure of the graph or of a worker) is followed by a save, and the save is
restored in a fresh Python process whose stream is compared with an uninterrupted run.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import InProcessReadingService, MultiProcessingReadingService
from tests.zygote import Zygote

ROOT = Path(__file__).resolve().parents[2]
SEED = 3
CUT = 10


def times_ten(x: int) -> int:
    return x * 10


def fails_at(bad: int, x: int) -> int:
    if x == bad:
        raise ValueError(f"bad sample {x}")
    return x * 10


def issue_graph(fn: Any = times_ten) -> Any:
    """The graph of issue 25: shuffle, shard, map, batch."""
    return IterableWrapper(range(1000)).shuffle().sharding_filter().map(fn).batch(8)


SERVICES = {"in_process": InProcessReadingService, "workers_2": functools.partial(MultiProcessingReadingService, 2)}


def plain(batches: list[Any]) -> list[list[int]]:
    return [[int(x) for x in batch] for batch in batches]


@functools.cache
def uninterrupted(service: str) -> list[list[int]]:
    with snapshot.DataLoader2(issue_graph(), reading_service=SERVICES[service]()) as loader:
        loader.seed(SEED)
        return plain(list(loader))


def loader_at_cut(service: str) -> tuple[snapshot.DataLoader2, Any, list[list[int]]]:
    loader = snapshot.DataLoader2(issue_graph(), reading_service=SERVICES[service]())
    loader.seed(SEED)
    it = iter(loader)
    return loader, it, plain([next(it) for _ in range(CUT)])


def _rest(src: str) -> list[list[int]]:
    """The rest of the epoch, restored from the file ``src`` alone (in a fresh process)."""
    if src.endswith(".pt"):
        loader = snapshot.DataLoader2.from_state(torch.load(src, weights_only=True))
    else:
        loader = snapshot.DataLoader2.from_snapshot(src)
    with loader:
        return [[int(x) for x in batch] for batch in loader]


@pytest.fixture
def rest_in_fresh_process(zygote: Zygote) -> Callable[[Path], list[list[int]]]:
    """The rest of the epoch, restored from ``src`` by a new process that never saw the saving loader."""
    return lambda src: zygote.call(_rest, str(src))


def assert_rest_is_exact(service: str, first: list[list[int]], rest: list[list[int]]) -> None:
    full = uninterrupted(service)
    assert len(rest) == len(full) - CUT > 0
    assert first == full[:CUT]
    assert rest == full[CUT:]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_save_after_shutdown_restores_where_the_loader_stopped(tmp_path, service: str, rest_in_fresh_process) -> None:
    loader, _, first = loader_at_cut(service)
    loader.shutdown()
    path = tmp_path / "after-shutdown.snap"
    loader.save_snapshot(path)
    manifest = snapshot.read_manifest(path)
    assert manifest["loader"]["yielded"] == CUT
    assert manifest["shards"], "the restore plan and shard positions are recorded"
    assert_rest_is_exact(service, first, rest_in_fresh_process(path))


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_save_after_the_with_block_restores_where_it_ended(tmp_path, service: str, rest_in_fresh_process) -> None:
    with snapshot.DataLoader2(issue_graph(), reading_service=SERVICES[service]()) as loader:
        loader.seed(SEED)
        it = iter(loader)
        first = plain([next(it) for _ in range(CUT)])
    path = tmp_path / "after-with.snap"
    loader.save_snapshot(path)
    assert_rest_is_exact(service, first, rest_in_fresh_process(path))


def test_save_after_an_exception_in_the_users_loop(tmp_path, rest_in_fresh_process) -> None:
    first: list[list[int]] = []
    loader = snapshot.DataLoader2(issue_graph(), reading_service=MultiProcessingReadingService(2))
    with pytest.raises(ZeroDivisionError), loader:
        loader.seed(SEED)
        for step, batch in enumerate(loader):
            first.append([int(x) for x in batch])
            if step == CUT - 1:
                _ = 1 / 0  # the training step fails; the with block shuts the loader down
    path = tmp_path / "after-error.snap"
    loader.save_snapshot(path)
    assert_rest_is_exact("workers_2", first, rest_in_fresh_process(path))


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_state_dict_after_shutdown_resumes_in_a_fresh_process(tmp_path, service: str, rest_in_fresh_process) -> None:
    loader, _, first = loader_at_cut(service)
    loader.shutdown()
    path = tmp_path / "state.pt"
    torch.save(loader.state_dict(), path)
    assert_rest_is_exact(service, first, rest_in_fresh_process(path))


def test_a_background_save_after_shutdown_is_exact_too(tmp_path, rest_in_fresh_process) -> None:
    loader, _, first = loader_at_cut("workers_2")
    loader.shutdown()
    path = tmp_path / "background.snap"
    assert loader.save_snapshot(path, blocking=False).result(timeout=60) == str(path)
    assert_rest_is_exact("workers_2", first, rest_in_fresh_process(path))


def test_shutdown_before_the_first_epoch_saves_the_start(tmp_path, rest_in_fresh_process) -> None:
    loader = snapshot.DataLoader2(issue_graph(), reading_service=MultiProcessingReadingService(2))
    loader.seed(SEED)
    loader.shutdown()
    path = tmp_path / "unstarted.snap"
    loader.save_snapshot(path)
    proc_rest = rest_in_fresh_process(path)
    assert proc_rest == uninterrupted("workers_2")


def test_saving_twice_after_shutdown_gives_the_same_position(tmp_path) -> None:
    loader, _, _ = loader_at_cut("in_process")
    loader.shutdown()
    loader.shutdown()
    a, b = loader.save_snapshot(), loader.save_snapshot()
    assert a.state == b.state


def test_verify_after_shutdown_is_refused() -> None:
    loader, _, _ = loader_at_cut("in_process")
    loader.shutdown()
    with pytest.raises(snapshot.SnapshotError, match=r"verify=3 computes samples ahead.*before shutdown\(\)"):
        loader.save_snapshot(verify=3)


# -- failures: no exact position exists past them, so the save says to use an earlier snapshot ----


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_failing_pipe_makes_a_later_save_refuse(tmp_path, service: str) -> None:
    graph = issue_graph(functools.partial(fails_at, 500))
    loader = snapshot.DataLoader2(graph, reading_service=SERVICES[service]())
    loader.seed(SEED)
    with pytest.raises(ValueError, match="bad sample 500"):
        for _ in loader:
            pass
    with pytest.raises(snapshot.SnapshotError) as info:
        loader.save_snapshot(tmp_path / "x.snap")
    message = str(info.value)
    assert "graph raised ValueError (" in message and "bad sample 500" in message
    assert "before shutdown()" in message and "restore the last snapshot" in message
    with pytest.raises(snapshot.SnapshotError, match="graph raised ValueError"):
        loader.state_dict()
    assert not (tmp_path / "x.snap").exists()
    loader.shutdown()


def _kill_a_worker() -> int:
    children = multiprocessing.active_children()
    assert children, "the loader has worker processes"
    pid = children[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while children[0].is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def test_a_worker_killed_before_shutdown_makes_the_save_refuse(tmp_path) -> None:
    loader, _, _ = loader_at_cut("workers_2")
    _kill_a_worker()
    loader.shutdown()
    with pytest.raises(snapshot.SnapshotError) as info:
        loader.save_snapshot(tmp_path / "x.snap")
    message = str(info.value)
    assert "could not report where it stood" in message and "WorkerError" in message
    assert "exited unexpectedly" in message and "before shutdown()" in message


def test_a_worker_killed_during_iteration_makes_the_save_refuse(tmp_path) -> None:
    loader, it, _ = loader_at_cut("workers_2")
    _kill_a_worker()
    with pytest.raises(snapshot.WorkerError, match="exited unexpectedly"):
        for _ in it:
            pass
    with pytest.raises(snapshot.SnapshotError, match=r"graph raised WorkerError .*exited unexpectedly"):
        loader.save_snapshot(tmp_path / "x.snap")
    loader.shutdown()


def test_a_save_before_the_failure_still_restores_exactly(tmp_path, rest_in_fresh_process) -> None:
    """What the refusal tells the user to do works: the last snapshot before the failure."""
    loader, it, first = loader_at_cut("workers_2")
    path = tmp_path / "before.snap"
    loader.save_snapshot(path)
    _kill_a_worker()
    with pytest.raises(snapshot.WorkerError):
        for _ in it:
            pass
    loader.shutdown()
    assert_rest_is_exact("workers_2", first, rest_in_fresh_process(path))


def _save_after_distributed_shutdown(rank: int, world: int, directory: str) -> str:
    loader = snapshot.DataLoader2(issue_graph(), reading_service=snapshot.DistributedReadingService(60))
    loader.seed(SEED)
    it = iter(loader)
    for _ in range(CUT):
        next(it)
    loader.shutdown()
    try:
        loader.save_snapshot(directory)
    except snapshot.SnapshotError as exc:
        return str(exc)
    return "saved"


def test_a_distributed_save_after_shutdown_is_refused(tmp_path) -> None:
    from tests.dist import run_ranks

    messages = run_ranks(2, _save_after_distributed_shutdown, str(tmp_path / "dist"))
    for message in messages:
        assert "read across ranks" in message and "before shutdown()" in message
    assert not (tmp_path / "dist").exists()
