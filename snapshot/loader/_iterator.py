"""The iterator ``iter(DataLoader2)`` returns, and the checks and conversions of the loader's graph argument."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

from snapshot.loader._position import LivePosition, Pausing
from snapshot.storage import _background

T_co = TypeVar("T_co", covariant=True)

_INVALIDATED = (
    "This iterator has been invalidated because another iterator has been created from the "
    "same DataLoader2. Keep a single iterator per DataLoader2."
)


def not_a_datapipe(datapipe: Any) -> str:
    """Why ``datapipe`` is refused, and which wrapper makes a DataPipe of it."""
    from torch.utils.data import Dataset, IterableDataset

    name = f"{type(datapipe).__module__}.{type(datapipe).__qualname__}"
    head = f"DataLoader2 expects an IterDataPipe or a MapDataPipe, got {name}."
    wrappers = "torch.utils.data.datapipes"
    by_index = "IterableWrapper(range(len(data))).map(data.__getitem__)"
    if isinstance(datapipe, IterableDataset):
        return (f"{head} Wrap an iterable dataset in IterableWrapper(dataset) (from {wrappers}.iter); "
                "its position is then replayed on restore unless it has state_dict()/load_state_dict().")
    sequence = (hasattr(datapipe, "__getitem__") and hasattr(datapipe, "__len__")
                and not isinstance(datapipe, (str, bytes, dict)))
    if sequence and not isinstance(datapipe, Dataset):  # a list, a tuple: wrap it as it is
        return (f"{head} Wrap it in IterableWrapper(data) (from {wrappers}.iter), then .shuffle(), .map(...) "
                f"as needed. For a large sequence read by index, {by_index} keeps only indices in the "
                "graph and in snapshots.")
    if isinstance(datapipe, Dataset) or sequence:
        return (f"{head} For a map-style dataset, pass {by_index} (IterableWrapper from "
                f"{wrappers}.iter; add .shuffle() after IterableWrapper to shuffle the indices), or, with torchdata "
                f"installed, SequenceWrapper(data) (from {wrappers}.map) or its .to_iter_datapipe().")
    if isinstance(datapipe, Iterable):
        return f"{head} Wrap an iterable in IterableWrapper(data) (from {wrappers}.iter)."
    return f"{head} Build a graph of DataPipes, starting from IterableWrapper or SequenceWrapper."


def map_to_iter(datapipe: Any) -> Any:
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


class IteratedLoader(Protocol):
    """What the iterator asks of its loader: whether it is still the valid one, and to end the
    epoch or stop (the graph raised). It reads the position and pausing it is given."""

    valid_iterator_id: int | None

    def _end_epoch(self) -> None: ...
    def _stop_after_error(self, error: BaseException) -> None: ...


class DataLoader2Iterator(Iterator[T_co]):
    """The iterator ``iter(DataLoader2)`` returns; only the newest one is valid.

    As in torchdata 0.9, ``limit(n)`` makes it stop (``StopIteration``, the epoch not ended)
    after ``n`` more samples, ``resume()`` lets it go on, and other attributes are looked up on
    the iterator of the reading service's graph. A snapshot taken while it is stopped restores
    exactly; the restored loader is not paused and has no limit.
    """

    def __init__(self, dataloader: IteratedLoader, iterator_id: int, position: LivePosition, pausing: Pausing):
        self.dataloader = dataloader
        self.iterator_id = iterator_id
        self._position, self._pausing = position, pausing
        _background.prepare()  # the writer of background saves starts with the first iteration, not at a save

    def __iter__(self) -> DataLoader2Iterator[T_co]:
        return self

    def __next__(self) -> T_co:
        loader = self.dataloader
        if self.iterator_id != loader.valid_iterator_id:
            raise RuntimeError(_INVALIDATED)
        pos = self._position
        pos.reset_iter = True
        if self._pausing.paused:
            raise StopIteration
        if pos.lookahead:
            item = pos.lookahead.popleft()
        else:
            it = pos.datapipe_iter
            if it is None:
                raise StopIteration
            try:
                item = next(it)
            except StopIteration:
                loader._end_epoch()
                raise
            except Exception as exc:
                loader._stop_after_error(exc)
                raise
        pos.yielded += 1
        self._pausing.count()
        return item

    @property
    def limit_threshold(self) -> int | None:
        return self._pausing.threshold

    @property
    def limit_counter(self) -> int | None:
        return self._pausing.counter

    def limit(self, num_batches: int | None) -> None:
        """Stop after ``num_batches`` more samples (counted from now; ``None`` removes the
        limit). The limit stays after each stop: call :meth:`resume` to get the next ones."""
        self._pausing.limit(num_batches)

    def resume(self) -> None:
        """Continue after a stop caused by :meth:`limit` or ``DataLoader2._pause()``."""
        self._pausing.resume()

    def __getattr__(self, name: str) -> Any:
        # only called for names not found on the iterator itself: ask the graph's iterator
        position = self.__dict__.get("_position")
        inner = position.datapipe_iter if position is not None else None
        if inner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(inner, name)


def adapter_list(datapipe_adapter_fn: Any) -> list[Any] | None:
    """The constructor's ``datapipe_adapter_fn`` (``None``, one adapter or several) as a list."""
    if datapipe_adapter_fn is None:
        return None
    if isinstance(datapipe_adapter_fn, Iterable):
        return list(datapipe_adapter_fn)
    return [datapipe_adapter_fn]
