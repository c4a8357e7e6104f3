"""State hooks for every DataPipe in ``torch.utils.data.datapipes.iter``.

Each module holds the resumable iterators of one family of pipes; this package lists them
in two tables, :data:`BUILTIN_HOOKS` and :data:`REFUSALS`, which :mod:`snapshot.hooks._install`
registers. torchdata's pipes are covered by :mod:`.torchdata` (tables of the same names),
registered on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    FileLister,
    FileOpener,
    Filter,
    Grouper,
    IterableWrapper,
    Mapper,
    Multiplexer,
    RoutedDecoder,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)
from torch.utils.data.datapipes.iter.combining import (
    _ChildDataPipe,
    _DemultiplexerIterDataPipe,
    _ForkerIterDataPipe,
)

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin.callable import FilterIterator, MapperIterator, RoutedDecoderIterator
from snapshot.hooks.builtin.combining import (
    ChildIterator,
    ConcaterIterator,
    DemultiplexerContainer,
    ForkerContainer,
    MultiplexerIterator,
    ZipperIterator,
)
from snapshot.hooks.builtin.files import FileListerIterator, FileOpenerIterator, StreamReaderIterator
from snapshot.hooks.builtin.grouping import BatcherIterator, GrouperIterator, UnBatcherIterator
from snapshot.hooks.builtin.sharding import ShardingFilterIterator
from snapshot.hooks.builtin.shuffle import ShufflerIterator
from snapshot.hooks.builtin.sources import IterableWrapperIterator, SamplerIterator

BUILTIN_HOOKS: dict[type, type[ResumableIterator]] = {
    IterableWrapper: IterableWrapperIterator,
    Sampler: SamplerIterator,
    Mapper: MapperIterator,
    Collator: MapperIterator,
    Filter: FilterIterator,
    RoutedDecoder: RoutedDecoderIterator,
    Shuffler: ShufflerIterator,
    Batcher: BatcherIterator,
    UnBatcher: UnBatcherIterator,
    Grouper: GrouperIterator,
    Concater: ConcaterIterator,
    Zipper: ZipperIterator,
    Multiplexer: MultiplexerIterator,
    _ForkerIterDataPipe: ForkerContainer,
    _DemultiplexerIterDataPipe: DemultiplexerContainer,
    _ChildDataPipe: ChildIterator,
    ShardingFilter: ShardingFilterIterator,
    FileLister: FileListerIterator,
    FileOpener: FileOpenerIterator,
    StreamReader: StreamReaderIterator,
}

def _random_sampler(datapipe: Sampler) -> str | None:
    if not hasattr(datapipe.sampler, "generator"):
        return None
    return ("its sampler draws a new order every epoch from a generator (its own, or torch's global "
            "one when it has none) that a snapshot cannot put back; shuffle with .shuffle() (seeded by "
            "the loader) over a sequential Sampler instead")


#: Per class: why an instance cannot be snapshotted (or ``None``), and which instances that is.
REFUSALS: dict[type, tuple[Callable[[Any], str | None], str]] = {
    Sampler: (_random_sampler, "its sampler has a generator (RandomSampler, ...)"),
}
