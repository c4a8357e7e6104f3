"""One epoch of a DataPipe graph, run so that its position can be read at any step.

A :class:`Run` iterates a graph (or the part of it that one logical shard owns) for one
epoch with the seeds it is given. Each node gets a *cell*, the iterator that runs it:

- a pipe with an iterator hook runs through its :class:`ResumableIterator`, which reads
  its inputs' cells directly;
- a pipe with an object hook (``state_dict``/``load_state_dict``) or without any hook runs
  its own ``__iter__``, counted by a thin wrapper. Its inputs are iterated by its own code,
  so their cells are put in torch's ``_fast_forward_iterator`` slot: ``iter(input)`` then
  hands out the cell instead of starting over. The graph itself is never modified, and the
  slots are cleared when the run closes.

So after any sample the run knows, per node path, how many samples each node yielded and
(for nodes with hooks) its state. A run restored from a snapshot loads those states and
replays only the subgraphs its :class:`~snapshot.plan.Plan` names (a pipe that keeps a
generator of its own is first rewound to the start of the epoch), then checks that the
replay ended where the snapshot says: the same counts, the same ends of epoch, the same
generator states.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from torch.utils.data import MapDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot import _progress
from snapshot.engine._passes import Passes, Slot, arm, carry_over, check_restart
from snapshot.engine._replay_check import divergence
from snapshot.engine.graph import ROOT, Graph
from snapshot.engine.plan import Plan, log_plan
from snapshot.errors import PositionError, RestoreError
from snapshot.hooks import StateHook, hook_for
from snapshot.hooks._base import STATE, YIELDED, ResumableIterator, counted_step
from snapshot.schema.state import NodeState

__all__ = ["CountingIterator", "NodeRecord", "Run", "capture_persistent", "restore_persistent", "rewind"]


_log = logging.getLogger(__name__)

#: A replay of at least this many samples shows a progress bar (see :mod:`snapshot._progress`).
REPLAY_PROGRESS = 1_000


class CountingIterator(Iterator[Any]):
    """Runs a pipe's own ``__iter__`` (started on first use) and counts its samples."""

    __slots__ = ("datapipe", "yielded", "exhausted", "path", "_it", "_raw")

    def __init__(self, datapipe: Any, *, raw: bool = False):
        self.datapipe = datapipe
        self.yielded = 0
        self.exhausted = False
        self.path: str | None = None
        self._it: Iterator[Any] | None = None
        self._raw = raw

    def __iter__(self) -> CountingIterator:
        return self

    @property
    def started(self) -> bool:
        return self._it is not None

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            it = self._it = _raw_iter(self.datapipe) if self._raw else iter(self.datapipe)
        return counted_step(self, it.__next__)


def _raw_iter(datapipe: Any) -> Iterator[Any]:
    """The pipe's own iterator without torch's ``reset()`` (used after ``load_state_dict``)."""
    method = type(datapipe).__iter__
    raw = getattr(method, "__wrapped__", None)
    return iter(raw(datapipe)) if raw is not None else iter(datapipe)


#: A node's record in a capture (:class:`snapshot.schema.NodeState`).
NodeRecord = NodeState

_NOTHING = object()


def _hand_over(item: Any, consumers: Iterable[Any]) -> None:
    """The last item of a replayed input, to its consumers restored from their state (see
    :meth:`~snapshot.hooks.ResumableIterator.replays_input`)."""
    for cell in consumers:
        if isinstance(cell, ResumableIterator):
            cell.replayed_input(item)


def _without_streams(value: Any) -> Any:
    """``value`` with every stream in it (an ``io`` object, a torch ``StreamWrapper``) as ``None``."""
    if isinstance(value, (io.IOBase, StreamWrapper)):
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(_without_streams(v) for v in value) if not hasattr(value, "_fields") else value
    if isinstance(value, dict):
        return {k: _without_streams(v) for k, v in value.items()}
    return value


def capture_persistent(graph: Graph) -> dict[str, Any]:
    """Per node path, the state its pipe keeps across epochs (only where there is some)."""
    states = {}
    for node in graph.nodes:
        hook = hook_for(node.datapipe)
        if hook is not None and hook.iterator is not None:
            state = hook.iterator.persistent_state(node.datapipe)
            if state is not None:
                states[node.path] = state
    return states


def restore_persistent(graph: Graph, states: Mapping[str, Any]) -> None:
    """Put back :func:`capture_persistent`'s states on a rebuilt graph."""
    for path, state in states.items():
        hook = hook_for(graph[path].datapipe)
        if hook is not None and hook.iterator is not None:
            hook.iterator.load_persistent_state(graph[path].datapipe, state)


def rewind(graph: Graph, records: Mapping[str, NodeRecord], paths: Iterable[str]) -> None:
    """Put the pipes at ``paths`` back as they were when the saved epoch began (before they
    are replayed from its start), from their saved records."""
    for path in paths:
        record = records.get(path)
        if record is None or record.state is None:
            continue
        hook = hook_for(graph[path].datapipe)
        if hook is not None and hook.iterator is not None:
            hook.iterator.rewind(graph[path].datapipe, record.state)


#: Builds the cell of a sharding point that a logical shard reads again on its own (see
#: :mod:`snapshot.reading_service._shards.reread`): ``(port, pass key, saved state or None)``.
Reread = Callable[[Any, tuple[int, ...], Any], Any]


class Run(Iterator[Any]):
    """Iterates ``graph`` from ``sink`` for one epoch, with a readable position.

    Args:
        graph: the graph (its DataPipes are used as they are: seeds are applied to them).
        seeds: per node path, the seed for pipes with ``set_seed``.
        sink: the node to iterate.
        sinks: further nodes whose cells other code reads (a router's input); see :meth:`cell`.
        ports: pre-built cells for some nodes (a logical shard's input, say).
        records: saved node records to restore from (``None``: start of the epoch).
        plan: with ``records``, which nodes to replay instead of loading.
        buffer_state: how buffering pipes save their samples (``"values"`` or ``"positions"``).
        reread: for a logical shard, builds the cell of a port read again within the epoch (a
            ``cycle`` below the sharding point); without it, such a graph is refused.
    """

    def __init__(
        self,
        graph: Graph,
        seeds: Mapping[str, int],
        *,
        sink: str = ROOT,
        sinks: tuple[str, ...] = (),
        ports: Mapping[str, Any] | None = None,
        records: Mapping[str, NodeRecord] | None = None,
        plan: Plan | None = None,
        buffer_state: str = "values",
        reread: Reread | None = None,
    ):
        self.graph = graph
        self.buffer_state = str(getattr(buffer_state, "value", buffer_state))
        self.sink_path = sink
        self.seeds = dict(seeds)
        for path, seed in self.seeds.items():
            graph[path].datapipe.set_seed(seed)
        self._ports = dict(ports or {})
        self._reread = reread
        self._records = records
        self._replay = plan.replay if (plan is not None and records is not None) else frozenset()
        self._hooks: dict[str, StateHook | None] = {}
        self._fresh: set[str] = set()
        self._passes = Passes(graph, self.seeds, records, self._replay)
        self._cells: dict[str, Any] = {}
        self._slots: list[Any] = []
        self._sink = [self._build(path) for path in (sink, *sinks)][0]
        self.exhausted = False
        if records is not None and plan is not None:
            self._replay_drivers(plan, records)
            self._check_replay(plan, records)

    # -- building -------------------------------------------------------------------------

    def _restored(self, path: str) -> NodeRecord | None:
        if self._records is None or path in self._replay or path in self._fresh:
            return None
        return self._records.get(path)

    def _build(self, path: str) -> Any:
        cell = self._cells.get(path)
        if cell is not None:
            return cell
        if path in self._ports:
            cell = self._cells[path] = self._port(path)
            return cell
        node = self.graph[path]
        datapipe = node.datapipe
        hook = self._hooks[path] = hook_for(datapipe)
        record = self._restored(path)
        if self._records is not None and path not in self._fresh:
            self._passes.restored(path)
        if path in self._replay and path not in self._fresh and self._records is not None:
            rewind(self.graph, {path: self._passes.rewind_record(path)}, [path])
        if hook is not None and hook.iterator is not None:
            inputs = [self._input(p) for p in node.inputs]
            cell = hook.iterator(datapipe, inputs)
            cell._restart = lambda index, path=path: self._again(path, self.graph[path].inputs[index])
            cell.path = path
            if self.buffer_state != "values":
                cell.buffer_state = self.buffer_state
            if record is not None and record.state is not None:
                cell.load_state_dict({YIELDED: record.yielded, STATE: record.state})
        else:
            for p in node.inputs:
                self._install(p, path)
            # A pipe that had not started this epoch starts afresh (its state may be the last
            # epoch's); one that had is put back and continued without torch's reset().
            restored = (hook is not None and record is not None and record.state is not None
                        and record.yielded is not None)
            if restored:
                assert hook is not None and hook.load_state_dict is not None and record is not None
                hook.load_state_dict(datapipe, record.state)
            cell = CountingIterator(datapipe, raw=restored)
            if restored:
                assert record is not None
                cell.yielded = int(record.yielded or 0)
        cell.path = path
        self._cells[path] = cell
        return cell

    def _port(self, path: str) -> Any:
        """The cell of port ``path``: the shared port in its first pass, else its own reading."""
        restoring = self._records is not None and path not in self._fresh
        state = self._passes.restored_port(path, self.graph[path].consumers) if restoring else None
        key = self._passes.key(path)
        if not key or self._reread is None:
            return self._ports[path]
        cell = self._reread(self._ports[path], key, state)
        cell.path = path
        return cell

    def _again(self, consumer: str, path: str, *, shared: bool = True) -> Any:
        """Fresh cells (a new pass) for ``path`` and its subgraph, started again by ``consumer``."""
        subgraph = self.graph.ancestors(path)
        check_restart(self.graph, consumer, subgraph, () if self._reread is not None else self._ports, shared=shared)
        previous = {p: self._cells.pop(p, None) for p in subgraph}
        self._passes.restart(consumer, path, subgraph)
        self._fresh.update(subgraph)
        cell = self._input(path)
        carry_over(previous, self._cells)
        return cell

    def _input(self, path: str) -> Any:
        datapipe = self.graph[path].datapipe
        return datapipe if isinstance(datapipe, MapDataPipe) else self._build(path)

    def _install(self, path: str, consumer: str) -> None:
        """Put ``path``'s cell in its slot for ``consumer`` (a pipe that iterates it itself); once
        taken, the slot is filled again, so a later ``iter()`` starts a new pass of it here."""
        datapipe = self.graph[path].datapipe
        if isinstance(datapipe, MapDataPipe):
            return
        arm(datapipe, self._build(path), lambda: self._again(consumer, path, shared=False))
        self._slots.append(datapipe)

    # -- restoring ------------------------------------------------------------------------

    def _replay_drivers(self, plan: Plan, records: Mapping[str, NodeRecord]) -> None:
        drivers = [(path, count) for path, count in plan.drivers if path in self._cells]
        log_plan(plan, self.graph, drivers, hooked=lambda node: self._hooks.get(node) is not None)
        if drivers:  # (else every node from its state: no progress bar to set up)
            with _progress.bar(sum(n for _, n in drivers), "snapshot: replaying", minimum=REPLAY_PROGRESS,
                               unit="sample") as progress:
                for path, count in drivers:
                    exhausted = getattr(records.get(path), "exhausted", False)
                    self._replay_driver(path, count, exhausted, progress if progress.shown else None)

    def _check_replay(self, plan: Plan, records: Mapping[str, NodeRecord]) -> None:
        """Refuse a replay that did not end where the snapshot says: every replayed node must
        have yielded its saved count, be exhausted exactly when it was, and (for hooks that
        name them) hold the same generator states and flags."""
        diverged = []
        for path in sorted(plan.replay):
            record, cell = records.get(path), self._cells.get(path)
            if record is None or record.yielded is None or cell is None:
                continue
            difference = self._passes.diverged(path) or divergence(cell, record.yielded, record.exhausted, record.state)
            if difference is not None:
                diverged.append(f"  {path} ({self.graph[path].signature}): {difference}")
        if diverged:
            raise RestoreError(
                "replaying the graph did not reproduce the saved position:\n" + "\n".join(diverged)
                + "\nA pipe in the replayed part is not deterministic for a given seed (it draws "
                "from an unseeded random source, or reads data that changed)."
            )

    def _replay_driver(self, path: str, count: int, to_the_end: bool, progress: _progress.Bar | None) -> None:
        cell = self._cells[path]
        done, item = 0, _NOTHING
        while done < count or to_the_end:
            try:
                item = next(cell)
            except StopIteration:
                if done < count:
                    raise PositionError(
                        f"the snapshot is at sample {count} of the DataPipe at {path} "
                        f"({self.graph[path].signature}), but replaying it ended after {done} "
                        "samples: the data is shorter than when the snapshot was taken. "
                        "Restore with the data the snapshot was taken on."
                    ) from None
                break
            done += 1
            if progress is not None and done % 256 == 0:
                progress.update(256)
        if item is not _NOTHING:
            _hand_over(item, [self._cells.get(c) for c in self.graph[path].consumers if c not in self._replay])

    def cell(self, path: str) -> Any:
        """The iterator running node ``path`` in this run."""
        return self._cells[path]

    # -- iterating ------------------------------------------------------------------------

    def __iter__(self) -> Run:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._sink)
        except StopIteration:
            self.exhausted = True
            raise

    @property
    def yielded(self) -> int:
        """Samples the sink has yielded in this epoch."""
        return int(self._sink.yielded)

    # -- capturing ------------------------------------------------------------------------

    def counts(self) -> dict[str, int | None]:
        """Per node path, samples yielded in this epoch (``None``: never iterated)."""
        counts: dict[str, int | None] = {}
        for node in self.graph.nodes:
            cell = self._cells.get(node.path)
            if cell is None:
                continue
            started = cell.yielded or not isinstance(cell, CountingIterator) or cell.started
            counts[node.path] = cell.yielded if started else None
        return counts

    def capture(self, replayed: Collection[str] = ()) -> dict[str, NodeRecord]:
        """Per node: samples yielded, its state (``None`` without a hook), buffered samples. Nodes a restore
        replays (``replayed``) keep no stream in their state (one no opener made is not data)."""
        records: dict[str, NodeRecord] = {}
        counts = self.counts()
        for path, count in counts.items():
            cell = self._cells[path]
            hook = self._hooks.get(path)
            state: Any = None
            buffered = 0
            if isinstance(cell, ResumableIterator):
                state = _without_streams(cell.get_state()) if path in replayed else cell.get_state()
                buffered = cell.buffered()
            elif hook is not None and hook.state_dict is not None:
                state = hook.state_dict(cell.datapipe)
            records[path] = NodeState(yielded=count, exhausted=bool(getattr(cell, "exhausted", False)), state=state,
                                      buffered=buffered,
                                      buffer_state=cell.buffer_note() if isinstance(cell, ResumableIterator) else None,
                                      passes=self._passes.record(path))
        return records

    def close(self) -> None:
        """Release what the cells hold (thread pools) and clear the slots this run installed."""
        for cell in self._cells.values():
            if isinstance(cell, ResumableIterator):
                cell.close()
        for datapipe in self._slots:
            if isinstance(getattr(datapipe, "_fast_forward_iterator", None), Slot):
                datapipe._fast_forward_iterator = None
        self._slots.clear()
