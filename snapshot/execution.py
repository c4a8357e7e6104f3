"""One epoch of a DataPipe graph, run so that its position can be read at any step.

A :class:`Run` iterates a graph (or the part of it one logical shard owns) for one epoch
with the seeds it is given. Every node's iteration goes through a *cell* that counts what
the node yields, so after any sample the run can report, per node path, how many samples
each node has produced in this epoch.

A cell sits in torch's ``_fast_forward_iterator`` slot of its DataPipe: when the consumer
(torch's own code, or a user's pipe) calls ``iter(datapipe)``, torch hands out the cell
instead of starting over, and the cell starts the pipe's real iteration on first use. The
graph itself is never modified; slots are cleared when the run closes.

Restoring by fast-forward builds a fresh run with the saved seeds and replays the saved
number of samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from snapshot.errors import PositionError
from snapshot.graph import ROOT, Graph

__all__ = ["CountingIterator", "Run"]


class CountingIterator(Iterator[Any]):
    """Counts the items of ``iter(datapipe)``, started on first use."""

    __slots__ = ("datapipe", "yielded", "_it")

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe
        self.yielded = 0
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            it = self._it = iter(self.datapipe)
        item = next(it)
        self.yielded += 1
        return item


def _apply_seeds(graph: Graph, seeds: Mapping[str, int]) -> None:
    for path, seed in seeds.items():
        graph[path].datapipe.set_seed(seed)


class Run(Iterator[Any]):
    """Iterates ``graph`` from ``sink`` for one epoch, counting every node's output."""

    def __init__(self, graph: Graph, seeds: Mapping[str, int], *, sink: str = ROOT):
        self.graph = graph
        self.sink_path = sink
        self.seeds = dict(seeds)
        _apply_seeds(graph, self.seeds)
        self._cells: dict[str, CountingIterator] = {}
        for path in graph.ancestors(sink):
            datapipe = graph[path].datapipe
            if not isinstance(datapipe, IterDataPipe):
                continue
            cell = CountingIterator(datapipe)
            self._cells[path] = cell
            if path != sink:
                datapipe._fast_forward_iterator = cell
        self._sink = self._cells[sink]
        self.exhausted = False

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
        return self._sink.yielded

    def counts(self) -> dict[str, int | None]:
        """Per node path, samples yielded in this epoch (``None``: never iterated)."""
        counts: dict[str, int | None] = {}
        for node in self.graph.nodes:
            cell = self._cells.get(node.path)
            if cell is None:
                continue
            counts[node.path] = cell.yielded if cell._it is not None or cell.yielded else None
        return counts

    def fast_forward(self, n: int) -> None:
        """Replay ``n`` samples from the start of the epoch (the run must be fresh)."""
        sink = self._sink
        for done in range(n):
            try:
                next(sink)
            except StopIteration:
                self.exhausted = True
                raise PositionError(
                    f"the snapshot is at sample {n} of its epoch, but replaying the graph "
                    f"ended after {done} samples: the data is shorter than when the snapshot "
                    "was taken (changed files, a different source, a filter that now drops "
                    "more). Restore with the data the snapshot was taken on."
                ) from None

    def close(self) -> None:
        """Clear the slots this run installed that nobody consumed."""
        for cell in self._cells.values():
            datapipe = cell.datapipe
            if getattr(datapipe, "_fast_forward_iterator", None) is cell:
                datapipe._fast_forward_iterator = None
