"""Background saves that fail or stall never hang the process, and their failure is never lost.

The hangs are run in fresh processes with a timeout: a loader collected while the interpreter clears its
modules (issue 32's hang: tests/storage/test_write_faults.py runs its reproducer), a child forked while a
save runs, a loader collected in the save's own thread, a save stuck at the interpreter's exit. A
failure is raised by the future, logged, and raised again by the next save or ``shutdown()`` unless
the future's outcome was read.
"""

from __future__ import annotations

import logging
import os
import textwrap

import pytest

import snapshot
from snapshot.storage import _sources
from tests.conftest import child_pids
from tests.faults import held_graph
from tests.integration_jobs import run_job

#: The start of every job: a loader over Held samples, one sample taken, a save that holds mid-write
#: once ``Held.armed`` (Held.entered set; it goes on when Held.go is set).
PROLOGUE = textwrap.dedent("""
    import gc, logging, os, sys
    import snapshot
    from snapshot.storage import _background
    from tests.faults import Held, held_graph

    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
    dest = sys.argv[1]
""")


def job(tmp_path, body: str, timeout: float = 120) -> str:
    script = tmp_path / "job.py"
    script.write_text(PROLOGUE + textwrap.dedent(body))
    return run_job([str(script), str(tmp_path / "data.snap")], cwd=tmp_path, timeout=timeout)


def test_a_child_forked_during_a_save_exits(tmp_path) -> None:
    """The child has no save thread: its exit must not wait for the save (it waited 1800 s)."""
    output = job(tmp_path, """
        dl = snapshot.DataLoader2(held_graph())
        dl.seed(0)
        it = iter(dl)
        next(it)
        Held.armed = True
        future = dl.save_snapshot(dest, blocking=False, include_graph=False)
        assert Held.entered.wait(60)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the interpreter's exit, its atexit hooks and finalizers, in the child
        Held.go.set()
        print("saved", future.result(timeout=60))
        _, status = os.waitpid(pid, 0)
        print("child exit status", os.waitstatus_to_exitcode(status))
    """)
    assert "child exit status 0" in output and f"saved {tmp_path / 'data.snap'}" in output


def test_a_loader_collected_in_the_save_thread_does_not_wait_for_itself(tmp_path) -> None:
    """The cyclic collector runs in whichever thread allocates: here the save's own, which a finalizer
    that waited for the save would block (for 1800 s)."""
    output = job(tmp_path, """
        class Collecting(Held):
            def __deepcopy__(self, memo):
                return Collecting(self.value)

            def __reduce__(self):
                if Held.armed:
                    Held.armed = False
                    gc.collect()  # as an allocation in the save thread may
                return (Collecting, (self.value,))

        from torch.utils.data.datapipes.iter import IterableWrapper

        class Job:  # a loader in a reference cycle: only the collector frees it
            def __init__(self):
                self.loader = snapshot.DataLoader2(IterableWrapper([Collecting(i) for i in range(20)]).shuffle(
                    buffer_size=4))
                self.me = self

        job = Job()
        job.loader.seed(0)
        it = iter(job.loader)
        next(it)
        gc.disable()
        Held.armed = True
        future = job.loader.save_snapshot(dest, blocking=False, include_graph=False)
        del job, it
        print("saved", future.result(timeout=60))
    """)
    assert f"saved {tmp_path / 'data.snap'}" in output
    assert _sources.read_container(tmp_path / "data.snap").manifest["loader"]["yielded"] == 1  # checked, not unpickled


def test_a_save_stuck_at_exit_is_abandoned_after_its_bound(tmp_path) -> None:
    """The exit waits EXIT_TIMEOUT for a save in flight, then ends; the previous snapshot is intact, and the
    next save into the directory removes what the abandoned one left (before: it waited without a bound)."""
    output = job(tmp_path, """
        _background.EXIT_TIMEOUT = 1.0
        dl = snapshot.DataLoader2(held_graph())
        dl.seed(0)
        it = iter(dl)
        next(it)
        dl.save_snapshot(dest, include_graph=False)
        next(it)
        Held.armed = True
        dl.save_snapshot(dest, blocking=False, include_graph=False)
        assert Held.entered.wait(60)
        print("exiting", flush=True)  # Held.go is never set: the save is stuck
    """)
    assert "exiting" in output
    assert "did not finish within 1 s of the interpreter's exit and is abandoned" in output
    assert _sources.read_container(tmp_path / "data.snap").manifest["loader"]["yielded"] == 1  # the previous one
    left = [name for name in os.listdir(tmp_path) if ".snapshot-tmp." in name]
    assert len(left) == 1
    with snapshot.DataLoader2(held_graph()) as dl:
        next(iter(dl))
        dl.save_snapshot(tmp_path / "next.snap", include_graph=False)
    assert not [name for name in os.listdir(tmp_path) if ".snapshot-tmp." in name]


def failing_save(dl, tmp_path):
    """A background save that fails (a file is in the way of its directory); its future."""
    (tmp_path / "file").write_bytes(b"")
    future = dl.save_snapshot(tmp_path / "file" / "x.snap", blocking=False)
    dl._saver.wait()  # not future.exception(): that reads it
    assert future.done()
    return future


def loader():
    dl = snapshot.DataLoader2(held_graph())
    dl.seed(0)
    next(iter(dl))
    return dl


def test_a_failure_nobody_read_is_raised_by_the_next_save_once(tmp_path, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="snapshot"), loader() as dl:
        failing_save(dl, tmp_path)
        with pytest.raises(snapshot.SnapshotFileError, match="a file is in the way") as info:
            dl.save_snapshot(tmp_path / "next.snap")
        assert "raised again: the background save of" in "\n".join(getattr(info.value, "__notes__", []))
        assert not (tmp_path / "next.snap").exists()  # that save did not start
        dl.save_snapshot(tmp_path / "next.snap")  # once: the save after it works
    assert snapshot.load(tmp_path / "next.snap", allow_pickle=True).yielded == 1
    assert [r for r in caplog.records if r.levelno == logging.ERROR and "x.snap" in r.getMessage()]


def test_a_failure_read_from_the_future_is_not_raised_again(tmp_path) -> None:
    with loader() as dl:
        future = failing_save(dl, tmp_path)
        assert isinstance(future.exception(), snapshot.SnapshotFileError)
        dl.save_snapshot(tmp_path / "next.snap", blocking=False).result(timeout=60)


def test_shutdown_raises_a_failure_nobody_read_unless_an_error_is_on_its_way(tmp_path) -> None:
    dl = loader()
    failing_save(dl, tmp_path)
    with pytest.raises(snapshot.SnapshotFileError, match="a file is in the way"):
        dl.shutdown()
    dl.shutdown()  # once
    with pytest.raises(KeyError, match="the loop's own"), loader() as dl:
        failing_save(dl, tmp_path)
        raise KeyError("the loop's own")


def test_shutdown_waits_a_bounded_time_and_stops_the_workers_anyway(tmp_path, held) -> None:
    before = child_pids()
    dl = snapshot.DataLoader2(held_graph(), reading_service=snapshot.MultiProcessingReadingService(1))
    dl.seed(0)
    next(iter(dl))
    dl._saver.background.timeout = 0.5
    held.armed = True
    future = dl.save_snapshot(tmp_path / "a.snap", blocking=False, include_graph=False)
    assert held.entered.wait(60)
    with pytest.raises(snapshot.SnapshotError, match="has not finished after 0.5 s"):
        dl.shutdown()
    assert child_pids() - before == set()  # the workers stopped though the save had not finished
    held.go.set()
    assert future.result(timeout=60) == os.fspath(tmp_path / "a.snap")
