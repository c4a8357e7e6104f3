"""save_snapshot(blocking=False): background writes, one at a time, never silently lost."""

from __future__ import annotations

import functools
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.hooks._fresh import Collected, Later
from snapshot.reading_service import MultiProcessingReadingService
from snapshot.storage import _staging
from snapshot.testing import first_difference
from tests.helpers import kill_once_started, start_slow_save


class Gate:
    """A sample whose pickling waits until the test opens the gate (a save held mid-write)."""

    armed = False
    opened = threading.Event()
    entered = threading.Event()

    def __init__(self, value: int):
        self.value = value

    def __deepcopy__(self, memo: Any) -> Gate:
        return Gate(self.value)

    def __reduce__(self) -> Any:
        if Gate.armed:
            Gate.entered.set()
            if not Gate.opened.wait(60):
                raise TimeoutError("the test never opened the gate")
        return (Gate, (self.value,))


def gated(n: int = 30):
    return IterableWrapper([Gate(i) for i in range(n)]).shuffle(buffer_size=8)


def bytes_graph(n: int = 60):
    return IterableWrapper([bytes([i]) * 64 for i in range(n)]).shuffle(buffer_size=16).sharding_filter().batch(3)


def loader(factory, service=None):
    dl = snapshot.DataLoader2(factory(), reading_service=service() if service else None)
    dl.seed(3)
    return dl


@pytest.fixture
def gate():
    Gate.opened.clear()
    Gate.entered.clear()
    yield Gate
    Gate.opened.set()
    Gate.armed = False


@pytest.fixture
def waiting(monkeypatch) -> threading.Event:
    """Set when a thread starts waiting for a background save still in flight (the real wait runs)."""
    from snapshot.storage._background import BackgroundSaver

    entered = threading.Event()
    wait = BackgroundSaver.wait

    def observed(self: BackgroundSaver, timeout: float | None = None) -> None:
        if self.busy:
            entered.set()
        wait(self, timeout)

    monkeypatch.setattr(BackgroundSaver, "wait", observed)
    return entered


@pytest.mark.parametrize("service", [None, functools.partial(MultiProcessingReadingService, 2)],
                         ids=["in_process", "workers_2"])
def test_background_save_resumes_exactly_and_does_not_change_the_stream(tmp_path, service) -> None:
    with loader(bytes_graph, service) as dl:
        reference = [list(dl) for _ in range(2)]
    with loader(bytes_graph, service) as dl:
        it = iter(dl)
        first = [next(it) for _ in range(7)]
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        assert isinstance(future, Future)
        rest = list(it)  # iteration goes on while the save is written
        second = list(dl)
        assert future.result(timeout=60) == os.fspath(tmp_path / "bg.snap")
    assert first + rest == reference[0] and second == reference[1]
    with snapshot.DataLoader2(bytes_graph(), reading_service=service() if service else None) as dl:
        dl.restore_snapshot(tmp_path / "bg.snap")
        resumed = [list(dl), list(dl)]
    assert first_difference(rest, resumed[0]) is None
    assert first_difference(reference[1], resumed[1]) is None


def test_background_and_blocking_saves_hold_the_same_position(tmp_path) -> None:
    with loader(bytes_graph) as dl:
        it = iter(dl)
        for _ in range(5):
            next(it)
        dl.save_snapshot(tmp_path / "sync.snap")
        dl.save_snapshot(tmp_path / "bg.snap", blocking=False).result(timeout=60)
    sync, bg = snapshot.load(tmp_path / "sync.snap"), snapshot.load(tmp_path / "bg.snap")
    assert sync.state == bg.state


def test_the_capture_shares_no_mutable_sample_with_the_graph() -> None:
    tensor, array, nested = torch.zeros(3), [1, [2]], {"k": bytearray(b"ab")}
    blob = b"x" * 100
    staged = _staging.stage({"buffer": [tensor, array, nested, blob], "rng": (1, [2, 3])})
    tensor.add_(1)
    array[1].append(3)
    nested["k"][0] = 0
    assert torch.equal(staged["buffer"][0], torch.zeros(3))
    assert staged["buffer"][1] == [1, [2]] and staged["buffer"][2] == {"k": bytearray(b"ab")}
    assert staged["buffer"][3] is blob  # immutable samples are shared, not copied


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_block_of_arrays_is_staged_in_order_across_threads(monkeypatch, threads) -> None:
    numpy = pytest.importorskip("numpy")
    monkeypatch.setattr(_staging, "_PER_THREAD", 16)  # a part per thread for this small block
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    items = [numpy.full((2, 3), i, dtype=numpy.int64) for i in range(7)]
    staged = _staging.stage([*items])
    for item in items:
        item += 100
    assert [a.tolist() for a in staged] == [[[i] * 3] * 2 for i in range(7)]
    assert len({a.base.ctypes.data for a in staged if a.base is not None}) == 1  # rows of one block


def test_prefaulting_a_block_changes_no_byte() -> None:
    pytest.importorskip("numpy")
    block = _staging._unadvised(5 * 4096)
    block[:4096] = 7  # a page already there
    part = block[100:3 * 4096 + 5]  # starts inside a page, ends inside another
    _staging._prefault(part)
    assert (block[:4096] == 7).all() and not block[4096:].any()
    part[:] = 1
    assert int(block.sum()) == 100 * 7 + part.nbytes and (block[3 * 4096 + 5:] == 0).all()


@pytest.mark.parametrize("kind", ["arrays", "tensors"])
def test_a_background_capture_leaves_a_blocks_rows_to_the_saves_thread(kind) -> None:
    numpy = pytest.importorskip("numpy")
    make = (lambda i: numpy.full(3, i)) if kind == "arrays" else (lambda i: torch.full((3,), i))
    items = [make(i) for i in range(5)]
    fresh = Collected()
    staged = _staging.stage({"buffer": items}, fresh)
    assert type(staged["buffer"]) is Later and fresh.later == 1
    for item in items:
        item += 10  # the graph goes on
    fresh.make_later(staged)
    assert [x.tolist() for x in staged["buffer"]] == [[i] * 3 for i in range(5)]
    assert [x.tolist() for x in _staging.stage(items)] == [[i + 10] * 3 for i in range(5)]  # elsewhere: at once


def test_a_failed_part_of_a_staging_copy_is_raised(monkeypatch) -> None:
    numpy = pytest.importorskip("numpy")
    monkeypatch.setattr(_staging, "_PER_THREAD", 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    calls: list[int] = []
    original = numpy.concatenate

    def concatenate(items, axis, out):
        calls.append(len(items))
        if len(calls) == 2:
            raise MemoryError("a part that failed")
        return original(items, axis=axis, out=out)

    monkeypatch.setattr(numpy, "concatenate", concatenate)
    with pytest.raises(MemoryError, match="a part that failed"):
        _staging.stage([numpy.zeros(200) for _ in range(8)])
    assert sorted(calls) == [4, 4]


def test_samples_changed_in_place_downstream_do_not_reach_the_saved_snapshot(tmp_path) -> None:
    def bump(t):
        t.add_(100)  # a training step that changes its batch in place
        return t

    def graph():
        return IterableWrapper([torch.full((2,), float(i)) for i in range(40)], deepcopy=False).shuffle(
            buffer_size=10).map(bump)

    with loader(graph) as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        future = dl.save_snapshot(tmp_path / "t.snap", blocking=False)
        list(it)
        future.result(timeout=60)
    buffer = snapshot.load(tmp_path / "t.snap").state["service"]["shards"][0]["nodes"]
    states = [r["state"] for r in buffer.values() if r.get("state") is not None]  # decoded as data
    saved = [t for s in states if isinstance(s, dict) for t in s.get("buffer") or []]
    assert len(saved) == 10 and all(float(t.max()) < 40 for t in saved)


def test_one_save_in_flight_the_next_waits(tmp_path, gate, waiting) -> None:
    with loader(gated) as dl:
        it = iter(dl)
        next(it)
        gate.armed = True
        first = dl.save_snapshot(tmp_path / "a.snap", blocking=False)
        assert gate.entered.wait(30)
        second: list[Future[str]] = []
        caller = threading.Thread(target=lambda: second.append(
            dl.save_snapshot(tmp_path / "b.snap", blocking=False)))
        caller.start()
        assert waiting.wait(30), "the second save did not wait for the first"
        assert not first.done() and not second  # held at the gate: the second save has not started
        gate.opened.set()
        caller.join(60)
        assert first.result(timeout=60) and second[0].result(timeout=60)
    assert snapshot.load(tmp_path / "a.snap", allow_pickle=True).yielded == 1  # Gates: pickled values
    assert snapshot.load(tmp_path / "b.snap", allow_pickle=True).yielded == 1


def test_shutdown_waits_for_the_save_in_flight(tmp_path, gate, waiting) -> None:
    dl = loader(gated)
    it = iter(dl)
    next(it)
    gate.armed = True
    future = dl.save_snapshot(tmp_path / "a.snap", blocking=False)
    assert gate.entered.wait(30)
    stopper = threading.Thread(target=dl.shutdown)
    stopper.start()
    assert waiting.wait(30), "shutdown() did not wait for the save in flight"
    assert stopper.is_alive() and not future.done()  # held at the gate
    gate.opened.set()
    stopper.join(60)
    assert future.done() and os.path.exists(tmp_path / "a.snap")


def test_a_failed_background_save_surfaces_in_the_future_and_the_log(tmp_path, caplog) -> None:
    (tmp_path / "file").write_bytes(b"")
    with loader(bytes_graph) as dl, caplog.at_level(logging.ERROR, logger="snapshot"):
        next(iter(dl))
        future = dl.save_snapshot(tmp_path / "file" / "x.snap", blocking=False)
        assert isinstance(future.exception(timeout=60), (OSError, snapshot.SnapshotError))
    records = [r for r in caplog.records if r.name.startswith("snapshot") and r.levelno == logging.ERROR]
    assert records and "x.snap" in records[0].getMessage()


def test_a_background_save_needs_a_path() -> None:
    with loader(bytes_graph) as dl, pytest.raises(TypeError, match="path"):
        dl.save_snapshot(blocking=False)


def test_interpreter_exit_waits_for_the_save(tmp_path) -> None:
    dest = tmp_path / "exit.snap"
    child = start_slow_save(tmp_path, "exit", str(dest), f"{dest}.started", 0.5)
    assert child.wait(120) == 0
    assert snapshot.storage._sources.read_container(dest).manifest["loader"]["yielded"] == 1  # checked, not unpickled


def test_a_kill_during_a_background_save_leaves_the_previous_snapshot(tmp_path) -> None:
    dest = tmp_path / "kill.snap"
    kill_once_started(start_slow_save(tmp_path, "kill", str(dest), f"{dest}.started", 600), f"{dest}.started")
    assert snapshot.storage._sources.read_container(dest).manifest["loader"]["yielded"] == 1  # checked, not unpickled
