"""The resident writer of background saves, and what a background save computes in it.

A process's first iteration starts one long-lived writer thread (``snapshot-writer``); each background save
is handed to it when it is idle, to a thread of its own when it is not. What a capture holds that is fixed
for the graph's life (its description, fingerprints and pickle, the service's pickle) is computed there, after
the loader went on: the file still holds the state as of the call, and the first background save of a loader
writes what a synchronous save at the same point writes.
"""

from __future__ import annotations

import gc
import os
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy
import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.container import format
from snapshot.loader import _save
from snapshot.storage import _background
from tests.integration_jobs import run_job


class Named:
    """A sample that records the name of the thread that pickles it; held there while ``hold`` is set."""

    names: list[str] = []
    hold: threading.Event | None = None
    entered = threading.Event()

    def __init__(self, value: int):
        self.value = value

    def __deepcopy__(self, memo: Any) -> Named:
        return Named(self.value)

    def __reduce__(self) -> Any:
        Named.names.append(threading.current_thread().name)
        if Named.hold is not None:
            Named.entered.set()
            if not Named.hold.wait(60):
                raise TimeoutError("the test never let the save go on")
        return (Named, (self.value,))


@pytest.fixture
def named():
    Named.names, Named.hold = [], None
    Named.entered.clear()
    yield Named
    if Named.hold is not None:
        Named.hold.set()
    Named.hold = None


def named_loader() -> snapshot.DataLoader2[Any]:
    dl = snapshot.DataLoader2(IterableWrapper([Named(i) for i in range(30)]).shuffle(buffer_size=8))
    dl.seed(1)
    return dl


def indexed() -> Any:
    return IterableWrapper(list(range(200))).map(str).shuffle(buffer_size=50).batch(2)


def positions_loader() -> snapshot.DataLoader2[Any]:
    dl = snapshot.DataLoader2(indexed(), buffer_state="positions")
    dl.seed(5)
    return dl


def same_file(a: Any, b: Any) -> bool:
    first, second = (format.unpack(Path(path).read_bytes()) for path in (a, b))
    return first.payload == second.payload and {**first.manifest, "created": None} == {**second.manifest,
                                                                                       "created": None}


def same_capture(a: Any, b: Any) -> bool:
    """Files of two loaders of the same graph saved at the same point: the same manifest and state (their graphs'
    pickles differ by the identities dill keeps, not by what they restore)."""
    first, second = (format.unpack(Path(path).read_bytes()) for path in (a, b))
    skip = {"created": None, "payload": None}
    loaded = [snapshot.load(path) for path in (a, b)]
    return ({**first.manifest, **skip} == {**second.manifest, **skip} and loaded[0].state == loaded[1].state
            and loaded[0].service == loaded[1].service and None not in (loaded[0].graph, loaded[1].graph))


def test_a_background_save_runs_in_the_writer_the_first_iteration_started(tmp_path, named) -> None:
    with named_loader() as dl:
        next(iter(dl))
        assert _background._resident is not None  # started by the iteration, before any save
        named.names.clear()  # the graph's own pickle, by the loader
        dl.save_snapshot(tmp_path / "a.snap", blocking=False).result(timeout=60)
        dl.save_snapshot(tmp_path / "b.snap", blocking=False).result(timeout=60)
    assert set(named.names) == {_background.NAME}  # before: a new thread per save, "snapshot-save <path>"


def test_the_writer_makes_the_next_save_s_future_ahead_of_it_and_each_save_has_its_own(tmp_path) -> None:
    with positions_loader() as dl:
        it = iter(dl)
        next(it)
        resident = _background._resident
        assert resident is not None
        futures = []
        for name in ("a", "b", "c"):
            for _ in range(600):  # the writer makes one as soon as it runs, and after each save
                if resident.spares:
                    break
                time.sleep(0.1)
            (spare, _finished), = resident.spares
            futures.append(dl.save_snapshot(tmp_path / f"{name}.snap", blocking=False))
            assert futures[-1] is spare
            assert futures[-1].result(timeout=60) == os.fspath(tmp_path / f"{name}.snap")
            next(it)
        assert len({id(f) for f in futures}) == 3 and all(f.done() for f in futures)


def test_a_save_while_the_writer_is_busy_gets_a_thread_of_its_own(tmp_path, named) -> None:
    with named_loader() as held, positions_loader() as other:
        next(iter(held))
        named.hold = threading.Event()  # from now on: the loader pickled its graph already
        it = iter(other)
        next(it)
        first = held.save_snapshot(tmp_path / "held.snap", blocking=False)
        assert named.entered.wait(60)  # the writer is busy with it
        second = other.save_snapshot(tmp_path / "other.snap", blocking=False)
        assert second.result(timeout=60) == os.fspath(tmp_path / "other.snap") and not first.done()
        named.hold.set()
        assert first.result(timeout=60) == os.fspath(tmp_path / "held.snap")
        rest = list(it)
    with snapshot.DataLoader2(indexed(), buffer_state="positions") as dl:
        dl.restore_snapshot(tmp_path / "other.snap")
        assert list(dl) == rest


def test_a_first_background_save_writes_what_a_first_synchronous_save_writes(tmp_path) -> None:
    """Each loader's first save: the background one computes the graph's description and the service's pickle in
    its thread, after the loader went on to the end of its epoch and into the next."""
    with positions_loader() as dl:
        it = iter(dl)
        head = [next(it) for _ in range(7)]
        dl.save_snapshot(tmp_path / "sync.snap")
    with positions_loader() as dl:
        it = iter(dl)
        assert [next(it) for _ in range(7)] == head
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        rest, second = list(it), list(dl)
        future.result(timeout=60)
    assert same_capture(tmp_path / "sync.snap", tmp_path / "bg.snap")
    with snapshot.DataLoader2(indexed(), buffer_state="positions") as dl:
        dl.restore_snapshot(tmp_path / "bg.snap")
        assert [list(dl), list(dl)] == [rest, second]


def test_what_the_loader_does_before_the_fixed_part_is_computed_does_not_reach_the_file(tmp_path,
                                                                                      monkeypatch) -> None:
    """Held before its thread computes the graph's description: the loader ends its epoch, restores another
    snapshot into itself and reads on; the file is still the synchronous save's at the call."""
    go, entered = threading.Event(), threading.Event()
    fill = _save._Fixed.fill

    def held(self: Any, source: Any) -> None:
        entered.set()
        assert go.wait(60)
        fill(self, source)

    with positions_loader() as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        dl.save_snapshot(tmp_path / "early.snap")
        for _ in range(6):
            next(it)
        dl.save_snapshot(tmp_path / "sync.snap")
        monkeypatch.setattr(_save._Fixed, "fill", held)
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        assert entered.wait(60)
        list(it)
        dl.restore_snapshot(tmp_path / "early.snap")
        next(iter(dl))
        go.set()
        future.result(timeout=60)
    assert same_file(tmp_path / "sync.snap", tmp_path / "bg.snap")


def test_the_writer_ends_with_the_interpreter_and_a_forked_child_has_its_own(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        from torch.utils.data.datapipes.iter import IterableWrapper
        import snapshot
        from snapshot.storage import _background

        dl = snapshot.DataLoader2(IterableWrapper(list(range(40))).shuffle(buffer_size=8), buffer_state="positions")
        dl.seed(0)
        it = iter(dl)
        next(it)
        print("parent", dl.save_snapshot(sys.argv[1] + ".parent", blocking=False).result(timeout=60), flush=True)
        pid = os.fork()
        if pid == 0:
            assert _background._resident is None  # the parent's writer is not in this process
            next(iter(dl))  # a new epoch's iteration starts this process's own
            print("child", dl.save_snapshot(sys.argv[1] + ".child", blocking=False).result(timeout=60), flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit status", os.waitstatus_to_exitcode(status), flush=True)
        dl.save_snapshot(sys.argv[1] + ".last", blocking=False)  # in flight at the exit: written before it
    """))
    dest = str(tmp_path / "s.snap")
    output = run_job([str(script), dest], cwd=tmp_path, timeout=120)
    assert f"parent {dest}.parent" in output and f"child {dest}.child" in output
    assert "child exit status 0" in output
    assert snapshot.load(dest + ".last").yielded == 1


class Copied:
    """A sample whose staged copies (a background save deep-copies it) are tracked, weakly."""

    copies: weakref.WeakSet[Copied] = weakref.WeakSet()

    def __init__(self, value: int):
        self.value = value

    def __deepcopy__(self, memo: Any) -> Copied:
        copy = Copied(self.value)
        Copied.copies.add(copy)
        return copy

    def __reduce__(self) -> Any:
        return (Copied, (self.value,))


def test_the_writer_lets_a_save_s_capture_go_when_the_save_ends(tmp_path) -> None:
    Copied.copies = weakref.WeakSet()
    with snapshot.DataLoader2(IterableWrapper([Copied(i) for i in range(30)]).shuffle(buffer_size=8)) as dl:
        dl.seed(1)
        next(iter(dl))
        before = len(Copied.copies)  # the loader's copy of the graph holds copies too
        dl.save_snapshot(tmp_path / "a.snap", blocking=False).result(timeout=60)
        assert len(Copied.copies) == before + 8  # the buffer, staged
        for _ in range(600):  # the writer lets go after it settled the future
            gc.collect()
            if len(Copied.copies) == before:
                break
            time.sleep(0.1)
        assert len(Copied.copies) == before  # before: held by the writer until the next save


def test_a_process_exits_cleanly_after_a_background_save_staged_a_block_of_arrays(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy
        from torch.utils.data.datapipes.iter import IterableWrapper
        import snapshot

        # 16 arrays of 512 KiB: staged as one block of 8 MiB (numpy would ask huge pages for it)
        items = [numpy.full(65536, i, dtype="<f8") for i in range(40)]
        dl = snapshot.DataLoader2(IterableWrapper(items).shuffle(buffer_size=16))
        dl.seed(0)
        it = iter(dl)
        next(it)
        print("saved", dl.save_snapshot(sys.argv[1], blocking=False).result(timeout=60), flush=True)
        next(it)
    """))
    dest = str(tmp_path / "s.snap")
    output = run_job([str(script), dest], cwd=tmp_path, timeout=120)  # an abort at the exit fails it
    assert f"saved {dest}" in output
    with snapshot.DataLoader2(IterableWrapper([numpy.full(65536, i, dtype="<f8") for i in range(40)])
                              .shuffle(buffer_size=16)) as dl:
        dl.restore_snapshot(dest)
        assert len(list(dl)) == 39
