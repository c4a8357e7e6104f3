"""The one table of hook cases: per registered hook, graphs that exercise it.

Each case is a factory with non-default arguments (module-level functions or
``functools.partial`` of them, so that they pickle). A case that reads files takes
:data:`DATA` in its arguments; :func:`bind` puts a data directory in its place (the
``data_dir`` fixture's, see ``graphs.write_files``). torchdata 0.9's cases are listed only
where ``torchdata.datapipes`` imports (torchdata>=0.10 has no DataPipes).

``tests/hooks/test_builtin.py`` runs every case through the hook harnesses and fails when a
registered hook has no case here; ``tests/hooks/test_coverage.py`` picks its graphs from here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from torch.utils.data.datapipes.datapipe import DataChunk
from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
    Grouper,
    IterableWrapper,
    Mapper,
    Multiplexer,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)
from torch.utils.data.datapipes.map import SequenceWrapper

from tests import graphs

try:
    import torchdata.datapipes.iter as td
except ImportError:  # torchdata>=0.10: no DataPipes, no torchdata hooks
    td = None

#: Stands for the data directory in a case's arguments (see :func:`bind`).
DATA = "<data>"


def bind(factory: Callable[..., Any], data_dir: str) -> Callable[[], Any]:
    """``factory`` with :data:`DATA` replaced by ``data_dir``."""
    if isinstance(factory, functools.partial) and DATA in factory.args:
        return functools.partial(factory.func, *[data_dir if a == DATA else a for a in factory.args],
                                 **factory.keywords)
    return factory


# -- torch ------------------------------------------------------------------------------------

def add(a, b):
    return a + b


def first_even(a, b):
    return a % 2 == 0


def to_pair(x):
    return (x, -x)


def to_dict(x):
    return {"x": x, "y": x * 10}


def nested(x):
    return [[x, x + 1], [x + 2]]


def key_mod4(x):
    return x % 4


def route3(x):
    return x % 3


def route_or_drop(x):
    return None if x % 5 == 0 else x % 2


class Box(DataChunk):
    pass


def sharded(count: int, me: int):
    dp = ShardingFilter(IterableWrapper(range(20)))
    dp.apply_sharding(count, me)
    return dp


def uneven_fork():
    a, b = Forker(IterableWrapper(range(12)), 2, buffer_size=-1)
    return Zipper(a, Batcher(b, 2))


def files_graph(root: str, chunk: int | None):
    return StreamReader(FileOpener(FileLister(root, "*.txt", recursive=True), mode="b"), chunk=chunk)


TORCH: dict[str, Callable[..., Any]] = {
    "mapper_input_output_col": lambda: Mapper(Mapper(IterableWrapper(range(15)), to_pair), add,
                                              input_col=[0, 1], output_col=-1),
    "mapper_dict_col": lambda: Mapper(Mapper(IterableWrapper(range(9)), to_dict), graphs.double,
                                      input_col="y", output_col="z"),
    "collator_default": lambda: Collator(Batcher(IterableWrapper(range(13)), 4)),
    "filter_input_col": lambda: Filter(Mapper(IterableWrapper(range(20)), to_pair), first_even,
                                       input_col=[0, 1]),
    "shuffler_disabled": lambda: Shuffler(IterableWrapper(range(12)), buffer_size=3).set_shuffle(False),
    "shuffler_big_buffer": lambda: Shuffler(IterableWrapper(range(25)), buffer_size=100),
    "batcher_drop_last_wrapper": lambda: Batcher(IterableWrapper(range(17)), 4, drop_last=True,
                                                 wrapper_class=Box),
    "unbatcher_all_levels": lambda: UnBatcher(Mapper(IterableWrapper(range(8)), nested), unbatch_level=-1),
    "unbatcher_level_2": lambda: UnBatcher(Batcher(Mapper(IterableWrapper(range(8)), nested), 2),
                                           unbatch_level=2),
    "grouper_keep_key": lambda: Grouper(Shuffler(IterableWrapper(range(40)), buffer_size=9), key_mod4,
                                        keep_key=True, buffer_size=6, group_size=3,
                                        guaranteed_group_size=1),
    "grouper_drop_remaining": lambda: Grouper(IterableWrapper(range(33)), key_mod4, buffer_size=5,
                                              group_size=4, guaranteed_group_size=2, drop_remaining=True),
    "grouper_unbounded": lambda: Grouper(IterableWrapper(range(21)), route3),
    "sampler": lambda: Sampler(IterableWrapper(range(11))),
    "sharding_filter_2_of_3": lambda: sharded(3, 2),
    "concater_three": lambda: Concater(IterableWrapper(range(3)), IterableWrapper([]), IterableWrapper(range(5))),
    "zipper_uneven": lambda: Zipper(IterableWrapper(range(7)), Shuffler(IterableWrapper(range(10)),
                                                                        buffer_size=4)),
    "multiplexer_uneven": lambda: Multiplexer(IterableWrapper(range(4)), IterableWrapper(range(10, 20)),
                                              IterableWrapper(range(20, 25))),
    "forker_deep_copy": lambda: Zipper(*Forker(Mapper(IterableWrapper(range(9)), to_dict), 2, copy="deep")),
    "forker_read_unevenly": uneven_fork,
    "demux_drop_none": lambda: Concater(*Demultiplexer(IterableWrapper(range(30)), 2, route_or_drop,
                                                       drop_none=True, buffer_size=-1)),
    "demux_three_mux": lambda: Multiplexer(*Demultiplexer(IterableWrapper(range(30)), 3, route3,
                                                          buffer_size=-1)),
    "files_decoded": functools.partial(graphs.files, DATA),
    "stream_reader_chunk_4": functools.partial(files_graph, DATA, 4),
}


# -- torchdata 0.9 ----------------------------------------------------------------------------

def explode(x):
    return [x] * (x % 3)


def batch_fn(batch):
    return [sum(batch), len(batch)]


def row(x):
    return {"v": x}


def triple(x):
    return (x, -x, 10 * x)


def unzip():
    a, b, c = td.UnZipper(td.Mapper(Shuffler(IterableWrapper(range(9)), buffer_size=3), triple), 3, buffer_size=-1)
    return td.Zipper(c, a, b)


def round_robin_demux():
    first, second = td.RoundRobinDemultiplexer(IterableWrapper(range(11)), 2, buffer_size=-1)
    return td.Concater(second, first)


def sample_multiplexer():
    pipes = {IterableWrapper(range(8)): 0.5, IterableWrapper(range(100, 104)): 0.3, IterableWrapper("xyz"): 0.2}
    return td.SampleMultiplexer(pipes, seed=9)


def cached(n: int = 12):
    return td.InMemoryCacheHolder(Shuffler(IterableWrapper(range(n)), buffer_size=4))


def read_lines(root: str):
    return td.LineReader(td.FileOpener(td.FileLister(root, "*.txt"), mode="b"), decode=True)


def corpus(root: str) -> str:
    return os.path.join(root, "corpus")  # written when the graph first lists it (tests/file_corpus.py)


def tar_webdataset(root: str):
    from tests import file_corpus

    return file_corpus.webdataset(corpus(root), shuffle=3)


def zip_members(root: str):
    from tests import file_corpus

    return file_corpus.zip_members(corpus(root))


def gzip_lines(root: str):
    from tests import file_corpus

    return file_corpus.gzip_lines(corpus(root))


def csv_rows(root: str, as_dict: bool):
    from tests import file_corpus

    return file_corpus.csv_rows(corpus(root), as_dict)


def json_files(root: str):
    return td.JsonParser(FileOpener(FileLister(root, "*.json"), mode="t"))


def tfrecords(root: str):
    from tests import file_corpus

    return file_corpus.tfrecords(corpus(root))


def shard_names(root: str):
    return td.ShardExpander(IterableWrapper([os.path.join(root, "r{00..03}.txt"), os.path.join(root, "d{7..8}.json")]))


def fsspec_chunks(root: str):
    return StreamReader(td.FSSpecFileOpener(td.FSSpecFileLister(root, "*.txt"), mode="rb"), chunk=4)


def corpus_case(name: str, root: str):
    from tests import file_corpus

    return getattr(file_corpus, name)(corpus(root))


def saved_path(root: str, name: str) -> str:
    return os.path.join(root, "saved", name)


def saved_flat(root: str, name: str) -> str:
    return os.path.join(root, f"fs-{name}")  # save_by_fsspec makes no directory


def named_bytes(x):
    return (f"item-{x}.bin", bytes([x]) * (x % 5))


def saved(root: str, fsspec: bool):
    items = td.Mapper(IterableWrapper(range(9)), named_bytes)
    if fsspec:
        out = td.FSSpecSaver(items, mode="wb", filepath_fn=functools.partial(saved_flat, root))
    else:
        out = td.Saver(items, mode="wb", filepath_fn=functools.partial(saved_path, root))
    return td.Mapper(out, os.path.basename)


def record(x):
    return {"a": x, "b": {"c": x * 2, "d": -x}, "e": [x, x + 1]}


def as_row(x):
    return (x, x * 2, x * 3, x * 4)


def mod5(x):
    return x % 5


def csv_both(root: str):
    return td.Concater(csv_rows(root, False), csv_rows(root, True))


def compressed_lines(root: str):
    return td.Concater(corpus_case("bz2_lines", root), corpus_case("xz_paragraphs", root))


def both_savers(root: str):
    return td.Concater(saved(root, False), saved(root, True))


def slow_square(x):
    return x * x


async def async_square(x):
    return x * x


TORCHDATA: dict[str, Callable[..., Any]] = {} if td is None else {
    "header": lambda: td.Header(Shuffler(IterableWrapper(range(30)), buffer_size=5), limit=11),
    "header_longer_than_source": lambda: td.Header(IterableWrapper(range(4)), limit=10),
    "cycler": lambda: td.Cycler(IterableWrapper(range(5)), count=3),
    "repeater": lambda: td.Repeater(IterableWrapper(range(6)), times=3),
    "enumerator": lambda: td.Enumerator(Shuffler(IterableWrapper(range(9)), buffer_size=3), starting_index=5),
    "index_adder": lambda: td.IndexAdder(td.Mapper(IterableWrapper(range(7)), row), index_name="i"),
    "map_to_iter": lambda: SequenceWrapper(list(range(10, 20))).to_iter_datapipe(),
    "flatmap": lambda: td.FlatMapper(IterableWrapper(range(10)), explode),
    "batch_mapper": lambda: td.BatchMapper(IterableWrapper(range(11)), batch_fn, batch_size=4),
    "in_batch_shuffle": lambda: td.InBatchShuffler(Batcher(IterableWrapper(range(20)), 5)),
    "prefetch": lambda: td.Prefetcher(Batcher(IterableWrapper(range(20)), 3), buffer_size=4),
    "mux_longest": lambda: td.MultiplexerLongest(IterableWrapper(range(3)), IterableWrapper(range(10, 16))),
    "zip_longest": lambda: td.ZipperLongest(IterableWrapper(range(3)), IterableWrapper(range(5)), fill_value=-1),
    "unzip": unzip,
    "round_robin_demux": round_robin_demux,
    "bucketbatch": lambda: td.BucketBatcher(IterableWrapper(range(23)), batch_size=3, batch_num=2, bucket_num=2),
    "bucketbatch_sorted": lambda: td.BucketBatcher(IterableWrapper(range(23)), batch_size=3, batch_num=2,
                                                   bucket_num=2, use_in_batch_shuffle=False, sort_key=sorted),
    "sample_multiplexer": sample_multiplexer,
    "in_memory_cache": cached,
    "read_lines": functools.partial(read_lines, DATA),
    "tar_webdataset": functools.partial(tar_webdataset, DATA),
    "zip_members": functools.partial(zip_members, DATA),
    "gzip_lines": functools.partial(gzip_lines, DATA),
    "csv_rows_and_dicts": functools.partial(csv_both, DATA),
    "json_files": functools.partial(json_files, DATA),
    "shard_expand": functools.partial(shard_names, DATA),
    "fsspec_chunks": functools.partial(fsspec_chunks, DATA),
    "threadpool_map": lambda: td.ThreadPoolMapper(Shuffler(IterableWrapper(range(30)), buffer_size=4), slow_square,
                                                  scheduled_tasks=5, max_workers=2),
    "async_map_batches": lambda: td.BatchAsyncMapper(IterableWrapper(range(17)), async_square, batch_size=4),
    "tfrecords": functools.partial(tfrecords, DATA),
    "bz2_lines_xz_paragraphs": functools.partial(compressed_lines, DATA),
    "check_hash": functools.partial(corpus_case, "checked_csv", DATA),
    "save_to_disk_and_by_fsspec": functools.partial(both_savers, DATA),
    "flatten_drop_slice_rows2columnar": lambda: td.Rows2Columnar(Batcher(td.Slicer(td.Dropper(
        td.Flattener(td.Mapper(IterableWrapper(range(10)), record)), ["e"]), ["a", "c"]), 3)),
    "drop_slice_tuples": lambda: td.Slicer(td.Dropper(td.Mapper(IterableWrapper(range(8)), as_row), [1]), 0, 2),
    "zip_with_map": lambda: td.MapKeyZipper(Shuffler(IterableWrapper(range(12)), buffer_size=3),
                                            SequenceWrapper(list(range(100, 105))), mod5),
}

#: Every case, as ``"torch:name"`` or ``"torchdata:name"``.
CASES: dict[str, Callable[..., Any]] = {
    **{f"torch:{k}": v for k, v in TORCH.items()},
    **{f"torchdata:{k}": v for k, v in TORCHDATA.items()},
}
