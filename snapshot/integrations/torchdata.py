"""torchdata after DataLoader2: a graph inside ``StatefulDataLoader``, or as a ``torchdata.nodes`` node.

Both adapters run the graph through a :class:`~snapshot.DataLoader2` and take their state
from it, so a resume is exact and costs what a snapshot restore costs:

- :class:`SnapshotDataset` is an ``IterableDataset`` with ``state_dict()`` /
  ``load_state_dict()``. ``torchdata.stateful_dataloader.StatefulDataLoader`` (torchdata 0.8
  and later) saves that state instead of counting samples, and restores it instead of
  fast-forwarding (which it does, with a warning, for datasets without state). Use it with
  ``num_workers=0``: ``StatefulDataLoader``'s workers would each read a copy of the dataset
  and split it themselves; for parallel reading, give the dataset a
  :class:`~snapshot.MultiProcessingReadingService` instead (its snapshots are exact with
  workers running ahead).
- :func:`as_node` wraps a graph as a ``torchdata.nodes.BaseNode`` (torchdata 0.10 and
  later), whose ``get_state()`` / ``reset(initial_state)`` are the loader's
  ``state_dict()`` / ``load_state_dict()``; ``torchdata.nodes.Loader`` saves and restores it.

Importing this module needs torchdata (any version from 0.8); :func:`as_node` needs
torchdata 0.10 or later (``pip install 'datapipe-snapshot[torchdata-nodes]'``), which no longer has
``DataLoader2``: keep it in an environment of its own if you also use torchdata 0.9.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

import snapshot
from snapshot.integrations._extras import require

require("torchdata", "torchdata-nodes", "snapshot.integrations.torchdata")

__all__ = ["SnapshotDataset", "as_node"]

#: Keys of the states below.
LOADER, FINISHED = "loader", "finished"


def _loader(datapipe: Any, reading_service: snapshot.ReadingServiceInterface | None,
            seed: int | None) -> snapshot.DataLoader2[Any]:
    loader: snapshot.DataLoader2[Any] = snapshot.DataLoader2(datapipe, reading_service=reading_service)
    if seed is not None:
        loader.seed(seed)
    return loader


class SnapshotDataset(IterableDataset[Any]):
    """A graph as an ``IterableDataset`` whose state is the graph's exact position.

    Each ``iter(dataset)`` after the previous iterator was used starts a new epoch (seeded
    with ``seed``, then the seed sequence continues, as :meth:`DataLoader2.seed
    <snapshot.DataLoader2.seed>`); ``state_dict()`` is the running loader's state dict and
    ``load_state_dict()`` puts the next ``iter(dataset)`` where it was taken. The loader
    runs the graph through ``reading_service`` (default in-process). Call :meth:`close`
    (or use ``with``) to stop its worker processes.
    """

    def __init__(self, datapipe: Any, *, reading_service: snapshot.ReadingServiceInterface | None = None,
                 seed: int | None = None) -> None:
        super().__init__()
        self.loader = _loader(datapipe, reading_service, seed)

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:
            raise RuntimeError(
                "SnapshotDataset runs in a DataLoader worker, where each worker would read its own copy of the "
                "graph and its state could not describe the stream: use StatefulDataLoader(..., num_workers=0) "
                "and give SnapshotDataset(graph, reading_service=snapshot.MultiProcessingReadingService(n)) for "
                "parallel reading")
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loader.load_state_dict(state_dict)

    def close(self) -> None:
        """Stop the loader (its worker processes, if any)."""
        self.loader.shutdown()

    def __enter__(self) -> SnapshotDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Any:
        raise TypeError(
            "a SnapshotDataset cannot be copied into DataLoader workers (or pickled): use num_workers=0 and give "
            "it a snapshot.MultiProcessingReadingService for parallel reading")


def as_node(datapipe: Any, *, reading_service: snapshot.ReadingServiceInterface | None = None,
            seed: int | None = None) -> Any:
    """The graph as a ``torchdata.nodes.BaseNode`` whose state comes from this library.

    ``reset(None)`` starts the next epoch (the first one seeded with ``seed``);
    ``reset(state)`` continues exactly where ``state`` was taken. Wrap it in
    ``torchdata.nodes.Loader`` for ``state_dict()`` / ``load_state_dict()`` across epochs.
    Call the node's ``close()`` to stop the loader's worker processes, if it has any.
    """
    nodes = require("torchdata.nodes", "torchdata-nodes", "snapshot.integrations.torchdata.as_node "
                    "(torchdata 0.10 or later)")
    return _node_class(nodes.BaseNode)(_loader(datapipe, reading_service, seed))


_NODE_CLASSES: dict[type, type] = {}


def _node_class(base: type) -> type:
    """``GraphNode``, defined on torchdata's ``BaseNode`` (imported only when asked for)."""
    if base in _NODE_CLASSES:
        return _NODE_CLASSES[base]

    class GraphNode(base):
        """A DataPipe graph, read through a DataLoader2, as a ``torchdata.nodes`` node."""

        def __init__(self, loader: snapshot.DataLoader2[Any]) -> None:
            super().__init__()
            self.loader = loader
            self._it: Iterator[Any] | None = None
            self._finished = False

        def reset(self, initial_state: dict[str, Any] | None = None) -> None:
            super().reset(initial_state)
            if initial_state is not None:
                self.loader.load_state_dict(initial_state[LOADER])
                self._finished = bool(initial_state[FINISHED])
                # an epoch saved as finished stays finished until the next reset(None)
                self._it = None if self._finished else iter(self.loader)
            else:
                self._finished = False
                self._it = iter(self.loader)

        def next(self) -> Any:
            if self._it is None:
                raise StopIteration
            try:
                return next(self._it)
            except StopIteration:
                self._finished = True
                self._it = None
                raise

        def get_state(self) -> dict[str, Any]:
            return {LOADER: self.loader.state_dict(), FINISHED: self._finished}

        def close(self) -> None:
            self.loader.shutdown()

    GraphNode.__module__ = __name__
    _NODE_CLASSES[base] = GraphNode
    return GraphNode
