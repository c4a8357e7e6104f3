"""State hooks for torchdata 0.9's most used DataPipes (loaded when one is first seen).

Covered: ``header``, ``cycle``, ``repeat``, ``enumerate``, ``add_index``,
``in_memory_cache``, ``to_iter_datapipe``, ``flatmap``, ``map_batches``, ``readlines``,
``in_batch_shuffle``, ``prefetch`` (run synchronously: same samples, no thread),
``mux_longest``, ``zip_longest``, ``unzip`` and ``SampleMultiplexer`` (see :mod:`.sampling`).
Other torchdata pipes are replayed; ``random_split(seed=None)`` is refused.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data.datapipes.datapipe import DataChunk
from torchdata.datapipes.iter import (
    BatchMapper,
    Cycler,
    Enumerator,
    FlatMapper,
    Header,
    InBatchShuffler,
    IndexAdder,
    InMemoryCacheHolder,
    LineReader,
    MultiplexerLongest,
    Prefetcher,
    Repeater,
    SampleMultiplexer,
    ZipperLongest,
)
from torchdata.datapipes.iter.util.combining import _UnZipperIterDataPipe
from torchdata.datapipes.iter.util.randomsplitter import _RandomSplitterIterDataPipe
from torchdata.datapipes.map.util.converter import MapToIterConverterIterDataPipe

from snapshot.hooks._base import ResumableIterator, Stateless
from snapshot.hooks.builtin._rng import rng_state, set_rng_state
from snapshot.hooks.builtin._skip import advance
from snapshot.hooks.builtin.combining import ForkerContainer
from snapshot.hooks.builtin.files import open_stream
from snapshot.hooks.builtin.sampling import SampleMultiplexerIterator
from snapshot.hooks.builtin.shuffle import consume_seed
from snapshot.hooks.builtin.sources import PositionedSource

COUNT = "count"
PENDING = "pending"
DONE = "done"


class HeaderIterator(ResumableIterator):
    """``header(limit)``: like the original, reads one sample past the limit before stopping."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._read = 0
        self._done = False

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            value = next(self.inputs[0])
        except StopIteration:
            self._done = True
            raise
        self._read += 1
        limit = self.datapipe.limit
        if limit is None or self._read <= limit:
            return value
        self._done = True
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {COUNT: self._read, DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._read, self._done = int(state[COUNT]), bool(state[DONE])


class CyclerIterator(ResumableIterator):
    """``cycle(count)``: iterates its input again from the start, ``count`` times."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._cycle = 0
        self._fresh = True

    def next(self) -> Any:
        count = self.datapipe.count
        while count is None or self._cycle < count:
            if not self._fresh:
                self.restart_input(0)
                self._fresh = True
            try:
                return next(self.inputs[0])
            except StopIteration:
                self._cycle += 1
                self._fresh = False
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"cycle": self._cycle, "fresh": self._fresh}

    def set_state(self, state: dict[str, Any]) -> None:
        self._cycle, self._fresh = int(state["cycle"]), bool(state["fresh"])


class RepeaterIterator(ResumableIterator):
    """``repeat(times)``: each input sample ``times`` times in a row."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._element: Any = None
        self._left = 0

    def next(self) -> Any:
        if self._left == 0:
            self._element = next(self.inputs[0])
            self._left = self.datapipe.times
        self._left -= 1
        return self._element

    def get_state(self) -> dict[str, Any]:
        return {"element": self._element, "left": self._left}

    def set_state(self, state: dict[str, Any]) -> None:
        self._element, self._left = state["element"], int(state["left"])


class EnumeratorIterator(Stateless):
    """``enumerate(starting_index)``: the index is the count of samples yielded."""

    def next(self) -> Any:
        return self.datapipe.starting_index + self.yielded, next(self.inputs[0])


class IndexAdderIterator(Stateless):
    """``add_index(index_name)`` on dict samples."""

    def next(self) -> Any:
        row = next(self.inputs[0])
        if not isinstance(row, dict):
            raise NotImplementedError("We only support adding index to row or batch in dict type")
        row[self.datapipe.index_name] = self.yielded
        return row


class MapToIterIterator(PositionedSource):
    """``to_iter_datapipe``: ``datapipe[i]`` for each index, restored by position."""

    what = "indices"

    def source(self) -> Any:
        return self.datapipe.indices

    def next(self) -> Any:
        return self.datapipe.datapipe[super().next()]

    def lookup(self) -> Callable[[int], Any] | None:
        indices = super().lookup()
        if indices is None:
            return None
        datapipe = self.datapipe.datapipe
        return lambda position: datapipe[indices(position)]


class _Expanding(ResumableIterator):
    """Pipes that turn one input sample (or batch) into several outputs."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._pending: deque[Any] = deque()

    def buffered(self) -> int:
        return len(self._pending)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._pending)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._pending = deque(state[PENDING])


class FlatMapperIterator(_Expanding):
    def next(self) -> Any:
        while not self._pending:
            self._pending.extend(self.datapipe._apply_fn(next(self.inputs[0])))
        return self._pending.popleft()


class BatchMapperIterator(_Expanding):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._batch: list[Any] = []
        self._done = False

    def next(self) -> Any:
        size = self.datapipe.batch_size
        while not self._pending:
            if self._done:
                raise StopIteration
            try:
                self._batch.append(next(self.inputs[0]))
            except StopIteration:
                self._done = True
                if self._batch:
                    batch, self._batch = self._batch, []
                    self._pending.extend(self.datapipe._apply_fn(batch))
                continue
            if len(self._batch) == size:
                batch, self._batch = self._batch, []
                self._pending.extend(self.datapipe._apply_fn(batch))
        return self._pending.popleft()

    def buffered(self) -> int:
        return len(self._pending) + len(self._batch)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._pending), "batch": list(self._batch), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self._batch, self._done = list(state["batch"]), bool(state[DONE])


class LineReaderIterator(ResumableIterator):
    """``readlines``: the lines of each stream; state: the path and lines already read.

    Restoring reopens the file through the ``FileOpener`` that feeds it and skips the lines
    already read, so it is restored from state only when a ``FileOpener`` is its input.
    """

    always_restorable = False

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._path: str | None = None
        self._lines: Iterator[Any] | None = None
        self._read = 0
        self._reopen = False

    @classmethod
    def can_restore(cls, node: Any, graph: Any) -> str | None:
        from torch.utils.data.datapipes.iter.fileopener import FileOpenerIterDataPipe

        inputs = [graph[p].datapipe for p in node.inputs]
        if len(inputs) == 1 and type(inputs[0]) is FileOpenerIterDataPipe:
            return None
        return "it reads streams that only a FileOpener directly before it can reopen"

    def _lines_of(self, path: str, stream: Any) -> Iterator[Any]:
        helper = self.datapipe._helper
        lines = helper.skip_lines(stream)
        lines = helper.strip_newline(lines)
        lines = helper.decode(lines)
        return iter(helper.return_path(lines, path=path))

    def next(self) -> Any:
        while True:
            if self._lines is None:
                if self._reopen and self._path is not None:
                    opener = self.inputs[0].datapipe
                    stream = open_stream(self._path, opener.mode, opener.encoding)
                    lines = self._lines_of(self._path, stream)
                    self._lines = advance(lines, self._read, what=f"lines of {self._path}")
                    self._reopen = False
                else:
                    path, stream = next(self.inputs[0])
                    self._path, self._lines, self._read = path, self._lines_of(path, stream), 0
            try:
                line = next(self._lines)
            except StopIteration:
                self._lines = None
                continue
            self._read += 1
            return line

    def get_state(self) -> dict[str, Any]:
        if self._lines is None and not self._reopen:
            return {"path": None, "read": 0}
        return {"path": self._path, "read": self._read}

    def set_state(self, state: dict[str, Any]) -> None:
        self._path, self._read = state["path"], int(state["read"])
        self._reopen = self._path is not None


class InBatchShufflerIterator(ResumableIterator):
    """``in_batch_shuffle``: each batch sampled by a seeded generator (saved by value)."""

    replay_checked = ("rng",)

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._enabled = datapipe._enabled
        self._rng = random.Random()
        if self._enabled:
            consume_seed(datapipe, self._rng)

    def next(self) -> Any:
        batch = next(self.inputs[0])
        if not self._enabled:
            return batch
        return DataChunk(self._rng.sample(batch, len(batch)))

    def get_state(self) -> dict[str, Any]:
        return {"enabled": self._enabled, "rng": rng_state(self._rng) if self._enabled else None}

    def set_state(self, state: dict[str, Any]) -> None:
        self._enabled = bool(state["enabled"])
        if state["rng"] is not None:
            set_rng_state(self._rng, state["rng"])


class PrefetcherIterator(Stateless):
    """``prefetch``: the same samples, read synchronously (no thread: nothing in flight)."""

    def next(self) -> Any:
        return next(self.inputs[0])


class MultiplexerLongestIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._finished: set[int] = set()
        self._turn = 0

    def next(self) -> Any:
        count = len(self.inputs)
        while len(self._finished) < count:
            i = self._turn
            self._turn = (i + 1) % count
            if i in self._finished:
                continue
            try:
                return next(self.inputs[i])
            except StopIteration:
                self._finished.add(i)
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished), "turn": self._turn}

    def set_state(self, state: dict[str, Any]) -> None:
        self._finished, self._turn = set(state["finished"]), int(state["turn"])


class ZipperLongestIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._finished: set[int] = set()
        self._done = not inputs

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        values = []
        for i, it in enumerate(self.inputs):
            value = self.datapipe.fill_value
            if i not in self._finished:
                try:
                    value = next(it)
                except StopIteration:
                    self._finished.add(i)
                    if len(self._finished) == len(self.inputs):
                        self._done = True
                        raise
            values.append(value)
        return tuple(values)

    def get_state(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._finished, self._done = set(state["finished"]), bool(state[DONE])


class InMemoryCacheIterator(ResumableIterator):
    """``in_memory_cache``: the first epoch fills the pipe's cache, later epochs read it.

    The cache lives on the pipe across epochs: it is persistent state, saved by value with
    every snapshot (``snapshot inspect`` shows its size).
    """

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._serving = bool(datapipe.cache)
        self._cache: deque[Any] = datapipe.cache if self._serving else deque()
        self._dropped = 0
        self._position = 0
        self._prefix_read = 0
        self._done = False

    @classmethod
    def persistent_state(cls, datapipe: Any) -> Any:
        return {"cache": list(datapipe.cache), "idx": datapipe.idx} if datapipe.cache else None

    @classmethod
    def load_persistent_state(cls, datapipe: Any, state: Any) -> None:
        datapipe.cache, datapipe.idx = deque(state["cache"]), int(state["idx"])

    def next(self) -> Any:
        dp = self.datapipe
        if self._done:
            raise StopIteration
        if not self._serving:
            try:
                data = next(self.inputs[0])
            except StopIteration:
                dp.cache, dp.idx = self._cache, self._dropped
                self._done = True
                raise
            self._cache.append(data)
            if dp.size is not None and sys.getsizeof(self._cache) > dp.size:
                self._cache.popleft()
                self._dropped += 1
            return data
        if dp.idx > 0 and self._prefix_read <= dp.idx:
            # the original re-reads the first ``idx`` samples from its input (and one more)
            try:
                data = next(self.inputs[0])
            except StopIteration:
                self._prefix_read = dp.idx + 1
            else:
                self._prefix_read += 1
                if self._prefix_read <= dp.idx:
                    return data
        if self._position < len(self._cache):
            self._position += 1
            return self._cache[self._position - 1]
        self._done = True
        raise StopIteration

    def buffered(self) -> int:
        return 0 if self._serving else len(self._cache)

    def get_state(self) -> dict[str, Any]:
        return {"serving": self._serving, "cache": None if self._serving else list(self._cache),
                "dropped": self._dropped, "position": self._position, "prefix": self._prefix_read,
                DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._serving = bool(state["serving"])
        self._cache = self.datapipe.cache if self._serving else deque(state["cache"])
        self._dropped = int(state["dropped"])
        self._position, self._prefix_read = int(state["position"]), int(state["prefix"])
        self._done = bool(state[DONE])


class UnZipperContainer(ForkerContainer):
    """``unzip``: a fork whose child ``i`` takes element ``instance_ids[i]`` of each sample."""

    def next_for(self, instance: int) -> Any:
        return super().next_for(instance)[self.datapipe.instance_ids[instance]]


TORCHDATA_HOOKS: dict[type, type[ResumableIterator]] = {
    Header: HeaderIterator,
    Cycler: CyclerIterator,
    Repeater: RepeaterIterator,
    Enumerator: EnumeratorIterator,
    IndexAdder: IndexAdderIterator,
    MapToIterConverterIterDataPipe: MapToIterIterator,
    FlatMapper: FlatMapperIterator,
    BatchMapper: BatchMapperIterator,
    LineReader: LineReaderIterator,
    InBatchShuffler: InBatchShufflerIterator,
    Prefetcher: PrefetcherIterator,
    MultiplexerLongest: MultiplexerLongestIterator,
    ZipperLongest: ZipperLongestIterator,
    InMemoryCacheHolder: InMemoryCacheIterator,
    SampleMultiplexer: SampleMultiplexerIterator,
    _UnZipperIterDataPipe: UnZipperContainer,
}

def _unseeded_split(datapipe: Any) -> str | None:
    if datapipe._seed is not None:
        return None  # reseeded from ``seed`` at every epoch: a replay draws the same split
    return ("random_split(seed=None) draws a new split every epoch from the operating system, so "
            "no replay can draw it again; pass seed=... (and override_seed(...) per epoch if you "
            "want a new split each epoch)")


#: Per class: why an instance cannot be snapshotted (or ``None``), and which instances that is.
REFUSALS: dict[type, tuple[Callable[[Any], str | None], str]] = {
    _RandomSplitterIterDataPipe: (_unseeded_split, "seed=None"),
}
