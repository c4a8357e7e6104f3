"""A grammar of random DataPipe graphs over the coverage table, for the graph fuzz.

A graph is a small JSON value: a node is ``[name, args, *children]``, with ``args`` a list
of JSON scalars. Sources have no children; a multi-output pipe (``fork``, ``demux``, ``unzip``,
``round_robin_demux``, ``random_split``) is ``[name, [k, recombiner, ...], input, branch_0,
..., branch_k-1]``, where branch ``i`` is a graph over the placeholder ``["out", [i]]`` and the
branches are recombined by ``zip``, ``mux``, ``concat``, ``mux_longest`` or ``zip_longest``.
:func:`build` turns a description into pipes, so a failing case prints as one line of JSON
and is rebuilt, in any process, from that line.

Every pipe of ``snapshot.hooks._coverage`` (torch's and torchdata 0.9's) is drawable, except
those in :data:`EXCLUDED`, each with its reason; ``tests/end_to_end/test_fuzz_graphs.py`` checks that.
Every function a graph calls is module-level (it pickles by reference) and looks at samples
only through :func:`key` (a digest of ``repr``), so any sample type flows anywhere.

Run the fuzz at any size, printing the counts table (``tests/fuzz_oracle.py``)::

    python -m tests.fuzz_grammar --examples 500
    python -m tests.fuzz_grammar --case '<one line of JSON from a report>'
"""

from __future__ import annotations

import functools
import io
import json
import warnings
import zlib
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    Filter,
    Forker,
    Grouper,
    IterableWrapper,
    Mapper,
    Multiplexer,
    Sampler,
    ShardingFilter,
    Shuffler,
    UnBatcher,
    Zipper,
)
from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES
from torch.utils.data.datapipes.map import SequenceWrapper

from tests import fuzz_files

td: Any
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata 0.9's deprecation notice
        import torchdata.datapipes.iter as td
except ImportError:  # torchdata>=0.10: the torch pipes only
    td = None

#: Pipes of the coverage table the grammar never draws, and why.
EXCLUDED: dict[str, str] = {
    "AISFileLister": "needs an AIStore server", "AISFileLoader": "needs an AIStore server",
    "S3FileLister": "needs S3 (torchdata's compiled S3 plugin)", "S3FileLoader": "needs S3",
    "GDriveReader": "needs the network", "HttpReader": "needs the network", "OnlineReader": "needs the network",
    "HuggingFaceHubReader": "needs the network (the Hub)",
    "IoPathFileLister": "iopath is not installed", "IoPathFileOpener": "iopath is not installed",
    "IoPathSaver": "iopath is not installed",
    "OnDiskCacheHolder": "needs portalocker (not installed); left to the file-pipeline tests",
    "EndOnDiskCacheHolder": "needs portalocker (not installed); left to the file-pipeline tests",
    "FSSpecSaver": "writes through fsspec like Saver, which is drawn; left to the file-pipeline tests",
    "RarArchiveLoader": "needs rarfile and an unrar binary (not installed)",
    "TFRecordLoader": "needs google.protobuf (not installed)",
    "DataFrameMaker": "needs torcharrow (not installed)", "ParquetDataFrameLoader": "needs torcharrow",
    "PinMemory": "needs CUDA (raises on a CPU-only machine)",
    "FullSync": "needs an initialized process group (the fuzz runs no distributed job)",
}


def key(x: Any) -> int:
    """A digest of ``repr(x)``: stable across processes (unlike ``hash`` of a str)."""
    return zlib.crc32(repr(x).encode())


def as_int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else key(x) % 1000


def tag(x: Any) -> Any:
    return ("m", x)


def keep(k: int, x: Any) -> bool:
    return key(x) % k != 0


def explode(x: Any) -> list[Any]:
    return [x] * (key(x) % 3)


def as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list) else explode(x)


def to_dict(x: Any) -> dict[str, Any]:
    return {"v": x}


def triple(x: Any) -> tuple[Any, ...]:
    return (x, key(x) % 7, "t")


def nest(x: Any) -> tuple[Any, ...]:
    return (x, (key(x) % 7, "f"))


def ktuple(k: int, x: Any) -> tuple[Any, ...]:
    return tuple((i, x) for i in range(k))


def route(k: int, drop: bool, x: Any) -> int | None:
    r = key(x) % (k + 1 if drop else k)
    return None if r == k else r


def bucket_key(k: int, x: Any) -> int:
    return key(x) % k


def summarize(batch: list[Any]) -> list[Any]:
    return [key(tuple(batch)) % 100, len(batch)]


def by_key(bucket: list[Any]) -> list[Any]:
    return sorted(bucket, key=key)


def tokens(x: Any) -> int:
    return key(x) % 4 + 1


def first(x: Any) -> Any:
    return x[0]


def identity(x: Any) -> Any:
    return x


async def async_tag(x: Any) -> Any:
    return ("a", x)


def _recombine(how: str, pipes: list[Any]) -> Any:
    if how == "zip":
        return Zipper(*pipes)
    if how == "mux":
        return Multiplexer(*pipes)
    if how == "concat":
        return Concater(*pipes)
    if how == "mux_longest":
        return td.MultiplexerLongest(*pipes)
    if how == "zip_longest":
        return td.ZipperLongest(*pipes, fill_value=-1)
    raise ValueError(how)


def _outputs(name: str, a: list[Any], dp: Any) -> list[Any]:
    """The outputs of multi-output pipe ``name`` over ``dp``."""
    made = _made(name, a, dp)
    return [made] if isinstance(made, IterDataPipe) else list(made)  # one output: the pipe itself


def _made(name: str, a: list[Any], dp: Any) -> Any:
    k = a[0]
    if name == "fork":
        return Forker(dp, k, buffer_size=-1)
    if name == "demux":
        return Demultiplexer(dp, k, functools.partial(route, k, a[2]), drop_none=a[2], buffer_size=-1)
    if name == "unzip":
        return td.UnZipper(Mapper(dp, functools.partial(ktuple, k)), k, buffer_size=-1)
    if name == "round_robin_demux":
        return td.RoundRobinDemultiplexer(dp, k, buffer_size=-1)
    if name == "random_split":  # over a sized source: RandomSplitter needs the total length
        weights = {i: w for i, w in enumerate(a[2:2 + k])}
        return dp.random_split(weights=weights, seed=a[-1], total_length=len(dp))
    raise ValueError(name)


MULTI = ("fork", "demux", "unzip", "round_robin_demux", "random_split")


def _source(name: str, a: list[Any], root: str) -> Any:
    if name == "range":
        return IterableWrapper(range(a[0]))
    if name == "seqmap":
        return SequenceWrapper(list(range(100, 100 + a[0]))).to_iter_datapipe()
    if name == "sampler":
        return Sampler(IterableWrapper(range(a[0])))
    if name == "shard_expand":
        return td.ShardExpander(IterableWrapper([f"s{{0..{a[0]}}}"]))
    if name == "files":
        return fuzz_files.source(a[0], fuzz_files.write_data(root))
    if name == "sharded_files":  # a sharding point between the lister and the opener
        return fuzz_files.sharded_source(a[0], fuzz_files.write_data(root))
    if name == "memory":  # streams that no opener made (tests/fuzz_elastic.py draws it)
        return td.LineReader(IterableWrapper([(f"m{i}.txt", io.StringIO("".join(f"{i}.{j}\n" for j in range(i + 1))))
                                              for i in range(a[0])]))
    raise ValueError(name)


UNARY: dict[str, Callable[[list[Any], Any], Any]] = {
    "shuffle": lambda a, dp: Shuffler(dp, buffer_size=a[0]),
    "map": lambda a, dp: Mapper(dp, tag if a[0] else as_int),
    "filter": lambda a, dp: Filter(dp, functools.partial(keep, a[0])),
    "batch": lambda a, dp: Batcher(dp, a[0], drop_last=a[1]),
    "unbatch": lambda a, dp: UnBatcher(Mapper(dp, as_list)),
    "collate": lambda a, dp: Collator(Batcher(Mapper(dp, as_int), a[0])),
    "groupby": lambda a, dp: Grouper(dp, functools.partial(bucket_key, a[0]), buffer_size=a[1], group_size=a[2],
                                     guaranteed_group_size=1),
    "shard": lambda a, dp: ShardingFilter(dp),
    "rr_dispatch": lambda a, dp: td.ShardingRoundRobinDispatcher(dp, SHARDING_PRIORITIES.MULTIPROCESSING),
    "cycle": lambda a, dp: td.Cycler(dp, a[0]),
    "repeat": lambda a, dp: td.Repeater(dp, a[0]),
    "header": lambda a, dp: td.Header(dp, a[0]),
    "enumerate": lambda a, dp: td.Enumerator(dp, a[0]),
    "add_index": lambda a, dp: td.IndexAdder(Mapper(dp, to_dict), "i"),
    "flatmap": lambda a, dp: td.FlatMapper(dp, explode),
    "shuffled_flatmap": lambda a, dp: td.ShuffledFlatMapper(dp, explode, buffer_size=a[0]),
    "batch_map": lambda a, dp: td.BatchMapper(dp, summarize, a[0]),
    "in_batch_shuffle": lambda a, dp: td.InBatchShuffler(Batcher(dp, a[0])),
    "bucketbatch": lambda a, dp: td.BucketBatcher(dp, a[0], drop_last=a[1], batch_num=a[2], bucket_num=a[3],
                                                  sort_key=by_key if a[4] else None, use_in_batch_shuffle=not a[4]),
    "max_token_bucketize": lambda a, dp: td.MaxTokenBucketizer(dp, max_token_count=a[0], len_fn=tokens,
                                                               buffer_size=a[1]),
    "prefetch": lambda a, dp: td.Prefetcher(dp, a[0]),
    "in_memory_cache": lambda a, dp: td.InMemoryCacheHolder(dp),
    "dropper": lambda a, dp: td.Dropper(Mapper(dp, triple), 1),
    "slice": lambda a, dp: td.Slicer(Mapper(dp, triple), a[0], a[0] + 2),
    "flatten": lambda a, dp: td.Flattener(Mapper(dp, nest), indices=[1]),
    "rows2columnar": lambda a, dp: td.Rows2Columnar(Batcher(Mapper(dp, to_dict), a[0])),
    "length_setter": lambda a, dp: td.LengthSetter(dp, a[0]),
    "threadpool_map": lambda a, dp: td.ThreadPoolMapper(dp, tag, max_workers=2),
    "batch_async_map": lambda a, dp: td.BatchAsyncMapper(dp, async_tag, batch_size=a[0]),
    "iter_key_zip": lambda a, dp: td.IterKeyZipper(td.Enumerator(dp), IterableWrapper(range(100_000)), first,
                                                   ref_key_fn=identity, keep_key=a[0]),
    "map_key_zip": lambda a, dp: td.MapKeyZipper(td.Enumerator(dp), SequenceWrapper(list(range(100_000))), first),
}

BINARY = ("zip", "mux", "concat", "mux_longest", "zip_longest", "sample_mux")


def build(node: Any, root: str, outs: list[Any] | None = None) -> Any:
    """The pipes a description stands for (file sources read the files under ``root``)."""
    name, a, *children = node
    if name == "out":
        assert outs is not None, "an 'out' placeholder outside a multi-output pipe's branch"
        return outs[a[0]]
    if not children:
        return _source(name, a, root)
    if name in UNARY:
        return UNARY[name](a, build(children[0], root, outs))
    if name in MULTI:
        made = _outputs(name, a, build(children[0], root, outs))
        return _recombine(a[1], [build(b, root, made) for b in children[1:]])
    if name == "sample_mux":
        pipes = [build(c, root, outs) for c in children]
        return td.SampleMultiplexer({p: w for p, w in zip(pipes, a[:-1])}, seed=a[-1])
    if name in BINARY:
        return _recombine(name, [build(c, root, outs) for c in children])
    raise ValueError(f"unknown node {name!r}")


# -- the strategies -----------------------------------------------------------------------------

def _node(name: str, args: st.SearchStrategy[Any], *children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.tuples(args, *children).map(lambda t: [name, list(t[0]), *t[1:]])


small = st.integers(1, 5)
TORCH_SOURCES = [_node("range", st.tuples(st.integers(0, 20))),
                 _node("sampler", st.tuples(st.integers(0, 12))),
                 _node("files", st.tuples(st.sampled_from(fuzz_files.TORCH_KINDS)))]
SHARDED_FILES = _node("sharded_files", st.tuples(st.sampled_from(fuzz_files.SHARDED_KINDS)))
TORCHDATA_SOURCES = [_node("seqmap", st.tuples(st.integers(0, 12))),
                     _node("shard_expand", st.tuples(st.integers(1, 8))),
                     _node("files", st.tuples(st.sampled_from(fuzz_files.TORCH_KINDS + fuzz_files.TORCHDATA_KINDS))),
                     SHARDED_FILES]

UNARY_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "shuffle": st.tuples(st.integers(1, 12)), "map": st.tuples(st.booleans()),
    "filter": st.tuples(st.integers(2, 5)), "batch": st.tuples(small, st.booleans()),
    "unbatch": st.tuples(), "collate": st.tuples(small),
    "groupby": st.tuples(st.integers(1, 3), st.integers(3, 8), st.integers(1, 3)),
    "shard": st.tuples(), "rr_dispatch": st.tuples(),
    "cycle": st.tuples(st.integers(1, 3)), "repeat": st.tuples(st.integers(2, 3)),
    "header": st.tuples(st.integers(0, 25)), "enumerate": st.tuples(st.integers(0, 5)),
    "add_index": st.tuples(), "flatmap": st.tuples(), "shuffled_flatmap": st.tuples(st.integers(1, 8)),
    "batch_map": st.tuples(small), "in_batch_shuffle": st.tuples(small),
    "bucketbatch": st.tuples(small, st.booleans(), st.integers(1, 3), st.integers(1, 2), st.booleans()),
    "max_token_bucketize": st.tuples(st.integers(4, 8), st.integers(1, 10)),
    "prefetch": st.tuples(st.integers(1, 4)), "in_memory_cache": st.tuples(),
    "dropper": st.tuples(), "slice": st.tuples(st.integers(0, 1)), "flatten": st.tuples(),
    "rows2columnar": st.tuples(small), "length_setter": st.tuples(st.integers(1, 30)),
    "threadpool_map": st.tuples(), "batch_async_map": st.tuples(small),
    "iter_key_zip": st.tuples(st.booleans()), "map_key_zip": st.tuples(),
}
TORCH_UNARY = ("shuffle", "map", "filter", "batch", "unbatch", "collate", "groupby", "shard")
#: Drawn more often: the random pipes and the re-iterating ones (issue 22 item 2).
FAVOURED = ("shuffle", "shard", "cycle", "repeat", "in_batch_shuffle", "bucketbatch", "in_memory_cache")
RECOMBINERS = ("zip", "mux", "concat", "mux_longest", "zip_longest")


def _unary(children: st.SearchStrategy[Any], names: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(names).flatmap(lambda n: _node(n, UNARY_ARGS[n], children))


def _branch(k: int, i: int, names: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """A graph over output ``i``: up to two unary pipes over it."""
    ops = st.lists(st.sampled_from(names).flatmap(lambda n: UNARY_ARGS[n].map(lambda a: [n, list(a)])), max_size=2)

    def fold(chain: list[list[Any]]) -> Any:
        node: Any = ["out", [i]]
        for op in chain:
            node = [*op, node]
        return node
    return ops.map(fold)


def _multi(children: st.SearchStrategy[Any], names: tuple[str, ...], torchdata: bool) -> st.SearchStrategy[Any]:
    kinds = MULTI if torchdata else ("fork", "demux")
    how = st.sampled_from(RECOMBINERS if torchdata else RECOMBINERS[:3])
    branch_ops = tuple(n for n in names if n not in ("shard", "rr_dispatch"))

    def make(kind: str) -> st.SearchStrategy[Any]:
        def with_k(k: int) -> st.SearchStrategy[Any]:
            branches = st.tuples(*[_branch(k, i, branch_ops) for i in range(k)])
            if kind == "random_split":  # its splits each read the source: one at a time (concat)
                args = st.tuples(st.just(k), st.just("concat"), *[st.integers(1, 3)] * k, st.integers(0, 99))
                source = _node("range", st.tuples(st.integers(0, 20)))
            else:
                args = st.tuples(st.just(k), how, st.booleans())
                source = children
            return st.tuples(args, source, branches).map(lambda t: [kind, list(t[0]), t[1], *t[2]])
        return st.integers(1 if kind != "random_split" else 2, 3).flatmap(with_k)
    return st.sampled_from(kinds).flatmap(make)


def _binary(children: st.SearchStrategy[Any], torchdata: bool) -> st.SearchStrategy[Any]:
    weights = st.tuples(st.floats(0.1, 1.0).map(lambda w: round(w, 2)), st.floats(0.1, 1.0).map(lambda w: round(w, 2)),
                        st.integers(-9, 99).map(lambda s: None if s < 0 else s))  # unseeded: 1 in 12

    def make(name: str) -> st.SearchStrategy[Any]:
        return st.tuples(weights if name == "sample_mux" else st.just(()), children, children).map(
            lambda t: [name, list(t[0]), t[1], t[2]])
    return st.sampled_from(BINARY if torchdata else BINARY[:3]).flatmap(make)


def graphs(torchdata: bool = td is not None, max_leaves: int = 4) -> st.SearchStrategy[Any]:
    """Random graph descriptions (torch's pipes only when ``torchdata`` is false)."""
    names = tuple(UNARY) if torchdata else TORCH_UNARY
    sources = st.one_of(*(TORCH_SOURCES[:2] + TORCHDATA_SOURCES if torchdata else TORCH_SOURCES))
    favoured = tuple(n for n in FAVOURED if n in names)

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        options = [_unary(children, favoured), _unary(children, names), _multi(children, names, torchdata),
                   _binary(children, torchdata)]
        return st.one_of(*options, *([_reiterated(children)] if torchdata else []))
    return st.recursive(sources, extend, max_leaves=max_leaves)


#: Pipes that read their input again within an epoch, and random pipes for them to re-read.
REITERATORS = ("cycle", "in_memory_cache")
RANDOM = ("shuffle", "in_batch_shuffle", "bucketbatch", "shuffled_flatmap")


def _reiterated(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A re-reading pipe right over a random one (issue 22 item 2): ``cycle(shuffle(...))``, ..."""
    inner = st.sampled_from(RANDOM).flatmap(lambda n: _node(n, UNARY_ARGS[n], children))
    return st.sampled_from(REITERATORS).flatmap(
        lambda n: _node(n, UNARY_ARGS[n] if n != "cycle" else st.tuples(st.integers(2, 3)), inner))


#: Reading services, by name (see ``tests/fuzz_oracle.service``); a restore takes the saved
#: number of logical shards, so the services restored onto leave it unset.
#: (saved on, restored onto): always another service. Hypothesis draws the first ones more
#: often; the last two restore one logical shard onto 2 workers (split into 2 sub-shards).
SERVICE_PAIRS = (("mp2", "mp1"), ("inproc_L2", "mp2"), ("mp2_L3", "inproc"), ("mp1", "inproc"), ("inproc", "mp1"),
                 ("mp2_L3", "mp2"), ("inproc_L2", "mp1"), ("mp2", "inproc"), ("mp2_L3", "mp1"), ("inproc_L2", "inproc"),
                 ("inproc", "mp2"), ("mp1", "mp2"))
#: Where to cut: ``[epoch, what, permille]``, what in ``at`` (permille of the epoch), ``end``
#: (after its last sample), ``after_end`` (after its StopIteration).
CUTS = st.one_of(st.tuples(st.integers(0, 1), st.just("at"), st.integers(0, 1000)),
                 st.tuples(st.integers(0, 1), st.sampled_from(["end", "after_end"]), st.just(0)))


def sharded_at(graph: Any, depth: int) -> Any:
    """``graph`` with a ``sharding_filter`` ``depth`` pipes below its sink (along first inputs),
    unless it has a sharding point already."""
    if any(f'"{name}"' in json.dumps(graph) for name in ("shard", "rr_dispatch", "sharded_files")):
        return graph
    if depth == 0 or len(graph) < 3 or graph[0] == "out":
        return ["shard", [], graph]
    return [graph[0], graph[1], sharded_at(graph[2], depth - 1), *graph[3:]]


def cases(torchdata: bool = td is not None) -> st.SearchStrategy[dict[str, Any]]:
    """A graph, a seed, the service that saves, the one that restores, cuts, a strategy, whether
    the restore rebuilds the graph in code or unpickles it, and whether it is saved again.

    Most graphs get a sharding point (at a random depth), so that the workers and logical
    shards have something to split.
    """
    graph = st.tuples(graphs(torchdata), st.integers(-1, 5)).map(
        lambda t: t[0] if t[1] < 0 else sharded_at(t[0], t[1]))
    services = st.sampled_from(SERVICE_PAIRS)
    fields = st.fixed_dictionaries({
        "graph": graph,
        "seed": st.integers(0, 2**31 - 1),
        "services": services,
        "cuts": st.lists(CUTS.map(list), min_size=1, max_size=3, unique_by=lambda c: (c[0], c[1], c[2])),
        "strategy": st.sampled_from(["auto", "fast_forward"]),
        "rebuild": st.sampled_from(["code", "pickle"]),
        "again": st.booleans(),
    })
    return fields.map(_case)


#: Rank services by name, ``r<ranks>w<workers per rank>`` (see ``tests/fuzz_ranks.service``): (saved on,
#: restored onto), on as many ranks (other workers) and on other numbers of ranks.
RANK_PAIRS = (("r2w0", "r3w0"), ("r2w0", "r2w0"), ("r3w0", "r2w0"), ("r2w1", "r3w0"), ("r2w2", "r2w1"),
              ("r2w0", "r1w0"))


def rank_graphs() -> st.SearchStrategy[Any]:
    """Small graphs for the ranks: over a source sharded by file (mostly), or a range sharded above.

    Only pipes that work sample by sample (and shuffles): one that groups or counts samples
    (``batch``, ``header``, ``enumerate``) works per sub-shard below the sharding point, so on
    another number of ranks it yields other items by design (docs/concepts/logical-shards.md).
    """
    sources = st.one_of(SHARDED_FILES, SHARDED_FILES, _node("range", st.tuples(st.integers(6, 20))))
    names = ("shuffle", "map", "filter", "flatmap", "shuffled_flatmap")

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return _unary(children, names)
    return st.tuples(st.recursive(sources, extend, max_leaves=4), st.integers(0, 3)).map(
        lambda t: sharded_at(t[0], t[1]))


def rank_cases() -> st.SearchStrategy[dict[str, Any]]:
    """A graph, a seed, the rank services that save and restore, a cut (permille of the shortest
    rank's epoch 0), and the equalizing policy (``even_batches``)."""
    fields = st.fixed_dictionaries({
        "graph": rank_graphs(), "seed": st.integers(0, 2**31 - 1), "services": st.sampled_from(RANK_PAIRS),
        "cut": st.integers(0, 1000), "policy": st.sampled_from([None, "drop"])})
    return fields.map(lambda f: {"graph": f["graph"], "seed": f["seed"], "save_on": f["services"][0],
                                 "restore_on": f["services"][1], "cut": f["cut"], "policy": f["policy"]})


def _case(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields in a fixed order, the two services apart (so a reproducer reads well)."""
    save_on, restore_on = fields["services"]
    return {"graph": fields["graph"], "seed": fields["seed"], "save_on": save_on, "restore_on": restore_on,
            "cuts": fields["cuts"], "strategy": fields["strategy"], "rebuild": fields["rebuild"],
            "again": fields["again"]}


def draw_cases(examples: int, seed: int = 0, kind: str = "graphs",
               module: str = "tests.fuzz_grammar") -> list[dict[str, Any]]:
    """``examples`` cases of ``kind`` (``graphs`` or ``ranks``), the same ones for the same ``seed`` in any
    process (``module``'s draw: ``python -m module --draw``).

    Hypothesis draws some integers from the constants of the local modules loaded at the
    time (``sys.modules``), so the draw runs in a fresh process that loads only this module.
    """
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", module, "--draw", str(examples), str(seed), kind],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300, check=True)
    drawn: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return drawn


def _draw_here(examples: int, seed: int, kind: str = "graphs",
               strategy: st.SearchStrategy[Any] | None = None) -> list[dict[str, Any]]:
    """Draw four times as many (of ``strategy``, default :func:`cases` or, for ``kind`` ``ranks``,
    :func:`rank_cases`), then keep graphs of new shapes first (hypothesis draws runs of small
    variations of one graph)."""
    pool: list[dict[str, Any]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=4 * examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy if strategy is not None else cases() if kind == "graphs" else rank_cases())
    def collect(case: dict[str, Any]) -> None:
        pool.append(case)

    collect()
    seen: set[str] = set()
    fresh, rest = [], []
    for case in pool:
        shape = json.dumps(_shape(case["graph"]))
        (rest if shape in seen else fresh).append(case)
        seen.add(shape)
    return (fresh + rest)[:examples]


def _shape(node: Any) -> Any:
    """The pipes of a graph, without their arguments."""
    return [node[0], *[_shape(c) for c in node[2:]]]


def drawable() -> set[type]:
    """Every pipe class the grammar can build (walks one graph of each production)."""
    from snapshot.graph import Graph

    root = _scratch()
    pipes = [build(g, root) for g in _one_of_each()]
    return {type(n.datapipe) for p in pipes for n in Graph(p)}


def undrawable() -> list[str]:
    """Rows of the coverage table neither drawn nor in :data:`EXCLUDED` (should be none)."""
    from snapshot.hooks._coverage import coverage

    drawn = drawable()
    return [r.name for r in coverage()
            if r.name not in EXCLUDED and r.name not in CONSTRUCTED and not set(r.classes) <= drawn]


#: Pipes whose constructor returns another pipe, so no graph holds them: where the grammar calls them.
CONSTRUCTED = {"Extractor": "the 'extract' file source (its constructor returns a Decompressor)"}


def _one_of_each() -> list[Any]:
    leaf = ["range", [6]]
    out = [["range", [3]], ["seqmap", [3]], ["sampler", [3]], ["shard_expand", [2]]]
    out += [["files", [k]] for k in (*fuzz_files.TORCH_KINDS, *fuzz_files.TORCHDATA_KINDS)]
    out += [["sharded_files", [k]] for k in fuzz_files.SHARDED_KINDS]
    out += [[n, [2, True, 1, 1, True], leaf] if n != "groupby" else [n, [2, 4, 2], leaf] for n in UNARY]
    out += [[n, [], leaf, leaf] for n in BINARY[:5]] + [["sample_mux", [0.5, 0.5, 1], leaf, leaf]]
    out += [[m, [2, r, 1, 1, 3], leaf, ["out", [0]], ["out", [1]]] for m in MULTI for r in RECOMBINERS]
    return out


def _scratch() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="fuzz-grammar-")


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--draw"]:
        print(json.dumps(_draw_here(int(args[1]), int(args[2]), *args[3:4])))
        return 0
    from tests import fuzz_oracle

    return fuzz_oracle.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
