"""The worker processes of a multi-process loader: starting them (with the first epoch, so that
under ``fork`` a restore hands each worker its share of the state in memory), the messages to
and from them, feeding dispatched samples, and a clear error when one fails or dies (never a
hang: every wait has a timeout)."""

from __future__ import annotations

import contextlib
import os
import pickle
import time
import traceback
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

import snapshot.reading_service._workers.transport as transport
from snapshot.container import _serialization
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import EpochSeeds
from snapshot.engine.sharding import Topology, WorkerInfo
from snapshot.errors import WorkerError
from snapshot.reading_service._rng import GlobalRNG
from snapshot.reading_service._shards.dispatch import Dispatcher, DispatchFailed
from snapshot.reading_service._shards.engine import EngineState
from snapshot.reading_service._shards.recombine import parts, recombine
from snapshot.reading_service._workers.process import WorkerProcess
from snapshot.schema import ServiceState

__all__ = ["WorkerPool"]

_ITEM, _END, _ERROR = 0, 1, 2


def _with_message(exc: BaseException, message: str) -> BaseException:
    """``exc``'s type with ``message``, as torch's ExceptionWrapper does (or ``exc`` with it as a note)."""
    try:
        wrapped = type(exc)(message)
    except Exception:  # noqa: BLE001 - a constructor that wants other arguments
        wrapped = None
    if wrapped is None or str(wrapped) != message:
        if hasattr(exc, "add_note"):
            exc.add_note(message)
        return exc
    wrapped.__dict__.update(vars(exc))
    return wrapped


class WorkerPool:
    """The worker processes of one loader, and the messages to and from them."""

    def __init__(self, *, context: Any, template: bytes, topology: Topology, count: int, shards: Sequence[int],
                 num_workers: int, init_fn: Any, global_rng: GlobalRNG, timeout: float, prefetch: int,
                 dispatcher: Dispatcher | None = None, dispatched: frozenset[str] = frozenset(),
                 buffer_state: str = "values", reset_fn: Any = None):
        self.count = count
        self.topology = topology
        self.dispatcher = dispatcher
        self.dispatched = dispatched  # the part above a dispatcher (in a worker when there is one shard)
        self.start_method = context.get_start_method()
        self.timeout = timeout
        self.prefetch = max(1, prefetch)
        self.owner = {shard: i % num_workers for i, shard in enumerate(shards)}
        self.workers: list[WorkerProcess] = []  # started by the first epoch (see _launch)
        self._context = context
        self._shards = [[s for s in shards if self.owner[s] == index] for index in range(num_workers)]
        self._setups = [_serialization.dumps({"graph": template, "count": count, "shards": mine,
                                              "worker": WorkerInfo(num_workers, index), "init_fn": init_fn,
                                              "global_rng": GlobalRNG(global_rng), "buffer_state": buffer_state,
                                              "reset_fn": reset_fn}, what="worker set-up")
                        for index, mine in enumerate(self._shards)]
        self._tag = 0
        self._reset_buffers()

    def _launch(self, first: list[tuple[Any, ...]]) -> None:
        """Start the worker processes with their first requests: under ``fork`` each has its own in its
        memory (a restore's state is neither pickled nor sent), otherwise they are sent once it runs."""
        inherit = self.start_method == "fork"
        parent = os.getpid()
        try:
            for index, (mine, message) in enumerate(zip(self._shards, first)):
                self.workers.append(WorkerProcess.start(self._context, index, self._setups[index], mine, self.timeout,
                                                        parent, message if inherit else None))
            if not inherit:
                for worker, message in zip(self.workers, first):
                    worker.send_epoch(message)
        except BaseException:
            self.shutdown()
            raise

    def _reset_buffers(self) -> None:
        self._buffers: dict[int, deque[tuple[int, Any]]] = {s: deque() for s in self.owner}
        self._requested = {s: 0 for s in self.owner}
        self._closed = {s: False for s in self.owner}
        self._control: dict[int, deque[tuple[Any, ...]]] = {}
        self._cut: dict[int, int] = {}

    # -- receiving --------------------------------------------------------------------------

    def _receive(self, worker: WorkerProcess, waiting_for: str) -> None:
        """Take one message from ``worker`` (items go to their shard's buffer)."""
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(
                    f"worker {worker.index} (pid {worker.process.pid}) sent nothing for {self.timeout:g} s "
                    f"while the loader waited for {waiting_for}: it is stuck (a hung read, a deadlock in "
                    "the graph's code?). The loader was stopped. Raise timeout= if one sample can take "
                    "that long.")
            others = [w.results for w in self.workers if w is not worker] if self.dispatcher is not None else []
            ready = wait([worker.results, worker.process.sentinel, *others], timeout=min(remaining, 1.0))
            if worker.results in ready:
                break
            if worker.process.sentinel in ready:
                raise worker.death(waiting_for, self.start_method)
            for other in self.workers:  # a worker may be waiting for the dispatcher: serve it
                if other.results in ready:
                    self._receive(other, waiting_for)
        try:
            message = transport.receive(worker.results)
        except (EOFError, OSError) as exc:
            worker.process.join(2)  # a dead worker's pipe reads as closed: say why it died
            if worker.process.exitcode is not None:
                raise worker.death(waiting_for, self.start_method) from exc
            raise WorkerError(f"worker {worker.index} (pid {worker.process.pid}) closed its connection "
                              f"while the loader waited for {waiting_for}") from exc
        kind = message[0]
        if kind in ("item", "end", "error"):
            tag, shard = message[1], message[2]
            if tag != self._tag:
                return  # from an abandoned epoch
            self._requested[shard] -= 1
            if kind == "item":
                self._buffers[shard].append((_ITEM, message[3]))
            else:
                self._closed[shard] = True
                self._buffers[shard].append((_END, None) if kind == "end" else (_ERROR, message[3]))
        elif kind == "fatal":
            raise self._error(message[1], worker, "while starting")
        elif kind == "need":
            self._feed(worker, *message[1:])
        else:
            if kind == "state":  # the samples received so far are the ones produced before it
                self._cut.update({s: len(self._buffers[s]) for s in worker.shards})
            self._control.setdefault(worker.index, deque()).append(message)

    def _feed(self, worker: WorkerProcess, tag: int, router: str, shard: int, read: int) -> None:
        """Answer a worker's request for a dispatcher's samples (``read``: how many it has)."""
        if tag != self._tag or self.dispatcher is None:
            return  # from an abandoned epoch: the worker drops that sample
        try:
            items, ended = self.dispatcher.feed(router, shard, read)
        except DispatchFailed:
            worker.send(("feed", tag, router, shard, None, True))
            return
        worker.send(("feed", tag, router, shard, items, ended))

    def _shard_error(self, error: dict[str, Any], worker: WorkerProcess, shard: int) -> BaseException:
        failure = self.dispatcher.failure if self.dispatcher is not None else None
        if failure is None:
            return self._error(error, worker, f"in logical shard {shard}")
        exc, node = failure  # raised here, in the main process, by the part above the dispatcher
        message = (f"Caught {type(exc).__name__} in dispatching process (the main process, pid {os.getpid()}, "
                   f"by the DataPipe at {node}).\nOriginal {''.join(traceback.format_exception(exc))}")
        return _with_message(exc, message)

    def _await(self, worker: WorkerProcess, tag: int, what: str) -> tuple[Any, ...]:
        while True:
            waiting = self._control.get(worker.index)
            while waiting:
                message = waiting.popleft()
                if message[1] == tag:
                    if message[0] == "failed":
                        raise self._error(message[2], worker, what)
                    return message
            self._receive(worker, what)

    def _error(self, error: dict[str, Any], worker: WorkerProcess, where: str) -> BaseException:
        """The worker's exception, raised again here with torch's and torchdata 0.9's text:
        "Caught <Type> in worker process N" (or "in dispatching process" for the part above a
        dispatcher), then our place and node path, then the original traceback."""
        node = error.get("node")
        dispatching = node is not None and (node in self.dispatched
                                            or node in self.topology.upstream and bool(self.topology.routers))
        process = "in dispatching process" if dispatching else f"in worker process {worker.index}"
        short = error["type"].rsplit(".", 1)[-1]
        detail = f"pid {worker.process.pid}, {where}" + (f", by the DataPipe at {node}" if node else "")
        message = f"Caught {short} {process} ({detail}).\nOriginal {error['traceback']}"
        exc: BaseException | None = None
        if error.get("pickled"):
            try:
                exc = pickle.loads(error["pickled"])
            except Exception:  # noqa: BLE001 - fall back to a description
                exc = None
        if exc is None:
            return WorkerError(message)
        return _with_message(exc, message)

    # -- epochs -----------------------------------------------------------------------------

    def start(self, seeds: EpochSeeds, state: ServiceState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        """Start an epoch in every worker (or put each back from the saved service ``state``); the
        first epoch starts the processes."""
        self._tag += 1
        self._reset_buffers()
        wanted = parts(self.topology, dispatchers=False)
        first = [("start", self._tag, seeds.state()) if state is None else
                 ("restore", self._tag, seeds.state(), recombine(state.upstream, state.shards, mine, wanted),
                  strategy.value) for mine in self._shards]
        if not self.workers:
            self._launch(first)
        else:
            for worker, message in zip(self.workers, first):
                worker.send_epoch(message)
        if self.dispatcher is not None:  # (after the processes started: they need not copy its threads)
            self.dispatcher.start(seeds, state, strategy)
        for worker in self.workers:
            self._await(worker, self._tag, "restoring its shards" if state is not None else "starting the epoch")

    def _top_up(self, shard: int) -> None:
        worker = self.workers[self.owner[shard]]
        while not self._closed[shard] and self._requested[shard] + len(self._buffers[shard]) < self.prefetch:
            worker.send(("next", self._tag, shard))
            self._requested[shard] += 1

    def fetch(self, shard: int) -> Any:
        """The next sample of ``shard`` (``StopIteration`` at its end)."""
        buffer = self._buffers[shard]
        self._top_up(shard)
        worker = self.workers[self.owner[shard]]
        while not buffer:
            self._receive(worker, f"logical shard {shard}")
        kind, payload = buffer.popleft()
        if kind == _ITEM:
            self._top_up(shard)
            return payload
        if kind == _END:
            raise StopIteration
        raise self._shard_error(payload, worker, shard)

    def capture(self) -> tuple[list[EngineState], dict[int, list[Any]]]:
        """Every worker's engine state, and per shard the samples received but not yet taken.

        Those samples are handed over (removed from the pool's buffers): the caller yields
        them before asking for more.
        """
        tag = self._tag
        if self.dispatcher is not None:
            self.dispatcher.hold()
        for worker in self.workers:
            worker.send(("capture", tag))
        states = []
        for worker in self.workers:
            message = self._await(worker, tag, "taking a snapshot")
            state = message[2]  # as is, or dill's bytes when plain pickle could not carry it
            states.append(_serialization.loads(state, what="worker state") if isinstance(state, bytes) else state)
        if self.dispatcher is not None:
            read = {int(s): r for state in states for s, r in state.shards.items()}
            states.append(EngineState(self.dispatcher.capture(read)))
        pending = {}
        for shard, buffer in self._buffers.items():
            cut = self._cut.pop(shard, len(buffer))  # later samples were produced after the worker's state
            before = list(buffer)[:cut]
            for kind, payload in before:
                if kind == _ERROR:
                    raise self._shard_error(payload, self.workers[self.owner[shard]], shard)
            pending[shard] = [payload for kind, payload in before if kind == _ITEM]
            self._buffers[shard] = deque([entry for entry in before if entry[0] != _ITEM] + list(buffer)[cut:])
        return states, pending

    def close(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()
        for worker in self.workers:
            with contextlib.suppress(WorkerError):  # a worker that reads nothing is terminated below
                worker.send(("stop",), timeout=0.5)
        deadline = time.monotonic() + 2
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(2)
            worker.requests.close()
            worker.results.close()
        self.workers = []
