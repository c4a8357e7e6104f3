"""``DataLoader2``: torchdata 0.9's loader, kept alive, that saves and restores exact positions.

Migrating from torchdata 0.9 is a change of import: the constructor, iteration, ``seed``,
``shutdown``, the context manager, ``state_dict``, ``load_state_dict`` and ``from_state``
behave as they did, except that a state dict now resumes *mid-epoch* (0.9 restarted the
epoch). On top of that: ``save_snapshot``, ``restore_snapshot`` and ``from_snapshot``.

Epochs follow torchdata 0.9: each ``iter(loader)`` after the previous iterator was used
starts a new epoch; the seed set by ``seed()`` seeds the first epoch after the call, and
later epochs continue the same seed sequence. Without ``seed()``, every epoch draws a seed
from torch's global generator (without advancing it), and the drawn seed is saved.
"""

from __future__ import annotations

import pickle
from concurrent.futures import Future
from typing import Any, Generic, Literal, TypeVar, overload

from torch.utils.data import IterDataPipe, MapDataPipe

from snapshot.container.capture import LoaderState, Snapshot
from snapshot.container.format import PathOrFile
from snapshot.engine.plan import CodeChanges, RestoreStrategy
from snapshot.engine.randomness import UINT64_LIMIT
from snapshot.hooks._positions import BufferState
from snapshot.loader import _lightning_guard
from snapshot.loader._graph_copy import GraphCopy
from snapshot.loader._iterator import DataLoader2Iterator, adapter_list, map_to_iter, not_a_datapipe
from snapshot.loader._position import LivePosition, Pausing, PausingMethods, loader_repr
from snapshot.loader._restore import Restorer, load_with_graph
from snapshot.loader._save import Saver
from snapshot.loader._service import LoaderService
from snapshot.loader.restore import restore as _restore_into
from snapshot.reading_service.base import ReadingServiceInterface

__all__ = ["DataLoader2", "DataLoader2Iterator"]

T_co = TypeVar("T_co", covariant=True)

class DataLoader2(PausingMethods, Generic[T_co]):
    """Load data from a DataPipe graph through a reading service, with exact snapshots.

    Args:
        datapipe: the graph's sink. A ``MapDataPipe`` is converted with
            ``to_iter_datapipe()``. The loader works on a deep copy, so the same graph can
            feed several loaders. ``None`` only with ``load_state_dict``/``from_state``.
        datapipe_adapter_fn: an adapter or a list of adapters applied to the copy.
        reading_service: where the graph runs; default ``InProcessReadingService()``.
            The loader works on a copy of it.
        buffer_state: how buffering pipes (``shuffle``) save their samples in snapshots:
            ``"values"`` (the samples themselves) or ``"positions"`` (each sample's position
            upstream, re-produced on restore, where the pipes above can: an indexable source
            followed by ``map``; elsewhere values, and the manifest says why). Positions make a large
            shuffle buffer's snapshot small; they assume the map functions are deterministic.
        code_changes: what restoring does when a function of the graph has other code than
            when the snapshot was saved: ``"refuse"`` (a ``GraphMismatchError`` naming it),
            ``"warn"`` or ``"allow"`` (see ``CodeChanges``; recorded in the manifest).

    Examples:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> import snapshot
        >>> dl = snapshot.DataLoader2(IterableWrapper(range(10)).shuffle().batch(3))
        >>> dl.seed(0)
        >>> it = iter(dl)
        >>> first = next(it)
        >>> snap = dl.save_snapshot()
        >>> rest = list(it)
        >>> dl2 = snapshot.DataLoader2.from_snapshot(snap)
        >>> list(dl2) == rest
        True
    """

    def __init__(
        self,
        datapipe: Any,
        datapipe_adapter_fn: Any = None,
        reading_service: ReadingServiceInterface | None = None,
        *,
        buffer_state: BufferState | str = BufferState.VALUES,
        code_changes: CodeChanges | str = CodeChanges.REFUSE,
    ) -> None:
        self.buffer_state = BufferState.parse(buffer_state)
        if datapipe is not None and not isinstance(datapipe, (IterDataPipe, MapDataPipe)):
            raise TypeError(not_a_datapipe(datapipe))
        if isinstance(datapipe, MapDataPipe):
            datapipe = map_to_iter(datapipe)
        self.datapipe_adapter_fns: list[Any] | None = adapter_list(datapipe_adapter_fn)
        #: Epoch, samples yielded, randomness (torchdata 0.9 semantics) and the running iterator.
        self._position = LivePosition()
        # torchdata 0.9's pause and limit: iteration stops without ending the epoch.
        self._pausing = Pausing()
        self.valid_iterator_id: int | None = None
        # The loader's own copies of the reading service and of the graph (with their pickles), and
        # the saver and restorer that read and set them and the position.
        self._service = LoaderService(reading_service, self.buffer_state)
        self._graph = GraphCopy(datapipe, self.datapipe_adapter_fns, CodeChanges.parse(code_changes))
        self._saver = Saver(self._graph, self._service, self._position)
        self._restorer = Restorer(self._graph, self._service, self._position)

    @property
    def datapipe(self) -> Any:
        """The graph's sink this loader runs: its own adapted copy of the one it was given."""
        return self._graph.datapipe

    @property
    def reading_service(self) -> ReadingServiceInterface:
        """This loader's copy of the reading service it was given."""
        return self._service.service

    @property
    def code_changes(self) -> CodeChanges:
        """What restoring does when a function of the graph has other code than when it was saved."""
        return self._graph.code_changes

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> DataLoader2Iterator[T_co]:
        if self.datapipe is None:
            raise RuntimeError("Please provide datapipe or use load_state_dict to load datapipe from state")
        if self._service.terminated:
            raise RuntimeError("Cannot iterate over the DataLoader as it has already been shut down")
        if self._position.reset_iter:
            self._start_epoch()
            self._position.reset_iter = False
        self.valid_iterator_id = 0 if self.valid_iterator_id is None else self.valid_iterator_id + 1
        return DataLoader2Iterator(self, self.valid_iterator_id, self._position, self._pausing)

    def _start_epoch(self) -> None:
        self._ensure_initialized()
        self._position.start_epoch(self.reading_service, self._service.collective())

    def _ensure_initialized(self) -> None:
        if self._position.end is None:
            self._position.end = self.reading_service.initialize(self.datapipe)

    def _end_epoch(self) -> None:
        self._position.epoch_finished = True
        self.reading_service.finalize_iteration()

    def seed(self, seed: int) -> None:
        """Seed the next epoch (and, through it, every later one). ``seed`` is a uint64."""
        if not 0 <= seed < UINT64_LIMIT:
            raise ValueError(f"Expected an uint64 seed, but got {seed}.")
        self._position.user_seed = seed
        self._position.reset_seed = True

    def shutdown(self) -> None:
        """Wait for a background save (at most 30 minutes), stop the reading service (worker processes, ...);
        then raise, once, the error of a background save that failed unread. Safe to call twice. A save after it
        restores exactly where the loader stopped; after a failure of the graph or a worker it raises."""
        self._stop(keep_position=True)
        self._saver.raise_failure()

    def _stop_after_error(self, error: BaseException) -> None:
        """The graph raised ``error`` into the loop: stop, keeping why a later save cannot be exact."""
        self._graph.explain(error)
        self._stop(keep_position=True, error=error)

    def _stop(self, *, keep_position: bool, error: BaseException | None = None) -> None:
        try:
            self._saver.wait()
        finally:  # a save that outlasts its bound still leaves the service stopped
            keep_position = keep_position and self._graph.graph is not None
            self._service.stop(self._position, keep_position=keep_position, error=error)

    def __del__(self) -> None:
        try:  # no capture (nobody saves a collected loader), no wait (a finalizer may run in the save's thread)
            self._service.stop(self._position, keep_position=False)
        except Exception:  # noqa: BLE001 - never raise from a finalizer (nor for a loader its __init__ refused)
            pass

    def __enter__(self) -> DataLoader2[T_co]:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._stop(keep_position=True)
        if exc_type is None:  # an error on its way out wins over a failed background save's (logged already)
            self._saver.raise_failure()

    # -- snapshots ------------------------------------------------------------------------

    def _snapshot_source(self, *, include_graph: bool, verify: int = 0) -> LoaderState:
        """What ``snapshot.capture(loader)`` encodes (see :meth:`Saver.source`)."""
        return self._saver.source(include_graph=include_graph, verify=verify)

    @overload
    def save_snapshot(self, dest: PathOrFile | None = None, *, include_graph: bool = True, keep_last: int | None = None,
                      key: bytes | str | None = None, verify: int = 0, blocking: Literal[True] = True,
                      metadata: dict[str, Any] | None = None) -> Snapshot: ...
    @overload
    def save_snapshot(self, dest: PathOrFile | None = None, *, include_graph: bool = True, keep_last: int | None = None,
                      key: bytes | str | None = None, verify: int = 0, blocking: Literal[False],
                      metadata: dict[str, Any] | None = None) -> Future[str]: ...

    def save_snapshot(
        self, dest: PathOrFile | None = None, *, include_graph: bool = True,
        keep_last: int | None = None, key: bytes | str | None = None, verify: int = 0,
        blocking: bool = True, metadata: dict[str, Any] | None = None,
    ) -> Snapshot | Future[str]:
        """Capture the current position; write it atomically to ``dest`` when given.

        ``include_graph=False`` leaves the pickled graph out (restore then needs the graph built in
        code). ``keep_last=K`` then removes older snapshots numbered like ``dest`` in its directory
        (``ckpt/step-{step}.snap``), keeping the K newest (``snapshot.latest(directory)``: the newest).
        ``key`` (or ``$SNAPSHOT_KEY``) signs the file. ``verify=K`` records fingerprints of the next K
        samples (computed ahead, served from a buffer); a restore checks its stream against them.
        ``metadata``: plain JSON data (64 KiB at most) for this save's manifest only, given back by
        ``Snapshot.metadata``; across ranks the index keeps rank 0's.

        ``blocking=False`` (``dest`` a path) captures the position now, then writes it in a background
        thread while iteration goes on (mutable samples copied first); it returns a ``Future`` of the
        path, or of the reason the save failed (also logged, and raised by the next save or
        ``shutdown()`` unless read). One save runs at a time; a second, ``shutdown()`` and the exit wait
        for it (at most 30 min). Across ranks the save stays synchronous (the future is done).
        """
        return self._saver.save(dest, blocking=blocking, include_graph=include_graph, keep_last=keep_last,
                                key=key, verify=verify, metadata=metadata)

    def restore_snapshot(
        self, src: Any, *, strategy: RestoreStrategy | str = "auto",
        key: bytes | str | None = None, allow_pickle: bool = False,
    ) -> Snapshot:
        """Continue from a snapshot: the next ``iter(loader)`` yields the rest of its epoch.

        ``src`` is a path, a binary file, bytes, a :class:`Snapshot` or a state dict.
        Everything is validated before the loader changes. The state is decoded as data, so
        this runs no code from the file; a snapshot whose state holds values that are not data
        (saved pickled), or one in format 1, is refused unless it is signed with ``key`` (or
        ``$SNAPSHOT_KEY``) or ``allow_pickle=True`` says that you trust it.
        """
        return _restore_into(self, src, strategy=strategy, key=key, allow_pickle=allow_pickle)

    @classmethod
    def from_snapshot(
        cls, src: Any, reading_service: ReadingServiceInterface | None = None, *,
        strategy: RestoreStrategy | str = "auto", key: bytes | str | None = None,
        buffer_state: BufferState | str = BufferState.VALUES, code_changes: CodeChanges | str = CodeChanges.REFUSE,
    ) -> DataLoader2[Any]:
        """A loader built from the graph pickled in ``src``, positioned where it was saved.

        Without ``reading_service``, the service saved in the snapshot is used again.
        This unpickles the graph (and the service) from the file, which runs code from it: use it
        on snapshots you trust (signed ones, with ``key``). It trusts the file's pickled values
        too. To run nothing from a file, build the graph in code and call :meth:`restore_snapshot`.
        """
        snap, reading_service = load_with_graph(src, reading_service, key)
        loader: DataLoader2[Any] = cls(None, reading_service=reading_service, buffer_state=buffer_state,
                                       code_changes=code_changes)
        loader._restorer.restore(snap, RestoreStrategy.parse(strategy))
        return loader

    # -- torchdata 0.9 state-dict API -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-able manifest + payload bytes) that resumes mid-epoch.

        It survives ``torch.save``/``torch.load`` (``weights_only=True`` included), and is
        what accelerate and ``torch.distributed.checkpoint`` save as they are. Lightning saves
        it too, but its fetcher takes one batch ahead of the training step: wrap the loader in
        :class:`snapshot.integrations.lightning.LightningLoader`, or the resume comes one
        batch late (a bare loader in Lightning's fit loop raises a ``SnapshotError`` that says so).
        In a distributed run this is a collective: call it on every rank.
        """
        _lightning_guard.check_caller("state_dict")
        return self._saver.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (mid-epoch); runs no code from it (as :meth:`restore_snapshot`: pickled
        values need ``$SNAPSHOT_KEY`` on both sides, or ``restore_snapshot(state_dict, allow_pickle=True)``)."""
        _lightning_guard.check_caller("load_state_dict")
        self.restore_snapshot(state_dict)

    @classmethod
    def from_state(cls, state: dict[str, Any], reading_service: ReadingServiceInterface | None = None
                   ) -> DataLoader2[Any]:
        """A loader built from a state dict's pickled graph, positioned where it was saved (it unpickles
        the graph: see :meth:`from_snapshot`)."""
        return cls.from_snapshot(state, reading_service)

    def __repr__(self) -> str:
        graph, service = getattr(self, "_graph", None), getattr(self, "_service", None)
        return loader_repr(getattr(graph, "graph", None), getattr(service, "service", None),
                           getattr(self, "_position", None), getattr(service, "terminated", False))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "a DataLoader2 cannot be pickled; save its position with state_dict() or "
            "save_snapshot() and rebuild it with from_state() or from_snapshot()"
        )
