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

import os
import pickle
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, Literal, TypeVar, overload

from torch.utils.data import IterDataPipe, MapDataPipe

from snapshot import _lightning_guard, _object_directory, _rotation, _serialization, _staging, _storage
from snapshot._background import BackgroundSaver
from snapshot._fingerprint import sample_fingerprint
from snapshot.capture import (
    LoaderState,
    Snapshot,
    capture,
    decode_nodes,
    part_info,
    parts_state_dict,
    save,
    snapshot_of,
)
from snapshot.errors import LayoutError, RankError, SnapshotError, VerificationError
from snapshot.format import PathOrFile
from snapshot.graph import Graph
from snapshot.hooks._positions import BufferState
from snapshot.randomness import UINT64_LIMIT, SeedGenerator, draw_seed
from snapshot.reading_service.base import ReadingServiceInterface
from snapshot.reading_service.in_process import InProcessReadingService
from snapshot.restore import RestoreStrategy, check_graph, make_plan
from snapshot.restore import restore as _restore_into
from snapshot.schema import SavedState, VerifyRecord

__all__ = ["DataLoader2", "DataLoader2Iterator"]

T_co = TypeVar("T_co", covariant=True)

_INVALIDATED = (
    "This iterator has been invalidated because another iterator has been created from the "
    "same DataLoader2. Keep a single iterator per DataLoader2."
)


def _check_keep_last(dest: Any, keep_last: int) -> None:
    """Refuse ``keep_last`` before saving where it cannot apply."""
    if not isinstance(dest, (str, os.PathLike)):
        raise ValueError(f"keep_last needs dest to be a path in a directory of snapshots, got {dest!r}")
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    _rotation.prune_check(dest)


def _not_a_datapipe(datapipe: Any) -> str:
    """Why ``datapipe`` is refused, and which wrapper makes a DataPipe of it."""
    from torch.utils.data import Dataset, IterableDataset

    name = f"{type(datapipe).__module__}.{type(datapipe).__qualname__}"
    head = f"DataLoader2 expects an IterDataPipe or a MapDataPipe, got {name}."
    wrappers = "torch.utils.data.datapipes"
    by_index = "IterableWrapper(range(len(data))).map(data.__getitem__)"
    if isinstance(datapipe, IterableDataset):
        return (f"{head} Wrap an iterable dataset in IterableWrapper(dataset) (from {wrappers}.iter); "
                "its position is then replayed on restore unless it has state_dict()/load_state_dict().")
    if isinstance(datapipe, Dataset) or (hasattr(datapipe, "__getitem__") and hasattr(datapipe, "__len__")
                                         and not isinstance(datapipe, (str, bytes, dict))):
        return (f"{head} For a map-style dataset or a sequence, pass {by_index} (IterableWrapper from "
                f"{wrappers}.iter; add .shuffle() after IterableWrapper to shuffle the indices), or, with torchdata "
                f"installed, SequenceWrapper(data) (from {wrappers}.map) or its .to_iter_datapipe().")
    if isinstance(datapipe, Iterable):
        return f"{head} Wrap an iterable in IterableWrapper(data) (from {wrappers}.iter)."
    return f"{head} Build a graph of DataPipes, starting from IterableWrapper or SequenceWrapper."


def _map_to_iter(datapipe: Any) -> Any:
    """A MapDataPipe as an IterDataPipe, through torchdata's ``to_iter_datapipe`` (which it registers)."""
    try:
        return datapipe.to_iter_datapipe()
    except AttributeError:
        pass
    try:
        import torchdata.datapipes.map  # noqa: F401 - registers to_iter_datapipe
    except ImportError:
        raise TypeError(
            f"DataLoader2 converts a MapDataPipe ({type(datapipe).__qualname__}) with to_iter_datapipe(), which "
            "comes with torchdata (not installed). Install torchdata==0.9.0, or pass "
            "IterableWrapper(range(len(data))).map(data.__getitem__) (IterableWrapper from "
            "torch.utils.data.datapipes.iter) instead."
        ) from None
    return datapipe.to_iter_datapipe()


def _configure_buffers(service: Any, buffer_state: BufferState) -> None:
    """Tell every service that runs graph parts (nested ones included) how to save buffers."""
    seen: set[int] = set()
    stack = [service]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if hasattr(type(current), "buffer_state"):
            current.buffer_state = buffer_state.value
        stack.extend(getattr(current, name, None) for name in ("inner", "executor"))
        stack.extend(getattr(current, "reading_services", []))


class DataLoader2Iterator(Iterator[T_co]):
    """The iterator ``iter(DataLoader2)`` returns; only the newest one is valid.

    As in torchdata 0.9, ``limit(n)`` makes it stop (``StopIteration``, the epoch not ended)
    after ``n`` more samples, ``resume()`` lets it go on, and other attributes are looked up on
    the iterator of the reading service's graph. A snapshot taken while it is stopped restores
    exactly; the restored loader is not paused and has no limit.
    """

    def __init__(self, dataloader: DataLoader2[T_co], iterator_id: int):
        self.dataloader = dataloader
        self.iterator_id = iterator_id

    def __iter__(self) -> DataLoader2Iterator[T_co]:
        return self

    def __next__(self) -> T_co:
        loader = self.dataloader
        if self.iterator_id != loader.valid_iterator_id:
            raise RuntimeError(_INVALIDATED)
        loader._reset_iter = True
        if loader._paused:
            raise StopIteration
        if loader._lookahead:
            item = loader._lookahead.popleft()
        else:
            it = loader._datapipe_iter
            if it is None:
                raise StopIteration
            try:
                item = next(it)
            except StopIteration:
                loader._end_epoch()
                raise
            except Exception:
                loader.shutdown()
                raise
        loader._yielded += 1
        loader._count_towards_limit()
        return item

    @property
    def limit_threshold(self) -> int | None:
        return self.dataloader._limit_threshold

    @property
    def limit_counter(self) -> int | None:
        return self.dataloader._limit_counter

    def limit(self, num_batches: int | None) -> None:
        """Stop after ``num_batches`` more samples (counted from now; ``None`` removes the
        limit). The limit stays after each stop: call :meth:`resume` to get the next ones."""
        self.dataloader._limit(num_batches)

    def resume(self) -> None:
        """Continue after a stop caused by :meth:`limit` or ``DataLoader2._pause()``."""
        self.dataloader._resume()

    def __getattr__(self, name: str) -> Any:
        # only called for names not found on the iterator itself: ask the graph's iterator
        loader = self.__dict__.get("dataloader")
        inner = loader._datapipe_iter if loader is not None else None
        if inner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(inner, name)


class DataLoader2(Generic[T_co]):
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
            followed by ``map``; elsewhere values, and the manifest says why). Positions make a
            large shuffle buffer's snapshot small; they assume the map functions are
            deterministic.

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
    ) -> None:
        self.buffer_state = BufferState.parse(buffer_state)
        if datapipe is not None and not isinstance(datapipe, (IterDataPipe, MapDataPipe)):
            raise TypeError(_not_a_datapipe(datapipe))
        if isinstance(datapipe, MapDataPipe):
            datapipe = _map_to_iter(datapipe)
        if datapipe_adapter_fn is None:
            self.datapipe_adapter_fns: list[Any] | None = None
        elif isinstance(datapipe_adapter_fn, Iterable):
            self.datapipe_adapter_fns = list(datapipe_adapter_fn)
        else:
            self.datapipe_adapter_fns = [datapipe_adapter_fn]
        service = reading_service if reading_service is not None else InProcessReadingService()
        if not isinstance(service, ReadingServiceInterface):
            raise TypeError(
                f"reading_service must implement snapshot.ReadingServiceInterface, got "
                f"{type(service).__name__}. torchdata's own reading services cannot take "
                "snapshots; use the ones from snapshot with the same names."
            )
        self._service_bytes = _serialization.dumps(service, what="reading service")
        self.reading_service: ReadingServiceInterface = _serialization.loads(self._service_bytes)
        _configure_buffers(self.reading_service, self.buffer_state)
        self.datapipe: Any = None
        self._graph: Graph | None = None
        self._graph_bytes: bytes | None = None
        if datapipe is not None:
            self._set_graph(datapipe, adapt=True)
        self._end: Iterable[Any] | None = None
        self._datapipe_iter: Iterator[Any] | None = None
        self._reset_iter = True
        self._terminated = False
        self.valid_iterator_id: int | None = None
        # Randomness (torchdata 0.9 semantics) and position.
        self._seed: int | None = None
        self._reset_seed = True
        self._generator: SeedGenerator | None = None
        self._epoch_seed: int | None = None
        self._epoch_seed_given = False
        self._epoch = -1
        self._yielded = 0
        self._epoch_finished = False
        #: Samples computed ahead (for verification) and not yet yielded.
        self._lookahead: deque[Any] = deque()
        # torchdata 0.9's pause and limit: iteration stops without ending the epoch.
        self._paused = False
        self._limit_threshold: int | None = None
        self._limit_counter: int | None = None
        self._saver = BackgroundSaver()

    def _set_graph(self, datapipe: Any, *, adapt: bool) -> None:
        """Work on a private copy of ``datapipe``; keep its pickle for snapshots."""
        datapipe, data = _serialization.clone(datapipe)
        if adapt and self.datapipe_adapter_fns is not None:
            for adapter_fn in self.datapipe_adapter_fns:
                datapipe = adapter_fn(datapipe)
            data = _serialization.dumps_graph(datapipe)
        self._set_graph_bytes(data, datapipe)

    def _set_graph_bytes(self, data: bytes, datapipe: Any = None) -> None:
        self._graph_bytes = data
        self.datapipe = datapipe if datapipe is not None else _serialization.loads_graph(data)
        self._graph = Graph(self.datapipe)

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> DataLoader2Iterator[T_co]:
        if self.datapipe is None:
            raise RuntimeError("Please provide datapipe or use load_state_dict to load datapipe from state")
        if self._terminated:
            raise RuntimeError("Cannot iterate over the DataLoader as it has already been shut down")
        if self._reset_iter:
            self._start_epoch()
            self._reset_iter = False
        self.valid_iterator_id = 0 if self.valid_iterator_id is None else self.valid_iterator_id + 1
        return DataLoader2Iterator(self, self.valid_iterator_id)

    def _start_epoch(self) -> None:
        self._ensure_initialized()
        # torchdata 0.9: a seed from seed() seeds the first epoch after the call, later epochs
        # continue its sequence; without one, each epoch draws a seed. Across ranks, rank 0
        # decides (one broadcast per epoch on every rank).
        given = self._seed is not None
        reseed = not given or self._reset_seed or self._generator is None
        seed = self._seed if given else (draw_seed() if reseed else None)
        collective = self._collective()
        if collective is not None:
            reseed, seed, given = collective.broadcast((reseed, seed, given), "sharing the loader seed")
        if reseed:
            assert seed is not None
            self._generator = SeedGenerator(seed)
            self._epoch_seed, self._epoch_seed_given = seed, given
            self._reset_seed = False
        assert self._generator is not None
        self.reading_service.initialize_iteration(self._generator)
        self._epoch += 1
        self._yielded = 0
        self._epoch_finished = False
        self._lookahead.clear()
        assert self._end is not None
        self._datapipe_iter = iter(self._end)

    def _ensure_initialized(self) -> None:
        if self._end is None:
            self._end = self.reading_service.initialize(self.datapipe)

    def _end_epoch(self) -> None:
        self._epoch_finished = True
        self.reading_service.finalize_iteration()

    def seed(self, seed: int) -> None:
        """Seed the next epoch (and, through it, every later one). ``seed`` is a uint64."""
        if not 0 <= seed < UINT64_LIMIT:
            raise ValueError(f"Expected an uint64 seed, but got {seed}.")
        self._seed = seed
        self._reset_seed = True

    def shutdown(self) -> None:
        """Wait for a background save, stop the reading service (worker processes, ...).
        Safe to call twice."""
        saver = getattr(self, "_saver", None)
        if saver is not None:
            saver.wait()
        if not self._terminated:
            self._terminated = True
            service = getattr(self, "reading_service", None)
            if service is not None:
                service.finalize_iteration()
                service.finalize()
        self._reset_iter = True
        self._datapipe_iter = None

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __enter__(self) -> DataLoader2[T_co]:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.shutdown()

    # -- torchdata 0.9's pause / resume / limit ---------------------------------------------
    # Private in 0.9 too; its tests and some users call them. Pausing changes nothing but the
    # loader's willingness to yield: workers keep what they prefetched, so a snapshot taken
    # while paused is as exact as any other.

    def _pause(self) -> None:
        """Make the current iterator stop (``StopIteration``) until :meth:`_resume`."""
        self._paused = True
        if self._limit_threshold is not None:
            self._limit_counter = 0

    def _resume(self) -> None:
        if not self._paused:
            warnings.warn("Resume is called when `DataLoader2` is not paused. No operation is performed.",
                          stacklevel=2)
            return
        self._paused = False

    def _limit(self, num_batches: int | None) -> None:
        """Pause after ``num_batches`` more samples, then again after each ``num_batches``."""
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"num_batches must be >= 0 or None, got {num_batches}")
        self._limit_threshold = num_batches
        self._limit_counter = 0

    def _count_towards_limit(self) -> None:
        if self._limit_threshold is None or self._limit_counter is None:
            return
        self._limit_counter += 1
        if self._limit_counter >= self._limit_threshold:
            self._pause()

    # -- snapshots ------------------------------------------------------------------------

    def _snapshot_source(self, *, include_graph: bool, verify: int = 0) -> LoaderState:
        if self._graph is None:
            raise SnapshotError("this DataLoader2 has no graph yet; nothing to capture")
        service_state = self.reading_service.checkpoint() if self._epoch >= 0 else {}
        source = LoaderState(
            epoch=self._epoch,
            yielded=self._yielded,
            epoch_finished=self._epoch_finished,
            seed=self._epoch_seed if self._epoch >= 0 else None,
            seed_given=self._epoch_seed_given,
            pending_seed=self._seed if self._reset_seed else None,
            generator=self._generator.state() if self._generator is not None else None,
            service=service_state,
            service_name=type(self.reading_service).__name__,
            graph_nodes=self._graph.describe(),
            graph_fingerprint=self._graph.fingerprint,
            graph_bytes=self._graph_bytes if include_graph else None,
            service_bytes=self._service_bytes,
            lookahead=list(self._lookahead),
        )
        if verify:
            source.verify = self._fingerprint_ahead(verify)
        return source

    def _fingerprint_ahead(self, count: int) -> dict[str, Any]:
        """Compute up to ``count`` samples ahead (kept for the loader) and fingerprint them."""
        if self._epoch < 0 or self._epoch_finished:
            return {"count": 0, "fingerprints": [], "ends": True}
        it = self._datapipe_iter
        while it is not None and len(self._lookahead) < count:
            try:
                self._lookahead.append(next(it))
            except StopIteration:
                break
        ahead = list(self._lookahead)[:count]
        return {"count": count, "fingerprints": [sample_fingerprint(x) for x in ahead],
                "ends": len(ahead) < count}

    def _verify(self, recorded: VerifyRecord) -> None:
        count = recorded.count
        got: list[str] = self._fingerprint_ahead(count)["fingerprints"] if count else []
        expected = list(recorded.fingerprints)
        for index, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                sample = repr(self._lookahead[index])
                sample = sample if len(sample) <= 100 else sample[:97] + "..."
                raise VerificationError(
                    f"the restored stream differs from the one recorded when the snapshot was saved, "
                    f"at sample {index} after the snapshot (sample {self._yielded + index} of epoch "
                    f"{self._epoch}): recorded fingerprint {want}, restored {have} = {sample}. The "
                    "graph's code or data changed since the snapshot (a map function?), or a pipe is "
                    "not deterministic. The loader was not restored."
                )
        if len(expected) != len(got):
            raise VerificationError(
                f"the restored stream has {len(got)} samples where the recorded one "
                f"had {len(expected)} before the end of epoch {self._epoch}: the data changed since "
                "the snapshot. The loader was not restored."
            )

    @overload
    def save_snapshot(
        self, dest: PathOrFile | None = None, *, include_graph: bool = True,
        keep_last: int | None = None, key: bytes | str | None = None, verify: int = 0,
        blocking: Literal[True] = True,
    ) -> Snapshot: ...

    @overload
    def save_snapshot(
        self, dest: PathOrFile | None = None, *, include_graph: bool = True,
        keep_last: int | None = None, key: bytes | str | None = None, verify: int = 0,
        blocking: Literal[False],
    ) -> Future[str]: ...

    def save_snapshot(
        self, dest: PathOrFile | None = None, *, include_graph: bool = True,
        keep_last: int | None = None, key: bytes | str | None = None, verify: int = 0,
        blocking: bool = True,
    ) -> Snapshot | Future[str]:
        """Capture the current position; write it atomically to ``dest`` when given.

        ``include_graph=False`` leaves the pickled graph out (restore then needs the graph
        built in code). ``keep_last=K`` then removes older snapshots numbered like ``dest``
        in its directory (``ckpt/step-{step}.snap``), keeping the K newest; see
        ``snapshot.latest(directory)`` to find the newest. ``key`` (or ``$SNAPSHOT_KEY``) signs
        the file. ``verify=K`` records fingerprints of the next K samples (computed ahead and
        served from a buffer, so nothing is lost); restoring then checks the restored stream
        against them.

        ``blocking=False`` (``dest`` a path) captures the position now and pickles and
        writes it in a background thread while iteration goes on; it returns a
        ``concurrent.futures.Future`` whose result is the path, or whose exception says why
        the save failed (also logged). The capture shares only immutable samples (``bytes``,
        strings, numbers) with the live graph; tensors, arrays and other objects in buffers
        are copied first (see ``snapshot._staging``). One save runs at a time per loader: a
        second waits for the first, and so do ``shutdown()`` and the interpreter's exit. The
        write is atomic as with ``blocking=True`` (``keep_last`` prunes once it is written).
        Across ranks the save is a collective and stays synchronous: the returned future is
        already done.
        """
        if keep_last is not None:
            _check_keep_last(dest, keep_last)
        self._saver.wait()
        if blocking:
            return self._save_now(dest, include_graph=include_graph, keep_last=keep_last, key=key, verify=verify)
        if dest is None or not isinstance(dest, (str, os.PathLike)):  # a path or a URL
            raise TypeError(
                f"save_snapshot(blocking=False) writes to a path, got {type(dest).__name__}; pass a "
                "path, or use blocking=True to write to a file object or to get the Snapshot")
        path = os.fspath(dest)
        done: Future[str] = Future()
        if self._collective() is not None:
            self._save_now(dest, include_graph=include_graph, keep_last=keep_last, key=key, verify=verify)
            done.set_result(path)
            return done
        source = _staging.stage(self._snapshot_source(include_graph=include_graph, verify=verify))

        def write() -> str:
            with _serialization.cooperative():
                save(snapshot_of(source), path, key=key, progress=False)
            if keep_last is not None:
                _rotation.prune(path, keep_last)
            return path

        return self._saver.submit(write, path)

    def _save_now(self, dest: PathOrFile | None, *, include_graph: bool, keep_last: int | None,
                  key: bytes | str | None, verify: int) -> Snapshot:
        collective = self._collective()
        snap = capture(self, include_graph=include_graph, verify=verify)
        if dest is not None and collective is not None and _storage.is_url(dest):
            # object storage: every rank uploads its part, rank 0 the index last
            _object_directory.save_directory(collective, snap.to_bytes(key=key), snap.manifest, str(dest), key)
        elif dest is not None and collective is not None:
            # a directory: every rank writes its part, rank 0 the manifest
            collective.save_directory(snap.to_bytes(key=key), snap.manifest, dest, key)
        elif dest is not None:
            save(snap, dest, key=key)
        if keep_last is not None and (collective is None or collective.rank == 0):
            _rotation.prune(dest, keep_last)  # type: ignore[arg-type]
        return snap

    def _collective(self) -> Any:
        """The reading service's collective operations when it spans ranks (else ``None``)."""
        return getattr(self.reading_service, "collective", None)

    def restore_snapshot(
        self, src: Any, *, strategy: RestoreStrategy | str = "auto",
        key: bytes | str | None = None,
    ) -> Snapshot:
        """Continue from a snapshot: the next ``iter(loader)`` yields the rest of its epoch.

        ``src`` is a path, a binary file, bytes, a :class:`Snapshot` or a state dict.
        Everything is validated before the loader changes.
        """
        return _restore_into(self, src, strategy=strategy, key=key)

    def _restore(self, snap: Snapshot, strategy: RestoreStrategy) -> None:
        if self._terminated:
            raise RuntimeError("Cannot restore a DataLoader2 that has been shut down")
        if self._graph is None:
            if snap.graph is None:
                raise SnapshotError(
                    "the snapshot does not include the graph (saved with include_graph=False) "
                    "and this loader has none: build the graph in code and pass it to "
                    "DataLoader2(...) before restoring."
                )
            self._set_graph_bytes(snap.graph)
        assert self._graph is not None
        check_graph([node.to_dict() for node in snap.info.graph.nodes], self._graph)
        make_plan(self._graph, {}, strategy)  # refuses an impossible strategy up front
        state = snap.state
        problems = self.reading_service.validate(state["service"]) if state["service"] else []
        collective = self._collective()
        rank_position = self._rank_position(state, collective)
        ranks = state.get("ranks", [])
        if rank_position is None and any(r["lookahead"] for r in ranks):
            problems.append("the snapshot holds samples computed ahead for verification on some rank; it "
                            "restores only onto the same number of ranks")
        if problems:
            raise LayoutError("cannot restore onto this reading service:\n  " + "\n  ".join(problems))
        if collective is not None:
            identities = collective.all_gather(snap.identity, "checking that every rank restores the same snapshot")
            if len(set(identities)) != 1:
                differ = [r for r, i in enumerate(identities) if i != identities[0]]
                raise RankError(f"ranks {differ} restore a different snapshot than rank 0; every rank must "
                                "restore the same one")
        service_state = decode_nodes(state["service"]) if state["service"] else {}
        # Validated: now change the loader (and put it back if verification fails).
        before = self._position()
        try:
            self._apply(state, service_state, strategy, rank_position)
            recorded = snap.info.verify if rank_position is not None else None
            if recorded is not None:
                self._verify(recorded)
        except BaseException:
            self._set_position(before)
            raise

    _POSITION = ("_epoch", "_yielded", "_epoch_finished", "_epoch_seed", "_epoch_seed_given",
                 "_generator", "_seed", "_reset_seed", "_reset_iter", "_datapipe_iter", "_end")

    def _position(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._POSITION} | {"_lookahead": deque(self._lookahead)}

    def _set_position(self, position: dict[str, Any]) -> None:
        for name, value in position.items():
            setattr(self, name, value)
        if self._datapipe_iter is not None:  # the previous epoch's run was replaced: start afresh
            self._datapipe_iter = None
            self._reset_iter = True

    @staticmethod
    def _rank_position(state: dict[str, Any], collective: Any) -> Any:
        """This rank's saved loader position if the snapshot had the same ranks, ``None`` if it
        must be derived from the shards (another layout), ``False`` for a one-process snapshot."""
        ranks = state.get("ranks")
        world = collective.world if collective is not None else 1
        if ranks is None:
            return False if world == 1 else None
        rank = collective.rank if collective is not None else 0
        return ranks[rank] if len(ranks) == world else None

    def _apply(self, state: dict[str, Any], service_state: dict[str, Any], strategy: RestoreStrategy,
               rank_position: Any = False) -> None:
        if self._datapipe_iter is not None:
            self.reading_service.finalize_iteration()
            self._datapipe_iter = None
        saved = SavedState.from_dict(state)  # checked when loaded; here, typed
        self._epoch = saved.position.epoch
        self._yielded = saved.position.yielded
        self._epoch_finished = saved.position.epoch_finished
        self._epoch_seed = saved.seed
        self._epoch_seed_given = saved.seed_given
        self._generator = SeedGenerator.from_state(saved.generator) if saved.generator is not None else None
        self._lookahead = deque(saved.lookahead)
        # seed() semantics: a seed given before the snapshot and not yet used stays pending;
        # otherwise the epoch's own seed keeps driving the seed sequence.
        self._seed = self._epoch_seed if self._epoch_seed_given else None
        self._reset_seed = False
        if saved.pending_seed is not None:
            self._seed, self._reset_seed = saved.pending_seed, True
        if self._epoch < 0:
            self._datapipe_iter = None
            self._reset_iter = True
            return
        if rank_position:
            self._yielded = int(rank_position["yielded"])
            self._epoch_finished = bool(rank_position["epoch_finished"])
            self._lookahead = deque(rank_position["lookahead"])
        elif rank_position is None:  # another layout: this rank's share starts where its shards stand
            self._lookahead = deque()
            self._epoch_finished = all(r["epoch_finished"] for r in state.get("ranks", [])) and bool(state.get("ranks"))
        self._end = self.reading_service.restore(self.datapipe, service_state, strategy=strategy)
        if rank_position is None:
            progress = getattr(self.reading_service, "progress", None)
            self._yielded = progress()[0] if progress is not None else 0
        if self._epoch_finished:
            self._reset_iter = True
            self._datapipe_iter = None
        else:
            self._datapipe_iter = iter(self._end)
            self._reset_iter = False

    @classmethod
    def from_snapshot(
        cls, src: Any, reading_service: ReadingServiceInterface | None = None, *,
        strategy: RestoreStrategy | str = "auto", key: bytes | str | None = None,
        buffer_state: BufferState | str = BufferState.VALUES,
    ) -> DataLoader2[Any]:
        """A loader built from the graph pickled in ``src``, positioned where it was saved.

        Without ``reading_service``, the service saved in the snapshot is used again.
        """
        from snapshot.capture import load

        snap = load(src, key=key)
        if snap.graph is None:
            raise SnapshotError(
                "the snapshot was saved with include_graph=False, so it holds no graph: "
                "build the graph in code, pass it to DataLoader2(...) and call restore_snapshot()."
            )
        if reading_service is None and snap.service is not None:
            reading_service = _serialization.loads(snap.service, what="saved reading service")
        loader: DataLoader2[Any] = cls(None, reading_service=reading_service, buffer_state=buffer_state)
        loader._restore(snap, RestoreStrategy.parse(strategy))
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
        snap = capture(self, include_graph=True)
        collective = self._collective()
        if collective is None:
            return snap.state_dict()
        # every rank returns every rank's part: identical everywhere, so DCP keeps one copy
        data = snap.to_bytes()
        gathered = collective.all_gather((snap.manifest, data), "gathering the loader's state")
        infos = [part_info(rank, manifest, part) for rank, (manifest, part) in enumerate(gathered)]
        return parts_state_dict(infos, [part for _, part in gathered])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (mid-epoch; ``strategy="auto"``)."""
        _lightning_guard.check_caller("load_state_dict")
        self.restore_snapshot(state_dict)

    @classmethod
    def from_state(cls, state: dict[str, Any], reading_service: ReadingServiceInterface | None = None
                   ) -> DataLoader2[Any]:
        """A loader built from a state dict's pickled graph, positioned where it was saved."""
        return cls.from_snapshot(state, reading_service)

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "a DataLoader2 cannot be pickled; save its position with state_dict() or "
            "save_snapshot() and rebuild it with from_state() or from_snapshot()"
        )
