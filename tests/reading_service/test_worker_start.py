"""Starting the workers of a restore: each takes its share of the saved state in its memory (``fork``: nothing
pickled) or through its pipe (other start methods, tensors out of band, dill where pickle cannot), and a worker
that reads none of a request is an error, never a hang."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.errors import WorkerError
from snapshot.reading_service import MultiProcessingReadingService as Workers
from snapshot.reading_service._workers import transport
from snapshot.reading_service._workers.process import WorkerProcess
from snapshot.testing import first_difference
from tests import helpers
from tests.conftest import _service_pids, child_pids

SEED = 11
CUT = 9  # samples taken before the snapshot: the shuffle buffers in the workers are full

#: How many times a ``Tracked`` was pickled in this process.
PICKLED = [0]


class Tracked:
    """A sample that counts its pickling in the process that pickles it."""

    def __init__(self, value: int):
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        PICKLED[0] += 1
        return Tracked, (self.value,)


def _tracked(x: int) -> Tracked:
    return Tracked(x)


def _value(sample: Any) -> int:
    return int(sample.value)


def tracked_graph(n: int = 60) -> Any:
    """Samples held in the workers' shuffle buffers as ``Tracked``; the loader yields ints."""
    return IterableWrapper(range(n)).sharding_filter().map(_tracked).shuffle(buffer_size=8).map(_value)


def _tensor(x: int) -> torch.Tensor:
    return torch.arange(x, x + 4, dtype=torch.float32) * 0.5


def tensor_graph(n: int = 60) -> Any:
    """Tensors in the workers' shuffle buffers and batches (sent out of band when sent)."""
    return IterableWrapper(range(n)).sharding_filter().map(_tensor).shuffle(buffer_size=8).batch(3)


def _with_code(x: int) -> tuple[int, Any]:
    return x, lambda: x  # a value plain pickle cannot carry: dill can


def _first(sample: tuple[int, Any]) -> int:
    return sample[0]


def lambda_graph(n: int = 60) -> Any:
    """A lambda in every buffered sample: the workers' states need dill, both ways."""
    return IterableWrapper(range(n)).sharding_filter().map(_with_code).shuffle(buffer_size=8).map(_first)


def _stream(factory: Any, service: Any) -> list[Any]:
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.seed(SEED)
        return list(loader)


def _rest(factory: Any, data: bytes, service: Any) -> list[Any]:
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.restore_snapshot(data, allow_pickle=True)
        return list(loader)


def _saved(factory: Any) -> bytes:
    with helpers.loader_at(factory(), CUT, seed=SEED, reading_service=Workers(2)) as (loader, _):
        return loader.save_snapshot().to_bytes()


def test_a_restore_onto_forked_workers_pickles_nothing_of_the_state() -> None:
    data = _saved(tracked_graph)
    reference = _stream(tracked_graph, Workers(2))
    PICKLED[0] = 0
    with snapshot.DataLoader2(tracked_graph(), reading_service=Workers(2, multiprocessing_context="fork")) as loader:
        loader.restore_snapshot(data, allow_pickle=True)
        rest = list(loader)
        assert PICKLED[0] == 0, "the restore pickled the saved samples to send them to the workers"
    assert first_difference(reference[CUT:], rest) is None


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
@pytest.mark.parametrize("factory", [tensor_graph, lambda_graph], ids=lambda f: f.__name__)
def test_a_restore_is_exact_whatever_the_start_method(factory: Any, start_method: str) -> None:
    data = _saved(factory)
    reference = _stream(factory, Workers(2))
    rest = _rest(factory, data, Workers(2, multiprocessing_context=start_method))
    assert first_difference(reference[CUT:], rest) is None, f"{start_method}: the restored stream differs"


def test_a_restore_onto_a_running_pool_is_exact() -> None:
    """The same layout restored into a loader whose workers already run: the states go through their pipes."""
    data = _saved(tensor_graph)
    reference = _stream(tensor_graph, Workers(2))
    with snapshot.DataLoader2(tensor_graph(), reading_service=Workers(2)) as loader:
        loader.seed(SEED + 1)
        next(iter(loader))
        workers = child_pids() - _service_pids()
        loader.restore_snapshot(data, allow_pickle=True)
        rest = list(loader)
        assert child_pids() - _service_pids() == workers, "the restore started other workers"
    assert first_difference(reference[CUT:], rest) is None


def test_a_message_cut_short_is_given_up_when_its_sender_is_gone() -> None:
    """A worker reading a request whose sender died in the middle of it does not wait for the rest."""
    reader, writer = mp.get_context("fork").Pipe(duplex=False)
    try:
        os.write(writer.fileno(), struct.pack("<Q", 1000) + bytes(10))  # a message's length, then 10 of its bytes
        checks: list[float] = []

        def idle() -> None:
            checks.append(time.monotonic())
            if len(checks) == 2:
                raise EOFError("the sender is gone")

        with pytest.raises(EOFError, match="the sender is gone"):
            transport.receive(reader, idle=idle)
        assert len(checks) == 2
    finally:
        reader.close()
        writer.close()


def test_a_worker_that_reads_no_request_is_an_error_not_a_hang() -> None:
    context = mp.get_context("fork")
    requests_out, requests_in = context.Pipe(duplex=False)
    results_out, results_in = context.Pipe(duplex=False)
    process = context.Process(target=time.sleep, args=(60,), daemon=True)  # never reads its requests
    process.start()
    worker = WorkerProcess(0, process, requests_in, results_out, [0], timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            worker.send(("restore", 1, {}, bytes(16 << 20), "auto"))  # more than any pipe holds
        assert time.monotonic() - started < 30
        message = str(caught.value)
        assert f"worker 0 (pid {process.pid}) read none of a request for 1 s" in message
        assert "it is stuck" in message and "Raise timeout=" in message
    finally:
        process.kill()
        process.join(5)
        for end in (requests_out, requests_in, results_out, results_in):
            end.close()
