"""Passes: a subgraph iterated again within one epoch, and the seeds of its later passes.

A pipe such as ``cycle`` starts its input over when it ends (through
:meth:`~snapshot.hooks._base.ResumableIterator.restart_input`), and a pipe without a hook may
call ``iter()`` on an input a second time (through the input's :class:`Slot`): every node
behind that input starts a new *pass*, run by the engine. A random pipe there (``shuffle``,
``in_batch_shuffle``, ``bucketbatch``, any pipe with ``set_seed``) would draw the seed of that
pass from torch's global generator, which no snapshot reproduces. Here each pass gets a seed
derived from the pipe's epoch seed and the pass's *key* (:func:`snapshot.randomness.pass_seed`)
instead.

The key of a pass is hierarchical: when the pipe at ``by`` starts its input over for the
``j``-th time in its own current pass (whose key is ``K``), every node behind that input gets
the pass ``(by, K + (j,))``. Nodes never started over keep the empty key (the epoch seed), so
a graph without re-iteration yields exactly what it yielded before.

A node's pass is saved in its record (``passes``: ``{"by": ..., "key": [...]}``), so:

- a node restored from its state continues its pass, and its next pass gets the right key;
- a node that is replayed starts at the pass its replay begins in: the saved one when the
  pipe that started it over is not replayed, else (as that pipe replays its own pass from its
  start) the pass in which that pipe's pass began, recursively;
- after a replay, every replayed node must have reached its saved pass, or the restore is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from snapshot.engine.randomness import pass_seed
from snapshot.errors import ExecutionError, ShardingError
from snapshot.hooks.builtin._rng import AT_PASS_START
from snapshot.schema.state import NodeState

__all__ = ["AT_PASS_START", "BY", "KEY", "Pass", "Passes", "Slot", "arm", "carry_over", "check_restart"]

BY = "by"
KEY = "key"


@dataclass(frozen=True)
class Pass:
    """A pass of a node: which pipe started it (``None``: the epoch did) and its key."""

    by: str | None = None
    key: tuple[int, ...] = ()

    def plain(self) -> dict[str, Any]:
        return {BY: self.by, KEY: list(self.key)}

    @classmethod
    def from_record(cls, record: NodeState | None) -> Pass:
        saved = record.passes if record is not None else None
        if not saved:
            return cls()
        return cls(None if saved[BY] is None else str(saved[BY]), tuple(int(k) for k in saved[KEY]))


_FIRST = Pass()


class Passes:
    """The current pass of every node of one :class:`~snapshot.execution.Run`.

    Args:
        graph: the run's graph (random pipes get their pass seeds through ``set_seed``).
        seeds: per node path, the epoch seed of each random pipe the run may start.
        records: the saved node records the run restores from (``None``: a fresh epoch).
        replay: the nodes the run replays from the start of their pass.
    """

    def __init__(self, graph: Any, seeds: Mapping[str, int], records: Mapping[str, NodeState] | None,
                 replay: Collection[str]):
        self._graph = graph
        self._seeds = seeds
        self._records = records or {}
        self._replay = replay
        self._now: dict[str, Pass] = {}

    def saved(self, path: str) -> Pass:
        return Pass.from_record(self._records.get(path))

    def restored(self, path: str, *, replayed: bool | None = None) -> None:
        """Put back the pass of node ``path``, built from the saved records (``replayed``: whether
        it is read again from the start of a pass; default: whether the plan replays it)."""
        if replayed is None:
            replayed = path in self._replay
        if not replayed and path not in self._now:  # (most nodes: in their first pass, nothing to put back)
            record = self._records.get(path)
            if record is None or not record.passes:
                return
        self._begin(path, self._first_replayed(path) if replayed else self.saved(path))

    def restored_port(self, path: str, consumers: Collection[str]) -> Any:
        """Put back the pass of port ``path`` (a logical shard's sharding point) from the saved
        records; returns its saved state if it continues that pass (``None``: it starts over)."""
        replayed = any(c in self._replay for c in consumers)
        self.restored(path, replayed=replayed)
        record = self._records.get(path)
        return None if replayed or record is None else record.state

    def key(self, path: str) -> tuple[int, ...]:
        """The key of ``path``'s current pass (empty: its first pass of the epoch)."""
        return self._now.get(path, _FIRST).key

    def _first_replayed(self, path: str) -> Pass:
        current = self.saved(path)
        while current.by is not None and current.by in self._replay:
            current = self.saved(current.by)
        return current

    def rewind_record(self, path: str) -> NodeState:
        """The record to rewind replayed node ``path`` with: its state, with the values it had at
        the start of its pass (:data:`AT_PASS_START`) when its replay starts in its saved pass."""
        record = self._records.get(path) or NodeState()
        state = record.state
        saved = self.saved(path)
        if (saved != _FIRST and isinstance(state, dict) and AT_PASS_START in state
                and self._first_replayed(path) == saved):
            return replace(record, state={**state, **state[AT_PASS_START]})
        return record

    def restart(self, consumer: str, input_path: str, subgraph: Collection[str]) -> None:
        """``consumer`` starts its input ``input_path`` (and all of ``subgraph`` behind it) over."""
        previous = self._now.get(input_path, _FIRST)
        count = previous.key[-1] + 1 if previous.by == consumer else 1
        started = Pass(consumer, self._now.get(consumer, _FIRST).key + (count,))
        for path in subgraph:
            self._begin(path, started)

    def _begin(self, path: str, current: Pass) -> None:
        if current == _FIRST and path not in self._now:
            return
        self._now[path] = current
        seed = self._seeds.get(path)
        if seed is not None:
            self._graph[path].datapipe.set_seed(pass_seed(seed, current.key))

    def record(self, path: str) -> dict[str, Any] | None:
        """What a record saves of ``path``'s pass (``None``: its first pass of the epoch)."""
        current = self._now.get(path, _FIRST)
        return None if current == _FIRST else current.plain()

    def diverged(self, path: str) -> str | None:
        """After a replay: how ``path``'s pass differs from the saved one (``None``: it does not)."""
        now, saved = self._now.get(path, _FIRST), self.saved(path)
        if now == saved:
            return None
        return f"it replayed pass {list(now.key)}, the snapshot was in pass {list(saved.key)}"


def _nothing() -> None:
    return None


class Slot(Iterator[Any]):
    """What torch hands a pipe without a hook that iterates an input itself (through the input's
    ``_fast_forward_iterator`` slot): on its first sample it asks ``take()`` for the cell to read,
    the input's cell the first time and a new pass of it (run by the engine, seeded for that
    pass) every later time, instead of torch's own generator, whose seed no snapshot knows."""

    __slots__ = ("_take", "_rearm", "_cell")

    def __init__(self, take: Callable[[], Any], rearm: Callable[[], None]):
        self._take, self._rearm = take, rearm
        self._cell: Any = None

    def __iter__(self) -> Slot:
        return self

    def __next__(self) -> Any:
        cell = self._cell
        if cell is not None:
            return next(cell)
        cell = self._cell = self._take()
        try:
            return next(cell)
        finally:  # not before: a cell that runs its pipe's own __iter__ takes the slot itself
            self._rearm()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _nothing, ()  # a graph pickled while it runs keeps an empty slot


def arm(datapipe: Any, cell: Any, again: Callable[[], Any]) -> None:
    """Put ``cell`` in ``datapipe``'s slot; once it is taken, the slot is filled again, so that a
    later ``iter(datapipe)`` reads the new pass that ``again()`` starts."""
    first: Any = cell

    def take() -> Any:
        nonlocal first
        taken, first = first, None
        return taken if taken is not None else again()

    def rearm() -> None:
        datapipe._fast_forward_iterator = Slot(take, rearm)

    rearm()


def carry_over(previous: Mapping[str, Any], cells: Mapping[str, Any]) -> None:
    """Let each cell started again within the epoch take over from its previous cell what it
    keeps for the whole epoch (a cell that defines ``follow(previous)``)."""
    for path, old in previous.items():
        follow = getattr(cells.get(path), "follow", None)
        if old is not None and follow is not None:
            follow(old)


def check_restart(graph: Any, consumer: str, subgraph: Collection[str], ports: Collection[str], *,
                  shared: bool = True) -> None:
    """Refuse to start ``subgraph`` over (for ``consumer``) when other pipes read part of it
    (with ``shared``), or when it reaches a sharding point that this logical shard shares with
    the others."""
    region = set(subgraph) | {consumer}
    for path in sorted(subgraph) if shared else ():
        others = [c for c in graph[path].consumers if c not in region]
        if others:
            raise ExecutionError(
                f"the DataPipe at {consumer} ({graph[consumer].signature}) iterates its input again within "
                f"the epoch, but {path} ({graph[path].signature}) behind that input is also read by "
                f"{', '.join(others)}, which would see it start over (torch's own pipes refuse this too: "
                "the other iterator is invalidated). Give the re-iterated branch a source of its own.")
    crossed = [p for p in subgraph if p in ports]
    if crossed:
        raise ShardingError(
            f"the DataPipe at {consumer} ({graph[consumer].signature}) iterates its input again, and that "
            f"input reads from the sharding point at {crossed[0]}, which this logical shard shares with the "
            f"others, so it cannot read it again on its own. Put the {type(graph[consumer].datapipe).__name__} "
            "above the sharding_filter, or run with one logical shard (logical_shards=1).")
