"""Graph factories shared by the tests.

Module-level functions (or ``functools.partial`` of them) so that they pickle by reference
and can be rebuilt in a fresh process. Together they use every DataPipe in
``torch.utils.data.datapipes.iter``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import Any

from torch.utils.data import IterDataPipe
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
    RoutedDecoder,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)

ALL_ITER_DATAPIPES = {
    "Batcher", "Collator", "Concater", "Demultiplexer", "FileLister", "FileOpener", "Filter",
    "Forker", "Grouper", "IterableWrapper", "Mapper", "Multiplexer", "RoutedDecoder", "Sampler",
    "ShardingFilter", "Shuffler", "StreamReader", "UnBatcher", "Zipper",
}


def double(x: int) -> int:
    return 2 * x


def is_not_multiple_of_5(x: int) -> bool:
    return x % 5 != 0


def mod3(x: int) -> int:
    return x % 3


def parity(x: int) -> int:
    return x % 2


def linear(n: int = 47) -> Any:
    """Shuffle, map, filter, batch: the common training graph."""
    dp = IterableWrapper(range(n))
    dp = Shuffler(dp, buffer_size=7)
    dp = Mapper(dp, double)
    dp = Filter(dp, is_not_multiple_of_5)
    return Batcher(dp, batch_size=4)


def linear_lambdas(n: int = 31) -> Any:
    """The same with lambdas: only dill can pickle this graph."""
    return IterableWrapper(range(n)).shuffle(buffer_size=5).map(lambda x: x * 3).batch(3)


def collate_unbatch(n: int = 29) -> Any:
    dp = Batcher(IterableWrapper(range(n)), batch_size=5)
    dp = UnBatcher(dp)
    dp = Shuffler(dp, buffer_size=4)
    dp = Batcher(dp, batch_size=3, drop_last=True)
    return Collator(dp)


def grouped(n: int = 40) -> Any:
    dp = Shuffler(IterableWrapper(range(n)), buffer_size=6)
    return Grouper(dp, group_key_fn=mod3, buffer_size=5, group_size=3, guaranteed_group_size=1)


def combining(n: int = 24) -> Any:
    """fork, demux, zip, concat and mux, with shuffles on both sides of the fork."""
    a, b, c = Forker(Shuffler(IterableWrapper(range(n)), buffer_size=5), 3, buffer_size=-1)
    even, odd = Demultiplexer(IterableWrapper(range(100, 100 + n)), 2, parity, buffer_size=-1)
    zipped = Zipper(Shuffler(a, buffer_size=3), Mapper(b, double))
    chained = Concater(even, odd)
    return Multiplexer(zipped, chained, c)


def sampled(n: int = 13) -> Any:
    return Batcher(Sampler(IterableWrapper(range(n))), batch_size=2)


def sharded(n: int = 33) -> Any:
    dp = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=8))
    return Batcher(Shuffler(Mapper(dp, double), buffer_size=3), batch_size=2)


def write_files(root: str, count: int = 9) -> str:
    """Text and JSON files for the file pipes; returns ``root``."""
    os.makedirs(root, exist_ok=True)
    for i in range(count):
        with open(os.path.join(root, f"r{i:02d}.txt"), "w") as f:
            f.write(f"line {i}\n" * (i % 4 + 1))
        with open(os.path.join(root, f"d{i:02d}.json"), "w") as f:
            json.dump({"id": i, "tags": list(range(i % 3))}, f)
    return root


def files(root: str) -> Any:
    """FileLister, FileOpener, StreamReader and RoutedDecoder on real files."""
    texts = FileLister(root, "*.txt")
    chunks = StreamReader(FileOpener(texts, mode="b"), chunk=5)
    decoded = RoutedDecoder(FileOpener(FileLister(root, "*.json"), mode="b"))
    return Zipper(Shuffler(chunks, buffer_size=4), Multiplexer(decoded, decoded_ids(root)))


def decoded_ids(root: str) -> Any:
    return Mapper(FileLister(root, "*.txt"), os.path.basename)


def noisy(n: int = 20) -> Any:
    """Draws from the global ``random`` module: NOT reproducible (the harness must notice)."""
    return Mapper(IterableWrapper(range(n)), _add_noise)


def _add_noise(x: int) -> float:
    return x + random.random()


class Squares(IterDataPipe):
    """A user pipe with a generator ``__iter__`` and no hook: its position is hidden."""

    def __init__(self, datapipe: Any):
        self.datapipe = datapipe

    def __iter__(self):
        for x in self.datapipe:
            yield x * x


def with_generator_pipe(n: int = 40) -> Any:
    """shuffle -> a hookless user pipe -> batch: restored by replaying the user pipe's part."""
    return Batcher(Squares(Shuffler(IterableWrapper(range(n)), buffer_size=6)), batch_size=3)


# -- random graphs (hypothesis) ----------------------------------------------------------

def build(spec: Sequence[tuple[Any, ...]], n: int = 30) -> Any:
    """A graph from a list of operations (see tests/end_to_end/test_resume_random.py)."""
    dp: Any = IterableWrapper(range(n))
    sharded = False
    for op in spec:
        kind = op[0]
        if kind == "shard":
            if sharded:  # a second sharding_filter in a row is refused (as torchdata does)
                continue
            sharded = True
        if kind == "shuffle":
            dp = Shuffler(dp, buffer_size=op[1])
        elif kind == "map":
            dp = Mapper(dp, _double_any)
        elif kind == "filter":
            dp = Filter(dp, _keep_any)
        elif kind == "batch":
            dp = Batcher(dp, batch_size=op[1], drop_last=op[2])
        elif kind == "unbatch":
            dp = UnBatcher(dp, unbatch_level=-1)
        elif kind == "shard":
            dp = ShardingFilter(dp)
        elif kind == "fork_zip":
            left, right = Forker(dp, 2, buffer_size=-1)
            dp = Zipper(left, Mapper(right, _identity))
        elif kind == "concat":
            dp = Concater(dp, IterableWrapper(range(op[1])))
        elif kind == "mux":
            dp = Multiplexer(dp, IterableWrapper(range(1000, 1000 + op[1])))
        elif kind == "demux":
            first, second = Demultiplexer(dp, 2, _bucket, buffer_size=-1)
            dp = Concater(first, second) if op[1] else Multiplexer(first, second)
        elif kind == "squares":
            dp = Squares(Mapper(dp, _as_int))
        elif kind == "group":
            dp = Grouper(dp, group_key_fn=_bucket, buffer_size=op[1], group_size=2, guaranteed_group_size=1)
        else:
            raise ValueError(kind)
    return dp


def _as_int(x: Any) -> int:
    return x if isinstance(x, int) else _bucket5(x)


def _double_any(x: Any) -> Any:
    return 2 * x if isinstance(x, int) else (x, "mapped")


def _keep_any(x: Any) -> bool:
    return _bucket5(x) != 0


def _bucket5(x: Any) -> int:
    return sum(map(ord, repr(x))) % 5


def _identity(x: Any) -> Any:
    return x


def _bucket(x: Any) -> int:
    return sum(map(ord, repr(x))) % 2  # not hash(): str hashes differ between processes


FILTER_SHIFT = [0]


def _keep_shifted(x: int) -> bool:
    return (x + FILTER_SHIFT[0]) % 3 != 0


def shifting_filter(n: int = 60) -> Any:
    """A hookless pipe behind a filter whose behaviour a global changes (not reproducible)."""
    return Batcher(Squares(Filter(IterableWrapper(range(n)), _keep_shifted)), batch_size=2)


SPY_CALLS: list[Any] = []


def spy(x: Any) -> Any:
    """Records every call (module-level, so a cloned graph still records here)."""
    SPY_CALLS.append(x)
    return x


def spied(n: int = 10_000) -> Any:
    return Batcher(Mapper(Shuffler(IterableWrapper(range(n)), buffer_size=10), spy), 4)


class StatefulCounter(IterDataPipe):
    """A user pipe that keeps its position in attributes (the torchdata Stateful protocol)."""

    def __init__(self, n: int):
        self.n = n
        self._i = 0

    def reset(self) -> None:
        self._i = 0

    def __iter__(self):
        while self._i < self.n:
            self._i += 1
            yield self._i - 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self._i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._i = state["i"]


def with_stateful_pipe(n: int = 50) -> Any:
    return Batcher(Shuffler(StatefulCounter(n), buffer_size=5), batch_size=3)


def stateful_behind_generator(n: int = 30) -> Any:
    """A Stateful pipe read by a hookless pipe (through torch's iteration slot)."""
    return Batcher(Squares(StatefulCounter(n)), batch_size=4)


MAP_OFFSET = [0]


def offset(x: int) -> int:
    """Behaviour controlled by a global: 'the code changed' without changing the graph."""
    return x + MAP_OFFSET[0]


def offset_graph(n: int = 40) -> Any:
    return Batcher(Mapper(Shuffler(IterableWrapper(range(n)), buffer_size=5), offset), batch_size=2)


# -- sharded graphs (logical shards, workers) -------------------------------------------------

def sharded_hookless(n: int = 45) -> Any:
    """A hookless pipe right below the sharding point: its replay reaches the router."""
    dp = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=6))
    return Batcher(Squares(dp), batch_size=2)


class RangeShards(IterDataPipe):
    """A source that reads only its own share once ``apply_sharding`` told it which."""

    def __init__(self, n: int):
        self.n = n
        self.count, self.index = 1, 0

    def apply_sharding(self, count: int, index: int) -> None:
        self.count, self.index = count, index

    def __iter__(self):
        yield from range(self.index, self.n, self.count)


def replicated_source(n: int = 40) -> Any:
    return Batcher(Shuffler(Mapper(RangeShards(n), double), buffer_size=4), batch_size=3)


def _jitter(x: int) -> float:
    return x + random.random() + float(__import__("torch").rand(()).item())


def global_rng_graph(n: int = 30) -> Any:
    """Draws from the global random and torch generators below the sharding point."""
    return Mapper(ShardingFilter(IterableWrapper(range(n))), _jitter)


def sharded_batches(n: int = 64) -> Any:
    """shuffle -> sharding_filter -> map -> batch -> collate, the usual training graph."""
    dp = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=16))
    return Collator(Batcher(Mapper(dp, double), batch_size=4))


MAIN_PID = [0]


def _fail_at(x: int) -> int:
    if x == 7:
        raise KeyError(f"bad sample {x}")
    return x


def failing_graph(n: int = 20) -> Any:
    return Mapper(ShardingFilter(IterableWrapper(range(n))), _fail_at)


def _kill_worker_at(x: int) -> int:
    if x == 9 and os.getpid() != MAIN_PID[0]:
        os.kill(os.getpid(), 9)
    return x


def killing_graph(n: int = 40) -> Any:
    return Mapper(ShardingFilter(IterableWrapper(range(n))), _kill_worker_at)


def _hang_at(x: int) -> int:
    if x == 5 and os.getpid() != MAIN_PID[0]:
        __import__("time").sleep(3600)
    return x


def hanging_graph(n: int = 40) -> Any:
    return Mapper(ShardingFilter(IterableWrapper(range(n))), _hang_at)


MAIN_PID[0] = os.getpid()
