"""State hooks for torchdata 0.9's most used DataPipes (loaded when one is first seen):
the table of hooks and refusals. The iterators live in this package's modules, one per kind
of pipe; ``SampleMultiplexer``'s in :mod:`snapshot.hooks.builtin.sampling`.

Covered: ``header``, ``cycle``, ``repeat``, ``enumerate``, ``add_index``,
``in_memory_cache``, ``to_iter_datapipe``, ``flatmap``, ``map_batches``, ``readlines``,
``in_batch_shuffle``, ``prefetch`` (run synchronously: same samples, no thread),
``mux_longest``, ``zip_longest``, ``unzip`` and ``SampleMultiplexer``; the file pipes
(``load_from_tar``, ``load_from_zip``, ``decompress``, ``webdataset``, ``parse_csv``,
``parse_csv_as_dict``, ``parse_json_files``, ``load_from_tfrecord``, ``shard_expand``, the fsspec
lister and opener), restored by address and offset; ``threadpool_map`` and ``async_map_batches``.
Other torchdata pipes are replayed (the coverage table says why); ``random_split(seed=None)`` is refused.
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdata.datapipes.iter import (
    BatchMapper,
    Bz2FileLoader,
    CSVDictParser,
    CSVParser,
    Cycler,
    Decompressor,
    Dropper,
    Enumerator,
    FlatMapper,
    Flattener,
    FSSpecFileLister,
    FSSpecFileOpener,
    FSSpecSaver,
    HashChecker,
    Header,
    InBatchShuffler,
    IndexAdder,
    InMemoryCacheHolder,
    JsonParser,
    LengthSetter,
    LineReader,
    MapKeyZipper,
    MultiplexerLongest,
    ParagraphAggregator,
    Prefetcher,
    Repeater,
    Rows2Columnar,
    SampleMultiplexer,
    Saver,
    ShardExpander,
    Slicer,
    TarArchiveLoader,
    TFRecordLoader,
    ThreadPoolMapper,
    WebDataset,
    XzFileLoader,
    ZipArchiveLoader,
    ZipperLongest,
)
from torchdata.datapipes.iter.transform.callable import _BatchAsyncMapperIterDataPipe
from torchdata.datapipes.iter.util.combining import _UnZipperIterDataPipe
from torchdata.datapipes.iter.util.randomsplitter import _RandomSplitterIterDataPipe
from torchdata.datapipes.map.util.converter import MapToIterConverterIterDataPipe

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin.sampling import SampleMultiplexerIterator
from snapshot.hooks.builtin.torchdata_pipes.archives import (
    DecompressorIterator,
    TarArchiveLoaderIterator,
    WebDatasetIterator,
    ZipArchiveLoaderIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.combining import (
    MultiplexerLongestIterator,
    UnZipperContainer,
    ZipperLongestIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.concurrent import (
    AsyncBatchIterator,
    LengthSetterIterator,
    ThreadPoolMapperIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.counting import (
    CyclerIterator,
    EnumeratorIterator,
    HeaderIterator,
    IndexAdderIterator,
    MapToIterIterator,
    RepeaterIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.itemwise import (
    CompressedFileIterator,
    HashCheckerIterator,
    ItemwiseIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.openers import (
    FSSpecFileListerIterator,
    FSSpecFileOpenerIterator,
    ShardExpanderIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.parsers import (
    CSVParserIterator,
    JsonParserIterator,
    LineReaderIterator,
    ParagraphAggregatorIterator,
    TFRecordLoaderIterator,
)
from snapshot.hooks.builtin.torchdata_pipes.reading import InMemoryCacheIterator
from snapshot.hooks.builtin.torchdata_pipes.reshaping import (
    BatchMapperIterator,
    FlatMapperIterator,
    InBatchShufflerIterator,
    PrefetcherIterator,
)

__all__ = ["REFUSALS", "TORCHDATA_HOOKS"]


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
    # files, archives, parsers and openers: restored by address and offset
    TarArchiveLoader: TarArchiveLoaderIterator,
    ZipArchiveLoader: ZipArchiveLoaderIterator,
    Decompressor: DecompressorIterator,
    WebDataset: WebDatasetIterator,
    CSVParser: CSVParserIterator,
    CSVDictParser: CSVParserIterator,
    JsonParser: JsonParserIterator,
    ParagraphAggregator: ParagraphAggregatorIterator,
    TFRecordLoader: TFRecordLoaderIterator,
    ShardExpander: ShardExpanderIterator,
    FSSpecFileLister: FSSpecFileListerIterator,
    FSSpecFileOpener: FSSpecFileOpenerIterator,
    Bz2FileLoader: CompressedFileIterator,
    XzFileLoader: CompressedFileIterator,
    HashChecker: HashCheckerIterator,
    Saver: ItemwiseIterator,
    FSSpecSaver: ItemwiseIterator,
    # one output per input, nothing kept between samples
    Dropper: ItemwiseIterator,
    Flattener: ItemwiseIterator,
    Slicer: ItemwiseIterator,
    Rows2Columnar: ItemwiseIterator,
    MapKeyZipper: ItemwiseIterator,
    # thread pools and async mappers
    ThreadPoolMapper: ThreadPoolMapperIterator,
    _BatchAsyncMapperIterDataPipe: AsyncBatchIterator,
    LengthSetter: LengthSetterIterator,
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
