"""The contract between :class:`~snapshot.DataLoader2` and the services that run its graph.

A reading service decides *where* the graph runs (this process, worker processes, ranks).
The first half of the interface has torchdata 0.9's names and call order::

    initialize(datapipe)              once, before the first epoch
    initialize_iteration(seeds)       at the start of every epoch
    finalize_iteration()              when an epoch's iterator is exhausted
    finalize()                        on shutdown

The second half, checkpoint and restore, is part of the same interface (torchdata kept it
in an optional subclass): every service can say exactly where its epoch stands and put a
fresh graph back at that point.

    checkpoint() -> dict              the running epoch's state (see ``ServiceCheckpoint``)
    restore(datapipe, state, ...)     instead of ``initialize`` + ``initialize_iteration``

A service's ``initialize`` and ``restore`` return the iterable that the loader iterates for
the epoch.

Only ``initialize`` is required, as in torchdata 0.9: a service written for 0.9 that implements
nothing else runs as it did, and the first attempt to snapshot it raises a
:class:`~snapshot.SnapshotError` that says what to implement.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from snapshot import schema
from snapshot.engine.randomness import SeedGenerator
from snapshot.errors import SnapshotError

__all__ = ["ReadingServiceInterface", "ServiceCheckpoint", "as_record"]

#: A service's checkpoint, as plain nested dicts: what :meth:`snapshot.schema.ServiceState.to_dict`
#: gives, and what it reads (``service``, ``layout`` and ``shards`` at least; see that record for
#: every field). Code reads it through that record, never by its keys.
ServiceCheckpoint = dict[str, Any]


def as_record(state: ServiceCheckpoint | schema.ServiceState) -> schema.ServiceState:
    """A (non-empty) checkpoint as its typed record: a record as it is, a dict read and checked.

    The loader passes the built-in services the record it read from the snapshot; a dict comes
    from code that calls ``restore``/``validate`` itself.
    """
    if isinstance(state, schema.ServiceState):
        return state
    record = schema.ServiceState.from_dict(state)
    if record is None:
        raise ValueError("an empty checkpoint ({}: taken before the first epoch) has no record")
    return record


def __getattr__(name: str) -> Any:
    if name == "ServiceState":  # the dict's earlier name; the record is snapshot.schema.ServiceState
        warnings.warn("snapshot.reading_service.ServiceState is deprecated: the dict a checkpoint() returns is "
                      "ServiceCheckpoint, and its typed record is snapshot.schema.ServiceState",
                      DeprecationWarning, stacklevel=2)
        return ServiceCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ReadingServiceInterface(ABC):
    """How a :class:`~snapshot.DataLoader2` runs its graph, and how it saves and restores it.

    A service must be picklable before ``initialize`` is called: the loader keeps a copy of
    the unconfigured service in each snapshot so that ``DataLoader2.from_snapshot`` can make
    the same kind of service again.
    """

    #: Whether :meth:`restore` and :meth:`validate` take the snapshot's typed record
    #: (:class:`snapshot.schema.ServiceState`, as the loader read it) instead of the plain dict.
    reads_records: bool = False
    #: Whether :meth:`restore` takes ``graph``: the loader's analysis of the ``datapipe`` it passes
    #: (:class:`snapshot.engine.graph.Graph`), so that the service need not walk the graph again.
    takes_graph: bool = False

    @abstractmethod
    def initialize(self, datapipe: Any) -> Iterable[Any]:
        """Take the loader's graph (once, before the first epoch) and prepare to run it."""

    def initialize_iteration(
        self, seed_generator: SeedGenerator, iter_reset_fn: Callable[[Any], Any] | None = None
    ) -> Callable[[Any], Any] | None:
        """Start an epoch: draw this epoch's seeds from ``seed_generator`` and reset."""
        return None

    def finalize_iteration(self) -> None:  # noqa: B027 - optional hook
        """The epoch's iterator is exhausted (or abandoned)."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release everything (worker processes, process groups). Must be idempotent."""

    def checkpoint(self) -> ServiceCheckpoint:
        """The running epoch's exact state; ``{}`` before the first epoch."""
        raise self._not_checkpointable("save a snapshot", "checkpoint")

    def restore(self, datapipe: Any, state: ServiceCheckpoint | schema.ServiceState, *,
                strategy: Any = "auto", graph: Any = None) -> Iterable[Any]:
        """Prepare ``datapipe`` and position it where ``state`` was taken (its record, when :attr:`reads_records`;
        ``graph``, the loader's :class:`~snapshot.engine.graph.Graph` of ``datapipe``, when :attr:`takes_graph`)."""
        raise self._not_checkpointable("restore a snapshot", "restore")

    def _not_checkpointable(self, action: str, method: str) -> SnapshotError:
        name = type(self).__name__
        return SnapshotError(
            f"cannot {action} with the reading service {name}: it does not implement {method}(). "
            f"Implement checkpoint() and restore() in {name} (see snapshot.ReadingServiceInterface), "
            "or use one of snapshot's reading services, which all can.")

    def validate(self, state: ServiceCheckpoint | schema.ServiceState) -> list[str]:
        """Problems that would stop :meth:`restore` (checked before anything changes)."""
        return []

    def parts_to_read(self, index: schema.Manifest) -> Sequence[int] | None:
        """The ranks whose parts a restore onto this service reads from a distributed snapshot whose
        index (the directory's manifest) is ``index``; ``None``: all of them. A service that runs on
        several ranks names only those its rank needs (see :mod:`snapshot.reading_service.reshard`)."""
        return None
