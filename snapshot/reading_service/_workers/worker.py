"""The worker process: runs a :class:`ShardEngine` for the logical shards it owns.

Protocol (main -> worker, over ``requests``; every reply on ``results``):

=========================================  ===============================================
``("start", tag, seeds)``                  start an epoch; reply ``("ready", tag)``
``("restore", tag, seeds, state, how)``    restore an epoch; reply ``("ready", tag)`` or
                                           ``("failed", tag, error)``
``("next", tag, shard)``                   reply ``("item", tag, shard, sample)``,
                                           ``("end", tag, shard)`` or
                                           ``("error", tag, shard, error)``
``("capture", tag)``                       reply ``("state", tag, engine state)``
``("stop",)``                              exit
=========================================  ===============================================

A graph with a dispatcher (``sharding_round_robin_dispatch``) runs the part above it in the
main process. While producing a sample, a worker that needs that part's samples for a shard
sends ``("need", tag, dispatcher, shard, read so far)`` and waits for ``("feed", tag,
dispatcher, shard, samples, ended)`` (``samples`` is ``None`` if that part failed); other
requests arriving meanwhile are queued, and a new epoch or a stop abandons the sample.

Messages both ways go through :mod:`.transport` (arrays and tensors out of band); an engine
state that plain pickle cannot carry travels as dill's bytes instead. The first epoch's
request comes with the process under ``fork`` (see :mod:`.process`): a restore's state is
then in the worker's memory, never pickled. Replies are pickled here (a sample that cannot be
pickled becomes an ``error``) and sent in the order they were made, so a ``state`` reply
follows every sample produced before it. A ``capture`` is served before the ``next`` requests
queued ahead of it (those samples are simply produced after the snapshot). A worker whose
parent dies exits within a second, even in the middle of a request.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import snapshot.reading_service._workers.transport as transport
from snapshot.container import _serialization


def describe_error(exc: BaseException) -> dict[str, Any]:
    """An exception as data: its type, message, traceback, node path, and itself if picklable."""
    pickled: bytes | None
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
        pickled = None
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "node": getattr(exc, "_snapshot_node", None),
        "pickled": pickled,
    }


def _alive(pid: int) -> bool:
    """Whether the loader's process still runs. Its own child (``fork``, ``spawn``) just checks
    its parent; under ``forkserver`` the parent is the fork server, so the loader's pid is
    looked up, and a zombie (killed, not yet reaped) counts as gone."""
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except OSError:  # no such process, or the pid now belongs to someone else
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc: the pid exists


def _next_message(pending: deque[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The next request to handle: a ``capture`` goes before the ``next`` requests queued ahead
    of it (so a snapshot waits for one sample at most), never before anything else."""
    for index, message in enumerate(pending):
        if message[0] == "capture":
            del pending[index]
            return message
        if message[0] != "next":
            break
    return pending.popleft()


def run_worker(requests: Connection, results: Connection, setup: bytes, parent: int,
               first: tuple[Any, ...] | None = None) -> None:
    """Entry point of a worker process; ``first``: a request to handle before any from ``requests``
    (the first epoch's, handed over in memory under ``fork``)."""
    import torch

    torch.set_num_threads(1)
    sender = transport.Sender(results)
    try:
        _serve(requests, sender, setup, parent, first)
    finally:
        sender.close()


def _serve(requests: Connection, sender: transport.Sender, setup: bytes, parent: int,
           first: tuple[Any, ...] | None) -> None:
    config = _serialization.loads(setup, what="worker set-up")
    server = _Server(requests, sender.send, parent)
    try:
        server.engine = _make_engine(config, server.fetch)
    except BaseException as exc:  # noqa: BLE001 - reported to the main process, which raises it
        sender.send(("fatal", describe_error(exc)))
        return
    if first is not None:
        server.pending.append(first)
    server.run()


def _make_engine(config: dict[str, Any], fetch: Any) -> Any:
    from snapshot.engine.graph import Graph
    from snapshot.engine.sharding import analyze
    from snapshot.reading_service._shards.engine import ShardEngine
    from snapshot.reading_service._workers.reset import ResetEngine

    template = config["graph"]
    graph = Graph(_serialization.loads_graph(template))
    reset_fn = config.get("reset_fn")
    options = {"reset_fn": reset_fn} if reset_fn is not None else {}
    kind = ShardEngine if reset_fn is None else ResetEngine
    return kind(graph, lambda: _serialization.loads_graph(template),
                analyze(graph).for_shards(config["count"]), config["count"],
                config["shards"], worker=config["worker"], init_fn=config["init_fn"],
                global_rng=config["global_rng"], protect_caller_rng=False, remote=fetch,
                buffer_state=config.get("buffer_state", "values"), **options)


class _Server:
    """A worker's loop: the main process's requests, answered in order (see the module's table)."""

    def __init__(self, requests: Connection, send: Callable[[tuple[Any, ...]], None], parent: int):
        self.requests = requests
        self.send = send
        self.parent = parent
        self.engine: Any = None
        self.epoch: Any = None
        self.pending: deque[tuple[Any, ...]] = deque()

    def _receive(self) -> tuple[Any, ...]:
        """The next request (``EOFError`` if the main process dies before it has come whole)."""
        message: tuple[Any, ...] = transport.receive(self.requests, idle=self._check_parent)
        return message

    def _check_parent(self) -> None:
        if not _alive(self.parent):
            raise EOFError("the main process is gone")

    def fetch(self, router: str, shard: int, read: int) -> tuple[list[Any], bool]:
        """Samples of the part above dispatcher ``router`` for ``shard``, from the main process."""
        tag = self.epoch
        self.send(("need", tag, router, shard, read))
        while True:
            if not self.requests.poll(1.0):
                if not _alive(self.parent):
                    raise _Abandoned
                continue
            try:
                message = self._receive()
            except (EOFError, OSError):
                raise _Abandoned from None
            if message[0] == "feed" and message[1] == tag and message[2] == router and message[3] == shard:
                if message[4] is None:
                    raise DispatchError("the part of the graph above the dispatcher failed in the main process")
                return message[4], message[5]
            if message[0] == "feed":
                continue  # for an abandoned epoch
            self.pending.append(message)
            if message[0] in ("start", "restore", "stop"):
                raise _Abandoned

    def run(self) -> None:
        while True:
            if not self.pending and not self.requests.poll(1.0):
                if not _alive(self.parent):  # the main process is gone
                    return
                continue
            try:
                while self.requests.poll(0):
                    self.pending.append(self._receive())
            except (EOFError, OSError):
                return
            message = _next_message(self.pending)
            kind = message[0]
            if kind == "next":
                if not self._next(message):
                    return
            elif kind in ("start", "restore"):
                self._start(message)
            elif kind == "capture":
                self._capture(message[1])
            elif kind == "stop":
                self.engine.close()
                return

    def _next(self, message: tuple[Any, ...]) -> bool:
        """Produce one sample of a shard and send it; ``False`` when the worker should exit."""
        _, tag, shard = message
        if tag != self.epoch:
            return True
        try:
            item = self.engine.next(shard)
        except StopIteration:
            self.send(("end", tag, shard))
            return True
        except _Abandoned:
            if not self.pending or not _alive(self.parent):
                return False
            self.epoch = None  # the epoch was abandoned: drop its remaining requests
            return True
        except BaseException as exc:  # noqa: BLE001 - sent to the main process
            self.send(("error", tag, shard, describe_error(exc)))
            return True
        try:
            self.send(("item", tag, shard, item))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            error = TypeError(f"a sample of logical shard {shard} cannot be pickled to send it to the main "
                              f"process: {type(exc).__name__}: {exc}")
            self.send(("error", tag, shard, describe_error(error)))
        return True

    def _start(self, message: tuple[Any, ...]) -> None:
        from snapshot.engine.plan import RestoreStrategy
        from snapshot.engine.randomness import EpochSeeds

        kind, tag = message[0], message[1]
        self.epoch = tag  # a restore may already need the dispatcher's samples
        try:
            seeds = EpochSeeds.from_state(message[2])
            if kind == "start":
                self.engine.start(seeds)
            else:
                state = message[3]  # as is, or dill's bytes when plain pickle could not carry it
                if isinstance(state, bytes):
                    state = _serialization.loads(state, what="restore state")
                self.engine.start(seeds, state, RestoreStrategy.parse(message[4]))
        except BaseException as exc:  # noqa: BLE001 - a failed restore is the main process's error
            self.epoch = None
            self.send(("failed", tag, describe_error(exc)))
            return
        self.epoch = tag
        self.send(("ready", tag))

    def _capture(self, tag: Any) -> None:
        try:
            state = self.engine.capture()
            try:  # arrays and tensors out of band (see transport)
                self.send(("state", tag, state))
                return
            except Exception:  # noqa: BLE001 - not for plain pickle: dill, which names what cannot be pickled
                packed = _serialization.dumps(state, what="worker state")
            self.send(("state", tag, packed))
        except BaseException as exc:  # noqa: BLE001
            self.send(("failed", tag, describe_error(exc)))


class _Abandoned(BaseException):
    """A sample waiting for the main process's dispatcher is abandoned (new epoch, stop, or no parent)."""


class DispatchError(RuntimeError):
    """Raised in a worker when the dispatching part of the graph failed (the main process has the error)."""
